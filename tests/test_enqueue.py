"""Enqueueing: defaults, scheduling, batches, idempotency (also under concurrency)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from tidegate import EnqueueError, NewRun, RunState, Tidegate


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


def test_enqueue_many_is_one_statement_in_input_order(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    new = [NewRun("echo", {"i": i}, key=f"k{i % 7}", priority=i % 3) for i in range(10_000)]
    runs = app.enqueue_many(new)
    assert [run.args["i"] for run in runs] == list(range(10_000))
    assert [run.id for run in runs] == sorted(run.id for run in runs)
    assert sql.execute("SELECT count(*) FROM runs").fetchone() == (10_000,)


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


def test_duplicate_idempotency_key_returns_the_original(app: Tidegate) -> None:
    first = app.enqueue("echo", {"n": 1}, idempotency_key="order-1")
    again = app.enqueue("echo", {"n": 2}, idempotency_key="order-1")
    assert again.id == first.id and again.args == {"n": 1}
    other_project = app.enqueue("echo", idempotency_key="order-1", project="p2")
    assert other_project.id != first.id


def test_enqueue_many_with_repeated_keys_maps_each_to_its_run(app: Tidegate) -> None:
    original = app.enqueue("echo", {"n": 0}, idempotency_key="a")
    runs = app.enqueue_many(
        [
            NewRun("echo", {"n": 1}),
            NewRun("echo", {"n": 2}, idempotency_key="a"),
            NewRun("echo", {"n": 3}, idempotency_key="b"),
            NewRun("echo", {"n": 4}, idempotency_key="b"),
            NewRun("echo", {"n": 5}),
        ]
    )
    assert [r.args["n"] for r in runs] == [1, 0, 3, 3, 5]
    assert runs[1].id == original.id and runs[2].id == runs[3].id


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
