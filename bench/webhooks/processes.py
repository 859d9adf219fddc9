"""The processes a part runs (API servers, workers) and the CPU each spends."""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.harness import (
    ROOT,
    BenchError,
    WorkerProcess,
    child_env,
    python_module,
)
from bench.webhooks.common import ADMIN_TOKEN, START_SECONDS, WORKER_APP, WORKER_READY, WORKLOOPS
from tidegate import Settings, Tidegate

# -- processes ---------------------------------------------------------------------------


def migrate(url: str, schema: str) -> None:
    """Bring ``schema`` to tidegate's current version."""
    with Tidegate(settings=Settings(database_url=url, schema=schema)) as app:
        app.migrate()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def descendants(pid: int) -> list[int]:
    """Return ``pid`` and every process below it (from ``/proc``)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{current}/task/{task}/children").read_text().split()
            except OSError:
                continue
            todo.extend(int(child) for child in children)
    return found


def listeners(url: str, schema: str) -> int:
    """Count the API processes on ``schema`` whose completion listener is up."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s",
            [f'LISTEN "{schema}.completed"'],
        ).fetchone()
    return int(row[0]) if row else 0


class ApiServer:
    """``python -m tidegate serve --role api`` on a free port, in a session of its own."""

    def __init__(self, url: str, schema: str, processes: int) -> None:
        self.processes = processes
        self.base = f"http://127.0.0.1:{free_port()}"
        env = child_env(
            TIDEGATE_DATABASE_URL=url, TIDEGATE_SCHEMA=schema, TIDEGATE_ADMIN_TOKEN=ADMIN_TOKEN
        )
        self.log: collections.deque[str] = collections.deque(maxlen=40)
        self.process = subprocess.Popen(
            python_module(
                "tidegate",
                "serve",
                "--role",
                "api",
                "--port",
                self.base.rsplit(":", 1)[1],
                "--api-processes",
                str(processes),
            ),
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: a failed run can reach them all
        )
        self._reader = threading.Thread(target=self._read, name="bench-api-log", daemon=True)
        self._reader.start()
        try:
            self._wait_ready(url, schema)
        except BaseException:
            self.kill()
            raise

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line.rstrip())

    def _fail(self, what: str) -> BenchError:
        return BenchError(f"tidegate serve {what}:\n" + "\n".join(self.log))

    def _wait_ready(self, url: str, schema: str) -> None:
        deadline = time.monotonic() + START_SECONDS
        while True:
            if self.process.poll() is not None:
                self._reader.join(2)
                raise self._fail(f"exited with {self.process.returncode}")
            try:
                answer = httpx.get(self.base + "/readyz", timeout=2)
                # Ready to accept, with or without the workers the benchmark starts next.
                ready = answer.status_code == 200
            except httpx.TransportError:
                ready = False
            if ready and listeners(url, schema) >= self.processes:
                return
            if time.monotonic() > deadline:
                raise self._fail(f"not ready within {START_SECONDS:.0f}s")
            time.sleep(0.1)

    def pids(self) -> list[int]:
        return descendants(self.process.pid)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server and require a clean exit."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise self._fail(f"did not stop within {timeout:.0f}s") from None
        self._reader.join(2)
        if code != 0:
            raise self._fail(f"exited with {code}")

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> ApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()  # a no-op after a clean stop()


def start_worker(url: str, schema: str) -> WorkerProcess:
    env = child_env(TIDEGATE_DATABASE_URL=url, TIDEGATE_SCHEMA=schema)
    argv = python_module("tidegate", "worker", "--app", WORKER_APP, "--workloops", WORKLOOPS)
    worker = WorkerProcess(argv, env, WORKER_READY)
    try:
        worker.wait_ready(START_SECONDS)  # it has written its workers row: admission sees it
    except BaseException:
        worker.kill()
        raise
    return worker


# -- CPU: who spent it -------------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float | None:
    """Return the CPU seconds (user + system) ``pid`` has used, or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def server_pids(url: str) -> Callable[[], list[int]]:
    """Return a function listing the PostgreSQL server's processes (postmaster's children).

    Every backend of the server counts, including other users' on a shared server.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        try:  # read while the backend lives: once the connection closes, it exits
            status = Path(f"/proc/{row[0]}/status").read_text()
            postmaster = int(status.split("PPid:", 1)[1].split()[0])
        except (OSError, IndexError, ValueError):
            return lambda: []  # the server runs where this process cannot see it

    def pids() -> list[int]:
        found = [postmaster]
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                if int(stat[1]) == postmaster:
                    found.append(int(entry))
        return found

    return pids


class CpuMeter:
    """CPU seconds spent by groups of processes between ``start()`` and ``stop()``."""

    def __init__(self, groups: dict[str, Callable[[], Iterable[int]]]) -> None:
        self.groups = groups
        self.before: dict[str, dict[int, float]] = {}
        self.wall = 0.0

    def _read(self) -> dict[str, dict[int, float]]:
        found: dict[str, dict[int, float]] = {}
        for name, pids in self.groups.items():
            found[name] = {}
            for pid in pids():
                cpu = cpu_of(pid)
                if cpu is not None:
                    found[name][pid] = cpu
        return found

    def start(self) -> None:
        self.before = self._read()
        self.wall = time.monotonic()

    def stop(self) -> dict[str, Any]:
        after = self._read()
        wall = time.monotonic() - self.wall
        spent = {
            name: round(sum(cpu - self.before[name].get(pid, 0.0) for pid, cpu in now.items()), 3)
            for name, now in after.items()
        }
        return {"wall_seconds": round(wall, 3), "cpu_seconds": spent}


def client_group() -> Callable[[], list[int]]:
    return lambda: [os.getpid()]
