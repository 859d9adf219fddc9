"""A real ``tidegate serve --role api`` on a port, for the HTTP ingress tests.

The server runs as separate processes (``--api-processes N`` uvicorn workers) on the
test's schema, configured through ``TIDEGATE_*`` variables like a deployment would be.
Tests talk to it with httpx over TCP; nothing is mocked. The fixtures that use these
helpers live in ``conftest.py`` (``start_api``, ``api``, ``start_worker_process``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tidegate import Settings
from tidegate.api.kernel import ProblemType
from tidegate.storage.embedded import pgdata_path

ROOT = Path(__file__).resolve().parent.parent
ADMIN_TOKEN = "tga_test-super-admin"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
START_SECONDS = 30.0
STOP_SECONDS = 15.0

API_SETTINGS = {
    "lease_seconds": 2.0,
    # The API reads a worker as live for 3 heartbeats. One second (rather than the
    # workers' 0.5 s) keeps a worker starved of CPU for a moment on a busy test machine
    # from looking dead to admission, which would turn 429s into 503s.
    "heartbeat_seconds": 1.0,
    "poll_seconds": 0.5,
    "shutdown_grace_seconds": 5.0,
}


def database_env(settings: Settings) -> dict[str, str]:
    """The ``TIDEGATE_*`` variables that say where a process's database is: its URL and,
    behind a pooler, the URL of PostgreSQL itself and the pooler's kind."""
    env = {"TIDEGATE_DATABASE_URL": settings.database_url or "", "TIDEGATE_SCHEMA": settings.schema}
    if settings.listen_database_url is not None:
        env["TIDEGATE_LISTEN_DATABASE_URL"] = settings.listen_database_url
        env["TIDEGATE_DATABASE_POOLER"] = settings.database_pooler
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def listeners(database_url: str, schema: str) -> int:
    """Count the API processes on ``schema`` whose completion listener is up."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s",
            [f'LISTEN "{schema}.completed"'],
        ).fetchone()
    return int(row[0]) if row else 0


class ServerExited(RuntimeError):
    """The server process ended before it was ready."""


@dataclass
class ApiServer:
    """One ``tidegate serve --role api`` process tree, listening on ``url``."""

    url: str
    process: subprocess.Popen[bytes]
    processes: int

    @classmethod
    def start(
        cls, settings: Settings, *, processes: int = 1, log: Path | None = None, **overrides: Any
    ) -> ApiServer:
        """Start the server and return once every API process answers and listens; with
        ``log``, what it writes (its log) goes to that file."""
        assert settings.database_url, "the server needs a database URL"
        # free_port() only finds a port free now: another test process may take it before
        # the server binds it ("address already in use"), so a server that exits at
        # start is tried again on another port, twice at most.
        for attempt in range(3):
            try:
                return cls._start_on(free_port(), settings, processes, log, overrides)
            except ServerExited:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _start_on(
        cls,
        port: int,
        settings: Settings,
        processes: int,
        log: Path | None,
        overrides: dict[str, Any],
    ) -> ApiServer:
        assert settings.database_url
        env = {
            **os.environ,
            **database_env(settings),
            "TIDEGATE_ADMIN_TOKEN": ADMIN_TOKEN,
            "PYTHONPATH": str(ROOT),
        }
        for name, value in {**API_SETTINGS, **overrides}.items():
            env[f"TIDEGATE_{name.upper()}"] = str(value)
        before = listeners(settings.database_url, settings.schema)
        output = None if log is None else log.open("ab")
        try:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tidegate",
                    "serve",
                    "--role",
                    "api",
                    "--port",
                    str(port),
                    "--api-processes",
                    str(processes),
                ],
                env=env,
                cwd=ROOT,
                start_new_session=True,  # its own process group: teardown reaches stragglers
                stdout=output,
                stderr=None if output is None else subprocess.STDOUT,
            )
        finally:
            if output is not None:
                output.close()  # the server holds its own
        server = cls(f"http://127.0.0.1:{port}", process, processes)
        try:
            server._wait_ready(settings, before + processes)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, settings: Settings, wanted_listeners: int) -> None:
        assert settings.database_url
        deadline = time.monotonic() + START_SECONDS
        while True:
            if self.process.poll() is not None:
                raise ServerExited(f"tidegate serve exited with {self.process.returncode}")
            try:
                ready = serving(httpx.get(self.url + "/readyz", timeout=2))
            except httpx.TransportError:
                ready = False
            if ready and listeners(settings.database_url, settings.schema) >= wanted_listeners:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"tidegate serve not ready within {START_SECONDS}s")
            time.sleep(0.1)

    def stop(self) -> int | None:
        """SIGTERM the server and wait; kill its process group if it does not exit."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)
            return None


def serving(readyz: httpx.Response) -> bool:
    """Tell whether a ``/readyz`` answer says the server serves: its database and schema
    are right (with or without a live worker, which many tests start later)."""
    return readyz.status_code == 200


def wait_for_workers(database_url: str, schema: str, count: int, timeout: float = 30.0) -> None:
    """Block until ``count`` workers of ``schema`` have heartbeated."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(database_url, autocommit=True, options=f"-c search_path={schema}") as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM workers").fetchone()
            if row and row[0] >= count:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} worker(s) not up within {timeout}s")
            time.sleep(0.05)


def counts(conn: psycopg.Connection) -> tuple[int, int]:
    """Return (runs, requests): how many rows the webhooks left behind."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM requests)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def assert_problem(
    response: httpx.Response, status: int, kind: ProblemType | None = None
) -> dict[str, Any]:
    """Check that ``response`` is an RFC 9457 problem with ``status`` (of type ``kind``,
    or of the type that status stands for), its ``title`` the one of its type and its
    ``detail`` saying something; return its body."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    expected = kind or ProblemType.for_status(status)
    assert expected is not None and expected.status == status
    assert (body["type"], body["title"], body["status"]) == (
        expected.uri,
        expected.title,
        status,
    ), body
    assert isinstance(body["detail"], str) and body["detail"]
    return body


async def create_project(
    client: httpx.AsyncClient, project_id: str, **limits: Any
) -> dict[str, Any]:
    """Create a project through the admin API; the result holds its token."""
    response = await client.post(
        "/admin/projects", json={"id": project_id, **limits}, headers=ADMIN
    )
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def create_trigger(
    client: httpx.AsyncClient, project_id: str, name: str, **fields: Any
) -> dict[str, Any]:
    """Create a trigger through the admin API; ``url`` is where its webhooks go."""
    response = await client.post(
        f"/admin/projects/{project_id}/triggers", json={"name": name, **fields}, headers=ADMIN
    )
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    assert created["url"] == f"/hooks/{created['token']}"
    return created


HOLD_EMBEDDED = """
import sys
from pathlib import Path

from tidegate.storage.embedded import start_embedded

print(start_embedded(Path(sys.argv[1])), flush=True)
sys.stdin.read()  # hold the server until the test closes stdin; exiting stops it
"""


class PrivatePostgres:
    """An embedded PostgreSQL the test can stop and start again, at the same URL.

    A holder process starts (or restarts) the server under ``data_dir`` and keeps it up;
    when the holder exits, the embedded server's own clean-up stops PostgreSQL (fast
    shutdown: every connection is cut).
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.holder: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> str:
        assert self.holder is None
        self.holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_EMBEDDED, str(self.data_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.holder.stdout is not None
        url = self.holder.stdout.readline().strip()
        assert url.startswith("postgresql://"), f"the embedded server did not start: {url!r}"
        assert self.url in ("", url), "the server came back at another URL"
        self.url = url
        return url

    def stop(self) -> None:
        if self.holder is None:
            return
        holder, self.holder = self.holder, None
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)

    def crash(self) -> None:
        """Stop the server as a crash would: an immediate shutdown (SIGQUIT to the
        postmaster), nothing flushed that was not already; the next start recovers
        from the WAL."""
        pid = int((pgdata_path(self.data_dir) / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists():
            assert time.monotonic() < deadline, "the server did not stop"
            time.sleep(0.01)
        self.stop()
