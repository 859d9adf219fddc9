"""Fixtures: a real PostgreSQL, a fresh schema per test, workers in-process or not.

The server is ``TIDEGATE_DATABASE_URL`` when set, else an embedded one started once for
the session. Each test gets its own schema, so tests never see each other's runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.http_fixtures import ADMIN, ApiServer, database_env, wait_for_workers
from tidegate import Settings, Tidegate
from tidegate.worker.link import RemoteLink
from tidegate.worker.runtime import Worker

ROOT = Path(__file__).resolve().parent.parent

FAST = {
    "lease_seconds": 2.0,
    "heartbeat_seconds": 0.5,
    "poll_seconds": 0.5,
    "stage_seconds": 0.1,
    "rescue_seconds": 0.2,
    "backoff_base_seconds": 0.05,
    "backoff_max_seconds": 0.2,
    "shutdown_grace_seconds": 5.0,
}
"""Short intervals so leases lapse and retries come back within a test."""


def admission(trigger: dict[str, Any], key: str) -> dict[str, Any]:
    """The parameters of ``admit_webhook.sql`` for an empty webhook to an async trigger
    (``trigger`` as ``projects.create_trigger`` returns it), its run under ``key``."""
    return {
        "trigger_id": trigger["id"],
        "project": trigger["project"],
        "lane": "default",
        "task": trigger["task"],
        "key": key,
        "args": "{}",
        "max_attempts": 20,
        "idempotency_key": None,
        "content_type": "application/json",
        "headers": "{}",
        "body": b"{}",
        "default_fast_lane_cap": 10,
        "live_seconds": 6.0,
        "channel": "c",
        "ticket": None,
        "place_grace": 2.0,
        "max_places": 10_000,
        "default_max_attempts": 20,
        "unique_key": None,
        "unique_states": None,
    }


@pytest.fixture(scope="session")
def database_url(tidegate_database_url: str) -> str:
    """The server (tidegate.testing's fixture, as the suite's users get it)."""
    return tidegate_database_url


@pytest.fixture
def schema(tidegate_schema: str) -> str:
    """The test's own schema, dropped after it (tidegate.testing's fixture)."""
    return tidegate_schema


@pytest.fixture
def settings(database_url: str, schema: str) -> Settings:
    return Settings(database_url=database_url, schema=schema, **FAST)  # type: ignore[arg-type]


@pytest.fixture
def app(settings: Settings) -> Iterator[Tidegate]:
    from tests.apps import EXECUTIONS, register

    application = Tidegate(settings=settings)
    application.migrate()
    with application.database.connect() as conn:
        conn.execute(EXECUTIONS)
    register(application)
    yield application
    application.close()


@pytest.fixture
def sql(database_url: str, schema: str) -> Iterator[psycopg.Connection]:
    """A plain connection on the test's schema, to look at the tables directly."""
    with psycopg.connect(database_url, autocommit=True, options=f"-c search_path={schema}") as conn:
        yield conn


@contextlib.asynccontextmanager
async def running_worker(
    app: Tidegate, workloops: str, link: RemoteLink | None = None, **options: object
) -> AsyncIterator[Worker]:
    """Run a worker in this process for the block, then stop it gracefully; with
    ``link``, a remote one (``remote_link``)."""
    worker = Worker(app, app.settings.replace(workloops=workloops, **options), link)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(worker.started.wait(), 10)
        yield worker
    finally:
        stop.set()
        await task


def spawn_worker(
    settings: Settings, workloops: str, *extra: str, remote: Remote | None = None
) -> subprocess.Popen[bytes]:
    """Start ``tidegate worker`` on the test app in a separate process; with ``remote``, a
    remote one (``--server-url``), given no database to reach."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if remote is None:
        env.update(database_env(settings))
    else:
        # The worker has none; only the tests' handlers do, to write ``executions``.
        executions = make_conninfo(
            settings.listen_database_url or settings.database_url or "",
            options=f"-c search_path={settings.schema}",
        )
        env.update(
            TIDEGATE_SCHEMA=settings.schema,
            TIDEGATE_SERVER_URL=remote.url,
            TIDEGATE_WORKER_TOKEN=remote.token,
            TESTS_EXECUTIONS_URL=executions,
        )
    for name, value in FAST.items():
        env[f"TIDEGATE_{name.upper()}"] = str(value)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidegate",
            "worker",
            "--app",
            "tests.apps:app",
            "--workloops",
            workloops,
            *extra,
        ],
        env=env,
        cwd=ROOT,
    )


def stop_worker(process: subprocess.Popen[bytes], timeout: float = 30) -> int:
    """SIGTERM a spawned worker and wait for it to exit; return its exit code."""
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout)


async def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` (sync) until true; fail the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that talks to PostgreSQL, so CI can rerun them on another server."""
    for item in items:
        if "database_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.db)


@pytest.fixture
def start_api(app: Tidegate, settings: Settings) -> Iterator[Callable[..., ApiServer]]:
    """Start ``tidegate serve --role api`` servers on the test's (migrated) schema.

    ``start_api(processes=N, settings=..., log=path, **TIDEGATE_options)``; every server
    started is stopped with SIGTERM at the end of the test.
    """
    servers: list[ApiServer] = []

    def start(
        processes: int = 1,
        settings: Settings = settings,
        log: Path | None = None,
        **options: object,
    ) -> ApiServer:
        server = ApiServer.start(settings, processes=processes, log=log, **options)
        servers.append(server)
        return server

    yield start
    exits = [server.stop() for server in reversed(servers)]
    assert exits == [0] * len(servers), f"tidegate serve exit codes on SIGTERM: {exits}"


@pytest.fixture
def api(start_api: Callable[..., ApiServer]) -> ApiServer:
    """One API server (one process) on the test's schema."""
    return start_api()


@dataclass(frozen=True)
class Remote:
    """Where a test's remote workers go: an API server, and a worker token for every lane."""

    url: str
    token: str
    poll_seconds: float

    def link(self) -> RemoteLink:
        """A new link, for one worker in this process."""
        return RemoteLink(self.url, self.token, self.poll_seconds)


@pytest.fixture
def remote(start_api: Callable[..., ApiServer], settings: Settings) -> Remote:
    """An API server on the test's schema and a worker token for every lane."""
    server = start_api()
    created = httpx.post(
        server.url + "/admin/worker-tokens",
        json={"name": "tests", "lanes": ["*"]},
        headers=ADMIN,
        timeout=10,
    )
    assert created.status_code == 201, created.text
    return Remote(server.url, created.json()["token"], settings.poll_seconds)


@pytest.fixture(params=["local", "remote"])
def worker_mode(request: pytest.FixtureRequest) -> Remote | None:
    """A test that takes it runs twice: with local workers (``None``), then with remote
    ones (``Remote``: pass it to ``spawn_worker``, ``start_worker_process``, ``worker_of``)."""
    if request.param == "local":
        return None
    remote: Remote = request.getfixturevalue("remote")
    return remote


WorkerOf = Callable[..., contextlib.AbstractAsyncContextManager[Worker]]


@pytest.fixture
def worker_of(worker_mode: Remote | None) -> WorkerOf:
    """``worker_of(app, workloops, **options)``: ``running_worker`` in the test's mode (a
    new link per remote worker)."""

    def start(
        app: Tidegate, workloops: str, **options: object
    ) -> contextlib.AbstractAsyncContextManager[Worker]:
        link = worker_mode.link() if worker_mode else None
        return running_worker(app, workloops, link, **options)

    return start


@pytest.fixture
def start_worker_process(settings: Settings) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Spawn ``tidegate worker`` processes (``spawn_worker``), stopped at the end of the test.

    ``start_worker_process("fast_lane:1 manual>*:2", remote=None)`` returns once the
    worker has registered its slots, so admission counts them from the first request on.
    """
    processes: list[subprocess.Popen[bytes]] = []

    def start(workloops: str, *extra: str, remote: Remote | None = None) -> subprocess.Popen[bytes]:
        before = len(processes)
        process = spawn_worker(settings, workloops, *extra, remote=remote)
        processes.append(process)
        assert settings.database_url
        url = settings.listen_database_url or settings.database_url
        wait_for_workers(url, settings.schema, before + 1)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            stop_worker(process)
