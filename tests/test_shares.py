"""Weighted shares of a workloop's slots across lanes, in a real worker process.

A ``tidegate worker --workloops "a=3,b=1,c=1/2:12"`` on a backlog in every lane: what
each lane holds in flight is read from the runs table (``running``, and its handler not
yet finished: the handler writes ``executions`` as it returns, and a run still
``running`` past that waits only for its outcome to be written, its slot already free).
No assertion reads a duration: each bound holds at every sample, and what must happen
is waited for.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from typing import Any

import psycopg

from tests.conftest import wait_until
from tidegate import NewRun, Tidegate

SHARES = "a=3,b=1,c=1/2:12"
TARGET = {"a": 6, "b": 2, "c": 4}
"""The split of 12 slots with every lane busy: ``c``'s minimum 2, then 10 by 3:1:1."""
LENT = {"a": 9, "b": 3}
"""The split while ``c`` has no runs: its share lent to ``a`` and ``b``, 3 to 1."""

SAMPLE = """
SELECT r.lane,
       count(*) FILTER (WHERE r.state = 'running' AND NOT EXISTS (
           SELECT 1 FROM executions e WHERE e.run_id = r.id AND e.attempt = r.attempt)),
       count(*) FILTER (WHERE r.state = 'available'),
       count(*) FILTER (WHERE r.state <> 'available' AND EXISTS (
           SELECT 1 FROM executions e WHERE e.run_id = r.id))
FROM runs r WHERE r.lane IN ('a', 'b', 'c') GROUP BY r.lane
"""


class Sampler:
    """Samples of each lane's runs in flight, ready and finished, one snapshot each."""

    def __init__(self, sql: psycopg.Connection) -> None:
        self.sql = sql
        self.samples: list[dict[str, tuple[int, int, int]]] = []

    def sample(self) -> dict[str, tuple[int, int, int]]:
        rows = self.sql.execute(SAMPLE).fetchall()
        taken = {lane: (int(busy), int(ready), int(done)) for lane, busy, ready, done in rows}
        self.samples.append(taken)
        return taken

    def executing(self, sample: dict[str, tuple[int, int, int]]) -> dict[str, int]:
        return {lane: counts[0] for lane, counts in sample.items() if counts[0]}

    def never_over(self, bound: dict[str, int]) -> None:
        for sample in self.samples:
            for lane, busy in self.executing(sample).items():
                assert busy <= bound.get(lane, 0), (lane, sample)


def enqueue(app: Tidegate, lane: str, count: int, seconds: float) -> None:
    app.enqueue_many(
        NewRun("async_sleep_record", {"seconds": seconds}, lane=lane) for _ in range(count)
    )


async def test_a_saturated_workloop_holds_each_lane_at_its_share_and_starves_none(
    app: Tidegate,
    sql: psycopg.Connection,
    start_worker_process: Callable[..., subprocess.Popen[bytes]],
) -> None:
    for lane in "abc":
        enqueue(app, lane, 24, 1.0)
    start_worker_process(SHARES)
    sampler = Sampler(sql)
    last: dict[str, Any] = {}

    def saturated_sample() -> bool:
        """Sample while every lane still has a backlog; True once one ran out."""
        sample = sampler.sample()
        if any(sample.get(lane, (0, 0, 0))[1] == 0 for lane in "abc"):
            sampler.samples.pop()
            return True
        last.update(sample)
        return False

    await wait_until(saturated_sample, timeout=120, interval=0.02)
    # At no moment did a lane hold more than its share (a chain `a>b>c` would give `a`
    # all 12; weights alone, without c's minimum, 7, 2 and 3), ...
    sampler.never_over(TARGET)
    # ... each reached it (c its minimum and its weight's part), ...
    for lane, share in TARGET.items():
        assert max(s.get(lane, (0, 0, 0))[0] for s in sampler.samples) == share, lane
    # ... and every lane finished runs while every lane had a backlog: none starved.
    assert all(last[lane][2] > 0 for lane in "abc"), last


async def test_an_idle_lanes_share_is_lent_and_comes_back_as_runs_finish(
    app: Tidegate,
    sql: psycopg.Connection,
    start_worker_process: Callable[..., subprocess.Popen[bytes]],
) -> None:
    enqueue(app, "a", 60, 1.0)
    enqueue(app, "b", 30, 1.0)
    start_worker_process(SHARES)
    sampler = Sampler(sql)
    # c has no runs: its share is lent, 3 to 1, so the workloop's 12 slots stay busy.
    await wait_until(
        lambda: sampler.executing(sampler.sample()) == LENT, timeout=120, interval=0.02
    )
    sampler.never_over(LENT)
    sampler.samples.clear()
    # c has runs again: the slots it lent come back as a's and b's runs finish (none is
    # stopped), and from then on each lane holds its share.
    enqueue(app, "c", 30, 1.0)
    await wait_until(
        lambda: sampler.executing(sampler.sample()) == TARGET, timeout=120, interval=0.02
    )
    sampler.never_over({**LENT, "c": TARGET["c"]})
    sampler.samples.clear()
    for _ in range(20):  # a second or so of every lane busy
        sampler.sample()
        await asyncio.sleep(0.05)
    assert all(sample["c"][1] for sample in sampler.samples)  # c still had a backlog
    sampler.never_over(TARGET)
