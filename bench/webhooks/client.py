"""The benchmark's HTTP clients, and reading back what the database holds."""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg

from bench.harness import (
    BenchError,
    percentiles,
)
from bench.webhooks.common import ADMIN, HTTP_TIMEOUT_SECONDS, JSON_HEADERS, T

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


KEEPALIVE_SECONDS = 2.0
"""How long an idle connection is reused: well inside uvicorn's 5 s keep-alive, or a
request sent as the server closes the connection fails (a ReadError after a client
slept a Retry-After of about 5 s)."""


def new_client(base: str, **options: Any) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=None, max_keepalive_connections=None, keepalive_expiry=KEEPALIVE_SECONDS
    )
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
    """Fill in the run id (``Location``), the problem's detail, and whether the body is right."""
    location = headers.get("location", "")
    if location.startswith("/runs/"):
        reply.run_id = int(location.rsplit("/", 1)[1])
    if headers.get("content-type", "").startswith("application/problem+json"):
        reply.title = str(json.loads(content).get("detail"))
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
