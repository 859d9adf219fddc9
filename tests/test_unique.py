"""Unique runs: a second enqueue of a run like one already there returns that run."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import psycopg
import pytest

from tidegate import EnqueueError, NewRun, RunState, Tidegate, Unique
from tidegate.runs import cancel_run, retry_runs


def count(sql: psycopg.Connection, where: str = "true") -> int:
    row = sql.execute(f"SELECT count(*) FROM runs WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


def test_a_second_enqueue_returns_the_first_run_marked_duplicate(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    first = app.enqueue("echo", {"account": 7}, unique=Unique(period=3600))
    again = app.enqueue("echo", {"account": 7}, unique=Unique(period=3600))
    assert not first.duplicate and again.duplicate
    assert again.id == first.id and again.unique_key == first.unique_key
    other_args = app.enqueue("echo", {"account": 8}, unique=Unique(period=3600))
    other_project = app.enqueue("echo", {"account": 7}, project="p2", unique=Unique())
    other_task = app.enqueue("fail", {"account": 7}, unique=Unique(period=3600))
    plain = app.enqueue("echo", {"account": 7})  # no option: never a duplicate
    ids = {first.id, other_args.id, other_project.id, other_task.id, plain.id}
    assert len(ids) == 5
    assert plain.unique_key is None and count(sql) == 5


def test_by_names_the_fields_that_make_runs_alike(app: Tidegate) -> None:
    by_key = Unique(by=("key",))
    first = app.enqueue("echo", {"n": 1}, key="acme", unique=by_key)
    assert app.enqueue("echo", {"n": 2}, key="acme", unique=by_key).id == first.id
    assert app.enqueue("echo", {"n": 1}, key="other", unique=by_key).id != first.id

    some_args = Unique(args_keys=("user",))
    one = app.enqueue("echo", {"user": 1, "at": "09:00"}, unique=some_args)
    assert app.enqueue("echo", {"user": 1, "at": "10:00"}, unique=some_args).id == one.id
    assert app.enqueue("echo", {"user": 2, "at": "09:00"}, unique=some_args).id != one.id

    by_lane = Unique(by=("args", "lane"))
    default = app.enqueue("echo", {"n": 3}, unique=by_lane)
    assert app.enqueue("echo", {"n": 3}, lane="manual", unique=by_lane).id != default.id
    # The order of the args' keys, or the period's type, makes no other key.
    first_order = app.enqueue("echo", {"a": 1, "b": 2}, unique=Unique(period=60))
    assert app.enqueue("echo", {"b": 2, "a": 1}, unique=Unique(period=60.0)).duplicate
    assert first_order.unique_key is not None


def test_a_run_is_unique_within_its_window_of_the_period(app: Tidegate) -> None:
    hour = Unique(period=3600)
    window = (math.floor(time.time() / 3600) + 2) * 3600  # a window two hours ahead

    def at(offset: float) -> datetime:
        return datetime.fromtimestamp(window + offset, UTC)

    first = app.enqueue("echo", run_at=at(10), unique=hour)
    assert first.state is RunState.SCHEDULED
    assert app.enqueue("echo", run_at=at(3599), unique=hour).id == first.id
    assert app.enqueue("echo", run_at=at(3600), unique=hour).id != first.id
    assert app.enqueue("echo", run_at=at(-1), unique=hour).id != first.id
    # Without a period: one such run as long as one is in the states.
    forever = app.enqueue("echo", run_at=at(10), unique=Unique())
    assert app.enqueue("echo", run_at=at(99_999), unique=Unique()).id == forever.id


def test_states_say_which_runs_hold_the_key(app: Tidegate, sql: psycopg.Connection) -> None:
    first = app.enqueue("echo", {"n": 1}, unique=Unique())
    sql.execute("UPDATE runs SET state = 'succeeded' WHERE id = %s", [first.id])
    assert app.enqueue("echo", {"n": 1}, unique=Unique()).id == first.id  # the default
    sql.execute("UPDATE runs SET state = 'discarded' WHERE id = %s", [first.id])
    after_discard = app.enqueue("echo", {"n": 1}, unique=Unique())
    assert after_discard.id != first.id and not after_discard.duplicate

    all_states = Unique(states=tuple(RunState))
    kept = app.enqueue("echo", {"n": 2}, unique=all_states)
    app.execute(cancel_run(kept.id, completed_channel=app.completed_channel))
    assert app.enqueue("echo", {"n": 2}, unique=all_states).id == kept.id


def test_a_retried_run_drops_its_key_and_collides_with_nothing(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    first = app.enqueue("echo", unique=Unique())
    app.execute(cancel_run(first.id, completed_channel=app.completed_channel))
    second = app.enqueue("echo", unique=Unique())
    assert second.id != first.id
    (retried,) = app.execute(retry_runs([first.id], "manual", channel=app.available_channel))
    assert retried.state is RunState.AVAILABLE and retried.unique_key is None
    assert app.enqueue("echo", unique=Unique()).id == second.id


def test_a_batch_maps_each_unique_run_to_the_run_that_holds_its_key(app: Tidegate) -> None:
    held = app.enqueue("echo", {"n": 0}, unique=Unique())
    runs = app.enqueue_many(
        [
            NewRun("echo", {"n": 0}, unique=Unique()),
            NewRun("echo", {"n": 1}, unique=Unique()),
            NewRun("echo", {"n": 1}, unique=Unique()),
            NewRun("echo", {"n": 1}),
            NewRun("echo", {"n": 2}, idempotency_key="k", unique=Unique()),
            NewRun("echo", {"n": 2}, idempotency_key="j", unique=Unique()),
            NewRun("echo", {"n": 3}, idempotency_key="k"),
        ]
    )
    assert [run.duplicate for run in runs] == [True, False, True, False, False, True, True]
    assert runs[0].id == held.id and runs[2].id == runs[1].id and runs[3].id != runs[1].id
    assert runs[5].id == runs[4].id and runs[6].id == runs[4].id


@pytest.mark.parametrize(
    ("unique", "reason"),
    [
        (Unique(period=0), "unique period must be 1 to"),
        (Unique(period="60"), "unique period must be"),  # type: ignore[arg-type]
        (Unique(by=("args", "colour")), "unique by must name some of"),
        (Unique(by="args"), "unique by must name some of"),
        (Unique(by=("key",), args_keys=("user",)), "with 'args' in by"),
        (Unique(states=("available", "running")), "must include scheduled"),
        (Unique(states=("done",)), "unique states must be run states"),
    ],
)
def test_bad_unique_options_are_a_clear_error_and_store_nothing(
    app: Tidegate, sql: psycopg.Connection, unique: Unique, reason: str
) -> None:
    with pytest.raises(EnqueueError, match=reason):
        app.enqueue("echo", unique=unique)
    assert count(sql) == 0


def test_concurrent_enqueues_of_one_unique_run_make_exactly_one(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    start = threading.Barrier(16)

    def enqueue(i: int) -> tuple[int, bool]:
        if i < 16:
            start.wait()
        run = app.enqueue("echo", {"report": "daily"}, unique=Unique(period=3600))
        return run.id, run.duplicate

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(enqueue, range(64)))
    assert len({run_id for run_id, _ in results}) == 1
    assert sorted(duplicate for _, duplicate in results) == [False] + [True] * 63
    assert count(sql) == 1


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_unique_enqueue_in_an_open_transaction_holds_the_key_until_it_ends(
    app: Tidegate, sql: psycopg.Connection, database_url: str, outcome: str
) -> None:
    """A second enqueue waits for the transaction holding the key: it gets that run if it
    commits, and inserts its own if it rolls back."""
    with psycopg.connect(database_url) as conn:
        mine = app.enqueue("echo", {"n": 1}, connection=conn, unique=Unique())
        with ThreadPoolExecutor(1) as pool:
            other = pool.submit(app.enqueue, "echo", {"n": 1}, unique=Unique())
            waiting = "wait_event_type = 'Lock' AND query LIKE '-- Insert one run%%'"
            deadline = time.monotonic() + 30
            while not sql.execute(f"SELECT 1 FROM pg_stat_activity WHERE {waiting}").fetchone():
                if time.monotonic() >= deadline:
                    conn.rollback()  # lets the other enqueue end, and the pool's block
                    raise AssertionError("the second enqueue never waited")
                time.sleep(0.01)
            getattr(conn, outcome)()
            theirs = other.result(timeout=30)
    if outcome == "commit":
        assert theirs.id == mine.id and theirs.duplicate
    else:
        assert theirs.id != mine.id and not theirs.duplicate
    assert count(sql) == 1


async def test_aenqueue_takes_the_same_option(app: Tidegate) -> None:
    first = await app.aenqueue("echo", {"n": 1}, unique=Unique(period=60))
    again = await app.aenqueue("echo", {"n": 1}, unique=Unique(period=60))
    assert again.id == first.id and again.duplicate
    await app.aclose()


def test_an_ordinary_run_has_no_entry_in_the_unique_index(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """Runs without the option cost the unique index nothing: 5,000 of them leave it at
    the size one unique run gives it (its metapage and one leaf)."""
    app.enqueue("echo", unique=Unique())
    one = sql.execute("SELECT pg_relation_size('runs_unique')").fetchone()
    app.enqueue_many([NewRun("echo", {"i": i}) for i in range(5_000)])
    for i in range(20):
        app.enqueue("echo", {"i": i})
    assert sql.execute("SELECT pg_relation_size('runs_unique')").fetchone() == one == (16384,)
