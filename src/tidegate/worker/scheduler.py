"""The worker's part in schedules (``tidegate.schedules``): write the app's declared
schedules when it starts (``declare_steps``), and fire the due ones of its tasks every
``schedule_seconds`` (``Scheduler``, a service of every worker on PostgreSQL).

Firing is one transaction: lock the due schedules (``lock_due_schedules``, SKIP LOCKED),
insert the runs of their due ticks as this worker's app would enqueue them, move each
schedule's ``next_tick`` past now. A worker that dies half way leaves nothing: the
next one to lock the rows fires the same ticks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

from tidegate.app import NewRun
from tidegate.lanes import FAST_LANE
from tidegate.schedules import NO_FAST_LANE, Plan, ScheduleError, plans, sync_declared, tick_key
from tidegate.storage.sql import Statement, Steps, adrive
from tidegate.worker.services import Periodic

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from tidegate.app import Tidegate

log = logging.getLogger("tidegate.worker")

FIRE_LIMIT = 200
"""Schedules fired per transaction; a full batch goes again at once."""


class Scheduler(Periodic):
    """Fire the due schedules of ``tasks`` (``fire_steps``), one transaction a round; a
    round that locked ``FIRE_LIMIT`` schedules goes again at once."""

    def __init__(
        self, app: Tidegate, pool: AsyncConnectionPool, interval: float, tasks: Sequence[str]
    ) -> None:
        super().__init__("scheduler", interval, self.fire)
        self.app = app
        self.pool = pool
        self.tasks = list(tasks)

    async def fire(self) -> bool:
        async with self.pool.connection() as conn, conn.transaction():
            locked = await adrive(conn, fire_steps(self.app, self.tasks))
        return locked >= FIRE_LIMIT


def declare_steps(app: Tidegate, tasks: Sequence[str]) -> Steps[None]:
    """Write ``app``'s declared schedules; say what changed, and which names an admin's
    schedule holds (those are not the code's)."""
    declared = list(app.schedules.values())
    changes = yield from sync_declared(declared, tasks)
    written = {(project, name) for change, project, name in changes if change == "written"}
    for change, project, name in changes:
        if change == "deleted":
            log.info("schedule %r of project %r: no longer declared, deleted", name, project)
    for d in declared:
        if (d.project, d.name) not in written:
            log.warning(
                "schedule %r of project %r is declared in code but an admin made one of that "
                "name: the admin's stays, the code's is not written (rename one of them)",
                d.name,
                d.project,
                extra={"schedule": d.name, "project": d.project},
            )


def fire_steps(app: Tidegate, tasks: Sequence[str]) -> Steps[int]:
    """Fire the due schedules of ``tasks``; return how many were locked (run these in a
    transaction: the locks hold until the runs and the new ticks are written)."""
    due = yield Statement(
        "lock_due_schedules", {"tasks": list(tasks), "limit": FIRE_LIMIT}, dict_row
    )
    rows: list[dict[str, Any]] = []
    fired: list[dict[str, Any]] = []
    for schedule, plan in plans(due):
        if plan.missed:
            _log_missed(schedule, plan)
        if schedule["overlap"] == "skip" and schedule["last_run_active"] and plan.ticks:
            log.info(
                "schedule %r of project %r: its last run has yet to finish, %d tick(s) "
                "passed over (overlap=skip)",
                schedule["name"],
                schedule["project"],
                len(plan.ticks),
                extra={"schedule": schedule["name"], "project": schedule["project"]},
            )
            plan = Plan([], plan.missed + len(plan.ticks), plan.next_tick)
        try:
            resolved = [app.resolve(_new_run(schedule, tick)) for tick in plan.ticks]
            # A schedule that names no lane takes its task's: one declared in the fast
            # lane would bypass its admission.
            if any(row["lane"] == FAST_LANE for row in resolved):
                raise ScheduleError(NO_FAST_LANE)
            rows += resolved
        except Exception as error:  # the task's key function, or a value it refused
            log.error(
                "schedule %r of project %r: its tick at %s made no run: %s",
                schedule["name"],
                schedule["project"],
                plan.ticks[-1].isoformat() if plan.ticks else "-",
                error,
                extra={"schedule": schedule["name"], "project": schedule["project"]},
            )
            fired.append(_fired(schedule, plan, None, f"{type(error).__name__}: {error}"))
            continue
        fired.append(_fired(schedule, plan, plan.ticks[-1] if plan.ticks else None, None))
    runs = (yield from app.insert_steps(rows)) if rows else []
    last_runs = {run.idempotency_key: run.id for run in runs}
    for entry in fired:
        entry["last_run_id"] = last_runs.get(entry.pop("key"))
    if fired:
        yield Statement("advance_schedules", {"fired": json.dumps(fired)})
    return len(due)


def _new_run(schedule: Mapping[str, Any], tick: datetime) -> NewRun:
    return NewRun(
        schedule["task"],
        schedule["args"],
        project=schedule["project"],
        lane=schedule["lane"],
        key=schedule["key"],
        priority=schedule["priority"],
        max_attempts=schedule["max_attempts"],
        run_at=tick,
        idempotency_key=tick_key(schedule["id"], tick),
    )


def _fired(
    schedule: Mapping[str, Any], plan: Plan, last_tick: datetime | None, error: str | None
) -> dict[str, Any]:
    return {
        "id": schedule["id"],
        "next_tick": plan.next_tick.isoformat(),
        "last_tick": last_tick.isoformat() if last_tick else None,
        "key": tick_key(schedule["id"], last_tick) if last_tick else None,
        "missed": plan.missed,
        "error": error,
    }


def _log_missed(schedule: Mapping[str, Any], plan: Plan) -> None:
    log.warning(
        "schedule %r of project %r: %d tick(s) since %s passed over (catch_up=%s), %d run",
        schedule["name"],
        schedule["project"],
        plan.missed,
        schedule["next_tick"].isoformat(),
        schedule["catch_up"],
        len(plan.ticks),
        extra={"schedule": schedule["name"], "project": schedule["project"]},
    )
