"""Per-key limits and fairness in real claims: caps, weights, cold keys, rates, aging.

Each test runs real workers (``worker_of`` in this process, or ``spawn_worker``
processes where claimers must compete) against a real PostgreSQL, twice: local workers,
then remote ones (through an API server: ``worker_mode``). It reads what happened from
the database: ``runs`` (claim time, key, rank) and ``executions`` (when each handler
really ran). Claim order is ``(attempted_at, rank, id)``: one claim shares
its transaction's ``attempted_at`` and picks in ``(rank, id)`` order.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.conftest import Remote, WorkerOf, spawn_worker, stop_worker, wait_until
from tidegate import NewRun, RunState, Settings, Tidegate
from tidegate.projects import create_project


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes a test starts; any still alive when it ends are killed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def scalar(sql: psycopg.Connection, query: str, params: Any = None) -> Any:
    row = sql.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def count(sql: psycopg.Connection, where: str, params: Any = None) -> int:
    return int(scalar(sql, f"SELECT count(*) FROM runs WHERE {where}", params))


def workers(sql: psycopg.Connection) -> int:
    return int(scalar(sql, "SELECT count(*) FROM workers"))


def running_per_key(sql: psycopg.Connection, where: str = "true") -> dict[str, int]:
    """Return how many runs of each key are running now (the ground truth of the cap)."""
    rows = sql.execute(
        f"SELECT key, count(*) FROM runs WHERE state = 'running' AND {where} GROUP BY key"
    ).fetchall()
    return dict(rows)


def claimed_keys(sql: psycopg.Connection, where: str = "true", params: Any = None) -> list[str]:
    """Return the key of every claimed run, in claim order."""
    rows = sql.execute(
        f"SELECT key FROM runs WHERE attempted_at IS NOT NULL AND {where}"
        " ORDER BY attempted_at, rank, id",
        params,
    ).fetchall()
    return [row[0] for row in rows]


def max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """Return how many of the intervals were open at once, at most."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def executions_by_key(sql: psycopg.Connection) -> dict[str, list[tuple[datetime, datetime]]]:
    """Return each key's handler executions (a sub-interval of its time 'running')."""
    rows = sql.execute(
        "SELECT runs.key, executions.started_at, executions.finished_at"
        " FROM executions JOIN runs ON runs.id = executions.run_id"
    ).fetchall()
    by_key: dict[str, list[tuple[datetime, datetime]]] = {}
    for key, started, finished in rows:
        by_key.setdefault(key, []).append((started, finished))
    return by_key


def longest_streak(keys: list[str], key: str) -> int:
    longest = current = 0
    for k in keys:
        current = current + 1 if k == key else 0
        longest = max(longest, current)
    return longest


# -- max_running -------------------------------------------------------------------


async def test_no_key_ever_has_more_runs_in_flight_than_its_max_running_across_workers(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    processes: list[subprocess.Popen[bytes]],
    worker_mode: Remote | None,
) -> None:
    app.set_key_policy("default", "*", max_running=2)
    processes += [spawn_worker(settings, "manual>*:6", remote=worker_mode) for _ in range(4)]
    await wait_until(lambda: workers(sql) == 4, 20)
    # 30 keys: five with a long backlog, so that once the others are done the cap is
    # what holds them back (24 free slots, 10 places), not the slots.
    heavy = [f"k{i:02}" for i in range(5)]
    light = [f"k{i:02}" for i in range(5, 30)]
    runs = [NewRun("sleep", {"seconds": 0.2}, key=key) for key in heavy for _ in range(20)]
    runs += [NewRun("sleep", {"seconds": 0.2}, key=key) for key in light for _ in range(4)]
    app.enqueue_many(runs)
    seen: list[int] = []

    def sample() -> bool:
        seen.append(max(running_per_key(sql).values(), default=0))
        return count(sql, "state = 'succeeded'") == len(runs)

    await wait_until(sample, 25, interval=0.01)

    assert count(sql, "state = 'succeeded' AND attempt = 1 AND errors = '[]'") == len(runs)
    assert max(seen) <= 2
    overlaps = {key: max_overlap(times) for key, times in executions_by_key(sql).items()}
    assert len(overlaps) == 30
    assert max(overlaps.values()) == 2, overlaps  # the cap was reached, and held
    assert scalar(sql, "SELECT count(DISTINCT pid) FROM executions") > 1
    assert [stop_worker(process) for process in processes] == [0, 0, 0, 0]


async def test_raising_max_running_takes_effect_at_the_next_claim(
    app: Tidegate, sql: psycopg.Connection, worker_of: WorkerOf
) -> None:
    app.set_key_policy("default", "k", max_running=1)
    app.enqueue_many([NewRun("async_sleep", {"seconds": 30}, key="k") for _ in range(6)])
    async with worker_of(app, "manual>*:4", shutdown_grace_seconds=0.5) as worker:
        (loop,) = worker.workloops
        # A remote claim is running in the database before its answer reaches the
        # worker: wait for both.
        await wait_until(lambda: count(sql, "state = 'running'") == 1 and loop.free < 4, 10)
        assert loop.free == 3  # slots to spare: the policy, not the worker, holds k at 1

        app.set_key_policy("default", "k", max_running=3)
        await wait_until(lambda: count(sql, "key = 'k' AND state = 'running'") == 3, 10)
        # A claim after that (the run of another key takes the last slot) still leaves k
        # at its new limit.
        other = app.enqueue("async_sleep", {"seconds": 30}, key="other")
        await wait_until(lambda: count(sql, "id = %s AND state = 'running'", [other.id]) == 1, 10)
        assert count(sql, "key = 'k' AND state = 'running'") == 3
        assert count(sql, "key = 'k' AND state = 'available'") == 3

    assert count(sql, "state = 'running'") == 0  # handed back at shutdown


async def test_killed_worker_gives_back_exactly_its_places_of_a_capped_key(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    processes: list[subprocess.Popen[bytes]],
    worker_mode: Remote | None,
) -> None:
    app.set_key_policy("default", "c", max_running=2)
    first = spawn_worker(settings, "manual>*:4", remote=worker_mode)
    processes.append(first)
    await wait_until(lambda: workers(sql) == 1, 20)
    runs = app.enqueue_many([NewRun("sleep", {"seconds": 1.5}, key="c") for _ in range(6)])
    await wait_until(lambda: count(sql, "state = 'running'") == 2, 20)
    first.kill()
    first.wait(10)
    # Dead now: what it held stays 'running' under its id until the lease runs out.
    held = {row[0] for row in sql.execute("SELECT id FROM runs WHERE state = 'running'")}
    assert len(held) == 2
    second = spawn_worker(settings, "manual>*:4", remote=worker_mode)
    processes.append(second)
    in_flight: list[int] = []

    def sample() -> bool:
        in_flight.append(count(sql, "key = 'c' AND state = 'running'"))
        return count(sql, "state = 'succeeded'") == len(runs)

    await wait_until(sample, 25, interval=0.01)

    assert min(in_flight) >= 0 and max(in_flight) <= 2
    rescued_at = []
    for run in [app.get_run(run.id) for run in runs]:
        assert run is not None and run.state is RunState.SUCCEEDED
        if run.id in held:
            assert run.attempt == 2, run
            assert "lease expired" in run.errors[0]["error"]
            rescued_at.append(datetime.fromisoformat(run.errors[0]["at"]))
        else:
            assert (run.attempt, run.errors) == (1, [])
    # The dead worker's runs held both places until the rescuer freed them: the second
    # worker claimed nothing of c before that, and then ran two at a time again.
    assert scalar(sql, "SELECT min(attempted_at) FROM runs") >= min(rescued_at)
    assert scalar(sql, "SELECT count(DISTINCT pid) FROM executions") == 1
    assert max_overlap(executions_by_key(sql)["c"]) == 2
    assert stop_worker(second) == 0


async def test_capped_keys_backlog_does_not_hold_back_other_keys(
    app: Tidegate, sql: psycopg.Connection, worker_of: WorkerOf
) -> None:
    app.set_key_policy("default", "slow", max_running=1)
    app.enqueue_many([NewRun("async_sleep", {"seconds": 5}, key="slow") for _ in range(1_000)])
    app.enqueue_many([NewRun("noop", key="fast") for _ in range(200)])

    def fast_done() -> int:
        return count(sql, "key = 'fast' AND state = 'succeeded'")

    async with worker_of(app, "manual>*:4", shutdown_grace_seconds=0.5):
        # slow runs one 5 s run at a time; its third attempt starts 10 s in. fast's 200
        # no-ops, each behind gated slow runs on the clock, take a second or two (each
        # claim passes over slow's gated head; a remote worker's claims of one or two
        # runs at a time did 50-80 runs/s on a slow day); held back by slow's backlog
        # they would take 1,000 x 5 s.
        await wait_until(
            lambda: fast_done() == 200 or count(sql, "key = 'slow' AND attempt > 0") >= 3,
            25,
            interval=0.1,
        )
        assert fast_done() == 200


# -- project concurrency -----------------------------------------------------------


async def test_project_concurrency_bounds_its_runs_across_every_lane_but_fast_lane(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    processes: list[subprocess.Popen[bytes]],
    worker_mode: Remote | None,
) -> None:
    app.execute(create_project("p", concurrency=2))
    processes += [spawn_worker(settings, "manual>*:6", remote=worker_mode) for _ in range(2)]
    await wait_until(lambda: workers(sql) == 2, 20)
    runs = [
        NewRun("sleep", {"seconds": 0.2}, project="p", lane=lane)
        for lane in ("default", "manual")
        for _ in range(10)
    ]
    runs += [NewRun("sleep", {"seconds": 0.2}, project="q") for _ in range(20)]
    app.enqueue_many(runs)
    seen: list[int] = []

    def sample() -> bool:
        seen.append(count(sql, "project = 'p' AND state = 'running'"))
        return count(sql, "state = 'succeeded'") == len(runs)

    await wait_until(sample, 25, interval=0.01)

    assert max(seen) <= 2
    overlaps = {key: max_overlap(times) for key, times in executions_by_key(sql).items()}
    assert overlaps["p"] == 2  # both lanes share the project's two places
    assert overlaps["q"] > 2  # another project is not held back by p's limit
    assert count(sql, "project = 'p' AND lane = 'manual' AND state = 'succeeded'") == 10
    assert [stop_worker(process) for process in processes] == [0, 0]


async def test_fast_lane_runs_are_exempt_from_project_concurrency_and_key_limits(
    app: Tidegate, sql: psycopg.Connection, worker_of: WorkerOf
) -> None:
    app.execute(create_project("p", concurrency=1))
    app.set_key_policy("default", "p", max_running=1)
    async with worker_of(app, "fast_lane:2 manual>*:2", shutdown_grace_seconds=0.5):
        occupying = app.enqueue("async_sleep", {"seconds": 30}, project="p")
        waiting = app.enqueue("noop", project="p")
        await wait_until(lambda: count(sql, "id = %s AND state = 'running'", [occupying.id]) == 1)

        fast = app.enqueue_many(
            [NewRun("sleep", {"seconds": 0.5}, project="p", lane="fast_lane") for _ in range(2)]
        )
        ids = [run.id for run in fast]
        await wait_until(lambda: count(sql, "id = ANY(%s) AND state = 'succeeded'", [ids]) == 2)

        # Both ran at once, while the project was at its limit of one: the other
        # default run, with a free slot in manual>*, still waits.
        assert max_overlap(executions_by_key(sql)["p"]) == 2
        assert count(sql, "id = %s AND state = 'running'", [occupying.id]) == 1
        assert count(sql, "id = %s AND state = 'available' AND attempt = 0", [waiting.id]) == 1


# -- fairness ----------------------------------------------------------------------


@pytest.mark.parametrize("hot_batches", [1, 8])
async def test_cold_keys_are_served_before_a_hot_keys_backlog(
    app: Tidegate, sql: psycopg.Connection, hot_batches: int, worker_of: WorkerOf
) -> None:
    hot = 20_000
    for _ in range(hot_batches):
        app.enqueue_many([NewRun("noop", key="hot") for _ in range(hot // hot_batches)])
    cold = [f"cold{i:02}" for i in range(50)]
    for key in cold:
        app.enqueue_many([NewRun("noop", key=key) for _ in range(20)])

    async with worker_of(app, "manual>*:4"):
        await wait_until(
            lambda: count(sql, "key <> 'hot' AND state = 'succeeded'") == 1_000, 25, interval=0.1
        )

    order = claimed_keys(sql)
    first = {key: order.index(key) for key in cold}
    last = max(i for i, key in enumerate(order) if key != "hot")
    # Every cold key's first run is in the first round (hot's first run, then one of
    # each key); all 1,000 cold runs are done after ~21 of hot's, not after 20,000.
    assert max(first.values()) < 50 * 2 + 20, sorted(first.values())
    assert last < 1_000 + 100, last


async def test_cold_key_is_next_in_line_when_every_run_has_the_same_priority(
    app: Tidegate, sql: psycopg.Connection, worker_of: WorkerOf
) -> None:
    app.enqueue_many([NewRun("noop", key="hot", priority=5) for _ in range(2_000)])
    app.enqueue_many([NewRun("noop", key="cold", priority=5) for _ in range(3)])

    async with worker_of(app, "manual>*:4"):
        await wait_until(lambda: count(sql, "key = 'cold' AND state = 'succeeded'") == 3, 20)

    order = claimed_keys(sql)
    assert order.index("cold") < 10, order.index("cold")


async def test_claims_are_shared_by_weight(
    app: Tidegate, sql: psycopg.Connection, worker_of: WorkerOf
) -> None:
    weights = {"w1": 1, "w2": 2, "w4": 4}
    for key, weight in weights.items():
        app.set_key_policy("default", key, weight=weight)
    for key in weights:
        app.enqueue_many([NewRun("noop", key=key) for _ in range(3_000)])

    async with worker_of(app, "manual>*:4"):
        # A bound for a stuck worker only: the shares are counted, however slow the drain.
        await wait_until(lambda: count(sql, "state = 'succeeded'") >= 3_000, 180, interval=0.1)

    shares = Counter(claimed_keys(sql)[:3_000])
    total = sum(weights.values())
    ratios = {key: shares[key] / (3_000 * weight / total) for key, weight in weights.items()}
    assert all(0.9 <= ratio <= 1.1 for ratio in ratios.values()), (shares, ratios)


async def test_key_that_was_idle_comes_back_without_banked_credit(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    processes: list[subprocess.Popen[bytes]],
    worker_mode: Remote | None,
) -> None:
    app.enqueue_many([NewRun("noop", key="b") for _ in range(5)])
    app.enqueue_many([NewRun("noop", key="a") for _ in range(6_000)])
    worker = spawn_worker(settings, "manual>*:4", remote=worker_mode)
    processes.append(worker)
    # b is served and goes idle; a runs alone for a while.
    await wait_until(lambda: count(sql, "key = 'b' AND state = 'succeeded'") == 5, 20)
    await wait_until(lambda: count(sql, "key = 'a' AND state = 'succeeded'") >= 1_000, 20)
    served = scalar(sql, "SELECT max(rank) FROM runs WHERE key = 'a' AND attempted_at IS NOT NULL")
    burst = app.enqueue_many([NewRun("noop", key="b") for _ in range(500)])
    await wait_until(lambda: count(sql, "key = 'b' AND state = 'succeeded'") == 505, 20)
    assert count(sql, "key = 'a' AND state = 'available'") > 0  # a still had a backlog
    assert stop_worker(worker) == 0

    # b re-enters where the clock stands (a's runs served so far), not where it left off.
    assert burst[0].vtime >= served, (burst[0].vtime, served)
    ids = [run.id for run in burst]
    came_back = scalar(sql, "SELECT min(attempted_at) FROM runs WHERE id = ANY(%s)", [ids])
    after = claimed_keys(sql, "attempted_at >= %s", [came_back])
    burst_claims = after[after.index("b") : len(after) - after[::-1].index("b")]
    assert burst_claims.count("b") == 500
    # One head start: the claims of a that committed while the burst was being inserted
    # (after its statement read the clock), give or take one claim of four.
    head = longest_streak(burst_claims[: burst_claims.index("a")], "b")
    raced = count(
        sql,
        "key = 'a' AND attempted_at >= %s AND attempted_at < %s",
        [burst[0].inserted_at, came_back],
    )
    assert head <= raced + 8 and head < 250, (head, raced)
    # Then the burst interleaves with a's backlog: equal weights, they alternate. It
    # does not take the next 500 claims in a row.
    rest = burst_claims[head:]
    assert 0.9 <= rest.count("a") / rest.count("b") <= 1.1, Counter(rest)
    assert longest_streak(rest, "b") <= 4, rest


# -- rate --------------------------------------------------------------------------


async def test_key_rate_limits_starts_per_second_with_its_burst(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    processes: list[subprocess.Popen[bytes]],
    worker_mode: Remote | None,
) -> None:
    rate, burst = 5, 2
    app.set_key_policy("default", "r", rate=rate, rate_burst=burst)
    processes += [spawn_worker(settings, "manual>*:4", remote=worker_mode) for _ in range(2)]
    await wait_until(lambda: workers(sql) == 2, 20)
    app.enqueue_many([NewRun("record", key="r") for _ in range(30)])
    await wait_until(lambda: count(sql, "state = 'succeeded'") == 30, 25, interval=0.1)

    # attempted_at is the claim's now(), the very clock the rate (GCRA) is kept on.
    starts = [row[0] for row in sql.execute("SELECT attempted_at FROM runs ORDER BY 1")]
    window = timedelta(seconds=1)
    most = max(sum(1 for s in starts if t <= s < t + window) for t in starts)
    assert most <= rate * 1 + burst, most
    # And over the whole: the first `burst` start at once, then one per 1/rate seconds.
    span = (starts[-1] - starts[0]).total_seconds()
    assert span >= (len(starts) - burst) / rate - 0.001, span
    assert [stop_worker(process) for process in processes] == [0, 0]


# -- priority ----------------------------------------------------------------------


async def test_low_priority_run_is_not_starved_by_a_stream_of_higher_priority_runs(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    processes: list[subprocess.Popen[bytes]],
    worker_mode: Remote | None,
) -> None:
    keys = [f"s{i}" for i in range(4)]

    def stream(per_key: int) -> None:
        app.enqueue_many([NewRun("noop", key=key, priority=0) for key in keys] * per_key)

    stream(100)
    last = app.enqueue("noop", key="k", priority=9)
    processes.append(spawn_worker(settings, "manual>*:4", remote=worker_mode))
    # The stream never lets the worker catch up: whenever its backlog falls under 2,000
    # runs, 400 more come, so a claim by priority alone would never reach the run. Paced
    # by the drain, not by the clock: a slow machine streams as long, not less.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 180  # a stuck worker's bound, not the property's
    while count(sql, "id = %s AND state = 'succeeded'", [last.id]) == 0:
        assert loop.time() < deadline, "the priority-9 run did not run while the stream went on"
        if count(sql, "priority = 0 AND state = 'available'") < 2_000:
            stream(100)
        await asyncio.sleep(0.05)
    stream(50)  # the stream has not ended

    ran = app.get_run(last.id)
    assert ran is not None and ran.attempted_at is not None
    waiting = count(
        sql,
        "priority = 0 AND inserted_at < %(at)s AND (attempted_at IS NULL OR attempted_at > %(at)s)",
        {"at": ran.attempted_at},
    )
    assert waiting >= 500, waiting  # it did not wait for the stream to drain
    # Priority 9 is 9 * 64 turns of the clock behind priority 0: here a turn is one run
    # of each streaming key, so it waited for about 4 * 577 claims, however long the
    # stream.
    claimed_before = count(sql, "attempted_at < %s", [ran.attempted_at])
    assert claimed_before <= (9 * 64 + 2) * len(keys) + 8, claimed_before
    assert count(sql, "priority = 0 AND state = 'available'") > 0
    assert stop_worker(processes[0]) == 0
