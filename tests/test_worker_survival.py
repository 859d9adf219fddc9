"""No database error ends a worker (docs/architecture.md, invariant 7).

Each test makes the database refuse one kind of statement of a running worker (a
trigger that raises, as a refused value or a revoked permission would), checks that the
worker logs it and goes on serving what it can, then lifts the fault and checks that
the worker recovers by itself, without a restart. Each runs twice: with a local worker,
and with a remote one, whose statements the API runs (the refusal reaches it as a 500).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
import pytest

from tests.conftest import Remote, WorkerOf, wait_until
from tidegate import NewRun, Tidegate
from tidegate.worker.services import (
    FIRST_RETRY_SECONDS,
    MAX_RETRY_SECONDS,
    Periodic,
    retry_delay,
)

REFUSE = """
CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'refused by the test' USING ERRCODE = 'P0001';
END
$$
"""


def states(sql: psycopg.Connection, where: str = "true") -> dict[str, int]:
    rows = sql.execute(f"SELECT state::text, count(*) FROM runs WHERE {where} GROUP BY 1")
    return dict(rows.fetchall())


async def test_a_claim_the_database_refuses_is_retried_and_other_workloops_go_on(
    app: Tidegate,
    sql: psycopg.Connection,
    caplog: pytest.LogCaptureFixture,
    worker_of: WorkerOf,
    worker_mode: Remote | None,
) -> None:
    sql.execute(REFUSE)
    # Claims of the lane 'broken' fail; the workloop of 'default' is not affected.
    sql.execute(
        "CREATE TRIGGER refuse_claim BEFORE UPDATE ON runs FOR EACH ROW"
        " WHEN (NEW.state = 'running' AND NEW.lane = 'broken') EXECUTE FUNCTION refuse()"
    )
    app.enqueue_many([NewRun("echo", {"i": i}, lane="broken") for i in range(5)])
    async with worker_of(app, "broken:2 default:2"):
        await wait_until(lambda: "claim failed" in caplog.text, 10)
        served = app.enqueue_many([NewRun("echo", {"i": i}) for i in range(20)])
        await wait_until(lambda: states(sql, "lane = 'default'") == {"succeeded": 20}, 10)
        assert states(sql, "lane = 'broken'") == {"available": 5}
        sql.execute("DROP TRIGGER refuse_claim ON runs")  # the operator fixes it
        await wait_until(lambda: states(sql) == {"succeeded": 25}, 40)
    assert len(served) == 20
    failures = [r for r in caplog.records if "claim failed" in r.getMessage()]
    assert failures and all(r.levelno == logging.ERROR for r in failures)
    why = "[P0001] refused by the test" if worker_mode is None else "with 500: internal error"
    assert why in failures[0].getMessage()


async def test_an_outcome_the_database_refuses_holds_back_no_other_outcome(
    app: Tidegate,
    sql: psycopg.Connection,
    caplog: pytest.LogCaptureFixture,
    worker_of: WorkerOf,
) -> None:
    sql.execute(REFUSE)
    # Completing a run of the key 'poison' as succeeded fails; every other write works.
    sql.execute(
        "CREATE TRIGGER refuse_outcome BEFORE UPDATE ON runs FOR EACH ROW"
        " WHEN (NEW.state = 'succeeded' AND NEW.key = 'poison') EXECUTE FUNCTION refuse()"
    )
    poison = app.enqueue("echo", {"bad": True}, key="poison", max_attempts=2)
    app.enqueue_many([NewRun("echo", {"i": i}, key=f"k{i % 3}") for i in range(200)])
    async with worker_of(app, "manual>*:8"):
        await wait_until(lambda: states(sql, "key <> 'poison'") == {"succeeded": 200}, 20)
        # Never written, the poison run's lease lapses; it is rescued and, out of
        # attempts, discarded: the worker never stopped for it.
        await wait_until(lambda: states(sql, "key = 'poison'") == {"discarded": 1}, 30)
    run = app.get_run(poison.id)
    assert run is not None and run.attempt == 2
    assert [e["error"].split(":")[0] for e in run.errors] == ["lease expired"] * 2
    assert any(
        r.levelno == logging.ERROR and f"run {poison.id}: its outcome" in r.getMessage()
        for r in caplog.records
    )


async def test_a_heartbeat_the_database_refuses_is_retried_while_runs_go_on(
    app: Tidegate,
    sql: psycopg.Connection,
    caplog: pytest.LogCaptureFixture,
    worker_of: WorkerOf,
) -> None:
    sql.execute(REFUSE)
    async with worker_of(app, "manual>*:2") as worker:
        sql.execute(
            "CREATE TRIGGER refuse_beat BEFORE UPDATE ON workers FOR EACH ROW"
            " EXECUTE FUNCTION refuse()"
        )
        await wait_until(lambda: "heartbeat failed" in caplog.text, 10)
        app.enqueue_many([NewRun("echo", {"i": i}) for i in range(10)])
        await wait_until(lambda: states(sql) == {"succeeded": 10}, 10)
        sql.execute("DROP TRIGGER refuse_beat ON workers")
        beat = "SELECT heartbeat_at > now() - interval '1 second' FROM workers WHERE id = %s"

        def beating() -> bool:
            row = sql.execute(beat, [worker.id]).fetchone()
            return bool(row and row[0])

        await wait_until(beating, 10)


async def test_a_worker_whose_outcomes_cannot_be_written_still_stops_after_its_grace(
    app: Tidegate,
    sql: psycopg.Connection,
    caplog: pytest.LogCaptureFixture,
    worker_of: WorkerOf,
) -> None:
    """An outage that lasts (here: every completion answered as a deadlock, which is
    retried) must not keep a stopping worker alive: it gives up after its grace, says
    which runs, and they are rescued as a dead worker's would be."""
    sql.execute(REFUSE.replace("'P0001'", "'40P01'"))
    sql.execute(
        "CREATE TRIGGER refuse_outcome BEFORE UPDATE ON runs FOR EACH ROW"
        " WHEN (NEW.state = 'succeeded') EXECUTE FUNCTION refuse()"
    )
    run = app.enqueue("echo", {"n": 1})
    clock = asyncio.get_running_loop().time
    async with worker_of(app, "manual>*:1", shutdown_grace_seconds=1):
        await wait_until(lambda: "completer: database unavailable" in caplog.text, 10)
        stopping = clock()
    assert clock() - stopping < 10
    assert (
        "1 outcome(s) could not be written within the shutdown's grace, given up: "
        f"run(s) {run.id}" in caplog.text
    )
    assert states(sql) == {"running": 1}  # its lease lapses, and a rescuer takes it


@pytest.mark.parametrize("task", ["sleep", "async_sleep_record"])
async def test_a_handler_whose_run_left_the_worker_is_stopped_or_its_outcome_noted(
    app: Tidegate,
    sql: psycopg.Connection,
    caplog: pytest.LogCaptureFixture,
    worker_of: WorkerOf,
    task: str,
) -> None:
    """As when the run is taken from its worker behind its back (an operator's UPDATE):
    the run is available again while its handler still runs. The next heartbeat, which
    does not renew its lease, tells the worker: an async handler is cancelled there; a
    sync one cannot be, and its late outcome, not recorded, is noted in the run's errors.
    The run runs again either way."""
    run = app.enqueue(task, {"seconds": 1.5})
    async with worker_of(app, "manual>*:1"):
        await wait_until(lambda: states(sql) == {"running": 1}, 10)
        sql.execute(
            "UPDATE runs SET state = 'available', attempt = 0, worker_id = NULL,"
            " workloop = NULL, lease_expires_at = NULL, attempted_at = NULL WHERE id = %s",
            [run.id],
        )
        await wait_until(lambda: states(sql) == {"succeeded": 1}, 10)
    finished = app.get_run(run.id)
    assert finished is not None and finished.attempt == 1
    spans = sql.execute(
        "SELECT extract(epoch FROM finished_at - started_at) FROM executions ORDER BY started_at"
    ).fetchall()
    assert len(spans) == 2  # it ran twice
    if task == "sleep":
        assert [e["error"].split(":")[0] for e in finished.errors] == ["late outcome"]
        assert "ended (succeeded) on worker" in finished.errors[0]["error"]
        assert any(
            r.levelno == logging.WARNING
            and f"run {run.id}: the outcome of attempt 1" in r.getMessage()
            for r in caplog.records
        )
    else:
        assert finished.errors == []
        assert spans[0][0] < 1.5  # the first execution was stopped


async def test_a_heartbeat_that_waited_for_a_lock_keeps_its_runs(
    app: Tidegate, sql: psycopg.Connection, worker_of: WorkerOf
) -> None:
    """The runs table locked for longer than a lease (2 s): the heartbeat waits behind
    the lock, then writes a lease from the time of its write, not from when it began
    to wait, so no rescuer takes the run while its handler executes
    (docs/guarantees.md)."""
    run = app.enqueue("async_sleep_record", {"seconds": 5})
    async with worker_of(app, "manual>*:1"):
        await wait_until(lambda: states(sql) == {"running": 1}, 10)
        with sql.transaction():
            sql.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
            await asyncio.sleep(3)
        await wait_until(lambda: states(sql) == {"succeeded": 1}, 15)
    finished = app.get_run(run.id)
    assert finished is not None
    assert (finished.attempt, finished.errors) == (1, [])
    (executed,) = sql.execute("SELECT count(*) FROM executions").fetchone() or (0,)
    assert executed == 1


async def test_a_service_stops_even_when_a_library_swallows_its_cancellation() -> None:
    """psycopg can catch the CancelledError of a cancel() that lands while a query or a
    transaction is cleaned up, and return as if nothing happened (seen on a worker's
    scheduler: its shutdown then waited forever). The stop sends it again."""
    ticks = 0

    async def tick() -> bool:
        nonlocal ticks
        ticks += 1
        if ticks == 1:
            with contextlib.suppress(asyncio.CancelledError):  # swallowed, as psycopg may
                await asyncio.sleep(10)
        return False

    service = Periodic("swallower", 0.05, tick)
    service.start()
    await asyncio.sleep(0.01)
    stopping = asyncio.create_task(service.stop())
    done, _ = await asyncio.wait([stopping], timeout=3)
    stopping.cancel()  # without the second cancel, the stop waits forever
    assert done, "the service did not stop"
    assert service.task is not None and service.task.cancelled()


async def test_a_run_that_comes_back_to_its_worker_replaces_its_stale_execution(
    app: Tidegate, sql: psycopg.Connection, worker_of: WorkerOf
) -> None:
    """The run leaves while its handler executes and the same worker, with a slot free,
    claims it again at once: the stale execution is stopped, and its end does not touch
    the slot of the new one."""
    run = app.enqueue("async_sleep_record", {"seconds": 2.0})
    async with worker_of(app, "manual>*:2") as worker:
        (loop,) = worker.workloops
        await wait_until(lambda: states(sql) == {"running": 1}, 10)
        sql.execute(
            "UPDATE runs SET state = 'available', attempt = 0, worker_id = NULL,"
            " workloop = NULL, lease_expires_at = NULL, attempted_at = NULL WHERE id = %s",
            [run.id],
        )
        sql.execute("SELECT pg_notify(%s, 'default')", [app.available_channel])

        def stale_stopped() -> bool:
            row = sql.execute("SELECT count(*) FROM executions").fetchone()
            return row is not None and row[0] == 1

        await wait_until(stale_stopped, 10)
        assert states(sql) == {"running": 1}
        assert list(loop.running) == [run.id] and loop.free == 1  # the new execution
        await wait_until(lambda: states(sql) == {"succeeded": 1}, 10)
        await wait_until(lambda: not loop.running and loop.free == 2, 5)
    spans = sql.execute(
        "SELECT extract(epoch FROM finished_at - started_at) FROM executions ORDER BY started_at"
    ).fetchall()
    assert len(spans) == 2 and spans[0][0] < 1.5 <= spans[1][0]
    finished = app.get_run(run.id)
    assert finished is not None and (finished.attempt, finished.errors) == (1, [])


def test_workers_that_lose_the_database_together_do_not_retry_in_step() -> None:
    """Every worker fails at the same moment of an outage: each one's next try falls
    anywhere under the doubling ceiling (full jitter), so a fleet comes back spread out,
    not at once at every doubling."""
    for failures in range(1, 16):
        ceiling = min(FIRST_RETRY_SECONDS * 2 ** (failures - 1), MAX_RETRY_SECONDS)
        delays = [retry_delay(failures) for _worker in range(8)]
        assert all(0 <= delay <= ceiling for delay in delays), (failures, delays)
        assert len(set(delays)) == len(delays), (failures, delays)
