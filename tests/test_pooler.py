"""tidegate behind PgBouncer in transaction mode: API processes and workers run their
statements through the pooler, and each process LISTENs on one direct connection.

The module starts its own PgBouncer (Debian's ``pgbouncer``; the tests skip without the
binary) in front of the tests' server, with ``POOL_SIZE`` server connections, and the
``settings`` fixture points every process of a test at it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.conftest import FAST, running_worker, spawn_worker, stop_worker, wait_until
from tests.http_fixtures import (
    ApiServer,
    create_project,
    create_trigger,
    database_env,
    free_port,
    wait_for_workers,
)
from tests.test_admission import most_at_once
from tidegate import ConfigError, NewRun, Settings, Tidegate
from tidegate.schedules import create_schedule

POOL_SIZE = 5
"""Server connections PgBouncer keeps for the tests' database and user."""
PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None
)


@pytest.fixture(scope="module")
def pgbouncer(database_url: str) -> Iterator[str]:
    """Start PgBouncer in transaction mode in front of the tests' server; its URL."""
    if PGBOUNCER is None:
        pytest.skip("no pgbouncer binary (apt-get install -y pgbouncer)")
    server = conninfo_to_dict(database_url)
    if str(server.get("host", "")).startswith("/"):
        # As root PgBouncer must become another user, who cannot open the embedded
        # server's socket (its folder is its own user's): CI runs these on PostgreSQL 15.
        pytest.skip("PgBouncer here needs a server on TCP (TIDEGATE_DATABASE_URL)")
    # Its own folder under /tmp, open to all: run as root, PgBouncer refuses to start
    # unless told to become another user (nobody), who must reach its files.
    folder = Path(tempfile.mkdtemp(prefix="tidegate-pgbouncer-"))
    folder.chmod(0o777)
    port = free_port()
    target = " ".join(
        f"{name}={server[name]}" for name in ("host", "port", "user") if server.get(name)
    )
    (folder / "pgbouncer.ini").write_text(
        f"[databases]\n* = {target}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\npool_mode = transaction\n"
        f"default_pool_size = {POOL_SIZE}\nmax_client_conn = 1000\n"
    )
    command = [PGBOUNCER, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        command[1:1] = ["-u", "nobody"]
    log = folder / "pgbouncer.log"
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    url = make_conninfo(database_url, host="127.0.0.1", port=str(port))
    deadline = time.monotonic() + 15
    while True:
        try:
            psycopg.connect(url, prepare_threshold=None).close()
            break
        except psycopg.OperationalError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"pgbouncer did not start:\n{log.read_text()}") from None
            time.sleep(0.05)
    yield url
    process.send_signal(signal.SIGTERM)
    process.wait(10)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def names() -> tuple[str, str]:
    """Application names of this test's pooled connections and of its sessions: how
    pg_stat_activity tells them from everyone else's."""
    tag = uuid.uuid4().hex[:8]
    return f"tg_pooled_{tag}", f"tg_listen_{tag}"


@pytest.fixture
def settings(pgbouncer: str, database_url: str, schema: str, names: tuple[str, str]) -> Settings:
    """Every process of the test through PgBouncer, LISTEN on PostgreSQL itself."""
    pooled, listen = names
    return Settings(
        database_url=make_conninfo(pgbouncer, application_name=pooled),
        listen_database_url=make_conninfo(database_url, application_name=listen),
        database_pooler="pgbouncer",
        schema=schema,
        **FAST,  # type: ignore[arg-type]
    )


def backends(sql: psycopg.Connection, name: str) -> int:
    row = sql.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name]
    ).fetchone()
    return int(row[0]) if row else 0


async def test_fast_lane_cap_holds_across_api_processes_through_pgbouncer_on_few_connections(
    start_api: Callable[..., ApiServer],
    start_worker_process: Callable[..., Any],
    sql: psycopg.Connection,
    names: tuple[str, str],
) -> None:
    """80 sync webhooks at once on 2 API processes and 2 workers: never more than the cap
    in flight, and PostgreSQL sees at most the pool's connections plus one listener per
    process."""
    cap = 3
    api = start_api(processes=2)
    start_worker_process("fast_lane:4")
    start_worker_process("fast_lane:4")
    pooled, listen = names
    most = [0, 0]

    async def watch() -> None:
        while True:
            most[0] = max(most[0], backends(sql, pooled))
            most[1] = max(most[1], backends(sql, listen))
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=api.url, timeout=30, limits=limits) as client:
        await create_project(client, "acme", fast_lane_cap=cap)
        trigger = await create_trigger(client, "acme", "quote", mode="sync", task="hook_sleep")
        responses = await asyncio.wait_for(
            asyncio.gather(
                *(client.post(trigger["url"], json={"seconds": 0.3}) for _ in range(80))
            ),
            timeout=60,
        )
    watcher.cancel()
    admitted = [r for r in responses if r.status_code == 200]
    statuses = {r.status_code for r in responses}
    assert statuses <= {200, 429} and len(admitted) >= cap, statuses
    assert all(r.json() == {"slept": 0.3} for r in admitted)
    executions = sql.execute("SELECT started_at, finished_at FROM executions").fetchall()
    assert len(executions) == len(admitted)
    assert most_at_once(executions) <= cap
    # Both kinds seen, neither past its bound: the pool, and one LISTEN per process (2
    # API processes, 2 workers).
    assert 0 < most[0] <= POOL_SIZE, most
    assert 0 < most[1] <= 4, most


FLEET = 8
"""API processes, and as many workers, of the fleet test: more processes than the pool
has connections."""


async def test_a_fleet_of_api_processes_and_workers_runs_every_webhook_on_the_pool(
    start_api: Callable[..., ApiServer],
    settings: Settings,
    sql: psycopg.Connection,
    names: tuple[str, str],
) -> None:
    """8 API processes and 8 workers (2 slots each) on a pool of 5: 300 async webhooks
    sent 32 at a time, over connections the API processes share, are all admitted and
    all run, and PostgreSQL sees at most the pool plus one listener per process."""
    api = start_api(processes=FLEET)
    workers = [spawn_worker(settings, "manual>*:2") for _ in range(FLEET)]
    pooled, listen = names
    most = [0, 0]

    async def watch() -> None:
        while True:
            most[0] = max(most[0], backends(sql, pooled))
            most[1] = max(most[1], backends(sql, listen))
            await asyncio.sleep(0.02)

    def done() -> bool:
        row = sql.execute("SELECT count(*) FROM runs WHERE state = 'succeeded'").fetchone()
        return row == (300,)

    assert settings.listen_database_url
    wait_for_workers(settings.listen_database_url, settings.schema, FLEET, timeout=60)
    # From here on: a worker's check of the schema at its start is a session of its own
    # for a moment, before it heartbeats.
    watcher = asyncio.create_task(watch())
    try:
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        async with httpx.AsyncClient(base_url=api.url, timeout=60, limits=limits) as client:
            await create_project(client, "fleet")
            trigger = await create_trigger(client, "fleet", "orders", mode="async", task="noop")
            responses = await asyncio.wait_for(
                asyncio.gather(*(client.post(trigger["url"], json={"n": n}) for n in range(300))),
                timeout=120,
            )
        assert {r.status_code for r in responses} == {202}
        await wait_until(done, 120)
    finally:
        watcher.cancel()
        exits = [stop_worker(worker) for worker in workers]
    assert exits == [0] * FLEET
    assert 0 < most[0] <= POOL_SIZE, most
    assert 0 < most[1] <= 2 * FLEET, most


async def test_max_running_and_rescue_hold_through_pgbouncer(
    app: Tidegate, settings: Settings, sql: psycopg.Connection
) -> None:
    """A key's max_running holds across two workers; a killed worker's runs are rescued
    and run again, their lapsed attempt counted."""
    app.set_key_policy("default", "*", max_running=2)
    runs = app.enqueue_many([NewRun("sleep", {"seconds": 0.2}, key=f"k{n % 3}") for n in range(24)])
    first = spawn_worker(settings, "manual>*:4")
    second = spawn_worker(settings, "manual>*:4")
    seen: list[int] = []

    def sample() -> bool:
        rows = sql.execute(
            "SELECT key, count(*) FILTER (WHERE state = 'running'),"
            " count(*) FILTER (WHERE state = 'succeeded') FROM runs GROUP BY key"
        ).fetchall()
        seen.append(max((running for _, running, _ in rows), default=0))
        return sum(done for *_, done in rows) == len(runs)

    try:
        await wait_until(lambda: sample() or bool(held_by(sql, first.pid)), 30, interval=0.01)
        first.kill()  # dies holding what it held
        first.wait(10)
        held = held_by(sql, first.pid)
        await wait_until(sample, 45, interval=0.01)
    finally:
        if first.poll() is None:
            first.kill()
        assert stop_worker(second) == 0
    assert max(seen) <= 2
    assert held
    again = sql.execute(
        "SELECT id FROM runs WHERE attempt = 2 AND errors::text LIKE '%%lease expired%%'"
    )
    assert {run_id for (run_id,) in again} == held
    executed = sql.execute("SELECT count(DISTINCT run_id) FROM executions").fetchone()
    assert executed == (len(runs),)


def held_by(sql: psycopg.Connection, pid: int) -> set[int]:
    """The runs running under the worker whose process is ``pid``."""
    rows = sql.execute(
        "SELECT runs.id FROM runs JOIN workers ON workers.id = runs.worker_id"
        " WHERE runs.state = 'running' AND workers.pid = %s",
        [pid],
    )
    return {run_id for (run_id,) in rows}


async def test_a_schedule_ticks_through_pgbouncer(app: Tidegate, sql: psycopg.Connection) -> None:
    app.execute(create_schedule("default", "tick", "record", interval_seconds=1))
    async with running_worker(app, "manual>*:2", schedule_seconds=0.05):
        await wait_until(
            lambda: (
                sql.execute(
                    "SELECT count(*) FROM runs WHERE task = 'record' AND state = 'succeeded'"
                ).fetchone()
                >= (2,)
            ),
            20,
        )
    ticks = sql.execute(
        "SELECT scheduled_at, count(*) FROM runs WHERE task = 'record' GROUP BY 1"
    ).fetchall()
    assert all(n == 1 for _, n in ticks)


def test_migrate_with_the_pooler_settings_runs_once_on_a_session_of_postgresql_itself(
    settings: Settings, sql: psycopg.Connection
) -> None:
    """Two ``tidegate migrate`` at once, given the pooler's URL as every process is: the
    session lock that makes one wait for the other is taken on the listen URL, so the
    schema is made once and both succeed."""
    env = {**os.environ, **database_env(settings)}
    command = [sys.executable, "-m", "tidegate", "migrate"]
    processes = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=120)[0].decode() for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    rows = sql.execute("SELECT version, count(*) FROM migrations GROUP BY 1").fetchall()
    assert rows and all(n == 1 for _, n in rows)
    assert sum("(up to date)" in output for output in outputs) >= 1, outputs


def test_a_pooler_needs_a_url_of_postgresql_itself_for_listen() -> None:
    url = "postgresql://tidegate@pgbouncer:6432/app"
    with pytest.raises(ConfigError, match="needs listen_database_url"):
        Settings(database_url=url, database_pooler="pgbouncer")
    with pytest.raises(ConfigError, match="database_pooler must be one of"):
        Settings(database_url=url, listen_database_url=url, database_pooler="pgpool")
    with pytest.raises(ConfigError, match="need a database_url"):
        Settings(listen_database_url=url)
    direct = "postgresql://tidegate@db:5432/app"
    settings = Settings.from_env(
        {
            "TIDEGATE_DATABASE_URL": url,
            "TIDEGATE_LISTEN_DATABASE_URL": direct,
            "TIDEGATE_DATABASE_POOLER": "pgbouncer",
        }
    )
    assert (settings.listen_database_url, settings.database_pooler) == (direct, "pgbouncer")
