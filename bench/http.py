"""The webhook path, measured: ``POST /hooks/{token}`` over real HTTP, on one database.

::

    python -m bench.http                  # embedded PostgreSQL 18 (or TIDEGATE_DATABASE_URL)
    python -m bench.http --database-url postgresql://postgres@127.0.0.1:5432/test
    python -m bench.http --smoke          # a few requests of each part: checks, not figures
    python -m bench.http --write-docs     # measure, then rewrite the figures in docs/benchmarks.md

Every part runs on a fresh schema with its own processes, started as a user would start
them: ``python -m tidegate serve --role api`` (``--api-processes N``) and ``python -m
tidegate worker --app tidegate.builtin:app --workloops "fast_lane:4 manual>*:4"``, with
tidegate's default settings. The client is this process: httpx over loopback TCP,
keep-alive connections opened before the clock starts. Each part is repeated
``--repeat`` times (default 3); a figure is the median of the repetitions, min and max.

1. ``sync``: a sync trigger running ``tidegate.echo``, one API process. (a) Open loop at
   ``--rate`` (100 req/s) for 10 s: requests leave on a fixed schedule whether or not
   earlier ones were answered; p50/p95/p99 of the time the caller waits, the replies
   slower than the send interval, and the time split into stages from the run's own
   timestamps. ``GET /healthz`` at the same rate is the HTTP floor. (b) A burst of 200
   requests at once (project cap 200): every status, and the wait of the 200s. (c) The
   control: (a) and the floor again with a minimal HTTP/1.1 client (``PlainClient``), to
   tell the client's cost from the server's on two shared cores.
2. ``admission``: the ``admit_webhook`` statement that the API runs, called directly with
   psycopg on one connection, paced, in the fast lane (cap 10, live worker) and the
   default lane: p50/p99 of the call as the client sees it (round trip and commit
   included); then the same calls rolled back (the decision alone: no commit, no
   NOTIFY); beside them ``SELECT 1`` and the trigger lookup. ``cap``: a burst of 200
   clients on 3 API processes against a project capped at 3 fast-lane runs whose
   handler sleeps 0.2 s; each client retries on 429/503 for 6 s. Over-admission is read
   from the runs table: the most fast-lane runs running at once (``attempted_at`` to
   ``completed_at``), and the most in flight seen by a sampler polling every 5 ms.
3. ``ingest``: accepted (202, durable) webhooks per second on 2 API processes, driven by
   ``--ingest-clients`` (16) concurrent httpx clients sending ``--ingest-requests``
   (5,000) in all, no worker running; beside it, in the same repetition and on
   tidegate's own tables, the raw-SQL floor: the same request row and run row per
   webhook, one transaction each, two single-row INSERTs, from as many connections. The
   control: the same ingest from as many minimal HTTP/1.1 clients.

Nothing counts unless the database agrees: every accepted webhook must have its run and
its request row (and a sync reply its succeeded run and the echo of its body), and a
rejected one nothing. Results go to ``bench/results/http-latest.json`` and
``bench/results/http-postgres<major>[-embedded].json``; ``--write-docs`` renders every
``http-postgres*.json`` into ``docs/benchmarks.md`` between its ``bench:http`` markers.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "http":  # pragma: no cover - only with bench/ itself on sys.path
    # ``python bench/<script>.py`` puts bench/ first on sys.path, where this file stands
    # in for the standard library's ``http`` package (httpx, urllib.request and uvicorn
    # import it): be that package too, its code and its submodules, then import the
    # rest of this file as usual.
    import sysconfig

    __path__ = [str(Path(sysconfig.get_paths()["stdlib"], "http"))]
    _stdlib_http = Path(__path__[0], "__init__.py")
    exec(compile(_stdlib_http.read_text(), str(_stdlib_http), "exec"))
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import importlib.util

if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
    # httpcore imports sniffio inside a function it calls several times per request, and
    # falls back to asyncio when it is missing (anyio >= 4.11 no longer installs it).
    # Python does not remember a failed import, so each call searched sys.path again:
    # ~14% of this client's CPU (encode/httpcore#1103). ``None`` in sys.modules makes the
    # import fail at once, with the same outcome.
    sys.modules["sniffio"] = None  # type: ignore[assignment]

import argparse
import asyncio
import collections
import dataclasses
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import psycopg

from bench.harness import (
    DOCS,
    EMBEDDED_DATA_DIR,
    RESULTS,
    ROOT,
    BenchError,
    WorkerProcess,
    child_env,
    close_record,
    fresh_schema,
    new_record,
    paced,
    percentiles,
    python_module,
    redact,
    schema_conninfo,
    spread,
    start_run,
    write_between,
    write_results,
)
from tidegate import Settings, Tidegate
from tidegate.storage.sql import query

T = TypeVar("T")

WORKER_READY = " started: "
"""What tidegate's worker logs once it listens and its workloops claim."""

ADMIN_TOKEN = "tga_bench-http-super-admin"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
JSON_HEADERS = {"content-type": "application/json"}
WORKLOOPS = "fast_lane:4 manual>*:4"
WORKER_APP = "tidegate.builtin:app"
START_SECONDS = 60.0
HTTP_TIMEOUT_SECONDS = 60.0
SAMPLER_INTERVAL_SECONDS = 0.005

# What ``admit_webhook`` is given besides the webhook, as the API would with tidegate's
# defaults (``Settings``: max_attempts 20, fast_lane_cap 10, heartbeat 2 s).
DEFAULT_MAX_ATTEMPTS = 20
DEFAULT_FAST_LANE_CAP = 10
LIVE_SECONDS = 3 * 2.0

AIM_SYNC_P50_MS = 5.0
AIM_SYNC_P99_MS = 15.0
AIM_ADMISSION_P99_MS = 3.0

STAGES = ("send", "admit", "run", "reply")
"""Stages of a sync round trip, from the client's clock and the run's timestamps: send
(client send to the admission transaction's start: HTTP in, trigger lookup, body, pool),
admit (admission transaction start to claim start: admission, commit, NOTIFY, worker
wake-up), run (claim start to completion start: claim, commit, the handler, the
completer's batch), reply (completion start to the reply in the client: completion write
and commit, NOTIFY to the API, reading the run, the HTTP reply)."""


# -- options ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """What to measure; the defaults are the published benchmark."""

    rate: float = 100.0
    steady_seconds: float = 10.0
    floor_requests: int = 300
    warmup_requests: int = 50
    burst: int = 200
    admission_calls: int = 500
    admission_interval_ms: float = 5.0
    admission_cap: int = DEFAULT_FAST_LANE_CAP
    cap: int = 3
    cap_clients: int = 200
    cap_api_processes: int = 3
    cap_sleep_seconds: float = 0.2
    cap_seconds: float = 6.0
    ingest_requests: int = 5000
    ingest_clients: int = 16
    ingest_api_processes: int = 2
    repeat: int = 3
    smoke: bool = False


SMOKE = Options(
    steady_seconds=0.3,
    floor_requests=20,
    warmup_requests=10,
    burst=20,
    admission_calls=30,
    cap_clients=20,
    cap_api_processes=2,
    cap_sleep_seconds=0.05,
    cap_seconds=1.0,
    ingest_requests=200,
    ingest_clients=4,
    repeat=1,
    smoke=True,
)


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
                # Serving: ready, or waiting only for the workers the benchmark starts next.
                ready = answer.status_code == 200 or answer.json().get("title") == "no live worker"
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
    try:
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


# -- HTTP ----------------------------------------------------------------------------------


@dataclass
class Reply:
    """One request as the client saw it."""

    k: int
    scheduled: float  # perf_counter: when it was due to leave (open loop), else sent
    sent: float  # perf_counter, just before the send
    done: float  # perf_counter, once the whole reply was in
    sent_at: float  # time.time() at ``sent``: compared with the database's timestamps
    replied_at: float  # time.time() at ``done``
    status: int
    title: str | None = None
    run_id: int | None = None
    body_ok: bool = False

    @property
    def wait_ms(self) -> float:
        return (self.done - self.sent) * 1000


def new_client(base: str, **options: Any) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(base_url=base, limits=limits, timeout=HTTP_TIMEOUT_SECONDS, **options)


Expect = Callable[[int, Any], bool]
"""Does a reply's status and JSON body check out?"""
Send = Callable[[int, float | None], Awaitable["Reply"]]
"""Send request number ``k``, due at ``scheduled`` (perf_counter), and time it."""


async def post(
    client: httpx.AsyncClient,
    path: str,
    k: int,
    payload: dict[str, Any],
    scheduled: float | None = None,
    expect: Expect | None = None,
) -> Reply:
    """POST ``payload`` as JSON; time the wait; read status, run id and problem title."""
    content = json.dumps(payload).encode()
    sent_at, sent = time.time(), time.perf_counter()
    try:
        response = await client.post(path, content=content, headers=JSON_HEADERS)
    except httpx.HTTPError as error:
        done = time.perf_counter()
        return Reply(k, scheduled or sent, sent, done, sent_at, time.time(), -1, repr(error))
    done, replied_at = time.perf_counter(), time.time()
    reply = Reply(k, scheduled or sent, sent, done, sent_at, replied_at, response.status_code)
    _read_reply(reply, response.headers, response.content, expect)
    return reply


def _read_reply(
    reply: Reply, headers: Mapping[str, str], content: bytes, expect: Expect | None
) -> None:
    """Fill in the run id (``Location``), the problem title, and whether the body is right."""
    location = headers.get("location", "")
    if location.startswith("/runs/"):
        reply.run_id = int(location.rsplit("/", 1)[1])
    if headers.get("content-type", "").startswith("application/problem+json"):
        reply.title = str(json.loads(content).get("title"))
    elif expect is not None:
        reply.body_ok = expect(reply.status, json.loads(content))


def echoes(payload: dict[str, Any]) -> Expect:
    """A sync reply of ``tidegate.echo`` must be ``{"echo": <the body sent>}``."""
    return lambda status, body: status == 200 and body == {"echo": payload}


def accepted(status: int, body: Any) -> bool:
    """An async webhook's 202 names its run and where to look at it."""
    return status == 202 and body.get("status_url") == f"/runs/{body.get('run_id')}"


async def get_health(client: httpx.AsyncClient, k: int, scheduled: float | None) -> Reply:
    sent_at, sent = time.time(), time.perf_counter()
    response = await client.get("/healthz")
    done = time.perf_counter()
    return Reply(k, scheduled or sent, sent, done, sent_at, time.time(), response.status_code)


def httpx_webhooks(
    client: httpx.AsyncClient, path: str, payload: Callable[[int], dict[str, Any]]
) -> Send:
    """Sync webhooks of ``tidegate.echo`` through httpx."""

    def send(k: int, scheduled: float | None) -> Awaitable[Reply]:
        body = payload(k)
        return post(client, path, k, body, scheduled, expect=echoes(body))

    return send


def httpx_health(client: httpx.AsyncClient) -> Send:
    return lambda k, scheduled: get_health(client, k, scheduled)


async def open_loop(send: Send, count: int, rate: float) -> list[Reply]:
    """Send ``count`` requests at ``rate`` per second on a fixed schedule (open loop)."""
    interval = 1 / rate
    start = time.perf_counter() + 0.01
    tasks: list[asyncio.Task[Reply]] = []
    for k in range(count):
        scheduled = start + k * interval
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(k, scheduled)))  # type: ignore[arg-type]
    return list(await asyncio.gather(*tasks))


class PlainClient:
    """A minimal HTTP/1.1 client on one keep-alive connection (asyncio streams).

    The control beside httpx: what the server does when the client costs next to
    nothing. It sends a request and reads a response with a Content-Length, which is all
    uvicorn sends for these requests; any failure closes the connection and is reported
    as status -1, like a failed httpx request.
    """

    def __init__(self, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.host = host
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, base: str) -> PlainClient:
        host = base.split("://", 1)[1]
        name, port = host.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(name, int(port))
        return cls(host, reader, writer)

    async def request(
        self,
        method: str,
        path: str,
        k: int,
        payload: dict[str, Any] | None = None,
        scheduled: float | None = None,
        expect: Expect | None = None,
    ) -> Reply:
        body = b"" if payload is None else json.dumps(payload).encode()
        head = f"{method} {path} HTTP/1.1\r\nhost: {self.host}\r\n"
        if payload is not None:
            head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        sent_at, sent = time.time(), time.perf_counter()
        try:
            self.writer.write(head.encode() + b"\r\n" + body)
            raw = await self.reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            headers = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(":") for line in lines[1:] if line)
            }
            content = await self.reader.readexactly(int(headers["content-length"]))
        except (OSError, asyncio.IncompleteReadError, KeyError, ValueError) as error:
            self.close()
            done = time.perf_counter()
            return Reply(k, scheduled or sent, sent, done, sent_at, time.time(), -1, repr(error))
        done, replied_at = time.perf_counter(), time.time()
        status = int(lines[0].split()[1])
        reply = Reply(k, scheduled or sent, sent, done, sent_at, replied_at, status)
        _read_reply(reply, headers, content, expect)
        return reply

    @property
    def usable(self) -> bool:
        """Still open: the server has not closed it (uvicorn closes idle ones after 5 s)."""
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


class PlainPool:
    """Plain connections for an open loop: an idle one if there is one, else a new one."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.idle: list[PlainClient] = []

    async def acquire(self) -> PlainClient:
        while self.idle:
            client = self.idle.pop()
            if client.usable:
                return client
            client.close()
        return await PlainClient.open(self.base)

    def release(self, client: PlainClient) -> None:
        if client.usable:
            self.idle.append(client)

    async def fill(self, count: int) -> None:
        """Open ``count`` connections ahead of the clock."""
        opened = [await self.acquire() for _ in range(count)]
        for client in opened:
            self.release(client)

    def close(self) -> None:
        for client in self.idle:
            client.close()
        self.idle.clear()

    def sender(
        self, method: str, path: str, payload: Callable[[int], dict[str, Any]] | None = None
    ) -> Send:
        """Requests on pooled connections; a POST of ``tidegate.echo`` must echo its body."""

        async def send(k: int, scheduled: float | None) -> Reply:
            client = await self.acquire()
            body = payload(k) if payload is not None else None
            expect = echoes(body) if body is not None else None
            reply = await client.request(method, path, k, body, scheduled, expect)
            self.release(client)
            return reply

        return send


async def open_connections(client: httpx.AsyncClient, count: int) -> None:
    """Open ``count`` keep-alive connections (``count`` concurrent ``GET /healthz``)."""
    responses = await asyncio.gather(*(client.get("/healthz") for _ in range(count)))
    if any(r.status_code != 200 for r in responses):
        raise BenchError("GET /healthz failed while opening connections")


async def create_trigger(
    client: httpx.AsyncClient, project: str, name: str, mode: str, task: str, **limits: Any
) -> dict[str, Any]:
    """Create a project (if needed) and a trigger through the admin API."""
    response = await client.post("/admin/projects", json={"id": project, **limits}, headers=ADMIN)
    if response.status_code not in (201, 409):
        raise BenchError(f"creating project {project}: {response.status_code} {response.text}")
    response = await client.post(
        f"/admin/projects/{project}/triggers",
        json={"name": name, "mode": mode, "task": task},
        headers=ADMIN,
    )
    if response.status_code != 201:
        raise BenchError(f"creating trigger {name}: {response.status_code} {response.text}")
    created: dict[str, Any] = response.json()
    return created


def run_async(coroutine: Awaitable[T]) -> T:
    """Run ``coroutine`` on a fresh event loop (uvloop when installed, as uvicorn's is)."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = None

    async def main() -> T:
        return await coroutine

    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())


# -- reading back what the database holds ----------------------------------------------

RUNS_OF = """
SELECT r.id, r.project, r.lane, r.state::text, r.attempt,
       extract(epoch FROM r.inserted_at)::float8,
       extract(epoch FROM r.attempted_at)::float8,
       extract(epoch FROM r.completed_at)::float8,
       (SELECT count(*) FROM requests q WHERE q.run_id = r.id AND q.project = r.project)
FROM runs r
WHERE r.project = %s
"""


@dataclass(frozen=True)
class RunRow:
    id: int
    project: str
    lane: str
    state: str
    attempt: int
    inserted_at: float
    attempted_at: float | None
    completed_at: float | None
    requests: int


def runs_of(conn: psycopg.Connection, project: str) -> dict[int, RunRow]:
    return {row[0]: RunRow(*row) for row in conn.execute(RUNS_OF, [project]).fetchall()}


def check_replies(
    conn: psycopg.Connection, project: str, replies: Sequence[Reply], *, sync: bool
) -> dict[str, Any]:
    """Hold the replies against the project's runs; return the verdict and the runs.

    Every admitted webhook must have its run, in the lane of its trigger's mode, and
    exactly one request row, and the project no other run: a rejected request (429,
    503) left nothing behind. Async: admitted is 202 with a body naming the run. Sync:
    200 with the handler's reply, whose run succeeded in one attempt; or 202 after the
    trigger's sync timeout, whose run exists (it was still going).
    """
    runs = runs_of(conn, project)
    statuses_ok = (200, 202) if sync else (202,)
    lane = "fast_lane" if sync else "default"
    admitted = [r for r in replies if r.status in statuses_ok]
    problems: list[str] = []
    ids = [r.run_id for r in admitted]
    if len(set(ids)) != len(ids) or None in ids:
        problems.append("admitted replies without a distinct run id")
    for reply in admitted:
        run = runs.get(reply.run_id or -1)
        if run is None:
            problems.append(f"run {reply.run_id} not found")
        elif run.lane != lane or run.requests != 1:
            problems.append(f"run {run.id}: lane {run.lane}, {run.requests} request rows")
        elif sync and reply.status == 200 and not (run.state == "succeeded" and run.attempt == 1):
            problems.append(f"run {run.id}: {run.state} after {run.attempt} attempts")
        elif (not sync or reply.status == 200) and not reply.body_ok:
            problems.append(f"run {run.id}: the reply's body did not check out")
    if len(runs) != len(admitted):
        problems.append(f"{len(runs)} runs in the project for {len(admitted)} admitted replies")
    return {
        "verified": not problems,
        "problems": problems[:10],
        "admitted": len(admitted),
        "runs": runs,
    }


def statuses(replies: Iterable[Reply]) -> dict[str, int]:
    """Count replies by status (and problem title, for the rejections)."""
    counted = collections.Counter(
        f"{r.status} {r.title}" if r.title else str(r.status) for r in replies
    )
    return dict(sorted(counted.items()))


def ms(values: Iterable[float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in percentiles(list(values)).items()}


# -- part 1 and 2: sync round trip, admission decision ------------------------------------


def measure_sync(url: str, options: Options) -> tuple[dict[str, Any], dict[str, Any]]:
    """One API process and one worker: steady sync load, burst, then admission calls."""
    with fresh_schema(url, "http") as schema:
        migrate(url, schema)
        with start_worker(url, schema) as worker, ApiServer(url, schema, 1) as api:
            meter = CpuMeter(
                {
                    "client": client_group(),
                    "api": api.pids,
                    "worker": lambda: [worker.process.pid],
                    "postgres": server_pids(url),
                }
            )
            http = run_async(_sync_over_http(api.base, options, meter))
            worker.check_alive()
            admission = _admission_calls(url, schema, http.pop("triggers"), options)
            worker.check_alive()
            api.stop()
            worker.stop()
        with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
            sync = _check_sync(conn, http, options)
            admission["verified"] = _check_admission(conn, admission)
    return sync, admission


async def _sync_over_http(base: str, options: Options, meter: CpuMeter) -> dict[str, Any]:
    async with new_client(base) as client:
        made = {
            "warm": await create_trigger(client, "warm", "echo", "sync", "tidegate.echo"),
            "steady": await create_trigger(client, "steady", "echo", "sync", "tidegate.echo"),
            "steady_plain": await create_trigger(
                client, "steady_plain", "echo", "sync", "tidegate.echo"
            ),
            "burst": await create_trigger(
                client, "burst", "echo", "sync", "tidegate.echo", fast_lane_cap=options.burst
            ),
            "admit_sync": await create_trigger(
                client,
                "admit",
                "sync",
                "sync",
                "tidegate.echo",
                fast_lane_cap=options.admission_cap,
            ),
            "admit_async": await create_trigger(client, "admit", "async", "async", "tidegate.echo"),
        }

        def payload(k: int) -> dict[str, Any]:
            return {"k": k, "event": "bench.sync"}

        count = max(1, round(options.rate * options.steady_seconds))
        # httpx: warm-up (connections, prepared statements, the worker's first claims),
        # the HTTP floor, then the measured steady load.
        warm = await open_loop(
            httpx_webhooks(client, made["warm"]["url"], payload),
            options.warmup_requests,
            options.rate,
        )
        await open_loop(httpx_health(client), options.warmup_requests, options.rate)
        floor = await open_loop(httpx_health(client), options.floor_requests, options.rate)
        meter.start()
        steady = await open_loop(
            httpx_webhooks(client, made["steady"]["url"], payload), count, options.rate
        )
        cpu = meter.stop()
        # The control: the same with a minimal client (its own warm-up, on the warm project).
        pool = PlainPool(base)
        try:
            await pool.fill(8)
            warm += await open_loop(
                pool.sender("POST", made["warm"]["url"], payload),
                options.warmup_requests,
                options.rate,
            )
            floor_plain = await open_loop(
                pool.sender("GET", "/healthz"), options.floor_requests, options.rate
            )
            meter.start()
            steady_plain = await open_loop(
                pool.sender("POST", made["steady_plain"]["url"], payload), count, options.rate
            )
            cpu_plain = meter.stop()
        finally:
            pool.close()
        await asyncio.sleep(0.5)  # the burst starts from an idle worker
        await open_connections(client, options.burst)
        started = time.perf_counter()
        burst = await asyncio.gather(
            *(
                post(client, made["burst"]["url"], k, payload(k), expect=echoes(payload(k)))
                for k in range(options.burst)
            )
        )
        burst_seconds = time.perf_counter() - started
    return {
        "triggers": made,
        "warm": warm,
        "floor": floor,
        "steady": steady,
        "steady_cpu": cpu,
        "floor_plain": floor_plain,
        "steady_plain": steady_plain,
        "steady_plain_cpu": cpu_plain,
        "burst": list(burst),
        "burst_seconds": burst_seconds,
    }


def _check_sync(conn: psycopg.Connection, http: dict[str, Any], options: Options) -> dict[str, Any]:
    names = ("warm", "steady", "steady_plain", "burst")
    checks = {name: check_replies(conn, name, http[name], sync=True) for name in names}
    burst: list[Reply] = http["burst"]
    # A rejection (429/503) is an answer, not a failure: it is counted, and it must have
    # stored nothing (check_replies). So is a request that got no HTTP answer (status -1,
    # counted under its error): it must have stored nothing either, or the run count
    # of its project does not match and the check fails.
    problems = [p for c in checks.values() for p in c["problems"]]
    for name in ("steady", "steady_plain"):
        if not any(r.status == 200 for r in http[name]):
            problems.append(f"{name}: no request was answered 200")
    if any(r.status != 200 for name in ("floor", "floor_plain") for r in http[name]):
        problems.append("GET /healthz failed")
    return {
        "verified": all(c["verified"] for c in checks.values()) and not problems,
        "problems": problems[:10],
        "steady": _steady_figures(http["steady"], checks["steady"], http["steady_cpu"], options),
        "floor": {
            "requests": len(http["floor"]),
            "path": "GET /healthz",
            "wait_ms": ms(r.wait_ms for r in http["floor"]),
        },
        "steady_plain": _steady_figures(
            http["steady_plain"], checks["steady_plain"], http["steady_plain_cpu"], options
        ),
        "floor_plain": {
            "requests": len(http["floor_plain"]),
            "path": "GET /healthz",
            "wait_ms": ms(r.wait_ms for r in http["floor_plain"]),
        },
        "burst": {
            "requests": len(burst),
            "fast_lane_cap": options.burst,
            "statuses": statuses(burst),
            "admitted": checks["burst"]["admitted"],
            "wait_ms_admitted": ms(r.wait_ms for r in burst if r.status == 200),
            "wait_ms_all": ms(r.wait_ms for r in burst),
            "seconds": round(http["burst_seconds"], 3),
        },
    }


def _steady_figures(
    replies: list[Reply], check: dict[str, Any], cpu: dict[str, Any], options: Options
) -> dict[str, Any]:
    """The caller's wait at a steady rate, and where it went (from the run's timestamps)."""
    interval_ms = 1000 / options.rate
    ok = [r for r in replies if r.status == 200]
    runs: dict[int, RunRow] = check["runs"]
    stages: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for reply in ok:
        run = runs.get(reply.run_id or -1)
        if run is None or run.attempted_at is None or run.completed_at is None:
            continue
        stages["send"].append((run.inserted_at - reply.sent_at) * 1000)
        stages["admit"].append((run.attempted_at - run.inserted_at) * 1000)
        stages["run"].append((run.completed_at - run.attempted_at) * 1000)
        stages["reply"].append((reply.replied_at - run.completed_at) * 1000)
    lags = [(r.sent - r.scheduled) * 1000 for r in replies]
    sent_span = max(r.sent for r in replies) - min(r.sent for r in replies)
    return {
        "requests": len(replies),
        "rate": options.rate,
        "sent_rate": round((len(replies) - 1) / sent_span, 2) if sent_span else None,
        "statuses": statuses(replies),
        "wait_ms": ms(r.wait_ms for r in ok),
        "from_schedule_ms": ms((r.done - r.scheduled) * 1000 for r in ok),
        "late_replies": sum(1 for r in ok if r.wait_ms > interval_ms),
        "late_reply_threshold_ms": interval_ms,
        "send_lag_ms": ms(lags),
        "late_sends": sum(1 for lag in lags if lag > 2.0),
        "stage_ms": {stage: ms(values) for stage, values in stages.items()},
        "cpu": cpu,
        "verified_runs": check["admitted"],
    }


def _admit_params(
    schema: str, trigger: dict[str, Any], lane: str, k: int, headers: dict[str, str]
) -> dict[str, Any]:
    """The parameters the API passes to ``admit_webhook`` for one webhook (hooks._admit)."""
    payload = {"k": k, "event": "bench.admission"}
    body = json.dumps(payload).encode()
    kept = {**headers, "content-length": str(len(body))}
    return {
        "trigger_id": trigger["id"],
        "project": trigger["project"],
        "lane": lane,
        "task": trigger["task"],
        "key": trigger["project"],
        "args": json.dumps({"body": payload, "headers": kept, "trigger": trigger["name"]}),
        "max_attempts": 1 if lane == "fast_lane" else DEFAULT_MAX_ATTEMPTS,
        "idempotency_key": None,
        "content_type": "application/json",
        "headers": json.dumps(kept),
        "body": body,
        "default_fast_lane_cap": DEFAULT_FAST_LANE_CAP,
        "live_seconds": LIVE_SECONDS,
        "channel": f"{schema}.available",
    }


def request_headers(host: str) -> dict[str, str]:
    """The headers httpx sends and the API keeps (its ``requests.headers``)."""
    return {
        "host": host,
        "accept": "*/*",
        "accept-encoding": "gzip, deflate",
        "connection": "keep-alive",
        "user-agent": f"python-httpx/{httpx.__version__}",
        "content-length": "0",
        "content-type": "application/json",
    }


def _admission_calls(
    url: str, schema: str, triggers: dict[str, Any], options: Options
) -> dict[str, Any]:
    """Time ``admit_webhook`` (and, for scale, ``SELECT 1`` and the trigger lookup)."""
    admit, find = query("admit_webhook"), query("find_trigger")
    headers = request_headers("127.0.0.1:8000")
    interval = options.admission_interval_ms / 1000
    calls = options.admission_calls
    timings: dict[str, list[float]] = {}
    decisions: dict[str, collections.Counter[str]] = {}
    with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:

        def timed(name: str, statement: str, params: Any) -> Any:
            started = time.perf_counter()
            rows = conn.execute(statement, params).fetchall()
            timings.setdefault(name, []).append((time.perf_counter() - started) * 1000)
            return rows

        lanes = {"fast_lane": triggers["admit_sync"], "default": triggers["admit_async"]}
        for lane, trigger in lanes.items():  # warm-up: prepared statements, caches
            for k in paced(20, interval):
                conn.execute(admit, _admit_params(schema, trigger, lane, -1 - k, headers))
        timings.clear()
        token = triggers["admit_sync"]["token"]
        for _ in paced(calls, interval):
            timed("select_1", "SELECT 1", None)
            timed("find_trigger", find, {"token": token})
        for lane, trigger in lanes.items():
            decisions[lane] = collections.Counter()
            for k in paced(calls, interval):
                rows = timed(
                    f"admit_{lane}", admit, _admit_params(schema, trigger, lane, k, headers)
                )
                decisions[lane][rows[0][0]] += 1
        # The decision alone: the same call inside a transaction that is rolled back, so
        # no commit (WAL flush) and no NOTIFY (nobody is woken); it stores nothing.
        for lane, trigger in lanes.items():
            for k in paced(calls, interval):
                with conn.transaction(force_rollback=True):
                    params = _admit_params(schema, trigger, lane, calls + k, headers)
                    timed(f"admit_{lane}_rolled_back", admit, params)
    return {
        "calls": calls,
        "interval_ms": options.admission_interval_ms,
        "fast_lane_cap": options.admission_cap,
        "ms": {name: ms(values) for name, values in timings.items()},
        "decisions": {lane: dict(counted) for lane, counted in decisions.items()},
        "warmup_calls": 20 * len(lanes),
    }


def _check_admission(conn: psycopg.Connection, admission: dict[str, Any]) -> bool:
    """Every admitted call left one run and one request row, and nothing else did."""
    runs = runs_of(conn, "admit")
    admitted = admission["warmup_calls"] + sum(
        counted.get("admitted", 0) for counted in admission["decisions"].values()
    )
    return len(runs) == admitted and all(r.requests == 1 for r in runs.values())


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The most intervals open at once (one ending when another starts: not both)."""
    events = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda event: (event[0], event[1]),
    )
    open_now = most = 0
    for _, change in events:
        open_now += change
        most = max(most, open_now)
    return most


def measure_cap(url: str, options: Options) -> dict[str, Any]:
    """A burst of retrying clients against a capped project on several API processes."""
    with fresh_schema(url, "http") as schema:
        migrate(url, schema)
        with (
            start_worker(url, schema) as worker,
            ApiServer(url, schema, options.cap_api_processes) as api,
        ):
            sampler = InflightSampler(schema_conninfo(url, schema), "capped")
            http = run_async(_cap_over_http(api.base, options, sampler))
            worker.check_alive()
            api.stop()
            worker.stop()
        with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
            replies: list[Reply] = http["replies"]
            check = check_replies(conn, "capped", replies, sync=True)
    runs: dict[int, RunRow] = check["runs"]
    running = [
        (r.attempted_at, r.completed_at)
        for r in runs.values()
        if r.attempted_at is not None and r.completed_at is not None
    ]
    most_running = max_overlap(running)
    most_sampled = max(sampler.counts, default=0)
    admitted = [r for r in replies if r.status in (200, 202)]
    return {
        "verified": check["verified"] and len(running) == len(runs),
        "problems": check["problems"],
        "cap": options.cap,
        "clients": options.cap_clients,
        "api_processes": options.cap_api_processes,
        "handler_sleep_seconds": options.cap_sleep_seconds,
        "seconds": options.cap_seconds,
        "requests": len(replies),
        "statuses": statuses(replies),
        "admitted": len(admitted),
        "clients_admitted": len({r.k for r in admitted}),
        "max_running": most_running,
        "max_inflight_sampled": most_sampled,
        "samples": len(sampler.counts),
        "over_admission": max(0, most_running - options.cap, most_sampled - options.cap),
        "wait_ms_admitted": ms(r.wait_ms for r in admitted),
        "wait_ms_rejected": ms(r.wait_ms for r in replies if r.status in (429, 503)),
    }


class InflightSampler:
    """Poll a project's in-flight fast-lane runs (one consistent snapshot per poll)."""

    def __init__(self, conninfo: str, project: str) -> None:
        self.conninfo = conninfo
        self.project = project
        self.counts: list[int] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            statement = (
                "SELECT count(*) FROM runs WHERE project = %s AND lane = 'fast_lane'"
                " AND state IN ('scheduled', 'available', 'running')"
            )
            while not self.stopping.wait(SAMPLER_INTERVAL_SECONDS):
                row = conn.execute(statement, [self.project]).fetchone()
                self.counts.append(int(row[0]) if row else 0)

    def __enter__(self) -> InflightSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(10)


async def _cap_over_http(base: str, options: Options, sampler: InflightSampler) -> dict[str, Any]:
    async with new_client(base) as client:
        trigger = await create_trigger(
            client, "capped", "sleep", "sync", "tidegate.sleep", fast_lane_cap=options.cap
        )
        await open_connections(client, options.cap_clients)
        replies: list[Reply] = []
        deadline = time.perf_counter() + options.cap_seconds

        async def one_client(k: int) -> None:
            payload = {"seconds": options.cap_sleep_seconds, "client": k}
            while time.perf_counter() < deadline:
                reply = await post(client, trigger["url"], k, payload, expect=slept(payload))
                replies.append(reply)
                if reply.status not in (429, 503):
                    return
                await asyncio.sleep(random.uniform(0.05, 0.15))

        with sampler:
            await asyncio.gather(*(one_client(k) for k in range(options.cap_clients)))
    return {"replies": replies}


def slept(payload: dict[str, Any]) -> Expect:
    return lambda status, body: status == 200 and body == {"slept": payload["seconds"]}


# -- part 3: async ingest, against the raw-SQL floor ------------------------------------------


def measure_ingest(url: str, options: Options, raw_first: bool) -> dict[str, Any]:
    """Both sides of the ingest comparison, in the order given."""
    sides = ("raw", "tidegate") if raw_first else ("tidegate", "raw")
    found = {side: (_ingest_raw if side == "raw" else _ingest_http)(url, options) for side in sides}
    found["ratio"] = found["tidegate"]["rate"] / found["raw"]["rate"]
    found["ratio_plain_client"] = found["tidegate"]["plain_client"]["rate"] / found["raw"]["rate"]
    found["verified"] = found["tidegate"]["verified"] and found["raw"]["verified"]
    found["order"] = list(sides)
    return found


def _ingest_http(url: str, options: Options) -> dict[str, Any]:
    """Async webhooks on ``ingest_api_processes``: httpx clients, then plain ones."""
    with fresh_schema(url, "http") as schema:
        migrate(url, schema)
        with ApiServer(url, schema, options.ingest_api_processes) as api:
            meter = CpuMeter(
                {"client": client_group(), "api": api.pids, "postgres": server_pids(url)}
            )
            http = run_async(_ingest_over_http(api.base, options, meter))
            api.stop()
        with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
            found = {
                client: _ingest_figures(conn, http[client], options)
                for client in ("httpx", "plain")
            }
    return {
        **found["httpx"],
        "verified": found["httpx"]["verified"] and found["plain"]["verified"],
        "plain_client": found["plain"],
    }


def _ingest_figures(
    conn: psycopg.Connection, http: dict[str, Any], options: Options
) -> dict[str, Any]:
    check = check_replies(conn, http["project"], http["warm"] + http["timed"], sync=False)
    timed: list[Reply] = http["timed"]
    ok = [r for r in timed if r.status == 202]
    return {
        "verified": check["verified"],
        "problems": check["problems"],
        "requests": len(timed),
        "accepted": len(ok),
        "statuses": statuses(timed),
        "seconds": round(http["seconds"], 3),
        "rate": len(ok) / http["seconds"],
        "wait_ms": ms(r.wait_ms for r in ok),
        "clients": options.ingest_clients,
        "api_processes": options.ingest_api_processes,
        "cpu": http["cpu"],
    }


async def _ingest_over_http(base: str, options: Options, meter: CpuMeter) -> dict[str, Any]:
    async with new_client(base) as admin:
        triggers = {
            client: await create_trigger(admin, project, "echo", "async", "tidegate.echo")
            for client, project in (("httpx", "ingest"), ("plain", "ingest_plain"))
        }
    found: dict[str, Any] = {}
    httpx_clients = [new_client(base) for _ in range(options.ingest_clients)]
    try:
        senders = [_ingest_httpx(c, triggers["httpx"]["url"]) for c in httpx_clients]
        found["httpx"] = await _drive_ingest(triggers["httpx"], senders, options, meter)
    finally:
        for client in httpx_clients:
            await client.aclose()
    plain = [await PlainClient.open(base) for _ in range(options.ingest_clients)]
    try:
        senders = [_ingest_plain(c, triggers["plain"]["url"]) for c in plain]
        found["plain"] = await _drive_ingest(triggers["plain"], senders, options, meter)
    finally:
        for client in plain:
            client.close()
    return found


def _ingest_httpx(client: httpx.AsyncClient, path: str) -> Send:
    return lambda k, _: post(client, path, k, ingest_payload(k), expect=accepted)


def _ingest_plain(client: PlainClient, path: str) -> Send:
    return lambda k, _: client.request("POST", path, k, ingest_payload(k), expect=accepted)


async def _drive_ingest(
    trigger: dict[str, Any], senders: Sequence[Send], options: Options, meter: CpuMeter
) -> dict[str, Any]:
    """Warm each client's connection, then send ``ingest_requests`` from all at once."""
    warm: list[Reply] = []
    for j, send in enumerate(senders):  # one connection each, statements prepared
        for i in range(5):
            warm.append(await send(-1 - 5 * j - i, None))
    timed: list[Reply] = []
    numbers = iter(range(options.ingest_requests))

    async def drive(send: Send) -> None:
        for k in numbers:
            timed.append(await send(k, None))

    meter.start()
    started = time.perf_counter()
    await asyncio.gather(*(drive(send) for send in senders))
    seconds = time.perf_counter() - started
    cpu = meter.stop()
    return {
        "project": trigger["project"],
        "warm": warm,
        "timed": timed,
        "seconds": seconds,
        "cpu": cpu,
    }


def ingest_payload(i: int) -> dict[str, Any]:
    return {"i": i, "event": "bench.ingest", "data": {"id": f"evt_{i:08d}", "amount": 1234}}


INSERT_RUN = """
INSERT INTO runs (project, lane, key, task, args, max_attempts)
VALUES (%(project)s, 'default', %(project)s, %(task)s, %(args)s::jsonb, %(max_attempts)s)
RETURNING id
"""
INSERT_REQUEST = """
INSERT INTO requests (project, trigger_id, run_id, idempotency_key, content_type, headers, body)
VALUES (%(project)s, %(trigger_id)s, %(run_id)s, NULL, 'application/json', %(headers)s::jsonb,
        %(body)s)
"""


def _ingest_raw(url: str, options: Options) -> dict[str, Any]:
    """The same two rows per webhook, two single-row INSERTs in one transaction each."""
    with fresh_schema(url, "http") as schema:
        migrate(url, schema)
        conninfo = schema_conninfo(url, schema)
        meter = CpuMeter({"client": client_group(), "postgres": server_pids(url)})
        seconds, cpu = run_async(_ingest_raw_async(conninfo, options, meter))
        with psycopg.connect(conninfo, autocommit=True) as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM runs),"
                " (SELECT count(*) FROM requests q JOIN runs r ON r.id = q.run_id),"
                " (SELECT count(DISTINCT args->'body'->>'i') FROM runs)"
            ).fetchone()
    n = options.ingest_requests
    return {
        "verified": row == (n, n, n),
        "problems": [] if row == (n, n, n) else [f"expected {n} runs and requests, found {row}"],
        "requests": n,
        "accepted": n,
        "seconds": round(seconds, 3),
        "rate": n / seconds,
        "clients": options.ingest_clients,
        "cpu": cpu,
    }


async def _ingest_raw_async(
    conninfo: str, options: Options, meter: CpuMeter
) -> tuple[float, dict[str, Any]]:
    headers = request_headers("127.0.0.1:8000")
    connections = [
        await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        for _ in range(options.ingest_clients)
    ]
    numbers = iter(range(options.ingest_requests))

    async def drive(conn: psycopg.AsyncConnection) -> None:
        for i in numbers:
            payload = ingest_payload(i)
            body = json.dumps(payload).encode()
            kept = {**headers, "content-length": str(len(body))}
            args = {"body": payload, "headers": kept, "trigger": "echo"}
            params = {
                "project": "ingest",
                "task": "tidegate.echo",
                "args": json.dumps(args),
                "max_attempts": DEFAULT_MAX_ATTEMPTS,
                "trigger_id": 1,
                "headers": json.dumps(kept),
                "body": body,
            }
            async with conn.transaction():
                cursor = await conn.execute(INSERT_RUN, params)
                row = await cursor.fetchone()
                assert row is not None
                await conn.execute(INSERT_REQUEST, {**params, "run_id": row[0]})

    try:
        meter.start()
        started = time.perf_counter()
        await asyncio.gather(*(drive(conn) for conn in connections))
        seconds = time.perf_counter() - started
        cpu = meter.stop()
    finally:
        for conn in connections:
            await conn.close()
    return seconds, cpu


# -- a run: repetitions, summary ------------------------------------------------------------


def run_benchmark(
    url: str,
    options: Options,
    *,
    embedded: bool = False,
    command: str = "",
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Measure every part ``options.repeat`` times against ``url``; return the results."""
    result = new_record(
        url,
        command,
        embedded,
        options=dataclasses.asdict(options),
        processes={"api": "python -m tidegate serve --role api", "worker": WORKER_APP},
        workloops=WORKLOOPS,
        repetitions=[],
    )
    started = time.monotonic()
    for repetition in range(options.repeat):
        load = [round(x, 2) for x in os.getloadavg()]
        sync, admission = measure_sync(url, options)
        progress(f"#{repetition + 1} sync       {_describe_sync(sync)}")
        progress(f"#{repetition + 1} admission  {_describe_admission(admission)}")
        cap = measure_cap(url, options)
        progress(f"#{repetition + 1} cap        {_describe_cap(cap)}")
        ingest = measure_ingest(url, options, raw_first=repetition % 2 == 1)
        progress(f"#{repetition + 1} ingest     {_describe_ingest(ingest)}")
        result["repetitions"].append(
            {
                "loadavg_at_start": load,
                "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
                "sync": sync,
                "admission": admission,
                "cap": cap,
                "ingest": ingest,
            }
        )
    close_record(result, started, progress)
    result["summary"] = summarize(result["repetitions"])
    result["verified"] = all(
        rep[part]["verified"]
        for rep in result["repetitions"]
        for part in ("sync", "admission", "cap", "ingest")
    )
    return result


def _describe_sync(s: dict[str, Any]) -> str:
    w, b = s["steady"]["wait_ms"], s["burst"]
    return (
        f"{s['steady']['rate']:g} req/s: p50 {w['p50']:.2f} ms, p99 {w['p99']:.2f} ms, "
        f"late {s['steady']['late_replies']}; burst {b['requests']}: {b['statuses']}"
        f"{'' if s['verified'] else ' NOT VERIFIED ' + str(s['problems'])}"
    )


def _describe_admission(a: dict[str, Any]) -> str:
    f, d = a["ms"]["admit_fast_lane"], a["ms"]["admit_default"]
    return (
        f"fast_lane p50 {f['p50']:.2f} p99 {f['p99']:.2f} ms, default p50 {d['p50']:.2f} "
        f"p99 {d['p99']:.2f} ms {a['decisions']}{'' if a['verified'] else ' NOT VERIFIED'}"
    )


def _describe_cap(c: dict[str, Any]) -> str:
    return (
        f"cap {c['cap']}: {c['admitted']} admitted of {c['requests']} ({c['statuses']}), "
        f"max running {c['max_running']}, max in flight sampled {c['max_inflight_sampled']}"
        f"{'' if c['verified'] else ' NOT VERIFIED ' + str(c['problems'])}"
    )


def _describe_ingest(i: dict[str, Any]) -> str:
    return (
        f"tidegate {i['tidegate']['rate']:,.0f}/s ({i['tidegate']['accepted']} verified; "
        f"plain client {i['tidegate']['plain_client']['rate']:,.0f}/s), "
        f"raw {i['raw']['rate']:,.0f}/s, ratio {i['ratio']:.2f}"
        f"{'' if i['verified'] else ' NOT VERIFIED'}"
    )


def _get(sample: dict[str, Any], path: str) -> Any:
    value: Any = sample
    for part in path.split("."):
        value = value[part]
    return value


SUMMARY_FIGURES = (
    "sync.steady.wait_ms.p50",
    "sync.steady.wait_ms.p95",
    "sync.steady.wait_ms.p99",
    "sync.steady.wait_ms.max",
    "sync.steady.from_schedule_ms.p99",
    "sync.steady.late_replies",
    "sync.steady.late_sends",
    "sync.steady.sent_rate",
    "sync.steady.stage_ms.send.p50",
    "sync.steady.stage_ms.admit.p50",
    "sync.steady.stage_ms.run.p50",
    "sync.steady.stage_ms.reply.p50",
    "sync.steady.stage_ms.send.p99",
    "sync.steady.stage_ms.admit.p99",
    "sync.steady.stage_ms.run.p99",
    "sync.steady.stage_ms.reply.p99",
    "sync.floor.wait_ms.p50",
    "sync.floor.wait_ms.p99",
    "sync.steady_plain.wait_ms.p50",
    "sync.steady_plain.wait_ms.p95",
    "sync.steady_plain.wait_ms.p99",
    "sync.steady_plain.late_replies",
    "sync.steady_plain.stage_ms.send.p50",
    "sync.steady_plain.stage_ms.admit.p50",
    "sync.steady_plain.stage_ms.run.p50",
    "sync.steady_plain.stage_ms.reply.p50",
    "sync.floor_plain.wait_ms.p50",
    "sync.floor_plain.wait_ms.p99",
    "sync.burst.admitted",
    "sync.burst.wait_ms_admitted.p50",
    "sync.burst.wait_ms_admitted.p99",
    "sync.burst.wait_ms_all.p50",
    "sync.burst.wait_ms_all.p99",
    "sync.burst.seconds",
    "admission.ms.admit_fast_lane.p50",
    "admission.ms.admit_fast_lane.p99",
    "admission.ms.admit_default.p50",
    "admission.ms.admit_default.p99",
    "admission.ms.admit_fast_lane_rolled_back.p50",
    "admission.ms.admit_fast_lane_rolled_back.p99",
    "admission.ms.admit_default_rolled_back.p50",
    "admission.ms.admit_default_rolled_back.p99",
    "admission.ms.select_1.p50",
    "admission.ms.select_1.p99",
    "admission.ms.find_trigger.p50",
    "admission.ms.find_trigger.p99",
    "cap.admitted",
    "cap.requests",
    "cap.max_running",
    "cap.max_inflight_sampled",
    "cap.over_admission",
    "ingest.tidegate.rate",
    "ingest.raw.rate",
    "ingest.ratio",
    "ingest.tidegate.plain_client.rate",
    "ingest.ratio_plain_client",
    "ingest.tidegate.wait_ms.p50",
    "ingest.tidegate.wait_ms.p99",
)


def summarize(repetitions: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max over the repetitions of every headline figure, and the aims."""
    figures = {}
    for path in SUMMARY_FIGURES:
        values = [_get(rep, path) for rep in repetitions]
        if all(isinstance(v, int | float) for v in values):
            figures[path] = spread(values)
    p50 = figures["sync.steady.wait_ms.p50"]["median"]
    p99 = figures["sync.steady.wait_ms.p99"]["median"]
    admit_p99 = max(
        figures["admission.ms.admit_fast_lane.p99"]["median"],
        figures["admission.ms.admit_default.p99"]["median"],
    )
    over = max(rep["cap"]["over_admission"] for rep in repetitions)
    return {
        "figures": figures,
        "aims": {
            "sync_p50": {"aim": f"<= {AIM_SYNC_P50_MS:g} ms", "met": p50 <= AIM_SYNC_P50_MS},
            "sync_p99": {"aim": f"<= {AIM_SYNC_P99_MS:g} ms", "met": p99 <= AIM_SYNC_P99_MS},
            "admission_p99": {
                "aim": f"<= {AIM_ADMISSION_P99_MS:g} ms",
                "met": admit_p99 <= AIM_ADMISSION_P99_MS,
            },
            "over_admission": {"aim": "0", "met": over == 0, "measured": over},
        },
    }


# -- reporting -------------------------------------------------------------------------------


def _stages(summary: dict[str, Any], prefix: str, percentile: str) -> str:
    found = [summary["figures"].get(f"{prefix}.{stage}.{percentile}") for stage in STAGES]
    return " / ".join("?" if f is None else f"{f['median']:.2f}" for f in found)


def _fig(summary: dict[str, Any], path: str, digits: int = 2) -> str:
    s = summary["figures"].get(path)
    if s is None:
        return "?"
    if s["min"] == s["max"]:
        return f"{s['median']:,.{digits}f}"
    return f"{s['median']:,.{digits}f} ({s['min']:,.{digits}f} - {s['max']:,.{digits}f})"


def _met(summary: dict[str, Any], aim: str) -> str:
    return "yes" if summary["aims"][aim]["met"] else "**no**"


def _joined_statuses(repetitions: list[dict[str, Any]], path: str) -> str:
    parts = []
    for rep in repetitions:
        found = _get(rep, path)
        parts.append(", ".join(f"{n} x {status}" for status, n in found.items()))
    return "; ".join(f"#{i + 1}: {p}" for i, p in enumerate(parts))


def render(result: dict[str, Any]) -> str:
    """Return one run's results as Markdown: where, how, and the tables."""
    server, machine, options = result["server"], result["machine"], result["options"]
    code, summary, reps = result.get("code", {}), result["summary"], result["repetitions"]
    where = "embedded, " if result.get("embedded") else ""
    loads = ", ".join(
        f"{rep['loadavg_at_start'][0]} / {rep['loadavg_at_end'][0]}"
        for rep in result["repetitions"]
    )
    software = (
        f"Python {machine['python']}, psycopg {machine['psycopg']}, httpx {httpx.__version__}, "
        f"tidegate commit {code.get('commit', '?')}"
        + (
            f" plus uncommitted changes in src/tidegate (sha256 {code.get('src_sha256')})"
            if code.get("src_modified")
            else ""
        )
        + (", measured on a copy taken at start (--snapshot)" if code.get("snapshot") else "")
        + (" (**changed during the run**)" if code.get("changed_during_run") else "")
    )
    n_steady = round(options["rate"] * options["steady_seconds"])
    lines = [
        f"#### PostgreSQL {server['version']} ({where}{server['connection']}), {result['date']}",
        "",
        f"- command: `{result['command']}`",
        f"- machine: {machine['cores']} cores, {machine['cpu_model']}, "
        f"{machine['memory_gib']} GiB memory, Linux {machine['kernel']}; 1-min load average "
        f"at start / end of each repetition: {loads}",
        f"- software: {software}",
        f"- server: synchronous_commit={server['settings']['synchronous_commit']}, "
        f"fsync={server['settings']['fsync']}, "
        f"shared_buffers={server['settings']['shared_buffers']}",
        f"- {options['repeat']} repetitions, each part on a fresh schema; median (min - max) "
        f"of the repetitions; every figure verified against the tables: "
        f"{'yes' if result.get('verified') else '**no**'}; the run took "
        f"{result.get('seconds', 0):.0f} s",
        "",
        "| measure | result | aim | met |",
        "| --- | ---: | --- | --- |",
        f"| sync, {options['rate']:g} req/s open loop ({n_steady:,} requests): p50 wait, ms "
        f"| {_fig(summary, 'sync.steady.wait_ms.p50')} | <= {AIM_SYNC_P50_MS:g} ms "
        f"| {_met(summary, 'sync_p50')} |",
        f"| sync, same: p95 wait, ms | {_fig(summary, 'sync.steady.wait_ms.p95')} | | |",
        f"| sync, same: p99 wait, ms | {_fig(summary, 'sync.steady.wait_ms.p99')} "
        f"| <= {AIM_SYNC_P99_MS:g} ms | {_met(summary, 'sync_p99')} |",
        f"| sync, same: max wait, ms | {_fig(summary, 'sync.steady.wait_ms.max')} | | |",
        f"| sync, same: replies slower than the send interval "
        f"({1000 / options['rate']:g} ms) | {_fig(summary, 'sync.steady.late_replies', 0)} "
        "| | |",
        "| sync, same: p50 by stage (send / admit / run / reply), ms | "
        + _stages(summary, "sync.steady.stage_ms", "p50")
        + " | | |",
        "| sync, same: p99 by stage (send / admit / run / reply), ms | "
        + _stages(summary, "sync.steady.stage_ms", "p99")
        + " | | |",
        f"| HTTP floor, GET /healthz at {options['rate']:g} req/s: p50 / p99 wait, ms "
        f"| {_fig(summary, 'sync.floor.wait_ms.p50')} / {_fig(summary, 'sync.floor.wait_ms.p99')}"
        " | | |",
        f"| control, a minimal HTTP/1.1 client instead of httpx, same rate: sync p50 / p95 / "
        f"p99 wait, ms | {_fig(summary, 'sync.steady_plain.wait_ms.p50')} / "
        f"{_fig(summary, 'sync.steady_plain.wait_ms.p95')} / "
        f"{_fig(summary, 'sync.steady_plain.wait_ms.p99')} | | |",
        "| control: p50 by stage (send / admit / run / reply), ms | "
        + _stages(summary, "sync.steady_plain.stage_ms", "p50")
        + " | | |",
        f"| control: GET /healthz p50 / p99 wait, ms "
        f"| {_fig(summary, 'sync.floor_plain.wait_ms.p50')} / "
        f"{_fig(summary, 'sync.floor_plain.wait_ms.p99')} | | |",
        f"| sync burst, {options['burst']} at once (cap {options['burst']}): admitted "
        f"| {_fig(summary, 'sync.burst.admitted', 0)} | | |",
        f"| sync burst: p50 / p99 wait of the admitted, ms "
        f"| {_fig(summary, 'sync.burst.wait_ms_admitted.p50')} / "
        f"{_fig(summary, 'sync.burst.wait_ms_admitted.p99')} | | |",
        f"| sync burst: p50 / p99 wait of every reply, ms "
        f"| {_fig(summary, 'sync.burst.wait_ms_all.p50')} / "
        f"{_fig(summary, 'sync.burst.wait_ms_all.p99')} | | |",
        f"| admit_webhook, fast lane (cap {options['admission_cap']}), "
        f"{options['admission_calls']} calls {options['admission_interval_ms']:g} ms apart: "
        f"p50 / p99, ms | {_fig(summary, 'admission.ms.admit_fast_lane.p50')} / "
        f"{_fig(summary, 'admission.ms.admit_fast_lane.p99')} "
        f"| p99 <= {AIM_ADMISSION_P99_MS:g} ms | {_met(summary, 'admission_p99')} |",
        f"| admit_webhook, default lane (async): p50 / p99, ms "
        f"| {_fig(summary, 'admission.ms.admit_default.p50')} / "
        f"{_fig(summary, 'admission.ms.admit_default.p99')} | | |",
        f"| the decision alone (same calls, rolled back: no commit, no NOTIFY), fast lane: "
        f"p50 / p99, ms | {_fig(summary, 'admission.ms.admit_fast_lane_rolled_back.p50')} / "
        f"{_fig(summary, 'admission.ms.admit_fast_lane_rolled_back.p99')} | | |",
        f"| the decision alone, default lane: p50 / p99, ms "
        f"| {_fig(summary, 'admission.ms.admit_default_rolled_back.p50')} / "
        f"{_fig(summary, 'admission.ms.admit_default_rolled_back.p99')} | | |",
        f"| for scale, same connection: SELECT 1 / find_trigger p50, ms "
        f"| {_fig(summary, 'admission.ms.select_1.p50', 3)} / "
        f"{_fig(summary, 'admission.ms.find_trigger.p50', 3)} | | |",
        f"| cap {options['cap']}, {options['cap_clients']} clients retrying for "
        f"{options['cap_seconds']:g} s, {options['cap_api_processes']} API processes, "
        f"handler sleeps {options['cap_sleep_seconds']:g} s: admitted / requests "
        f"| {_fig(summary, 'cap.admitted', 0)} / {_fig(summary, 'cap.requests', 0)} | | |",
        f"| same: most fast-lane runs running at once (attempted_at..completed_at) / most "
        f"in flight in a 5 ms sampler | {_fig(summary, 'cap.max_running', 0)} / "
        f"{_fig(summary, 'cap.max_inflight_sampled', 0)} | <= {options['cap']} "
        f"| {'yes' if summary['aims']['over_admission']['met'] else '**no**'} "
        f"(over-admission: {summary['aims']['over_admission']['measured']}) |",
        f"| async ingest, {options['ingest_requests']:,} webhooks, "
        f"{options['ingest_clients']} clients, {options['ingest_api_processes']} API "
        f"processes: accepted (202) per s | {_fig(summary, 'ingest.tidegate.rate', 0)} | | |",
        f"| raw SQL, same rows, {options['ingest_clients']} connections: per s "
        f"| {_fig(summary, 'ingest.raw.rate', 0)} | | |",
        f"| tidegate / raw | {_fig(summary, 'ingest.ratio')} | | |",
        f"| control: the same ingest driven by a minimal HTTP/1.1 client instead of httpx: "
        f"accepted (202) per s | {_fig(summary, 'ingest.tidegate.plain_client.rate', 0)} | | |",
        f"| tidegate (minimal client) / raw | {_fig(summary, 'ingest.ratio_plain_client')} | | |",
        "",
        "Statuses, sync at a steady rate: "
        + _joined_statuses(reps, "sync.steady.statuses")
        + ". Statuses, sync burst: "
        + _joined_statuses(reps, "sync.burst.statuses")
        + ".",
        "",
        "Statuses, cap burst: " + _joined_statuses(reps, "cap.statuses") + ".",
        "",
    ]
    return "\n".join(lines)


def write_docs() -> None:
    """Render every ``http-postgres*.json`` between the ``bench:http`` markers of the docs."""
    found = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("http-postgres*.json"))]
    found.sort(key=lambda r: (-r["server"]["major"], not r.get("embedded")))
    write_between(DOCS, "http", "\n".join(render(r) for r in found))


def server_label(result: dict[str, Any]) -> str:
    major = result["server"]["major"]
    return f"http-postgres{major}" + ("-embedded" if result.get("embedded") else "")


# -- the command ----------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.http",
        description="tidegate's webhook path over HTTP: sync round trip, admission, ingest.",
    )
    parser.add_argument(
        "--database-url",
        help="PostgreSQL to measure on (default: TIDEGATE_DATABASE_URL, else an embedded "
        f"PostgreSQL 18 under {EMBEDDED_DATA_DIR.relative_to(ROOT)})",
    )
    default = Options()
    parser.add_argument("--repeat", type=int, default=default.repeat, help="repetitions (3)")
    parser.add_argument("--rate", type=float, default=default.rate, help="sync req/s (100)")
    parser.add_argument("--steady-seconds", type=float, default=default.steady_seconds)
    parser.add_argument("--burst", type=int, default=default.burst, help="sync burst size")
    parser.add_argument("--ingest-requests", type=int, default=default.ingest_requests)
    parser.add_argument("--ingest-clients", type=int, default=default.ingest_clients)
    parser.add_argument(
        "--api-processes",
        type=int,
        default=default.ingest_api_processes,
        help="API processes for the async ingest (2)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a few requests of each part, once: checks only"
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="where to write the JSON (default: bench/results/http-latest.json and "
        "bench/results/http-postgres<major>[-embedded].json; nothing for --smoke)",
    )
    parser.add_argument(
        "--write-docs", action="store_true", help="rewrite the figures in docs/benchmarks.md"
    )
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="measure a copy of src/tidegate taken at start (in this process and every "
        "process it starts), so that edits to the tree during the run cannot mix versions",
    )
    args = parser.parse_args(argv)
    if args.smoke and args.write_docs:
        parser.error("--smoke measures too little to publish; drop --write-docs")
    if min(args.repeat, args.burst, args.ingest_requests, args.ingest_clients) < 1:
        parser.error("--repeat, --burst, --ingest-requests and --ingest-clients must be >= 1")
    if args.api_processes < 1 or args.rate <= 0 or args.steady_seconds <= 0:
        parser.error("--api-processes, --rate and --steady-seconds must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    url, embedded = start_run("bench.http", argv, args.database_url, args.snapshot)
    if args.smoke:
        options = SMOKE
    else:
        options = Options(
            repeat=args.repeat,
            rate=args.rate,
            steady_seconds=args.steady_seconds,
            burst=args.burst,
            ingest_requests=args.ingest_requests,
            ingest_clients=args.ingest_clients,
            ingest_api_processes=args.api_processes,
        )
    command = shlex.join(["python", "-m", "bench.http", *(redact(a) for a in argv)])
    print(f"tidegate webhook benchmark: {command}", file=sys.stderr)
    result = run_benchmark(
        url,
        options,
        embedded=embedded,
        command=command,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(render(result))
    if args.output:
        write_results(result, args.output)
    elif not args.smoke:
        write_results(result, RESULTS / "http-latest.json")
        write_results(result, RESULTS / f"{server_label(result)}.json")
    if args.write_docs:
        write_docs()
        print(f"wrote {DOCS.relative_to(ROOT)}", file=sys.stderr)
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
