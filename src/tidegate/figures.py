"""The cluster's figures, read from PostgreSQL: what ``GET /metrics`` exposes and the
dashboard shows.

Every figure is read when it is asked for, so every API process reports the same ones
and nothing resets when a process restarts or is counted twice across processes; the
workers are seen through their rows, so they need no port of their own. Each
statement's cost is bounded whatever the number of runs, lanes or projects: counts stop
at ``COUNT_CAP`` (an estimate above it), and the series per lane and per project at
``metrics_max_lanes`` and ``metrics_max_projects``, those of finished attempts at
``MAX_ATTEMPT_SERIES`` (docs/metrics.md says how each figure is computed, what it
costs, how exact it is).

- ``read_figures``: everything one scrape of ``/metrics`` reads (api/metrics.py writes
  it out in Prometheus' format).
- ``read_live_workers``: the workers' health (``GET /readyz/workers``).
- ``read_lanes``, ``read_keys``, ``fast_lane_projects``, ``waiting_lines``,
  ``list_workers``: the parts the dashboard's pages read too (ui/pages.py), with the
  same bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from tidegate.lanes import PausedLane, paused_lanes
from tidegate.settings import Settings
from tidegate.storage.sql import Statement, Steps
from tidegate.worker.counters import Tally

COUNT_CAP = 10_000
"""How many runs of a lane in a state a scrape counts; a depth past it is estimated."""
COUNT_BUDGET = 50_000
"""How many runs a scrape counts in all; depths past it are estimated."""
KEY_SCAN = 10_000
"""Ready runs read, in claim order, to find the keys next in line (read_keys.sql)."""
WAITING_CAP = 1000
"""A key's waiting runs are counted up to this: at most ``metrics_max_keys`` keys are
counted, so the default 100 read at most 100,000 index entries for them."""
ACTIVE_STATES = ("scheduled", "available", "pending", "running")
MAX_ATTEMPT_SERIES = 1000
"""How many (task, lane, outcome) series of finished attempts a scrape reports, at most."""

ANSWER_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0
)  # fmt: skip
"""Upper bounds, in seconds, of the time-to-answer histogram's buckets; one more above.
Each API process's ledger counts its webhook answers in them (api/ledger.py), and
``ingress_counters.buckets`` holds a count per bucket in this order."""


@dataclass(frozen=True)
class LaneFigures:
    lane: str
    depth: dict[str, int]
    """Runs by state: exact below ``COUNT_CAP``, an estimate (at least the cap) above."""
    lag_seconds: float
    """How long the lane's oldest ready run has been due; 0 when none is ready."""
    paused: PausedLane | None = None
    """Since when, from where and why the lane is paused; None while it is not."""

    def to_json(self) -> dict[str, Any]:
        """The lane as the admin API and the CLI list it."""
        shown = self.paused.to_json() if self.paused else {"lane": self.lane, "paused": False}
        return {**shown, "depth": self.depth, "lag_seconds": self.lag_seconds}


@dataclass(frozen=True)
class Workloop:
    chain: str
    slots: int
    busy: int


@dataclass(frozen=True)
class ProjectFigures:
    project: str
    fast_lane_in_flight: int
    fast_lane_cap: int


@dataclass(frozen=True)
class WaitingLine:
    """The callers waiting for one limit of a project in the waiting room
    (tidegate.admission): those refused by it that hold a live place."""

    project: str
    limit: str
    """``ingest``, ``fast_lane`` or ``backlog`` (every key of the project together)."""
    callers: int
    wait_seconds: float
    """The predicted wait: seconds until the last place in the line is due."""


@dataclass(frozen=True)
class Attempts:
    """The attempts finished in one (task, lane, outcome) series, all workers together."""

    task: str
    lane: str
    outcome: str
    attempts: int
    seconds: float
    """The attempts' handler time in all."""
    buckets: list[int]
    """The attempts by handler time, per bucket of ``DURATION_BUCKETS`` and one above."""


@dataclass(frozen=True)
class Answers:
    """The webhooks answered alike, all API processes together (counted by each API
    process's ledger, api/ledger.py)."""

    project: str
    """'' when the trigger was unknown, '(other)' past the busiest projects."""
    mode: str
    outcome: str
    status: int
    requests: int


@dataclass(frozen=True)
class KeyFigures:
    """One of the busiest keys of a lane (read_keys.sql)."""

    lane: str
    key: str
    max_running: int | None
    weight: float
    rate: float | None
    rate_burst: int
    in_flight: int | None
    """None for a lane's default (key ``*``)."""
    waiting: int | None
    """Counted up to ``WAITING_CAP``; None for a lane's default."""
    held_by: str
    """``breaker``, ``order``, ``cap``, ``rate`` or ''."""
    breaker: str | None
    """The key's circuit breaker, where it has a row: ``closed``, ``open``,
    ``half_open``, ``forced_open`` or ``forced_closed``."""
    breaker_until: datetime | None
    """Until when an open breaker stays open."""
    ordered: bool
    """Whether its runs start one at a time in enqueue order (``tidegate.policies``)."""
    head: int | None
    """An ordered key's front run, which the others wait behind: its run in flight, else
    its earliest not started (None where its project is not the reader's)."""
    head_state: str | None
    """The front run's state: ``running``, ``available`` (next to start), ``scheduled``
    (backing off to retry, or delayed) or ``pending`` (no worker has its task)."""

    @property
    def blocked(self) -> bool:
        """Whether the key is ordered and runs wait behind a front run that cannot start
        now: backing off, delayed or pending (a stuck head, until it runs or is
        cancelled)."""
        return self.held_by == "order" and self.head_state in ("scheduled", "pending")


@dataclass(frozen=True)
class Figures:
    """What one scrape read from the database."""

    lanes: list[LaneFigures]
    workers_live: int
    heartbeat_age_seconds: float
    workloops: list[Workloop]
    projects: list[ProjectFigures]
    waiting: list[WaitingLine]
    attempts: list[Attempts]
    webhooks: list[Answers]
    answer_times: dict[tuple[str, ...], Tally]
    """The time to answer by (mode, outcome), every project together."""
    keys: list[KeyFigures]
    schedules: dict[str, int]
    """Schedules by state: active, paused, failing (counted up to ``COUNT_CAP``)."""
    schedule_lag_seconds: float


def read_lanes(settings: Settings) -> Steps[list[LaneFigures]]:
    """Each lane's depth by state, its lag, and its pause (the dashboard's overview, the
    admin API's and the CLI's list of lanes read them too, the super admin's)."""
    paused = yield from paused_lanes()
    rows = yield Statement(
        "read_lanes",
        {
            "max_lanes": settings.metrics_max_lanes,
            "count_cap": COUNT_CAP,
            "count_budget": COUNT_BUDGET,
        },
    )
    return [
        LaneFigures(lane, dict(zip(ACTIVE_STATES, depths, strict=True)), lag, paused.get(lane))
        for lane, *depths, lag in rows
    ]


def read_keys(project: str | None, limit: int) -> Steps[list[KeyFigures]]:
    """The busiest ``limit`` keys: policy, runs in flight and waiting, what holds them
    (read_keys.sql; ``project`` None reads every project's runs). The dashboard's keys
    page reads them too."""
    rows = yield Statement(
        "read_keys",
        {"project": project, "limit": limit, "scan_limit": KEY_SCAN, "waiting_cap": WAITING_CAP},
    )
    return [KeyFigures(*row) for row in rows]


def fast_lane_projects(max_projects: int, default_cap: int) -> Steps[list[ProjectFigures]]:
    """The fast-lane figures of at most ``max_projects`` projects, the busiest first
    (read_fast_lane_projects.sql); a project's cap is its own, or ``default_cap``."""
    rows = yield Statement(
        "read_fast_lane_projects",
        {"max_projects": max_projects, "scan_limit": COUNT_CAP, "default_cap": default_cap},
    )
    return [ProjectFigures(*row) for row in rows]


def waiting_lines(projects: list[str] | None, max_lines: int) -> Steps[list[WaitingLine]]:
    """The waiting room's lines of ``projects`` (None: every project), the longest
    ``max_lines`` first (read_waiting_lines.sql: at most ``COUNT_CAP`` places read)."""
    rows = yield Statement(
        "read_waiting_lines", {"ids": projects, "max_lines": max_lines, "scan_limit": COUNT_CAP}
    )
    return [WaitingLine(*row) for row in rows]


def list_workers(limit: int) -> Steps[list[dict[str, Any]]]:
    """Every worker row (at most ``limit``), the most recent heartbeat first: its
    workloops, tasks and heartbeat's age (list_workers.sql; the dashboard's workers)."""
    return (yield Statement("list_workers", {"limit": limit}, dict_row))


@dataclass(frozen=True)
class LiveWorkers:
    """The workers whose last heartbeat is within three intervals, and their slots: what
    ``/readyz/workers`` answers and ``/metrics`` reports."""

    workers: int
    heartbeat_age_seconds: float
    """Seconds since the least recent heartbeat of a live worker (0: none is live)."""
    workloops: list[Workloop]


def read_live_workers(settings: Settings) -> Steps[LiveWorkers]:
    """The live workers and their workloops' slots by chain (read_workers.sql: a scan of
    the few worker rows)."""
    rows = yield Statement("read_workers", {"live_seconds": 3 * settings.heartbeat_seconds})
    return LiveWorkers(
        workers=rows[0][0],
        heartbeat_age_seconds=rows[0][1],
        workloops=[Workloop(chain, slots, busy) for *_, chain, slots, busy in rows if chain],
    )


def read_figures(settings: Settings) -> Steps[Figures]:
    """Read every figure of a scrape: nine statements, each bounded (see module doc)."""
    lanes = yield from read_lanes(settings)
    workers = yield from read_live_workers(settings)
    projects = yield from fast_lane_projects(settings.metrics_max_projects, settings.fast_lane_cap)
    waiting = yield from waiting_lines(None, settings.metrics_max_projects)
    attempts = yield Statement("read_counters", {"max_series": MAX_ATTEMPT_SERIES})
    webhooks = yield Statement(
        "read_ingress_counters", {"max_projects": settings.metrics_max_projects}
    )
    keys = (
        (yield from read_keys(None, settings.metrics_max_keys)) if settings.metrics_max_keys else []
    )
    (*schedules, schedule_lag), *_ = yield Statement("read_schedules", {"count_cap": COUNT_CAP})
    return Figures(
        lanes=lanes,
        workers_live=workers.workers,
        heartbeat_age_seconds=workers.heartbeat_age_seconds,
        workloops=workers.workloops,
        projects=projects,
        waiting=waiting,
        attempts=[Attempts(*row) for row in attempts],
        webhooks=[Answers(*row[:5]) for kind, *row in webhooks if kind == "count"],
        answer_times={
            (mode, outcome): Tally(ANSWER_BUCKETS, requests, seconds, buckets)
            for kind, _, mode, outcome, _, requests, seconds, buckets in webhooks
            if kind == "time"
        },
        keys=[key for key in keys if key.key != "*"],
        schedules=dict(zip(("active", "paused", "failing"), schedules, strict=True)),
        schedule_lag_seconds=schedule_lag,
    )
