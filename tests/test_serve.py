"""``tidegate serve`` as a person runs it: what it says, how it keeps its worker, how it stops.

Each test starts the real command as a process and reads its log from stderr; the
newcomer's path runs on an embedded database made in a temporary folder, the others on
the test's database and schema.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import ROOT, wait_until
from tests.http_fixtures import ADMIN, ADMIN_TOKEN, create_project, create_trigger
from tidegate import Settings, Tidegate

START_SECONDS = 60.0
"""An embedded database is made (initdb) on the first start: give it time."""
STOP_SECONDS = 30.0


class Serve:
    """A ``tidegate serve`` process and the lines it has logged so far.

    ``command`` runs tidegate: this environment's by default, another's (an installed
    wheel's ``tidegate``) if given.
    """

    def __init__(
        self,
        *args: str,
        env: dict[str, str],
        cwd: Path,
        command: Sequence[str] = (sys.executable, "-m", "tidegate"),
    ) -> None:
        self.process = subprocess.Popen(
            [*command, *args, "serve", "--port", "0"],
            env=env,
            cwd=cwd,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.ended = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.ended = True
            self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float = START_SECONDS) -> re.Match[str]:
        """Return the first logged line matching ``pattern``, waiting for it if need be."""
        found: list[re.Match[str]] = []

        def seen() -> bool:
            found.extend(m for line in self.lines if (m := re.search(pattern, line)))
            return bool(found) or self.ended

        with self._changed:
            if not self._changed.wait_for(seen, timeout) or not found:
                raise AssertionError(f"no line matching {pattern!r} in:\n" + "\n".join(self.lines))
        return found[0]

    @property
    def url(self) -> str:
        return self.wait_for(r"API: (http://\S+), docs at ")[1]

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Signal serve to stop; return its exit status once it has."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(STOP_SECONDS)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
            self._reader.join(STOP_SECONDS)


@pytest.fixture
def start_serve() -> Iterator[Callable[..., Serve]]:
    """``start_serve(*global_options, env=..., cwd=...)``; each is stopped at the end."""
    started: list[Serve] = []

    def start(*args: str, env: dict[str, str], cwd: Path = ROOT) -> Serve:
        serve = Serve(*args, env=env, cwd=cwd)
        started.append(serve)
        return serve

    yield start
    for serve in started:
        serve.stop()


def environment(**variables: str) -> dict[str, str]:
    """This process's environment without TIDEGATE_* variables, plus ``variables``."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    return {**kept, "PYTHONPATH": str(ROOT), **variables}


def on_test_database(settings: Settings, **variables: str) -> dict[str, str]:
    assert settings.database_url
    return environment(
        TIDEGATE_DATABASE_URL=settings.database_url,
        TIDEGATE_SCHEMA=settings.schema,
        TIDEGATE_ADMIN_TOKEN=ADMIN_TOKEN,
        TIDEGATE_HEARTBEAT_SECONDS="0.5",
        TIDEGATE_LEASE_SECONDS="2",
        **variables,
    )


def tidegate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidegate", *args],
        env=environment(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def live_workers(sql: psycopg.Connection) -> list[int]:
    """The pids of the workers that heartbeated within the last second."""
    rows = sql.execute(
        "SELECT pid FROM workers WHERE heartbeat_at > now() - interval '1 second' ORDER BY pid"
    )
    return [row[0] for row in rows]


def running(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_serve_on_the_embedded_database_says_where_it_is_and_subfolders_find_it(
    tmp_path: Path, start_serve: Callable[..., Serve]
) -> None:
    project = tmp_path / "project"
    (project / "src" / "deep").mkdir(parents=True)
    serve = start_serve(env=environment(TIDEGATE_ADMIN_TOKEN=ADMIN_TOKEN), cwd=project)
    url = serve.url
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
    serve.wait_for(
        rf"INFO tidegate\.serve: database: the embedded PostgreSQL in {project}/\.tidegate, "
        'schema "tidegate"$'
    )
    serve.wait_for(r"INFO tidegate\.serve: API: .*, docs at " + re.escape(url) + "/docs ")
    serve.wait_for(
        r"INFO tidegate\.serve: worker: app tidegate\.builtin:app, workloops "
        r"fast_lane:2 manual>\*:8$"
    )
    serve.wait_for(r"INFO tidegate\.worker: worker \S+ started: workloops fast_lane:2 manual>\*:8")
    assert httpx.get(url + "/docs").status_code == 200

    # From a subfolder, the commands use the database serve made, like git finds .git.
    enqueued = tidegate(
        "enqueue", "tidegate.echo", "--args", '{"body": "hi"}', cwd=project / "src" / "deep"
    )
    assert enqueued.returncode == 0, enqueued.stderr
    run_id = json.loads(enqueued.stdout)["id"]
    shown = tidegate("runs", str(run_id), cwd=project / "src")
    assert json.loads(shown.stdout)["id"] == run_id
    assert not (project / "src" / ".tidegate").exists()
    assert not (project / "src" / "deep" / ".tidegate").exists()
    # From elsewhere, they say there is none, and make none.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    listed = tidegate("runs", cwd=elsewhere)
    assert (listed.returncode, listed.stderr) == (
        1,
        "tidegate: no tidegate database here or in any parent folder; start one with "
        "tidegate serve, or set TIDEGATE_DATABASE_URL\n",
    )
    assert list(elsewhere.iterdir()) == []

    worker = int(serve.wait_for(r"worker \S+:(\d+):\S+ started")[1])
    assert serve.stop() == 0
    assert serve.lines[-1].endswith(
        "INFO tidegate.serve: tidegate serve stopped (the worker exited with status 0)"
    )
    assert not running(worker)


async def test_serve_restarts_a_worker_killed_with_sigkill_then_stops_cleanly(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    start_serve: Callable[..., Serve],
) -> None:
    serve = start_serve("--log-format", "json", env=on_test_database(settings))
    url = serve.url
    await wait_until(lambda: len(live_workers(sql)) == 1, START_SECONDS)
    [first] = live_workers(sql)

    os.kill(first, signal.SIGKILL)

    death = json.loads(serve.wait_for('"level": "ERROR", "logger": "tidegate.serve"').string)
    assert death == {
        "time": death["time"],
        "level": "ERROR",
        "logger": "tidegate.serve",
        "message": f"the worker (pid {first}) was killed by SIGKILL; starting a new one in 1 s",
        "pid": first,
        "exit_status": -signal.SIGKILL,
    }
    await wait_until(lambda: live_workers(sql) not in ([], [first]), 30)
    [second] = live_workers(sql)
    # The new worker runs what the API accepts: a sync webhook gets its reply.
    async with httpx.AsyncClient(base_url=url, timeout=20) as client:
        await create_project(client, "acme")
        trigger = await create_trigger(client, "acme", "quote", mode="sync", task="tidegate.echo")
        response = await client.post(trigger["url"], json={"q": 1})
        assert (await client.get("/readyz")).status_code == 200
    assert (response.status_code, response.json()) == (200, {"echo": {"q": 1}})
    ran = sql.execute("SELECT state, attempt, errors FROM runs").fetchall()
    assert ran == [("succeeded", 1, [])]

    assert serve.stop() == 0
    assert not running(second)
    assert json.loads(serve.lines[-1])["message"] == (
        "tidegate serve stopped (the worker exited with status 0)"
    )


@pytest.mark.parametrize(
    "stop",
    [
        lambda serve: os.killpg(serve.process.pid, signal.SIGINT),  # Ctrl+C in its terminal
        lambda serve: serve.process.send_signal(signal.SIGHUP),  # its terminal closed
    ],
    ids=["ctrl-c", "terminal-closed"],
)
async def test_ctrl_c_or_a_closed_terminal_stops_serve_and_its_worker(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    start_serve: Callable[..., Serve],
    stop: Callable[[Serve], None],
) -> None:
    serve = start_serve(env=on_test_database(settings))
    await wait_until(lambda: len(live_workers(sql)) == 1, START_SECONDS)
    [worker] = live_workers(sql)
    stop(serve)
    assert serve.process.wait(STOP_SECONDS) == 0
    serve.stop()  # reads the rest of its log
    assert not running(worker)
    assert "ERROR" not in "\n".join(serve.lines)  # the worker was stopped, not found dead


def test_serve_stops_when_its_worker_cannot_load_its_app(
    app: Tidegate, settings: Settings, start_serve: Callable[..., Serve]
) -> None:
    serve = start_serve(env=on_test_database(settings, TIDEGATE_APP="no_such_module:app"))
    serve.wait_for(r"ERROR tidegate\.serve: the worker \(pid \d+\) cannot start: exited with ")
    assert serve.stop() == 1
    assert any("No module named 'no_such_module'" in line for line in serve.lines)


def test_a_port_in_use_is_one_line(app: Tidegate, settings: Settings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "tidegate", "serve", "--port", str(port)],
            env=on_test_database(settings),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"tidegate: cannot listen on 127.0.0.1:{port}: address already in use"
    )
    assert "Traceback" not in done.stderr


async def test_access_log_is_one_json_object_per_request(
    app: Tidegate, settings: Settings, start_serve: Callable[..., Serve]
) -> None:
    serve = start_serve(
        "--log-format", "json", env=on_test_database(settings, TIDEGATE_ACCESS_LOG="1")
    )
    async with httpx.AsyncClient(base_url=serve.url) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/admin/projects", headers=ADMIN)).status_code == 200
    line = serve.wait_for(r'"path": "/admin/projects"').string
    entry: dict[str, Any] = json.loads(line)
    assert (entry["logger"], entry["level"], entry["method"], entry["status"]) == (
        "uvicorn.access",
        "INFO",
        "GET",
        200,
    )
    assert entry["message"].endswith('"GET /admin/projects HTTP/1.1" 200')
    for logged in serve.lines:
        json.loads(logged)  # every line is one object


async def test_demo_finishes_while_serve_runs_on_the_same_database(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    start_serve: Callable[..., Serve],
) -> None:
    """serve's worker has none of the demo's tasks: it must leave the demo's runs alone."""
    serve = start_serve(env=on_test_database(settings))
    serve.wait_for(r"tidegate\.worker: worker \S+ started")
    demo = subprocess.run(
        [sys.executable, "-m", "tidegate", "demo", "--runs", "40"],
        env=on_test_database(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert demo.returncode == 0, demo.stderr
    assert "all 40 runs finished" in demo.stdout
    assert "discarded" not in demo.stdout
    assert "UnknownTask" not in demo.stderr + "\n".join(serve.lines)
