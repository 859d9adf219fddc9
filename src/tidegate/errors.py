"""Errors raised by tidegate.

Every error tidegate raises derives from one base, so callers can catch them all::

    TidegateError
    ├── ConfigError          a setting, workloop spec or lane chain is malformed
    ├── SchemaError          the database schema is older or newer than this code
    ├── UnavailableError     something tidegate needs cannot be had: PostgreSQL cannot be
    │                        reached or refuses the login, the API's port is taken
    ├── InputError           a value is outside what tidegate can store or handle
    │   └── EnqueueError     an enqueue was malformed (args, lane, priority)
    ├── UnknownTaskError     a run names a task that is not registered
    ├── UnknownRunError      no run has the id (never made, or pruned)
    └── ResultError          a run awaited with ``result`` gave no result (``.run``)
        ├── RunFailed        it ended ``discarded``: its ``errors`` say why
        ├── RunCancelled     it ended ``cancelled``
        └── ResultTimeout    it had not finished within the timeout (a ``TimeoutError``)
"""

from __future__ import annotations

from typing import Any


class TidegateError(Exception):
    """Base of every error tidegate raises."""


class ConfigError(TidegateError, ValueError):
    """A setting, workloop spec or lane chain is malformed; the message names the bad part."""


class SchemaError(TidegateError):
    """The database schema does not match this version of tidegate."""


class UnavailableError(TidegateError):
    """Something tidegate needs cannot be had; the message says what, where and why.

    Expected in operation (a server down, a wrong password, a port in use), so the CLI
    prints it as one line rather than a traceback.
    """


class UnknownTaskError(TidegateError, LookupError):
    """A run or an enqueue names a task that this app has not registered."""


class InputError(TidegateError, ValueError):
    """A value is outside the bounds tidegate can store or handle (``tidegate.limits``).

    The message names the value and the bound, so the caller can correct it.
    """


class EnqueueError(InputError):
    """An enqueue was malformed: args not a JSON object, a bad lane name or priority."""


class UnknownRunError(TidegateError, LookupError):
    """No run has the id: it was never made, or it finished long ago and was pruned."""


class ResultError(TidegateError):
    """A run awaited with ``Tidegate.result`` gave no result; ``run`` is the run as last
    read (a ``tidegate.Run``: not named here, since runs.py imports this module),
    ``errors`` its attempts' errors."""

    def __init__(self, message: str, run: Any) -> None:
        super().__init__(message)
        self.run = run

    @property
    def errors(self) -> list[dict[str, Any]]:
        errors: list[dict[str, Any]] = self.run.errors
        return errors


class RunFailed(ResultError):
    """The run ended ``discarded``: its last attempt failed, or its handler discarded it."""


class RunCancelled(ResultError):
    """The run ended ``cancelled``: by its handler, the API, the dashboard or ``cancel``."""


class ResultTimeout(ResultError, TimeoutError):
    """The run had not finished within the timeout; it goes on, and can be awaited again."""
