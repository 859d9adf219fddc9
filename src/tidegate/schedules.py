"""Schedules: runs made on a cron expression or an interval, exactly one per tick.

::

    @app.periodic("*/5 * * * *", timezone="Europe/Berlin")
    async def report() -> None: ...

    app.periodic(every=30, name="sync-eu", args={"region": "eu"})(sync_region)

or at runtime, per project: ``create_schedule`` (the admin API's
``POST /admin/projects/{project}/schedules``, ``tidegate schedules create``).

**Timing.** ``cron``: five fields (minute hour day month weekday), six with seconds
first, or ``@hourly``/``@daily``/``@weekly``/``@monthly``/``@yearly``; read in the
schedule's ``timezone`` (an IANA name, default UTC), parsed by cronsim. Across DST
changes it behaves like Debian's cron: a time the clock skips runs when the clock jumps
(02:30 on the spring-forward day runs at 03:00), a time the clock shows twice runs once
(the first time); an every-30-minutes schedule keeps its real-time pace through both.
``interval_seconds`` (``every``): real seconds from the first tick, which is one
interval after the schedule is created.

**Exactly once.** Each worker looks for due schedules of its tasks every
``schedule_seconds`` (1 s). The one that locks a schedule's row inserts the runs of its
due ticks and moves ``next_tick`` past now in one transaction: however many workers run,
start, stop or crash, a tick makes one run. The run's idempotency key,
``schedule:<id>:<tick>``, makes the run of a tick unique in the database besides.

**Catch-up.** After downtime (no worker with the task, or a paused database), the ticks
in between are due at once; the schedule's ``catch_up`` policy says what runs:

- ``once`` (the default): one run, for the newest missed tick;
- ``all``: one run per missed tick, the newest ``catch_up_limit`` (100) of them;
- ``skip``: none of the ticks more than ``LATE_SECONDS`` (a minute) late.

Ticks passed over are counted in ``missed_ticks``. A paused schedule misses nothing:
resumed, it starts again from its next tick after now.

**Overlap.** ``overlap="allow"`` (the default) makes a tick's run even while the last one
has yet to finish (a key policy's ``max_running`` can queue them); ``"skip"`` passes over
a tick while the schedule's last run is scheduled, available, pending or running.

**Runs.** A tick's run is enqueued as the worker's app would enqueue it (``NewRun``):
``lane``, ``key``, ``priority`` and ``max_attempts`` left ``None`` come from the task (its
key function on the schedule's args, else the project), so scheduled runs go through the
same lanes, key policies, fairness and breakers as any other. Its ``scheduled_at`` is the
tick. A tick whose run cannot be made (the task's key function fails) is logged, and its
error kept in ``last_error`` until a tick succeeds.
"""

from __future__ import annotations

import collections
import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, available_timezones

from cronsim import CronSim, CronSimError
from psycopg.rows import dict_row

from tidegate.errors import InputError
from tidegate.lanes import FAST_LANE
from tidegate.limits import (
    DEFAULT_MAX_JSON_DEPTH,
    SCHEDULE_BOUNDS,
    check_identifier,
    check_json,
    check_lane,
    check_numbers,
    check_text,
)
from tidegate.projects import DEFAULT_PROJECT, ConflictError, NotFoundError
from tidegate.storage.sql import Statement, Steps

CATCH_UP = ("once", "all", "skip")
OVERLAP = ("allow", "skip")
DEFAULT_CATCH_UP = "once"
DEFAULT_CATCH_UP_LIMIT = 100
LATE_SECONDS = 60.0
"""A tick later than this is missed, for the ``skip`` policy."""
COUNT_LIMIT = 100_000
"""Missed cron ticks are counted up to this many per firing (a long outage of a
per-second schedule would take a while to count)."""
MAX_LISTED = 10_000
NEVER = datetime(9999, 12, 31, tzinfo=UTC)
"""The next tick of a cron that has none left."""
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
FIELDS = (
    "task",
    "args",
    "lane",
    "key",
    "priority",
    "max_attempts",
    "cron",
    "interval_seconds",
    "timezone",
    "catch_up",
    "catch_up_limit",
    "overlap",
    "paused",
)
TIMING = ("cron", "interval_seconds", "timezone")
DEFAULTS: dict[str, Any] = {
    "args": {},
    "lane": None,
    "key": None,
    "priority": None,
    "max_attempts": None,
    "cron": None,
    "interval_seconds": None,
    "timezone": "UTC",
    "catch_up": DEFAULT_CATCH_UP,
    "catch_up_limit": DEFAULT_CATCH_UP_LIMIT,
    "overlap": "allow",
    "paused": False,
}
"""A new schedule's fields where none is given: lane, key, priority and max_attempts
``None`` are the task's."""


NO_FAST_LANE = (
    f"a schedule's runs cannot go to lane {FAST_LANE!r}: it is the sync webhooks' lane, "
    "whose runs a waiting caller was admitted for under the project's fast-lane cap, "
    "and a schedule's runs are inserted without admission; give them a lane of their own "
    "(and a workloop slots for it) to keep them apart from the backlog"
)
"""Why a schedule is refused lane ``fast_lane`` (the API, the CLI, ``@app.periodic``)."""


class ScheduleError(InputError):
    """A schedule was malformed or refused; the message names the field."""


@dataclass(frozen=True)
class Plan:
    """What one firing of a schedule does: the ticks to run (oldest first), how many due
    ticks the catch-up policy passed over, and the tick to wait for next."""

    ticks: list[datetime]
    missed: int
    next_tick: datetime


@dataclass(frozen=True)
class Timing:
    """When a schedule ticks: a cron expression in a time zone, or an interval."""

    cron: str | None = None
    interval_seconds: float | None = None
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.interval_seconds is None):
            raise ScheduleError("give either cron or interval_seconds (every), not both")
        if not isinstance(self.timezone, str) or self.timezone not in time_zones():
            raise ScheduleError(
                f"timezone must be an IANA time zone name such as 'Europe/Berlin', "
                f"got {self.timezone!r}"
            ) from None
        if self.cron is not None:
            try:
                check_text(self.cron, "cron", 255)
                CronSim(self.expression, datetime.now(UTC))
            except (InputError, CronSimError) as error:
                raise ScheduleError(
                    f"cron must be five fields (minute hour day month weekday), six with "
                    f"seconds first, or @hourly/@daily/@weekly/@monthly/@yearly; "
                    f"{self.cron!r}: {error}"
                ) from None
            if self.first_tick(datetime.now(UTC)) == NEVER:
                raise ScheduleError(f"cron {self.cron!r} never comes: no date matches it")
        else:
            _check({"interval_seconds": self.interval_seconds})

    @property
    def expression(self) -> str:
        cron = (self.cron or "").strip()
        return ALIASES.get(cron.lower(), cron)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def first_tick(self, now: datetime) -> datetime:
        """The first tick of a schedule made (or re-timed, or resumed) at ``now``."""
        if self.interval_seconds is not None:
            return now + timedelta(seconds=self.interval_seconds)
        following = next(iter(CronSim(self.expression, now.astimezone(self.zone))), None)
        return NEVER if following is None else following.astimezone(UTC)

    def plan(self, next_tick: datetime, now: datetime, catch_up: str, limit: int) -> Plan:
        """The ticks due from ``next_tick`` to ``now`` that ``catch_up`` runs, and the next."""
        take = 1 if catch_up == "once" else limit
        due, count, following = self._due(next_tick, now, take)
        if catch_up == "skip":
            due = [tick for tick in due if (now - tick).total_seconds() <= LATE_SECONDS]
        return Plan(due, count - len(due), following)

    def _due(
        self, start: datetime, now: datetime, take: int
    ) -> tuple[list[datetime], int, datetime]:
        """The newest ``take`` ticks in [start, now] (oldest first), how many there were,
        and the first tick after now."""
        if self.interval_seconds is not None:
            step = timedelta(seconds=self.interval_seconds)
            count = (now - start) // step + 1 if now >= start else 0
            newest = range(max(count - take, 0), count)
            return [start + k * step for k in newest], count, start + count * step
        ticks: list[datetime] = []
        count = 0
        oldest = None
        local = (now + timedelta(microseconds=1)).astimezone(self.zone)
        for tick in CronSim(self.expression, local, reverse=True):
            if tick < start or count >= COUNT_LIMIT:
                break
            count += 1
            oldest = tick
            if len(ticks) < take:
                ticks.append(tick.astimezone(UTC))
        first = self.first_tick(start - timedelta(microseconds=1))
        if count < COUNT_LIMIT and first <= now and oldest != first:
            # cronsim walking backwards across a change of UTC offset can leap over
            # ticks (from 2029-04-01 02:00 at Lord Howe, which turns its clocks back half
            # an hour, to 2026): forwards from ``start`` then, as far as ``now``.
            return (*self._forward(first, now, take), self.first_tick(now))
        return ticks[::-1], count, self.first_tick(now)

    def _forward(self, first: datetime, now: datetime, take: int) -> tuple[list[datetime], int]:
        """The newest ``take`` ticks from ``first`` (a tick) to ``now``, and how many."""
        newest: collections.deque[datetime] = collections.deque([first], maxlen=take)
        count = 1
        for tick in CronSim(self.expression, first.astimezone(self.zone)):
            if tick > now or count >= COUNT_LIMIT:
                break
            count += 1
            newest.append(tick.astimezone(UTC))
        return list(newest), count


@functools.cache
def time_zones() -> frozenset[str]:
    """The IANA time zone names zoneinfo knows (read once)."""
    return frozenset(available_timezones())


def _check(fields: dict[str, Any]) -> dict[str, Any]:
    try:
        return check_numbers(fields, SCHEDULE_BOUNDS)
    except InputError as error:
        raise ScheduleError(str(error)) from None


def check_schedule(
    fields: Mapping[str, Any], max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
) -> dict[str, Any]:
    """Return a schedule's fields checked against their bounds (``FIELDS``, all given),
    with its ``Timing`` under ``timing``; raise ``ScheduleError`` naming a bad one."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ScheduleError(f"unknown schedule field(s) {sorted(unknown)}; known: {list(FIELDS)}")
    checked = {**fields, **_check({name: fields[name] for name in SCHEDULE_BOUNDS})}
    try:
        check_text(checked["task"], "task")
        if not isinstance(checked["args"], dict):
            raise ScheduleError(f"args must be a JSON object, got {checked['args']!r}")
        check_json(checked["args"], "args", max_json_depth)
        if checked["lane"] is not None:
            check_lane(checked["lane"])
        if checked["lane"] == FAST_LANE:
            raise ScheduleError(NO_FAST_LANE)
        if checked["key"] is not None:
            check_text(checked["key"], "key")
    except InputError as error:
        raise ScheduleError(str(error)) from None
    if checked["catch_up_limit"] is None:
        raise ScheduleError(f"catch_up_limit must be {SCHEDULE_BOUNDS['catch_up_limit']}, got None")
    if checked["catch_up"] not in CATCH_UP:
        raise ScheduleError(
            f"catch_up must be one of {list(CATCH_UP)}, got {checked['catch_up']!r}"
        )
    if checked["overlap"] not in OVERLAP:
        raise ScheduleError(f"overlap must be one of {list(OVERLAP)}, got {checked['overlap']!r}")
    if not isinstance(checked["paused"], bool):
        raise ScheduleError(f"paused must be true or false, got {checked['paused']!r}")
    checked["timing"] = Timing(checked["cron"], checked["interval_seconds"], checked["timezone"])
    return checked


def check_name(project: str, name: str) -> None:
    try:
        check_identifier(project, "project id")
        check_text(name, "schedule name")
    except InputError as error:
        raise ScheduleError(str(error)) from None


def _params(
    project: str, name: str, checked: Mapping[str, Any], next_tick: datetime
) -> dict[str, Any]:
    params = {field: checked[field] for field in FIELDS}
    return {
        **params,
        "project": project,
        "name": name,
        "args": json.dumps(checked["args"]),
        "next_tick": next_tick,
    }


def new_schedule(
    project: str, name: str, task: str, max_json_depth: int = DEFAULT_MAX_JSON_DEPTH, **options: Any
) -> dict[str, Any]:
    """Check a new schedule: its name, and its fields (``FIELDS``; those left out take
    ``DEFAULTS``); return them checked (``check_schedule``)."""
    check_name(project, name)
    fields = {**DEFAULTS, **{k: v for k, v in options.items() if v is not None}, "task": task}
    return check_schedule(fields, max_json_depth)


def create_schedule(
    project: str,
    name: str,
    task: str,
    *,
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
    **options: Any,
) -> Steps[dict[str, Any]]:
    """Create schedule ``name`` of ``project`` running ``task``, with ``cron`` or
    ``interval_seconds`` and the other ``FIELDS`` as options; its first tick is the
    first after now. Return it as ``get_schedule`` does.

    ``NotFoundError`` when the project does not exist (``default``, the library's own,
    always does): a schedule of no project would make runs nobody can see or limit.
    """
    checked = new_schedule(project, name, task, max_json_depth, **options)
    first = checked["timing"].first_tick(datetime.now(UTC))
    params = {**_params(project, name, checked, first), "default_project": DEFAULT_PROJECT}
    if not (yield Statement("insert_schedule", params)):
        raise NotFoundError(f"no project {project!r}: create it first")
    return (yield from get_schedule(project, name))


def get_schedule(project: str, name: str) -> Steps[dict[str, Any]]:
    """One schedule, with its last run's state; ``NotFoundError`` if there is none."""
    found = yield from list_schedules(project, name)
    if not found:
        raise NotFoundError(f"no schedule {name!r} in project {project!r}")
    return found[0]


def list_schedules(
    project: str | None = None,
    name: str | None = None,
    limit: int = MAX_LISTED,
    *,
    after: tuple[str, str] | None = None,
) -> Steps[list[dict[str, Any]]]:
    """Schedules (of a project, or of all) in project and name order, after the schedule
    ``after`` (its project and name), each with its next tick, its last tick and run
    (``last_run_id``, ``last_run_state``; the state is ``None`` once the run is pruned),
    ``missed_ticks`` and ``last_error``."""
    after_project, after_name = after or (None, None)
    params = {
        "project": project,
        "name": name,
        "limit": limit,
        "after_project": after_project,
        "after_name": after_name,
    }
    rows = yield Statement("list_schedules", params, dict_row)
    return [dict(row) for row in rows]


def update_schedule(
    project: str, name: str, max_json_depth: int = DEFAULT_MAX_JSON_DEPTH, **changes: Any
) -> Steps[dict[str, Any]]:
    """Change fields of a schedule (``FIELDS``); ``paused`` pauses or resumes it.

    Giving ``cron`` drops ``interval_seconds`` and the other way round. A change of
    timing, or a resume, starts again from the first tick after now: the ticks of a
    pause are not missed ones. A schedule declared in code can only be paused and
    resumed here; its code says the rest.
    """
    check_name(project, name)
    current = yield from get_schedule(project, name)
    if current["declared"] and set(changes) - {"paused"}:
        raise ConflictError(
            f"schedule {name!r} is declared in code (@app.periodic): change it there; "
            f"here it can only be paused and resumed"
        )
    if changes.get("cron") is not None:
        changes.setdefault("interval_seconds", None)
    if changes.get("interval_seconds") is not None:
        changes.setdefault("cron", None)
    merged = {field: current[field] for field in FIELDS} | changes
    checked = check_schedule(merged, max_json_depth)
    next_tick = current["next_tick"]
    retimed = any(checked[field] != current[field] for field in TIMING)
    if retimed or (current["paused"] and not checked["paused"]):
        next_tick = checked["timing"].first_tick(datetime.now(UTC))
    rows = yield Statement("update_schedule", _params(project, name, checked, next_tick))
    if not rows:
        raise NotFoundError(f"no schedule {name!r} in project {project!r}")
    return (yield from get_schedule(project, name))


def delete_schedule(project: str, name: str) -> Steps[bool]:
    """Delete a schedule (its runs stay); tell whether there was one. A schedule declared
    in code comes back when a worker with its task starts."""
    check_name(project, name)
    rows = yield Statement("delete_schedule", {"project": project, "name": name})
    return bool(rows)


@dataclass(frozen=True)
class Declared:
    """A schedule declared in code (``Tidegate.periodic``)."""

    project: str
    name: str
    fields: dict[str, Any]
    """Checked (``check_schedule``), with its ``timing``."""


def sync_declared(
    declared: Sequence[Declared], tasks: Sequence[str]
) -> Steps[list[tuple[str, str, str]]]:
    """Write the schedules an app declares, delete the declared schedules of ``tasks``
    that it no longer declares; return ``(change, project, name)`` for each."""
    now = datetime.now(UTC)
    rows = [
        {
            **_params(d.project, d.name, d.fields, d.fields["timing"].first_tick(now)),
            "args": d.fields["args"],
            "next_tick": d.fields["timing"].first_tick(now).isoformat(),
        }
        for d in declared
    ]
    params = {"schedules": json.dumps(rows), "tasks": list(tasks)}
    return (yield Statement("sync_declared_schedules", params))


def tick_key(schedule_id: int, tick: datetime) -> str:
    """The idempotency key of the run of one tick of a schedule."""
    return f"schedule:{schedule_id}:{tick.astimezone(UTC).isoformat()}"


def plans(due: Sequence[Mapping[str, Any]]) -> Iterator[tuple[Mapping[str, Any], Plan]]:
    """Each locked due schedule (``lock_due_schedules``) with what firing it does now."""
    for schedule in due:
        timing = Timing(schedule["cron"], schedule["interval_seconds"], schedule["timezone"])
        yield (
            schedule,
            timing.plan(
                schedule["next_tick"],
                schedule["now"],
                schedule["catch_up"],
                schedule["catch_up_limit"],
            ),
        )
