"""Worker processes: exactly-once claims under concurrency, crashes, SIGTERM, migrations.

Each test starts real ``tidegate worker`` processes (``spawn_worker``) on the tasks of
``tests/apps.py``, with the short leases of ``conftest.FAST``, and reads the outcome
from the database.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as sql_text
from psycopg.conninfo import make_conninfo

from tests.conftest import FAST, ROOT, spawn_worker, stop_worker, wait_until
from tidegate import NewRun, RunState, Settings, Tidegate
from tidegate.storage.migrate import migrations


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; any still alive when it ends are killed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def scalar(sql: psycopg.Connection, query: str, params: list[Any] | None = None) -> Any:
    row = sql.execute(query, params or []).fetchone()
    assert row is not None
    return row[0]


def count(sql: psycopg.Connection, where: str, params: list[Any] | None = None) -> int:
    return int(scalar(sql, f"SELECT count(*) FROM runs WHERE {where}", params))


def workers(sql: psycopg.Connection) -> int:
    return int(scalar(sql, "SELECT count(*) FROM workers"))


async def test_concurrent_worker_processes_run_each_run_exactly_once(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    processes += [spawn_worker(settings, "manual>*:12") for _ in range(4)]
    # Enqueue once all four are claiming, so that they compete for every run.
    await wait_until(lambda: workers(sql) == 4, 20)
    app.enqueue_many([NewRun("record", {"i": i}) for i in range(10_000)])
    await wait_until(lambda: count(sql, "state = 'succeeded'") == 10_000, 60, interval=0.2)

    assert count(sql, "state = 'succeeded' AND attempt = 1 AND errors = '[]'") == 10_000
    assert scalar(sql, "SELECT count(*) FROM executions") == 10_000
    assert (
        sql.execute("SELECT run_id FROM executions GROUP BY run_id HAVING count(*) > 1").fetchall()
        == []
    )
    assert scalar(sql, "SELECT count(DISTINCT run_id) FROM executions") == 10_000
    assert scalar(sql, "SELECT count(DISTINCT pid) FROM executions") > 1

    assert [stop_worker(process) for process in processes] == [0, 0, 0, 0]
    assert workers(sql) == 0
    assert count(sql, "state <> 'succeeded'") == 0


async def test_runs_of_a_killed_worker_are_rescued_and_run_again(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    runs = app.enqueue_many([NewRun("sleep", {"seconds": 0.3}) for _ in range(200)])
    first = spawn_worker(settings, "manual>*:8")
    processes.append(first)
    await wait_until(lambda: count(sql, "state = 'running'") > 0, 20)
    first.kill()
    first.wait(10)
    # Dead now: whatever it still held stays 'running' under its id until rescued.
    held = {
        row[0]
        for row in sql.execute(
            "SELECT runs.id FROM runs JOIN workers ON workers.id = runs.worker_id"
            " WHERE runs.state = 'running' AND workers.pid = %s",
            [first.pid],
        )
    }
    assert held

    second = spawn_worker(settings, "manual>*:16")
    processes.append(second)
    await wait_until(lambda: count(sql, "state = 'succeeded'") == 200, 30, interval=0.1)

    assert count(sql, "state = 'running'") == 0
    for run_id in [run.id for run in runs]:
        run = app.get_run(run_id)
        assert run is not None
        if run_id in held:
            assert run.attempt == 2, run
            assert [e["attempt"] for e in run.errors] == [1]
            assert "lease expired" in run.errors[0]["error"]
        else:
            assert (run.attempt, run.errors) == (1, [])
    # At least once: every run executed; only the rescued ones may have run twice.
    executed = dict(sql.execute("SELECT run_id, count(*) FROM executions GROUP BY run_id"))
    assert set(executed) == {run.id for run in runs}
    assert {run_id for run_id, times in executed.items() if times > 1} <= held
    assert stop_worker(second) == 0


async def test_sigterm_stops_claiming_and_lets_in_flight_runs_finish(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    worker = spawn_worker(settings, "manual>*:4")
    processes.append(worker)
    await wait_until(lambda: workers(sql) == 1, 20)
    app.enqueue_many([NewRun("async_sleep", {"seconds": 2}) for _ in range(8)])
    await wait_until(lambda: count(sql, "state = 'running'") == 4, 10)
    in_flight = {row[0] for row in sql.execute("SELECT id FROM runs WHERE state = 'running'")}

    assert stop_worker(worker) == 0  # the grace period (5 s) outlasts the 2 s runs

    assert {row[0] for row in sql.execute("SELECT id FROM runs WHERE state = 'succeeded'")} == (
        in_flight
    )
    assert count(sql, "result = '\"slept\"'") == 4
    # Claiming stopped at SIGTERM: the other four were never started.
    assert count(sql, "state = 'available' AND attempt = 0") == 4
    assert count(sql, "state = 'running'") == 0
    assert workers(sql) == 0


async def test_sigterm_hands_back_runs_that_outlast_the_grace_period(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    worker = spawn_worker(settings, "manual>*:4", "--shutdown-grace-seconds", "0.3")
    processes.append(worker)
    await wait_until(lambda: workers(sql) == 1, 20)
    runs = app.enqueue_many([NewRun("async_sleep", {"seconds": 30}) for _ in range(4)])
    await wait_until(lambda: count(sql, "state = 'running'") == 4, 10)

    assert stop_worker(worker, timeout=10) == 0

    for run_id in [run.id for run in runs]:
        run = app.get_run(run_id)
        assert run is not None
        # Handed back: available again, the interrupted attempt not counted, no error.
        assert (run.state, run.attempt, run.errors) == (RunState.AVAILABLE, 0, [])
        assert run.lease_expires_at is None
    assert count(sql, "state = 'running'") == 0
    assert workers(sql) == 0


async def test_sigterm_never_hands_back_a_run_whose_handler_still_executes(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    """Sync handlers cannot be interrupted; async ones are stopped before hand-back."""
    first = spawn_worker(settings, "manual>*:8", "--shutdown-grace-seconds", "0.3")
    processes.append(first)
    await wait_until(lambda: workers(sql) == 1, 20)
    runs = app.enqueue_many(
        [NewRun("sleep", {"seconds": 4}) for _ in range(4)]
        + [NewRun("async_sleep_record", {"seconds": 4}) for _ in range(4)]
    )
    await wait_until(lambda: count(sql, "state = 'running'") == 8, 10)
    second = spawn_worker(settings, "manual>*:8")  # takes whatever is handed back
    processes.append(second)
    await wait_until(lambda: workers(sql) == 2, 20)

    assert stop_worker(first, timeout=20) == 0
    await wait_until(lambda: count(sql, "state = 'succeeded'") == 8, 20)

    executions: dict[int, list[tuple[Any, Any, int]]] = {}
    for run_id, started, finished, pid in sql.execute(
        "SELECT run_id, started_at, finished_at, pid FROM executions ORDER BY started_at"
    ):
        executions.setdefault(run_id, []).append((started, finished, pid))
    for run in runs:
        ran = executions[run.id]
        # Never two executions of one run at a time: each starts after the last stopped.
        for (_, stopped, _), (started, _, _) in itertools.pairwise(ran):
            assert started >= stopped, (run.task, ran)
        if run.task == "sleep":
            # Waited for, not handed back: one execution, its outcome written by the first.
            assert [pid for _, _, pid in ran] == [first.pid], ran
        else:
            # Stopped, then handed back, then run again by the second worker.
            assert [pid for _, _, pid in ran] == [first.pid, second.pid], ran
    assert count(sql, "attempt = 1 AND errors = '[]'") == 8


async def test_sigterm_ends_within_the_grace_when_the_database_is_gone(
    database_url: str, processes: list[subprocess.Popen[bytes]]
) -> None:
    """A stopping worker whose database was dropped under it: claims, outcomes and its
    last words all fail, and it still exits within its grace (5 s), not after a pool's
    wait for a connection that never comes."""
    name = f"tidegate_gone_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(sql_text.SQL("CREATE DATABASE {}").format(sql_text.Identifier(name)))
    try:
        settings = Settings(database_url=make_conninfo(database_url, dbname=name), **FAST)  # type: ignore[arg-type]
        with Tidegate(settings=settings) as app:
            app.migrate()
            app.enqueue("async_sleep", {"seconds": 60})
        worker = spawn_worker(settings, "manual>*:2")
        processes.append(worker)
        with psycopg.connect(settings.database_url or "", autocommit=True) as conn:
            await wait_until(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM tidegate.runs WHERE state = 'running'"
                    ).fetchone()
                    == (1,)
                ),
                20,
            )
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(
                sql_text.SQL("DROP DATABASE {} WITH (FORCE)").format(sql_text.Identifier(name))
            )

    signalled = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    await asyncio.to_thread(worker.wait, 60)
    assert time.monotonic() - signalled < FAST["shutdown_grace_seconds"] + 5


def test_processes_migrating_at_once_apply_each_migration_once(
    database_url: str, schema: str, sql: psycopg.Connection
) -> None:
    env = {
        **os.environ,
        "TIDEGATE_DATABASE_URL": database_url,
        "TIDEGATE_SCHEMA": schema,
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "tidegate", "migrate"]
    started = [
        subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outputs = [process.communicate(timeout=30)[0] for process in started]

    assert [process.returncode for process in started] == [0, 0, 0, 0]
    versions = [migration.version for migration in migrations()]
    applied = f"(applied {', '.join(map(str, versions))})"
    assert sorted(applied in out for out in outputs) == [False, False, False, True], outputs
    assert sum("(up to date)" in out for out in outputs) == 3
    rows = sql.execute("SELECT version, count(*) FROM migrations GROUP BY version ORDER BY 1")
    assert rows.fetchall() == [(version, 1) for version in versions]
