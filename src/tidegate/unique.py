"""Unique runs: ask for a run at most once per period, as Oban's ``unique`` and River's
``UniqueOpts`` do.

::

    app.enqueue("sync_account", {"account": 7}, unique=Unique(period=60))
    app.enqueue("sync_account", {"account": 7}, unique=Unique(period=60))  # the same run,
                                                                           # .duplicate

A unique run carries a key: a digest of its project, its task, the fields ``by`` names
(``"args"``, the whole args or only ``args_keys`` of them; ``"key"``; ``"lane"``) and,
with a ``period``, the window of ``period`` seconds its due time falls in (windows are
aligned to the Unix epoch, as River's ``ByPeriod``: two enqueues a second apart across a
window's edge make two runs). While a run with that key is in one of ``states``, an
enqueue with the same key inserts nothing and returns that run, marked ``duplicate``.
The database decides (the unique index ``runs_unique``, see storage/schema.sql), so any
number of processes enqueueing at once make one run, also in the caller's transaction
(``connection=``): a second enqueue of the key waits for the first's transaction to
commit or roll back.

The project is always part of the key: a project never receives another project's run.

``states`` must hold every state a run passes through on its own (scheduled, available,
pending, running): a run that moved into a state outside them would take a key another
run may hold. The default adds ``succeeded``, as River's does: a run that failed for
good (``discarded``) or was ``cancelled`` frees its key, one that succeeded holds it for
the rest of its period. A retry from the API or the dashboard is a decision of its own:
the retried run drops its key (storage/queries/retry_run.sql).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tidegate.errors import InputError
from tidegate.limits import UNIQUE_PERIOD
from tidegate.runs import RunState

BY_FIELDS = ("args", "key", "lane")
"""What ``by`` may name, beside the project and the task, which are always part of it."""
REQUIRED_STATES = (RunState.SCHEDULED, RunState.AVAILABLE, RunState.PENDING, RunState.RUNNING)
"""The states every unique run holds its key in: those a run moves among on its own."""
DEFAULT_STATES = (*REQUIRED_STATES, RunState.SUCCEEDED)


@dataclass(frozen=True)
class Unique:
    """How a run is unique: among runs of the same project, task and ``by`` fields, in
    the same window of ``period`` seconds (``None``: for as long as such a run is in
    ``states``)."""

    period: float | timedelta | None = None
    by: Sequence[str] = ("args",)
    args_keys: Sequence[str] | None = None
    """With ``"args"`` in ``by``: only these keys of the args count (a key the args lack
    counts as absent); ``None``: the whole args."""
    states: Sequence[RunState | str] = field(default=DEFAULT_STATES)

    def checked(self) -> Unique:
        """Return the same options in canonical form, or raise ``InputError`` saying
        which one is wrong."""
        period = self.period
        if isinstance(period, timedelta):
            period = period.total_seconds()
        if period is not None and period not in UNIQUE_PERIOD:
            raise InputError(
                f"unique period must be 1 to {UNIQUE_PERIOD.high:.0f} seconds or None, "
                f"got {self.period!r}"
            )
        if isinstance(self.by, str) or not set(self.by) <= set(BY_FIELDS):
            raise InputError(f"unique by must name some of {BY_FIELDS}, got {self.by!r}")
        if self.args_keys is not None and (
            "args" not in self.by
            or isinstance(self.args_keys, str)
            or not all(isinstance(k, str) for k in self.args_keys)
        ):
            raise InputError(
                "unique args_keys must be a sequence of argument names, with 'args' in by; "
                f"got {self.args_keys!r}"
            )
        try:
            states = tuple(sorted({RunState(s) for s in self.states}, key=list(RunState).index))
        except ValueError:
            raise InputError(
                f"unique states must be run states ({', '.join(RunState)}), got {self.states!r}"
            ) from None
        if not set(REQUIRED_STATES) <= set(states):
            raise InputError(
                f"unique states must include {', '.join(REQUIRED_STATES)}, got {self.states!r}"
            )
        period = None if period is None else float(period)  # 60 and 60.0: one key
        by = tuple(f for f in BY_FIELDS if f in self.by)
        keys = None if self.args_keys is None else tuple(sorted(set(self.args_keys)))
        return Unique(period, by, keys, states)

    def key(self, run: dict[str, Any]) -> str:
        """Return the unique key of a resolved run (``Tidegate.resolve``'s row); the
        options must be ``checked``. The window is read from this process's clock, as
        River's is: windows are the same on every host up to the hosts' clock skew."""
        identity: dict[str, Any] = {"project": run["project"], "task": run["task"]}
        if "args" in self.by:
            args = run["args"]
            keys = self.args_keys
            identity["args"] = args if keys is None else {k: args[k] for k in keys if k in args}
        if "key" in self.by:
            identity["key"] = run["key"]
        if "lane" in self.by:
            identity["lane"] = run["lane"]
        period = self.period
        if period is not None:
            seconds = period.total_seconds() if isinstance(period, timedelta) else period
            due: datetime | None = run["scheduled_at"]
            at = time.time() if due is None else due.timestamp()
            identity["window"] = [seconds, math.floor(at / seconds)]
        text = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()
