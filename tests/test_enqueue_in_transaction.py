"""Enqueueing in the application's own transaction (``connection=``): the runs commit or
roll back with it, wake workers at its commit, and leave its ``search_path`` as it was.

The application's connection looks at a schema of its own, ``shop``, with a table of
its own named ``runs``: were tidegate's statements to leave the search path on their
schema, or to run on the application's, the two ``runs`` would be mixed up.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors

from tidegate import NewRun, RunState, Tidegate


@pytest.fixture
def shop(database_url: str) -> Iterator[str]:
    """The conninfo of a connection whose search_path is the application's own schema,
    which has a table ``runs`` of its own."""
    name = f"shop_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
        conn.execute(f"CREATE TABLE {name}.runs (id int PRIMARY KEY, note text)")
    yield psycopg.conninfo.make_conninfo(database_url, options=f"-c search_path={name}")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {name} CASCADE")


def count(sql: psycopg.Connection, where: str = "true") -> int:
    row = sql.execute(f"SELECT count(*) FROM runs WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


def search_path(conn: psycopg.Connection) -> str:
    row = conn.execute("SHOW search_path").fetchone()
    assert row is not None
    return str(row[0])


def test_runs_enqueued_in_a_rolled_back_transaction_leave_nothing(
    app: Tidegate, sql: psycopg.Connection, shop: str
) -> None:
    with psycopg.connect(shop) as conn:  # not autocommit: the caller's transaction
        before = search_path(conn)
        one = app.enqueue("echo", {"x": 1}, connection=conn, idempotency_key="order-1")
        again = app.enqueue("echo", {"x": 2}, connection=conn, idempotency_key="order-1")
        many = app.enqueue_many([NewRun("echo", {"i": i}) for i in range(3)], connection=conn)
        assert again == one  # the repeat found the original, in the same transaction
        assert [run.args for run in many] == [{"i": 0}, {"i": 1}, {"i": 2}]
        # The caller's statements after the enqueue see their own schema and table.
        assert search_path(conn) == before
        conn.execute("INSERT INTO runs (id, note) VALUES (1, 'order 1')")
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
        assert count(sql) == 0  # not committed: no other session sees the runs
        conn.rollback()
        assert count(conn) == 0  # the caller's own table
    assert count(sql) == 0
    assert app.get_run(one.id) is None


def test_a_committed_enqueue_is_claimed_at_once_woken_by_its_notify(
    app: Tidegate,
    sql: psycopg.Connection,
    shop: str,
    start_worker_process: Callable[..., Any],
) -> None:
    """The worker polls once a minute: only the NOTIFY, delivered at the caller's commit,
    can make it claim the run within the test's 20 seconds."""
    start_worker_process("manual>*:2", "--poll-seconds", "60")
    first = app.enqueue("noop")  # the worker's first claims are behind it once this ran
    wait = time.monotonic() + 20
    while count(sql, f"id = {first.id} AND state = 'succeeded'") == 0:
        assert time.monotonic() < wait, "the worker never ran the first run"
        time.sleep(0.05)

    with psycopg.connect(shop) as conn:
        run = app.enqueue("echo", {"x": 1}, connection=conn)
        conn.execute("INSERT INTO runs (id, note) VALUES (%s, 'paid')", [run.id])
        time.sleep(1)
        assert count(sql, f"id = {run.id}") == 0  # no worker can see it yet
        conn.commit()
        wait = time.monotonic() + 20
        assert conn.execute("SELECT note FROM runs").fetchall() == [("paid",)]

    while count(sql, f"id = {run.id} AND state = 'succeeded'") == 0:
        assert time.monotonic() < wait, "the committed run was not claimed: no wake-up"
        time.sleep(0.05)


def test_a_failed_statement_in_the_callers_transaction_is_the_callers_to_handle(
    app: Tidegate, sql: psycopg.Connection, shop: str
) -> None:
    with psycopg.connect(shop) as conn:
        conn.execute("INSERT INTO runs (id, note) VALUES (1, 'first')")
        conn.commit()
        # Handled in a savepoint: the transaction, and the enqueue in it, go on.
        kept = app.enqueue("echo", {"kept": True}, connection=conn)
        with contextlib.suppress(errors.UniqueViolation), conn.transaction():
            conn.execute("INSERT INTO runs (id, note) VALUES (1, 'again')")
        conn.execute("INSERT INTO runs (id, note) VALUES (2, 'second')")
        conn.commit()
        # Not handled: the caller rolls back, and the enqueue's rows go with it.
        lost = app.enqueue("echo", {"kept": False}, connection=conn)
        with pytest.raises(errors.UniqueViolation):
            conn.execute("INSERT INTO runs (id, note) VALUES (2, 'again')")
        with pytest.raises(errors.InFailedSqlTransaction):  # nothing more in it
            app.enqueue("echo", connection=conn)
        conn.rollback()
        assert [row[0] for row in conn.execute("SELECT id FROM runs ORDER BY id")] == [1, 2]
    assert app.get_run(kept.id) == kept
    assert app.get_run(lost.id) is None
    assert count(sql) == 1


def test_on_an_autocommit_connection_an_enqueue_commits_by_itself_or_with_its_block(
    app: Tidegate, sql: psycopg.Connection, shop: str
) -> None:
    with psycopg.connect(shop, autocommit=True) as conn:
        before = search_path(conn)
        alone = app.enqueue("echo", connection=conn)
        assert app.get_run(alone.id) == alone  # committed before it returned, as stored
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
        with conn.transaction():
            inside = app.enqueue("echo", connection=conn)
            conn.execute("INSERT INTO runs (id) VALUES (1)")
            assert count(sql, f"id = {inside.id}") == 0
        assert count(sql, f"id = {inside.id}") == 1
        with contextlib.suppress(ZeroDivisionError), conn.transaction():
            rolled_back = app.enqueue("echo", connection=conn)
            1 / 0  # noqa: B018
        assert app.get_run(rolled_back.id) is None
        assert search_path(conn) == before


async def test_aenqueue_commits_and_rolls_back_with_an_async_transaction(
    app: Tidegate, sql: psycopg.Connection, shop: str
) -> None:
    async with await psycopg.AsyncConnection.connect(shop) as conn:
        await app.aenqueue("echo", {"x": 1}, connection=conn)
        await app.aenqueue_many([NewRun("echo", {"i": i}) for i in range(2)], connection=conn)
        await conn.execute("INSERT INTO runs (id) VALUES (1)")  # its own table
        assert count(sql) == 0
        await conn.rollback()
        assert count(sql) == 0

        async with conn.transaction():
            run = await app.aenqueue("echo", {"x": 1}, connection=conn)
            many = await app.aenqueue_many(
                [NewRun("echo", {"i": i}) for i in range(2)], connection=conn
            )
            await conn.execute("INSERT INTO runs (id) VALUES (1)")
        assert [await app.aget_run(r.id) for r in [run, *many]] == [run, *many]
        assert all(r.state is RunState.AVAILABLE for r in [run, *many])
        assert count(sql) == 3


async def test_the_wrong_kind_of_connection_is_refused_with_a_type_error(
    app: Tidegate, database_url: str, sql: psycopg.Connection
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as aconn:
        with pytest.raises(TypeError, match=r"psycopg.Connection, got AsyncConnection.*aenqueue"):
            app.enqueue("echo", connection=aconn)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"psycopg.AsyncConnection, got Connection.*enqueue"):
            await app.aenqueue("echo", connection=sql)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"psycopg.Connection, got str"):
            app.enqueue_many([NewRun("echo")], connection="postgresql://")  # type: ignore[arg-type]
    assert count(sql) == 0
