"""The worker in this process: outcomes, retries, lanes, slot isolation, pruning.

Every test runs a real worker against a real PostgreSQL and waits on conditions in the
database, never on sleeps; each runs twice, with a local worker and with a remote one
(``tidegate worker --server-url``: through a real API server, no database of its own).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tidegate
from tests.conftest import ROOT, Remote, WorkerOf, running_worker, wait_until
from tidegate import NewRun, RunState, Tidegate, current_run
from tidegate.worker import workloop
from tidegate.worker.workloop import Pace

TIDEGATE = str(Path(tidegate.__file__).parent)


@pytest.fixture
def identity_tasks(app: Tidegate) -> None:
    """Tasks that report which run they saw and where they ran."""

    @app.task(name="whoami_async")
    async def whoami_async(**args: Any) -> dict[str, Any]:
        run = current_run()
        return {"id": run.id, "attempt": run.attempt, "args": args, "thread": _thread()}

    @app.task(name="whoami_sync")
    def whoami_sync(**args: Any) -> dict[str, Any]:
        run = current_run()
        return {"id": run.id, "attempt": run.attempt, "args": args, "thread": _thread()}


def _thread() -> str:
    return threading.current_thread().name


def state_of(app: Tidegate, run_id: int) -> RunState | None:
    run = app.get_run(run_id)
    return run.state if run else None


def finished(app: Tidegate, ids: list[int]) -> bool:
    return all((state := state_of(app, run_id)) is not None and state.finished for run_id in ids)


def count(sql: psycopg.Connection, where: str, params: list[Any] | None = None) -> int:
    row = sql.execute(f"SELECT count(*) FROM runs WHERE {where}", params or []).fetchone()
    assert row is not None
    return int(row[0])


def start_order(sql: psycopg.Connection) -> list[int]:
    """Return the runs' ids in the order their handlers started (task ``record``); in a
    workloop of one slot, the order they were claimed in."""
    rows = sql.execute("SELECT run_id FROM executions ORDER BY started_at").fetchall()
    return [row[0] for row in rows]


# -- outcomes ----------------------------------------------------------------------


async def test_a_handler_gets_its_args_as_enqueued_and_its_result_is_read_back_as_returned(
    app: Tidegate, worker_of: WorkerOf
) -> None:
    """JSON read from the database: numbers past 64 bits stay exact integers, floats stay
    floats, strings of digits stay strings, deep nesting survives."""
    args = {
        "big": 123456789012345678901234567890,
        "negative": -(2**64) - 1,
        "edge": 2**64 - 1,
        "float": 0.1,
        "digits": "12345678901234567890123",
        "unicode": "caf\u00e9 \U0001f30a",
        "nested": [[[{"x": None, "ok": True}]]],
    }
    seen: list[dict[str, Any]] = []

    @app.task(name="keep_args")
    async def keep_args(**given: Any) -> dict[str, Any]:
        seen.append(given)
        return given

    run = app.enqueue("keep_args", args)
    async with worker_of(app, "manual>*:1"):
        await wait_until(lambda: finished(app, [run.id]), 10)

    done = app.get_run(run.id)
    assert done is not None and done.state is RunState.SUCCEEDED
    assert seen == [args] and done.args == args and done.result == args
    assert type(seen[0]["big"]) is int and type(done.result["negative"]) is int


@pytest.mark.usefixtures("identity_tasks")
async def test_async_and_sync_handlers_succeed_and_their_results_are_stored(
    app: Tidegate,
    worker_of: WorkerOf,
) -> None:
    on_loop = app.enqueue("whoami_async", {"n": 1})
    in_thread = app.enqueue("whoami_sync", {"n": 2})
    nothing = app.enqueue("noop")
    async with worker_of(app, "manual>*:2"):
        await wait_until(lambda: finished(app, [on_loop.id, in_thread.id, nothing.id]), 10)

    for enqueued, n in ((on_loop, 1), (in_thread, 2)):
        run = app.get_run(enqueued.id)
        assert run is not None
        assert run.state is RunState.SUCCEEDED
        assert (run.attempt, run.errors) == (1, [])
        assert run.completed_at is not None and run.lease_expires_at is None
        # current_run() inside the handler was this very run, on its first attempt.
        assert run.result["id"] == run.id and run.result["attempt"] == 1
        assert run.result["args"] == {"n": n}
    on_loop_result = app.get_run(on_loop.id).result  # type: ignore[union-attr]
    in_thread_result = app.get_run(in_thread.id).result  # type: ignore[union-attr]
    assert on_loop_result["thread"] == threading.main_thread().name
    assert in_thread_result["thread"].startswith("tidegate-run")
    empty = app.get_run(nothing.id)
    assert empty is not None and empty.state is RunState.SUCCEEDED and empty.result is None


async def test_failing_handler_is_retried_after_a_backoff_and_can_recover(
    app: Tidegate,
    worker_of: WorkerOf,
) -> None:
    run = app.enqueue("fail", {"until_attempt": 2})
    # A backoff of 0.5-1 s keeps the run visibly 'scheduled' between its attempts.
    async with worker_of(app, "manual>*:1", backoff_base_seconds=1, backoff_max_seconds=1):
        await wait_until(lambda: state_of(app, run.id) is RunState.SCHEDULED, 10)
        waiting = app.get_run(run.id)
        assert waiting is not None
        assert waiting.attempt == 1
        assert waiting.attempted_at is not None and waiting.scheduled_at > waiting.attempted_at
        assert [e["error"] for e in waiting.errors] == ["ValueError: boom on attempt 1"]
        await wait_until(lambda: finished(app, [run.id]), 10)

    done = app.get_run(run.id)
    assert done is not None
    assert done.state is RunState.SUCCEEDED
    assert done.result == "ok on attempt 2"
    assert done.attempt == 2
    assert done.attempted_at is not None and done.attempted_at >= waiting.scheduled_at
    assert len(done.errors) == 1 and done.errors[0]["attempt"] == 1
    assert "ValueError: boom on attempt 1" in done.errors[0]["traceback"]


@pytest.mark.parametrize("verbose", [False, True], ids=["default", "verbose"])
async def test_a_failure_is_logged_and_stored_with_the_handlers_frames_first(
    app: Tidegate, caplog: pytest.LogCaptureFixture, verbose: bool
) -> None:
    """The frames that called the handler (tidegate's, asyncio's, the thread pool's)
    open neither the stored traceback nor the log's; with -v the log has them all."""
    caplog.set_level(logging.DEBUG if verbose else logging.INFO, logger="tidegate")
    on_loop = app.enqueue("fail", max_attempts=1)
    in_thread = app.enqueue("fail_in_thread")  # retried once: one WARNING, one ERROR
    async with running_worker(app, "manual>*:2", backoff_base_seconds=0.01):
        await wait_until(lambda: finished(app, [on_loop.id, in_thread.id]), 10)

    handlers = str(ROOT / "tests" / "apps.py")
    for run_id, raised in ((on_loop.id, "ValueError"), (in_thread.id, "ValueError")):
        done = app.get_run(run_id)
        assert done is not None and done.state is RunState.DISCARDED
        for error in done.errors:
            first_frame = error["traceback"].splitlines()[1]
            assert first_frame.startswith(f'  File "{handlers}"'), error["traceback"]
            assert "asyncio" not in error["traceback"] and TIDEGATE not in error["traceback"]
        logged = [
            record
            for record in caplog.records
            if record.name == "tidegate.worker" and record.getMessage().startswith(f"run {run_id} ")
        ]
        assert [record.levelname for record in logged] == (
            ["ERROR"] if run_id == on_loop.id else ["WARNING", "ERROR"]
        )
        for record in logged:
            assert record.exc_info is not None
            shown = logging.Formatter().formatException(record.exc_info)
            assert shown.endswith(raised + ": " + done.errors[-1]["error"].split(": ", 1)[1])
            frames = shown.splitlines()[1]
            if verbose:
                assert str(Path(TIDEGATE, "worker", "execute.py")) in shown, shown
            else:
                assert frames.startswith(f'  File "{handlers}"'), shown
                assert TIDEGATE not in shown, shown


async def test_handler_failing_every_attempt_is_discarded_with_all_errors_kept(
    app: Tidegate,
    worker_of: WorkerOf,
) -> None:
    run = app.enqueue("fail")  # max_attempts=3
    async with worker_of(app, "manual>*:1"):
        await wait_until(lambda: finished(app, [run.id]), 10)

    done = app.get_run(run.id)
    assert done is not None
    assert done.state is RunState.DISCARDED
    assert (done.attempt, done.max_attempts) == (3, 3)
    assert done.completed_at is not None and done.result is None
    assert [e["attempt"] for e in done.errors] == [1, 2, 3]
    assert [e["error"] for e in done.errors] == [
        f"ValueError: boom on attempt {n}" for n in (1, 2, 3)
    ]


async def test_retry_from_a_handler_reschedules_without_spending_an_attempt(
    app: Tidegate,
    worker_of: WorkerOf,
) -> None:
    run = app.enqueue("retry_once", max_attempts=1)
    async with worker_of(app, "manual>*:1"):
        await wait_until(lambda: finished(app, [run.id]), 10)

    done = app.get_run(run.id)
    assert done is not None
    # With one attempt allowed, a spent attempt would have ended it; Retry gave it back.
    assert done.state is RunState.SUCCEEDED
    assert done.result == "second time"
    assert (done.attempt, done.max_attempts) == (2, 2)
    assert done.errors == []


async def test_cancel_from_a_handler_ends_the_run_cancelled(
    app: Tidegate, worker_of: WorkerOf
) -> None:
    run = app.enqueue("cancel_me")
    async with worker_of(app, "manual>*:1"):
        await wait_until(lambda: finished(app, [run.id]), 10)

    done = app.get_run(run.id)
    assert done is not None
    assert done.state is RunState.CANCELLED
    assert done.attempt == 1 and done.completed_at is not None
    assert [e["error"] for e in done.errors] == ["Cancel: not needed any more"]


async def test_a_run_cancelled_while_its_async_handler_runs_stops_it_and_frees_the_slot(
    app: Tidegate, worker_of: WorkerOf, sql: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    run = app.enqueue("async_sleep_record", {"seconds": 60})
    async with worker_of(app, "manual>*:1"):
        await wait_until(lambda: state_of(app, run.id) is RunState.RUNNING, 10)
        app.cancel(run.id)
        # The next heartbeat (every 0.5 s) finds the lease not renewed and cancels the
        # handler, which records when it stopped; its one slot takes the next run.
        await wait_until(lambda: executions(sql, run.id) == 1, 10)
        after = app.enqueue("echo", {"n": 1})
        await wait_until(lambda: state_of(app, after.id) is RunState.SUCCEEDED, 10)

    (ran_for,) = sql.execute(
        "SELECT extract(epoch FROM finished_at - started_at) FROM executions"
    ).fetchone() or (None,)
    assert ran_for is not None and ran_for < 10
    done = app.get_run(run.id)
    assert done is not None and done.state is RunState.CANCELLED
    assert done.errors == []  # no outcome came after the cancel: nothing noted late
    assert f"run {run.id} (task async_sleep_record) attempt 1 is no longer" in caplog.text


def executions(sql: psycopg.Connection, run_id: int) -> int:
    row = sql.execute("SELECT count(*) FROM executions WHERE run_id = %s", [run_id]).fetchone()
    assert row is not None
    return int(row[0])


async def test_attempt_over_the_task_timeout_is_discarded_with_a_timeout_error(
    app: Tidegate,
    worker_of: WorkerOf,
) -> None:
    run = app.enqueue("slow")  # timeout 0.2 s, max_attempts 1; sleeps 5 s
    async with worker_of(app, "manual>*:1"):
        await wait_until(lambda: finished(app, [run.id]), 5)

    done = app.get_run(run.id)
    assert done is not None
    assert done.state is RunState.DISCARDED
    assert done.attempt == 1
    assert len(done.errors) == 1
    assert done.errors[0]["error"].startswith("TimeoutError")
    assert "0.2s" in done.errors[0]["error"]


async def test_delayed_run_starts_only_once_it_is_due(app: Tidegate, worker_of: WorkerOf) -> None:
    run = app.enqueue("echo", {"late": True}, delay=0.3)
    assert run.state is RunState.SCHEDULED
    async with worker_of(app, "manual>*:1"):
        await wait_until(lambda: finished(app, [run.id]), 10)

    done = app.get_run(run.id)
    assert done is not None
    assert done.state is RunState.SUCCEEDED and done.result == {"late": True}
    assert done.attempted_at is not None and done.attempted_at >= run.scheduled_at


# -- lanes in a real claim ---------------------------------------------------------


async def test_filter_workloop_never_takes_runs_of_other_lanes(
    app: Tidegate, worker_of: WorkerOf, sql: psycopg.Connection
) -> None:
    others = app.enqueue_many([NewRun("echo", {"i": i}) for i in range(3)])
    fast = app.enqueue_many([NewRun("echo", {"i": i}, lane="fast_lane") for i in range(2)])
    async with worker_of(app, "fast_lane:1"):
        await wait_until(lambda: finished(app, [run.id for run in fast]), 10)
        # One more fast-lane run: the workloop has claimed again since the first two.
        later = app.enqueue("echo", lane="fast_lane")
        await wait_until(lambda: finished(app, [later.id]), 10)

    assert count(sql, "lane = 'fast_lane' AND state = 'succeeded'") == 3
    for run in others:
        untouched = app.get_run(run.id)
        assert untouched is not None
        assert (untouched.state, untouched.attempt) == (RunState.AVAILABLE, 0)


async def test_preference_workloop_takes_its_named_lane_before_older_runs(
    app: Tidegate, worker_of: WorkerOf, sql: psycopg.Connection
) -> None:
    older = app.enqueue_many([NewRun("record", {"i": i}, priority=0) for i in range(4)])
    # The manual runs are newer and of a worse priority: the chain position still wins.
    manual = app.enqueue_many(
        [NewRun("record", {"i": i}, lane="manual", priority=9) for i in range(3)]
    )
    async with worker_of(app, "manual>*:1"):
        await wait_until(lambda: finished(app, [run.id for run in older + manual]), 10)

    assert start_order(sql) == [run.id for run in manual + older]


async def test_lower_priority_number_is_claimed_first_within_a_lane(
    app: Tidegate, worker_of: WorkerOf, sql: psycopg.Connection
) -> None:
    priorities = [5, 0, 9, 3, 0, 7]
    runs = app.enqueue_many([NewRun("record", priority=p) for p in priorities])
    async with worker_of(app, "manual>*:1"):
        await wait_until(lambda: finished(app, [run.id for run in runs]), 10)

    by_priority = sorted(runs, key=lambda run: (run.priority, run.id))
    assert start_order(sql) == [run.id for run in by_priority]


# -- slots -------------------------------------------------------------------------


async def test_fast_lane_slot_runs_at_once_while_every_other_slot_is_busy(
    app: Tidegate, worker_of: WorkerOf, sql: psycopg.Connection
) -> None:
    app.enqueue_many([NewRun("async_sleep", {"seconds": 5}) for _ in range(5_000)])
    async with worker_of(app, "fast_lane:1 manual>*:4", shutdown_grace_seconds=0.5) as worker:
        await wait_until(lambda: count(sql, "lane = 'default' AND state = 'running'") == 4, 10)
        fast = app.enqueue("echo", {"hello": "fast"}, lane="fast_lane")
        await wait_until(lambda: state_of(app, fast.id) is RunState.SUCCEEDED, 5)

        # The four slots of manual>* (workloop 1) were busy the whole time: their runs
        # sleep 5 s, and no other default run was ever started, so the fast-lane slot
        # (workloop 0) took none either.
        assert count(sql, "lane = 'default' AND state = 'running' AND workloop = 1") == 4
        assert count(sql, "lane = 'default' AND attempt > 0") == 4
        assert count(sql, "lane <> 'fast_lane' AND workloop = 0") == 0
        done = app.get_run(fast.id)
        assert done is not None
        assert (done.worker_id, done.workloop) == (worker.id, 0)
        assert done.result == {"hello": "fast"}

    # The short grace period handed the sleeping runs back, their attempt not counted.
    assert count(sql, "state = 'running'") == 0
    assert count(sql, "lane = 'default' AND attempt > 0") == 0
    assert count(sql, "lane = 'default' AND state = 'available'") == 5_000


def count_claims(loop: Any) -> list[int]:
    """Count ``loop``'s claims from now on: one entry per claim, the runs it took."""
    taken: list[int] = []
    claim = loop.claim

    async def counted(demand: int, demands: list[int] | None = None) -> Any:
        runs = await claim(demand, demands)
        taken.append(len(runs))
        return runs

    loop.claim = counted
    return taken


async def test_a_run_of_a_lane_a_workloop_names_wakes_that_workloop_alone(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """One claim per run: the `*` workloop, which could take fast-lane runs too, is not
    woken while the fast-lane workloop has a free slot (its poll is out of the way)."""
    async with running_worker(app, "fast_lane:2 manual>*:4", poll_seconds=60) as worker:
        fast_loop, other_loop = worker.workloops
        await wait_until(lambda: not fast_loop.backlog and not other_loop.backlog, 10)
        fast_claims, other_claims = count_claims(fast_loop), count_claims(other_loop)
        for i in range(10):
            run = app.enqueue("echo", {"i": i}, lane="fast_lane")
            await wait_until(lambda run=run: finished(app, [run.id]), 10)

    assert count(sql, "lane = 'fast_lane' AND state = 'succeeded' AND workloop = 0") == 10
    assert other_claims == []
    assert sum(fast_claims) == 10


async def test_runs_past_the_named_workloops_free_slots_go_to_the_others_at_once(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """Five fast-lane runs in one batch (one NOTIFY) for a fast-lane workloop of one
    slot: its claim comes back full, and the `*` workloop takes the other four then, not
    at its next poll."""
    async with running_worker(app, "fast_lane:1 manual>*:4", poll_seconds=60) as worker:
        fast_loop, other_loop = worker.workloops
        await wait_until(lambda: not fast_loop.backlog and not other_loop.backlog, 10)
        app.enqueue_many([NewRun("async_sleep", {"seconds": 3}, lane="fast_lane")] * 5)
        await wait_until(lambda: count(sql, "state = 'running'") == 5, 2.5)
        assert count(sql, "state = 'running' AND workloop = 0") == 1
        assert count(sql, "state = 'running' AND workloop = 1") == 4


async def test_workloop_never_runs_more_runs_than_its_slots(
    app: Tidegate, worker_of: WorkerOf, sql: psycopg.Connection
) -> None:
    runs = app.enqueue_many([NewRun("sleep", {"seconds": 0.1}) for _ in range(50)])
    ids = [run.id for run in runs]
    seen_running: list[int] = []
    seen_in_process: list[int] = []

    seen_waiting: list[int] = []

    async with worker_of(app, "manual>*:3") as worker:
        (loop,) = worker.workloops

        def sample() -> bool:
            seen_in_process.append(len(loop.running))
            seen_waiting.append(len(loop.waiting))
            seen_running.append(count(sql, "state = 'running' AND worker_id = %s", [worker.id]))
            return finished(app, ids)

        await wait_until(sample, 20, interval=0.01)

    assert count(sql, "state = 'succeeded'") == 50
    assert max(seen_in_process) == 3
    # Handlers slower than a claim: no run is claimed ahead of a free slot.
    assert max(seen_waiting) == 0
    assert worker.link.remote or loop.pace.ahead(0) == 0
    # A slot frees when its handler returns; the database shows the run running until
    # its outcome is written, and a workloop holds at most `slots` unwritten outcomes.
    assert 0 < max(seen_running) <= 6
    assert _max_overlap(sql) == 3


async def test_a_workloop_stops_claiming_while_its_slots_worth_of_outcomes_wait_unwritten(
    app: Tidegate, worker_of: WorkerOf, sql: psycopg.Connection
) -> None:
    """A slot frees when its handler returns, before its outcome is written; but a
    workloop holds at most its slot count of unwritten outcomes, so a database that
    cannot take the outcomes stops its claims rather than piling runs up."""
    runs = app.enqueue_many([NewRun("async_sleep", {"seconds": 0.2}) for _ in range(12)])
    ids = [run.id for run in runs]
    blocker = app.database.connect(autocommit=False)
    async with worker_of(app, "manual>*:2") as worker:
        try:
            await wait_until(lambda: count(sql, "state = 'running'") == 2, 10)
            # Hold the first two runs' rows: their outcomes cannot be written meanwhile.
            held = blocker.execute("SELECT id FROM runs WHERE state = 'running' FOR UPDATE")
            assert len(held.fetchall()) == 2
            # Their handlers return, two more runs are claimed into the freed slots and
            # finish too; then the workloop, with 2 outcomes unwritten, holds 4 runs
            # whose outcomes wait, and claims nothing more. A remote worker's slot frees
            # only once its outcome is in: it stops at 2.
            (loop,) = worker.workloops
            waiting = 2 if worker.link.remote else 4
            await wait_until(lambda: loop.unwritten == waiting, 10)
            await asyncio.sleep(1.0)
            assert count(sql, "attempt > 0") == waiting
            assert loop.unwritten == waiting and loop.free == 0
        finally:
            blocker.rollback()  # the outcomes go through, and so do the other runs
            blocker.close()
        await wait_until(lambda: finished(app, ids), 20)
    assert count(sql, "state = 'succeeded' AND attempt = 1") == 12


async def test_a_workloop_claims_ahead_for_handlers_faster_than_a_claim_yet_runs_at_most_its_slots(
    app: Tidegate, worker_of: WorkerOf, sql: psycopg.Connection, worker_mode: Remote | None
) -> None:
    """Short handlers finish while a claim travels: a local workloop then claims the
    runs that will start meanwhile, and they wait in the worker for a slot. A remote one
    claims no run ahead (the API holds it to its slots)."""
    executing = most = most_waiting = 0
    loops: list[Any] = []

    @app.task(name="count_at_once")
    async def count_at_once(**_: Any) -> None:
        nonlocal executing, most, most_waiting
        executing += 1
        most = max(most, executing)
        most_waiting = max(most_waiting, len(loops[0].waiting))
        await asyncio.sleep(0)  # the other handlers started meanwhile overlap this one
        executing -= 1

    total = 1_500 if worker_mode else 3_000
    app.enqueue_many([NewRun("count_at_once") for _ in range(total)])
    async with worker_of(app, "manual>*:4") as worker:
        loops.extend(worker.workloops)
        await wait_until(lambda: count(sql, "state = 'succeeded'") == total, 120)

    assert most == 4
    assert most_waiting == 0 if worker_mode else 0 < most_waiting <= 4
    assert count(sql, "state = 'succeeded' AND attempt = 1") == total


@pytest.fixture
def claims_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every workloop claims runs ahead, as it does while its handlers return faster
    than its claims, and a run claimed ahead waits for a slot as long as it takes (not
    ``HOLD_SECONDS``): what the worker does with such a run, whenever it is."""
    monkeypatch.setattr(Pace, "ahead", lambda pace, overdue: pace.slots)
    monkeypatch.setattr(workloop, "HOLD_SECONDS", 60.0)


@pytest.fixture
def handlers_faster_than_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every workloop claims ahead as it does while its handlers return faster than its
    claims (one run for each slot whose handler is not overdue), whatever the timing."""
    monkeypatch.setattr(Pace, "ahead", lambda pace, overdue: pace.slots - overdue)


@pytest.mark.usefixtures("handlers_faster_than_claims")
async def test_a_run_claimed_ahead_never_waits_behind_a_slow_handler_while_a_slot_is_free(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """Runs claimed ahead for two slots whose handlers turn out slow go back within
    milliseconds, their attempts not counted, and a worker with free slots runs them at
    once: none waits for the slow handlers, and the slow workloop does not claim again
    while its handlers are overdue (docs/guarantees.md)."""
    slow = app.enqueue_many(
        [NewRun("async_sleep_record", {"seconds": 30}, priority=0) for _ in range(2)]
    )
    quick = app.enqueue_many([NewRun("record", priority=1) for _ in range(4)])
    quick_ids = [run.id for run in quick]

    def attempted() -> list[Any]:
        rows = sql.execute(
            "SELECT attempted_at FROM runs WHERE id = ANY(%s) ORDER BY id", [quick_ids]
        )
        return [row[0] for row in rows]

    async with running_worker(app, "manual>*:2", shutdown_grace_seconds=0.2) as first:
        (loop,) = first.workloops
        await wait_until(lambda: len(loop.handling) == 2, 10)
        # Its first claim took both slow runs and two quick ones ahead; those two are
        # handed back once no slot took them within the hold.
        claimed_ahead = count(sql, "id = ANY(%s) AND attempted_at IS NOT NULL", [quick_ids])
        assert claimed_ahead == 2
        await wait_until(lambda: count(sql, "state = 'available'") == 4, 10)
        assert count(sql, "state = 'running'") == 2
        assert count(sql, "id = ANY(%s) AND attempt = 0", [quick_ids]) == 4
        # Overdue handlers are not counted on: no claim ahead, no churn (a run claimed
        # again would carry a new attempted_at).
        before = attempted()
        await asyncio.sleep(1.0)
        assert attempted() == before
        assert not loop.waiting and not loop.releasing
        async with running_worker(app, "manual>*:4") as second:
            await wait_until(lambda: finished(app, quick_ids), 15)
        assert state_of(app, slow[0].id) is RunState.RUNNING
    ran_on = {
        row[0] for row in sql.execute("SELECT worker_id FROM runs WHERE id = ANY(%s)", [quick_ids])
    }
    assert ran_on == {second.id}
    assert count(sql, "id = ANY(%s) AND attempt = 1", [quick_ids]) == 4
    assert [executions(sql, run_id) for run_id in quick_ids] == [1, 1, 1, 1]


@pytest.mark.usefixtures("claims_ahead")
async def test_runs_claimed_together_start_in_the_claims_order(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """A claim's rows come back in id order; the runs it took wait for the one slot in
    the order it took them: the chain's named lane first, then by priority."""
    runs = app.enqueue_many([NewRun("record", priority=p) for p in (5, 0, 9, 3, 0, 7)])
    manual = app.enqueue("record", lane="manual", priority=9)
    async with running_worker(app, "manual>*:1"):
        await wait_until(lambda: finished(app, [run.id for run in [*runs, manual]]), 10)

    by_priority = sorted(runs, key=lambda run: (run.priority, run.id))
    assert start_order(sql) == [manual.id] + [run.id for run in by_priority]


@pytest.mark.usefixtures("claims_ahead")
async def test_runs_waiting_for_a_slot_at_shutdown_are_handed_back_unstarted(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    first = app.enqueue("async_sleep_record", {"seconds": 1.0}, priority=0)
    ahead = app.enqueue_many(
        [NewRun("async_sleep_record", {"seconds": 0}, priority=1) for _ in range(2)]
    )
    async with running_worker(app, "manual>*:1") as worker:
        (loop,) = worker.workloops
        await wait_until(lambda: len(loop.waiting) == 1, 10)
        assert count(sql, "state = 'running'") == 2
    # The first run finished within the grace period; the one that waited for a slot
    # is available again, its attempt not counted, and never ran; the last was not
    # claimed.
    assert state_of(app, first.id) is RunState.SUCCEEDED
    assert count(sql, "state = 'available' AND attempt = 0") == 2
    assert [executions(sql, run.id) for run in ahead] == [0, 0]


@pytest.mark.usefixtures("claims_ahead")
async def test_a_run_cancelled_while_it_waits_for_a_slot_never_starts(
    app: Tidegate, sql: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    first = app.enqueue("async_sleep_record", {"seconds": 2.0}, priority=0)
    waiting = app.enqueue("async_sleep_record", {"seconds": 0}, priority=1)
    async with running_worker(app, "manual>*:1") as worker:
        (loop,) = worker.workloops
        await wait_until(lambda: waiting.id in loop.waiting, 10)
        app.cancel(waiting.id)
        # The next heartbeat finds its lease not renewed: it leaves the worker unstarted.
        await wait_until(lambda: not loop.waiting, 10)
        await wait_until(lambda: state_of(app, first.id) is RunState.SUCCEEDED, 10)
    assert f"run {waiting.id} (task async_sleep_record) attempt 1 left this worker" in caplog.text
    done = app.get_run(waiting.id)
    assert done is not None and done.state is RunState.CANCELLED and done.errors == []
    assert executions(sql, waiting.id) == 0


def _max_overlap(sql: psycopg.Connection) -> int:
    """Return how many handlers ran at once, at most, from their recorded executions."""
    rows = sql.execute("SELECT started_at, finished_at FROM executions").fetchall()
    edges = sorted([(start, 1) for start, _ in rows] + [(end, -1) for _, end in rows])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


# -- pruning -----------------------------------------------------------------------


async def test_pruner_deletes_finished_runs_and_keeps_unfinished_ones(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """Pruning is a local worker's duty (docs/workers.md): here with a local one."""
    succeeded = app.enqueue_many([NewRun("echo", {"i": i}) for i in range(5)])
    discarded = app.enqueue("fail", max_attempts=1)
    cancelled = app.enqueue("echo", delay=3600)
    app.cancel(cancelled.id)
    scheduled = app.enqueue("echo", delay=3600)
    elsewhere = app.enqueue("echo", lane="elsewhere")  # no workloop here takes it
    running = app.enqueue("async_sleep", {"seconds": 30})
    done_ids = [run.id for run in [*succeeded, discarded, cancelled]]

    async with running_worker(
        app,
        "default:2",
        retention_seconds=0.5,
        prune_seconds=0.1,
        shutdown_grace_seconds=0.5,
    ):
        await wait_until(lambda: state_of(app, running.id) is RunState.RUNNING, 10)
        await wait_until(lambda: count(sql, "id = ANY(%s)", [done_ids]) == 0, 10)
        # Still running after more than the retention period: not finished, so kept.
        assert state_of(app, running.id) is RunState.RUNNING

    assert state_of(app, scheduled.id) is RunState.SCHEDULED
    assert state_of(app, elsewhere.id) is RunState.AVAILABLE
    assert state_of(app, running.id) is RunState.AVAILABLE  # handed back at shutdown
    assert count(sql, "true") == 3
