"""Count the attempts a worker finishes, for ``GET /metrics``, with no write of their own.

A worker counts each attempt it finishes in memory, by (task, lane, outcome), with the
handler's time in a histogram. Its heartbeat adds what it counted since the last one to
its rows of ``worker_counters`` (``beat_worker``). The rows of a worker that is gone are
folded into those of ``retired`` (``fold_counters``): at a clean stop by the worker
itself, after a last beat and the removal of its row; when it died, by the others. The
scrape sums the rows. A worker that dies loses what it counted since its last heartbeat.

Outcomes: ``succeeded``; ``failed``, a failed attempt that will be retried;
``retry_requested``, a handler that raised ``Retry``; ``discarded``, a failed last
attempt; ``cancelled``, a handler that raised ``Cancel``; ``late``, an outcome that was
not recorded because the run had left the worker meanwhile (its lease lapsed, it was
cancelled) or because the database refused it; ``rescued``, an attempt whose lease
lapsed, counted by the worker whose rescuer took the run back. One more series shares
the table: ``claimed`` counts the runs a worker claimed, their time being how long each
waited from due (``scheduled_at``) to claimed (``attempted_at``), both the database's
clock.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tidegate.runs import Run, RunState
from tidegate.worker.execute import Outcome

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds, in seconds, of the handler-time histogram's buckets; one more bucket
holds the longer attempts. ``worker_counters.buckets`` holds a count per bucket in this
order: other bounds need a migration of its rows. Waits from due to claimed use them too."""
MAX_BEAT_ATTEMPTS = 1_000_000
"""The most attempts of one series a remote worker's heartbeat may add (the API refuses
more, 422): a remote drain finishes under 6,000 runs a second through one API process
(docs/benchmarks.md), about 12,000 between two default heartbeats."""
CLAIMED = "claimed"
"""The series of claims: their count, and how long each run waited from due to claimed."""
Series = tuple[str, str, str]
"""(task, lane, outcome)"""

K = TypeVar("K", bound=tuple[str | int, ...])


@dataclass
class Tally:
    """How many, their time in all, and how many per bucket of ``bounds`` and one above."""

    bounds: tuple[float, ...] = DURATION_BUCKETS
    count: int = 0
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.buckets:
            self.buckets = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.seconds += seconds
        self.buckets[bisect.bisect_left(self.bounds, seconds)] += 1

    def add(self, other: Tally) -> None:
        self.count += other.count
        self.seconds += other.seconds
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]


class Tallies(Generic[K]):
    """Tallies by series that have not been written yet: ``take`` them to write them,
    ``restore`` them if the write failed, so that nothing is lost or counted twice."""

    def __init__(self, bounds: tuple[float, ...] = DURATION_BUCKETS) -> None:
        self.bounds = bounds
        self.unwritten: dict[K, Tally] = {}

    def tally(self, series: K) -> Tally:
        tally = self.unwritten.get(series)
        if tally is None:
            tally = self.unwritten[series] = Tally(self.bounds)
        return tally

    def take(self) -> dict[K, Tally]:
        taken, self.unwritten = self.unwritten, {}
        return taken

    def restore(self, taken: dict[K, Tally]) -> None:
        for series, tally in taken.items():
            self.tally(series).add(tally)


def outcome_label(outcome: Outcome, recorded: bool) -> str:
    """Name what an attempt came to, as the ``outcome`` label says it."""
    if not recorded:
        return "late"
    if outcome.state is RunState.SCHEDULED:
        return "failed" if outcome.message is not None else "retry_requested"
    return outcome.state.value


class Counters(Tallies[Series]):
    """What this worker counted and has not written yet."""

    def count(self, run: Run, outcome: Outcome, recorded: bool, seconds: float) -> None:
        """Count one finished attempt whose handler ran for ``seconds``."""
        self.tally((run.task, run.lane, outcome_label(outcome, recorded))).observe(seconds)

    def stopped(self, run: Run, seconds: float) -> None:
        """Count an attempt whose handler was stopped when its run left the worker: as a
        late outcome, which it would have been."""
        self.tally((run.task, run.lane, "late")).observe(seconds)

    def claimed(self, runs: Iterable[Run]) -> None:
        """Count claimed runs with how long each waited from due to claimed."""
        for run in runs:
            if run.attempted_at is not None:
                wait = (run.attempted_at - run.scheduled_at).total_seconds()
                self.tally((run.task, run.lane, CLAIMED)).observe(max(wait, 0.0))


def as_json(taken: dict[Series, Tally]) -> str:
    """Return counts as the JSON rows ``beat_worker`` adds."""
    return json.dumps(
        [
            {
                "task": task,
                "lane": lane,
                "outcome": outcome,
                "attempts": tally.count,
                "seconds": tally.seconds,
                "buckets": tally.buckets,
            }
            for (task, lane, outcome), tally in taken.items()
        ]
    )
