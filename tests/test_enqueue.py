"""Enqueueing: defaults, scheduling, batches, idempotency (also under concurrency)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tidegate import EnqueueError, NewRun, RunState, Settings, Tidegate


def test_enqueue_applies_task_and_default_options(app: Tidegate) -> None:
    run = app.enqueue("echo", {"x": 1})
    assert run.state is RunState.AVAILABLE
    assert (run.lane, run.project, run.key, run.priority) == ("default", "default", "default", 0)
    assert run.args == {"x": 1}
    assert run.max_attempts == app.settings.max_attempts
    assert app.enqueue("fail").max_attempts == 3  # the task's own


def test_enqueue_with_delay_or_run_at_is_scheduled(app: Tidegate) -> None:
    later = app.enqueue("echo", delay=60)
    assert later.state is RunState.SCHEDULED
    at = datetime.now(UTC) + timedelta(hours=1)
    assert app.enqueue("echo", run_at=at).scheduled_at == at
    past = datetime.now(UTC) - timedelta(minutes=1)
    assert app.enqueue("echo", run_at=past).state is RunState.AVAILABLE
    # A naive time would be read in the session's time zone: refused, not guessed.
    with pytest.raises(EnqueueError, match="timezone-aware"):
        app.enqueue("echo", run_at=datetime.now())


def test_enqueue_many_is_one_statement_in_input_order(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    new = [NewRun("echo", {"i": i}, key=f"k{i % 7}", priority=i % 3) for i in range(10_000)]
    runs = app.enqueue_many(new)
    assert [run.args["i"] for run in runs] == list(range(10_000))
    assert [run.id for run in runs] == sorted(run.id for run in runs)
    assert sql.execute("SELECT count(*) FROM runs").fetchone() == (10_000,)


def test_enqueue_returns_the_runs_as_stored(app: Tidegate) -> None:
    """The returned runs are built from what was sent and what the insert returned, not
    read back: each must equal the stored run, field for field, and stay frozen."""
    at = datetime.now(UTC) + timedelta(hours=1)
    runs = app.enqueue_many(
        [NewRun("echo", {"i": i}, key=f"k{i % 3}", priority=i % 3) for i in range(6)]
        + [NewRun("echo", run_at=at, idempotency_key="later")]
        + [NewRun("echo", run_at=datetime.now(UTC) - timedelta(seconds=1))]
    )
    runs.append(app.enqueue("fail", {"x": 1}, lane="manual"))
    for run in runs:
        stored = app.get_run(run.id)
        assert run == stored
        assert vars(run) == vars(stored)
        with pytest.raises(dataclasses.FrozenInstanceError):
            run.state = RunState.RUNNING  # type: ignore[misc]


def test_bad_enqueue_is_a_clear_error_and_stores_nothing(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    with pytest.raises(EnqueueError, match="JSON object"):
        app.enqueue("echo", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(EnqueueError, match="lane name"):
        app.enqueue("echo", lane="no spaces")
    with pytest.raises(EnqueueError, match="priority"):
        app.enqueue("echo", priority=10)
    assert sql.execute("SELECT count(*) FROM runs").fetchone() == (0,)


@pytest.mark.parametrize(
    ("task", "args", "options", "reason"),
    [
        ("echo", {"a": "x\x00y"}, {}, "NUL"),
        ("echo", {"a\x00": 1}, {}, "NUL"),
        ("echo", {"a": "\ud800"}, {}, "lone surrogate"),
        ("echo", {"a": float("nan")}, {}, "JSON cannot represent"),
        ("echo", {"a": float("inf")}, {}, "JSON cannot represent"),
        ("echo", {"a": 10**5000}, {}, "4300 digits"),
        ("echo", {"a": {1: 2}}, {}, "key that is not text"),
        ("echo", {"when": datetime.now(UTC)}, {}, "datetime, which is not JSON"),
        ("echo", {"deep": json.loads("[" * 70 + "]" * 70)}, {}, "deeper than 64"),
        ("echo\x00", {}, {}, "task name contains a NUL"),
        ("t" * 256, {}, {}, "task name must be 1 to 255"),
        ("echo", {}, {"key": "k" * 10_000}, "key of a run of 'echo' must be 1 to 255"),
        ("echo", {}, {"key": "k\x00"}, "NUL"),
        ("echo", {}, {"project": "a b"}, "project id must match"),
        ("echo", {}, {"lane": "l" * 65}, "lane name must match"),
        ("echo", {}, {"idempotency_key": "i" * 256}, "idempotency key must be 1 to 255"),
        ("echo", {}, {"max_attempts": 40_000}, "max_attempts of 'echo' must be 1 to 1000"),
        ("echo", {}, {"delay": float("nan")}, "delay must be"),
        ("echo", {}, {"delay": 1e12}, "delay must be 0 to 3650 days"),
    ],
)
def test_values_postgresql_cannot_hold_are_refused_at_enqueue(
    app: Tidegate,
    sql: psycopg.Connection,
    task: str,
    args: dict[Any, Any],
    options: dict[str, Any],
    reason: str,
) -> None:
    with pytest.raises(EnqueueError, match=re.escape(reason)):
        app.enqueue(task, args, **options)
    with pytest.raises(EnqueueError, match=re.escape(reason)):
        app.enqueue_many([NewRun("echo", {}), NewRun(task, args, **options)])
    assert sql.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_duplicate_idempotency_key_returns_the_original(app: Tidegate) -> None:
    first = app.enqueue("echo", {"n": 1}, idempotency_key="order-1")
    again = app.enqueue("echo", {"n": 2}, idempotency_key="order-1")
    assert again.id == first.id and again.args == {"n": 1}
    other_project = app.enqueue("echo", idempotency_key="order-1", project="p2")
    assert other_project.id != first.id


def test_enqueue_many_with_repeated_keys_maps_each_to_its_run(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    original = app.enqueue("echo", {"n": 0}, idempotency_key="a")
    runs = app.enqueue_many(
        [
            NewRun("echo", {"n": 1}),
            NewRun("echo", {"n": 2}, idempotency_key="a"),
            NewRun("echo", {"n": 3}, idempotency_key="b"),
            NewRun("echo", {"n": 4}, idempotency_key="b"),
            NewRun("echo", {"n": 5}),
            NewRun("echo", {"n": 6}, idempotency_key="c"),
            NewRun("echo", {"n": 7}),
        ]
    )
    assert [r.args["n"] for r in runs] == [1, 0, 3, 3, 5, 6, 7]
    assert runs[1].id == original.id and runs[2].id == runs[3].id
    # Each run returned is the stored row of its input, whichever insert made it.
    stored = dict(sql.execute("SELECT id, args FROM runs").fetchall())
    assert [stored[r.id]["n"] for r in runs] == [1, 0, 3, 3, 5, 6, 7]


def test_concurrent_duplicates_create_one_run(app: Tidegate, sql: psycopg.Connection) -> None:
    def enqueue(i: int) -> int:
        return app.enqueue("echo", {"i": i}, idempotency_key="same").id

    with ThreadPoolExecutor(16) as pool:
        ids = set(pool.map(enqueue, range(64)))
    assert len(ids) == 1
    assert sql.execute("SELECT count(*) FROM runs").fetchone() == (1,)


async def test_async_enqueue_runs_the_same_steps(app: Tidegate) -> None:
    runs = await asyncio.gather(
        *(app.aenqueue("echo", {"i": i}, idempotency_key=f"k{i % 5}") for i in range(20))
    )
    assert len({run.id for run in runs}) == 5
    many = await app.aenqueue_many([NewRun("echo", {"i": i}) for i in range(100)])
    assert [run.args["i"] for run in many] == list(range(100))
    assert (await app.aget_run(many[0].id)) == many[0]
    await app.aclose()


def test_each_event_loop_gets_a_pool_that_closes_when_the_loop_ends(settings: Settings) -> None:
    """``asyncio.run(...aenqueue...)`` three times, as a script or a test does: each
    loop's end closes its pool (no end waiting on the pool's tasks, no connection left
    open), and the next loop opens its own."""
    name = f"probe-{settings.schema}"
    joint = "&" if "?" in settings.database_url else "?"
    url = f"{settings.database_url}{joint}application_name={name}"
    app = Tidegate(settings=dataclasses.replace(settings, database_url=url))
    app.migrate()

    async def burst() -> None:
        await asyncio.gather(*(app.aenqueue("echo", {"i": i}) for i in range(10)))

    def open_connections() -> int:
        # A connection the loop's end cancelled while it was being made is psycopg's
        # to finish when it is collected; the pool's own are closed by then.
        gc.collect()
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            return conn.execute(query, (name,)).fetchone()[0]  # type: ignore[index]

    try:
        for _ in range(3):
            asyncio.run(burst())
            deadline = time.monotonic() + 10  # for the server to see its backends go
            while open_connections() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert open_connections() == 0
        assert len(app.list_runs()) == 30
    finally:
        app.close()
