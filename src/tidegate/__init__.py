"""tidegate: a PostgreSQL-backed job dispatch engine with lanes and workloops.

The public API::

    from tidegate import Tidegate, NewRun, Unique, Retry, Cancel, Discard, DownstreamFailing

See ``tidegate.app`` for a quick start.
"""

from tidegate.app import NewRun, Task, Tidegate
from tidegate.errors import (
    ConfigError,
    EnqueueError,
    ResultError,
    ResultTimeout,
    RunCancelled,
    RunFailed,
    SchemaError,
    TidegateError,
    UnknownRunError,
    UnknownTaskError,
)
from tidegate.lanes import WorkloopSpec, parse_chain, parse_workloops
from tidegate.runs import Cancel, Discard, DownstreamFailing, Retry, Run, RunState, current_run
from tidegate.settings import Settings
from tidegate.unique import Unique

__version__ = "0.1.0"
"""tidegate's version, written here alone: pyproject.toml reads it (``dynamic``), and so
do ``tidegate --version`` and the installed distribution's metadata."""

__all__ = [
    "Cancel",
    "ConfigError",
    "Discard",
    "DownstreamFailing",
    "EnqueueError",
    "NewRun",
    "ResultError",
    "ResultTimeout",
    "Retry",
    "Run",
    "RunCancelled",
    "RunFailed",
    "RunState",
    "SchemaError",
    "Settings",
    "Task",
    "Tidegate",
    "TidegateError",
    "Unique",
    "UnknownRunError",
    "UnknownTaskError",
    "WorkloopSpec",
    "current_run",
    "parse_chain",
    "parse_workloops",
]
