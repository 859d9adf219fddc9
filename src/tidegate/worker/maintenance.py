"""A worker's maintenance duties, each a ``Periodic`` service of its own.

A worker on PostgreSQL runs them beside its workloops; a remote worker has the API do
what its stager and rescuer would, at each heartbeat, and leaves the rest to local
workers (worker/link.py):

- ``Stager``: makes ready the scheduled runs that came due, and the pending runs of
  this worker's tasks, every ``stage_seconds``.
- ``Parker``: sets pending the runs at the head of this worker's lanes whose task no
  live worker has, every ``stage_seconds`` after a claim came up short.
- ``Rescuer``: takes back the runs whose leases lapsed, every ``rescue_seconds``
  (``rescue``, which every API process runs too: a rescuer of its own, and at each
  remote worker's heartbeat).
- ``Pruner``: deletes what is past ``retention_seconds``, a batch at a time, every
  ``prune_seconds``.
- ``Folder``: folds the counters of workers no longer live into those of ``retired``,
  every ``rescue_seconds``, and the worker's own once it has left.

The scheduler, which fires due schedules, is in worker/scheduler.py with the statements
it runs; the heartbeat, which reads the workloops' slots, is the worker's own
(worker/runtime.py). A round that moves a full batch goes again at once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from tidegate.runs import Run, run_row
from tidegate.storage.sql import query
from tidegate.worker.counters import DURATION_BUCKETS
from tidegate.worker.services import Periodic, fetch

log = logging.getLogger("tidegate.worker")

BATCH_LIMIT = 5000
"""Rows the stager, the rescuer and the folder move per statement."""


class Stager(Periodic):
    """Make ready the scheduled runs that came due, and the pending runs of tasks this
    worker has in lanes its workloops take, and wake their lanes (``stage_runs``): a run
    that waited for its time, a retry, or a worker joins the line where its key stands
    now."""

    def __init__(self, pool: AsyncConnectionPool, interval: float, params: dict[str, Any]) -> None:
        super().__init__("stager", interval, self.stage)
        self.pool = pool
        self.params = {**params, "limit": BATCH_LIMIT}

    async def stage(self) -> bool:
        rows = await fetch(self.pool, "stage_runs", self.params)
        return bool(rows[0][0] >= BATCH_LIMIT)


class Parker(Periodic):
    """Set pending the runs at the head of this worker's lanes that no live worker can
    run (``park_strays``), and say so; a claim only passes over them.

    It looks only after a claim came up short (``came_up_short``): strays may be what
    the claim passed over. While every claim is full, none is in the way. Runs it parks
    make room at the head of their lanes: ``parked`` is called to look again.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool,
        interval: float,
        params: dict[str, Any],
        parked: Callable[[], None],
    ) -> None:
        super().__init__("parker", interval, self.park)
        self.pool = pool
        self.params = params
        self.parked = parked
        self.came_up_short = False
        """Whether a claim came up short since the parker last looked."""

    async def park(self) -> bool:
        if not self.came_up_short:
            return False
        self.came_up_short = False
        async with self.pool.connection() as conn:
            cursor = conn.cursor(row_factory=run_row)
            await cursor.execute(query("park_strays"), self.params)
            parked = await cursor.fetchall()
        if parked:
            log_parked(parked)
            self.parked()
        return False


def log_parked(parked: list[Run]) -> None:
    """Say loudly which runs wait for a worker that has their task: those the parker set
    pending, and those a claim did (worker/workloop.py)."""
    by_task: dict[tuple[str, str], list[int]] = {}
    for run in parked:
        by_task.setdefault((run.task, run.lane), []).append(run.id)
    for (task, lane), ids in by_task.items():
        shown = ", ".join(map(str, ids[:5])) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        log.warning(
            "no live worker has task %r for lane %r: run(s) %s wait as pending until one "
            "starts (is the task registered under this name in the worker's app?)",
            task,
            lane,
            shown,
        )


async def rescue(pool: AsyncConnectionPool, channel: str, completed_channel: str) -> bool:
    """Take back the runs whose leases lapsed (``rescue_runs``), say so, and tell
    whether a full batch asks to go again. Every worker does, and every API process: a
    run stops counting toward its caps only once rescued, and with no worker alive the
    API is the one left to do it."""
    params = {
        "channel": channel,
        "completed_channel": completed_channel,
        "limit": BATCH_LIMIT,
        "buckets": len(DURATION_BUCKETS) + 1,
    }
    rows = await fetch(pool, "rescue_runs", params)
    for task, lane, count in rows:
        log.warning(
            "rescued %d run(s) of task %r in lane %r: their leases lapsed (the worker "
            "holding them stopped renewing them); available again, or discarded after "
            "their last attempt",
            count,
            task,
            lane,
            extra={"task": task, "lane": lane},
        )
    return sum(int(count) for *_, count in rows) >= BATCH_LIMIT


class Rescuer(Periodic):
    """Take back the runs whose leases lapsed (``rescue``): available again, or discarded
    after their last attempt, and no longer counted toward their caps."""

    def __init__(
        self, pool: AsyncConnectionPool, interval: float, channel: str, completed_channel: str
    ) -> None:
        tick = functools.partial(rescue, pool, channel, completed_channel)
        super().__init__("rescuer", interval, tick)


class Pruner(Periodic):
    """Delete, a batch at a time and one process at a time (``prune_runs``), the runs
    finished before ``retention_seconds`` with their events, the webhook requests and the
    webhook log's refusals as old, the minute counts past the dashboard's hour, and the
    rows of workers silent for much longer than a lease."""

    def __init__(self, pool: AsyncConnectionPool, interval: float, params: dict[str, Any]) -> None:
        super().__init__("pruner", interval, self.prune)
        self.pool = pool
        self.params = params
        """``lease_seconds``, ``retention_seconds`` and ``batch``."""

    async def prune(self) -> bool:
        rows = await fetch(self.pool, "prune_runs", self.params)
        return bool(rows[0][0] >= self.params["batch"])


class Folder(Periodic):
    """Fold the counters of workers no longer live into those of ``retired``
    (``fold_counters``), so that ``worker_counters`` holds a few rows per live worker and
    the sums ``/metrics`` reports never go back."""

    def __init__(self, pool: AsyncConnectionPool, interval: float, live_seconds: float) -> None:
        super().__init__("folder", interval, self.fold)
        self.pool = pool
        self.params = {"live_seconds": live_seconds, "limit": BATCH_LIMIT}

    async def fold(self) -> bool:
        rows = await fetch(self.pool, "fold_counters", self.params)
        return bool(rows[0][0] >= BATCH_LIMIT)
