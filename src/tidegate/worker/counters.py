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
cancelled) or because the database refused it.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field

from tidegate.runs import Run, RunState
from tidegate.worker.execute import Outcome

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds, in seconds, of the handler-time histogram's buckets; one more bucket
holds the longer attempts. ``worker_counters.buckets`` holds a count per bucket in this
order: other bounds need a migration of its rows."""

Series = tuple[str, str, str]
"""(task, lane, outcome)"""


@dataclass
class Tally:
    """The attempts of one series, and their handler times."""

    attempts: int = 0
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))

    def add(self, other: Tally) -> None:
        self.attempts += other.attempts
        self.seconds += other.seconds
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]


def outcome_label(outcome: Outcome, recorded: bool) -> str:
    """Name what an attempt came to, as the ``outcome`` label says it."""
    if not recorded:
        return "late"
    if outcome.state is RunState.SCHEDULED:
        return "failed" if outcome.message is not None else "retry_requested"
    return outcome.state.value


class Counters:
    """The attempts this worker finished and has not written yet."""

    def __init__(self) -> None:
        self.unwritten: dict[Series, Tally] = {}

    def count(self, run: Run, outcome: Outcome, recorded: bool, seconds: float) -> None:
        """Count one finished attempt whose handler ran for ``seconds``."""
        series = (run.task, run.lane, outcome_label(outcome, recorded))
        tally = self.unwritten.setdefault(series, Tally())
        tally.attempts += 1
        tally.seconds += seconds
        tally.buckets[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1

    def take(self) -> dict[Series, Tally]:
        """Return the counts not written yet; ``restore`` them if writing them fails."""
        taken, self.unwritten = self.unwritten, {}
        return taken

    def restore(self, taken: dict[Series, Tally]) -> None:
        """Put back counts that ``take`` returned and that were not written."""
        for series, tally in taken.items():
            self.unwritten.setdefault(series, Tally()).add(tally)


def as_json(taken: dict[Series, Tally]) -> str:
    """Return counts as the JSON rows ``beat_worker`` adds."""
    return json.dumps(
        [
            {
                "task": task,
                "lane": lane,
                "outcome": outcome,
                "attempts": tally.attempts,
                "seconds": tally.seconds,
                "buckets": tally.buckets,
            }
            for (task, lane, outcome), tally in taken.items()
        ]
    )
