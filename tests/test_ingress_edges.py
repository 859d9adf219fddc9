"""Edges of the ingress hardening over real HTTP: what still got a 5xx or held on.

Each test sends the exact input that a review of the hardened server found answered
with a 5xx or let through, to a real ``tidegate serve --role api``, then checks the
status, that nothing was stored, and that the server answers the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from tests.http_fixtures import (
    ADMIN,
    ApiServer,
    PrivatePostgres,
    assert_problem,
    counts,
    create_project,
    create_trigger,
)
from tidegate import Settings, Tidegate

JSON = {"Content-Type": "application/json"}


async def still_serving(client: httpx.AsyncClient, hook: dict[str, Any] | None = None) -> None:
    """The server answers the next request; a valid webhook is still accepted."""
    assert (await client.get("/healthz")).status_code == 200
    if hook is not None:
        accepted = await client.post(hook["url"], json={"ok": True})
        assert accepted.status_code == 202, accepted.text


@pytest.fixture
async def clients(
    start_api: Callable[..., ApiServer],
) -> AsyncIterator[Callable[..., Any]]:
    """``await clients(**TIDEGATE_options)``: a server so configured, and a client to it."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(**options: Any) -> tuple[ApiServer, httpx.AsyncClient]:
            server = start_api(**options)
            client = await stack.enter_async_context(
                httpx.AsyncClient(base_url=server.url, timeout=20)
            )
            return server, client

        yield start


async def test_a_body_trickled_in_a_byte_at_a_time_is_cut_off_at_the_body_deadline(
    clients: Callable[..., Any], sql: psycopg.Connection
) -> None:
    """Each byte within the read timeout, the whole body never: 408 at the body deadline.

    Before, only the gap between two parts was timed, so a client sending a byte every
    second held the connection for as long as its Content-Length allowed.
    """
    server, client = await clients(read_timeout_seconds=1.0, body_timeout_seconds=2.0)
    await create_project(client, "acme")
    hook = await create_trigger(client, "acme", "orders", mode="async", task="echo")
    address = urlsplit(server.url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    head = (
        f"POST {hook['url']} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
    )
    started = time.monotonic()
    try:
        writer.write(head.encode())
        answer = b""
        while not answer and time.monotonic() - started < 15:
            writer.write(b" ")
            await writer.drain()
            try:
                answer = await asyncio.wait_for(reader.read(65536), 0.4)
            except TimeoutError:
                continue
        took = time.monotonic() - started
        answer += await asyncio.wait_for(reader.read(), 5)  # the rest, up to the close
    finally:
        writer.close()

    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"connection: close" in answer.lower()
    assert b"not all in within 2s" in answer
    assert 1.8 <= took < 4, took
    assert counts(sql) == (0, 0)
    await still_serving(client, hook)


async def test_an_unreachable_database_while_authenticating_gets_503_not_500(
    start_api: Callable[..., ApiServer], settings: Settings, tmp_path: Path
) -> None:
    """The token is looked up before any route runs (in the Guard), outside FastAPI's
    exception handlers: an outage there was a 500 where a route's own query gets 503."""
    database = PrivatePostgres(tmp_path)
    try:
        private = settings.replace(database_url=database.start())
        Tidegate(settings=private).migrate()
        server = start_api(settings=private)
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            await create_project(client, "acme")

            database.stop()
            for method, path, body in [
                ("GET", "/runs", None),
                ("GET", "/admin/projects", None),
                ("POST", "/runs/retry", {"ids": [1]}),
            ]:
                response = await client.request(method, path, json=body, headers=ADMIN)
                assert_problem(response, 503)
                assert int(response.headers["retry-after"]) >= 1
                if body is not None:  # its body was not read
                    assert response.headers["connection"] == "close"
            assert (await client.get("/healthz")).status_code == 200

            database.start()
            deadline = time.monotonic() + 10
            while (response := await client.get("/runs", headers=ADMIN)).status_code != 200:
                assert_problem(response, 503)
                assert time.monotonic() < deadline, "still refused 10 s after the database returned"
                await asyncio.sleep(0.2)
        server.stop()
    finally:
        database.stop()


async def test_runs_nested_as_deep_as_the_setting_allows_stay_readable(
    clients: Callable[..., Any], sql: psycopg.Connection
) -> None:
    """``max_json_depth`` goes up to 512; FastAPI's response serializer (pydantic) stops at
    about 255 levels, so a body admitted under a depth of 300 made every read of its run,
    and of the run listing, a 500."""
    _, client = await clients(max_json_depth=300)
    await create_project(client, "acme")
    hook = await create_trigger(client, "acme", "orders", mode="async", task="echo")
    nested: Any = "bottom"
    for _ in range(299):
        nested = [nested]
    accepted = await client.post(hook["url"], content=json.dumps(nested), headers=JSON)
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]

    shown = await client.get(f"/runs/{run_id}", headers=ADMIN)
    assert shown.status_code == 200, shown.text
    assert shown.json()["args"]["body"] == nested
    listed = await client.get("/runs", headers=ADMIN)
    assert listed.status_code == 200, listed.text
    assert listed.json()[0]["args"]["body"] == nested
    cancelled = await client.post(f"/runs/{run_id}/cancel", headers=ADMIN)
    assert cancelled.status_code == 200, cancelled.text
    retried = await client.post(f"/runs/{run_id}/retry", headers=ADMIN)
    assert retried.status_code == 200, retried.text
    assert retried.json()["args"]["body"] == nested
    assert counts(sql) == (1, 1)
    await still_serving(client, hook)


BAD_REPLIES = {
    "status not a number": {"status": "created"},
    "status below 200": {"status": 99},
    "status above 599": {"status": 1000},
    "status true": {"status": True},
    "headers not an object": {"headers": ["x-a", "b"]},
    "a line break in a value": {"headers": {"x-a": "b\r\nset-cookie: stolen=1"}},
    "a value beyond Latin-1": {"headers": {"x-a": "\u20ac"}},
    "a name that is not a token": {"headers": {"x a": "b"}},
    "a framing field": {"headers": {"content-length": "1"}},
}


async def test_a_handler_reply_http_cannot_carry_gets_502_not_500(
    clients: Callable[..., Any],
    start_worker_process: Callable[..., Any],
    sql: psycopg.Connection,
) -> None:
    """A handler may put what the sender sent into its reply (an echoed header value, a
    status): a reply HTTP cannot carry was a 500 (or a broken connection); it is the
    handler's failure, answered 502 with the run's id."""
    _, client = await clients()
    start_worker_process("fast_lane:1 manual>*:1")
    await create_project(client, "acme")
    hook = await create_trigger(client, "acme", "echo", mode="sync", task="hook_reply_as_sent")

    for case, reply in BAD_REPLIES.items():
        response = await client.post(hook["url"], json={**reply, "body": "hi"})
        problem = assert_problem(response, 502)
        assert problem["detail"] == "the run's reply is not a valid HTTP response", case
        assert "set-cookie" not in response.headers, case
        assert isinstance(problem["run_id"], int), case
    good = await client.post(
        hook["url"], json={"status": 201, "headers": {"x-a": "caf\u00e9"}, "body": "hi"}
    )
    assert good.status_code == 201, good.text
    assert good.headers["x-a"].encode("latin-1") == "caf\u00e9".encode("latin-1")
    assert good.text == "hi"
    # Statuses that carry no content go without the body (with it, the connection broke).
    for status in (204, 205, 304):
        empty = await client.post(hook["url"], json={"status": status, "body": {"a": 1}})
        assert (empty.status_code, empty.content) == (status, b""), status
    assert counts(sql) == (len(BAD_REPLIES) + 4, len(BAD_REPLIES) + 4)
    await still_serving(client)


async def test_nothing_sent_after_a_refused_head_on_the_same_connection_is_run(
    clients: Callable[..., Any], sql: psycopg.Connection
) -> None:
    """A head over the limit and, in the same packet, a request behind it: the first is
    refused (431) and the connection closed; the one behind it must not run either (it
    did: the parser went on to it and started the application on a closing connection)."""
    server, client = await clients(max_head_bytes=1024)
    await create_project(client, "acme")
    hook = await create_trigger(client, "acme", "orders", mode="async", task="echo")
    accepted = await client.post(hook["url"], json={"n": 1})
    run_id = accepted.json()["run_id"]
    too_large = f"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {'a' * 1200}\r\n\r\n"
    behind = (
        f"POST /runs/{run_id}/cancel HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: {ADMIN['Authorization']}\r\nContent-Length: 0\r\n\r\n"
    )
    address = urlsplit(server.url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    try:
        writer.write((too_large + behind).encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()

    assert answer.startswith(b"HTTP/1.1 431"), answer
    assert answer.count(b"HTTP/1.1") == 1, answer
    await asyncio.sleep(0.5)  # time for a request that should not have started
    state = sql.execute("SELECT state FROM runs WHERE id = %s", [run_id]).fetchone()
    assert state == ("available",)
    await still_serving(client, hook)


@pytest.mark.parametrize("name", [".", ".."])
async def test_a_project_or_trigger_named_as_a_dot_segment_is_refused(
    clients: Callable[..., Any], sql: psycopg.Connection, name: str
) -> None:
    """``..`` matched the id pattern, but ``/admin/projects/..`` is a dot segment that
    every HTTP client resolves away: such a project could only be reached as ``%2E%2E``."""
    _, client = await clients()
    response = await client.post("/admin/projects", json={"id": name}, headers=ADMIN)
    assert "must not be" in str(assert_problem(response, 422)["errors"])
    await create_project(client, "acme")
    response = await client.post(
        "/admin/projects/acme/triggers",
        json={"name": name, "mode": "async", "task": "echo"},
        headers=ADMIN,
    )
    assert_problem(response, 422)
    assert [p["id"] for p in (await client.get("/admin/projects", headers=ADMIN)).json()] == [
        "acme"
    ]
    assert counts(sql) == (0, 0)
    await create_project(client, "...")  # not a dot segment
    await still_serving(client)


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/runs/retry", ADMIN, b"413"),  # over max_api_body_bytes
        ("/runs/retry", {}, b"401"),  # no token
    ],
)
async def test_a_client_that_sends_its_whole_body_anyway_still_reads_the_refusal(
    clients: Callable[..., Any], path: str, headers: dict[str, str], status: bytes
) -> None:
    """Refused before its body was read, the connection is closed; a client that writes
    its whole body before it reads (as most do) then met a reset, the kernel's answer to
    unread bytes on a closed socket, and never saw the refusal. The server now shuts its
    side for writing and drops what still comes in, for a moment, before it closes."""
    server, client = await clients()
    body = b"[" + b"1," * 1_000_000 + b"1]"  # 2 MB
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    head += f"Content-Length: {len(body)}\r\n\r\n"
    address = urlsplit(server.url)
    for _ in range(3):
        reader, writer = await asyncio.open_connection(address.hostname, address.port)
        try:
            writer.write(head.encode())
            await writer.drain()
            await asyncio.sleep(0.2)  # the refusal is out, the connection closing
            writer.write(body)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
        assert answer.startswith(b"HTTP/1.1 " + status), answer
    await still_serving(client)


@pytest.mark.parametrize(
    "head",
    [
        "POST /hooks/tgh_no-such-trigger HTTP/1.1",  # 404 before the body is read
        "GET /healthz HTTP/1.1",  # a route that reads no body
    ],
)
async def test_a_body_still_trickling_after_the_answer_does_not_hold_the_connection(
    clients: Callable[..., Any], head: str
) -> None:
    """Answered before its body was all in, uvicorn kept the connection and dropped the
    rest of the body as it came, with no limit in time (each byte cancelled its keep-alive
    timer): a client trickling a large announced body held it for ever."""
    server, client = await clients(read_timeout_seconds=1.0, body_timeout_seconds=2.0)
    address = urlsplit(server.url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    request = (
        f"{head}\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000000\r\n\r\n"
    )
    started = time.monotonic()
    closed_after = None
    try:
        writer.write(request.encode())
        answer = b""
        while time.monotonic() - started < 15:
            try:
                writer.write(b" ")
                await writer.drain()
                chunk = await asyncio.wait_for(reader.read(65536), 0.3)
            except TimeoutError:
                continue
            except ConnectionError:
                chunk = b""
            if not chunk:
                closed_after = time.monotonic() - started
                break
            answer += chunk
    finally:
        writer.close()

    assert answer.startswith(b"HTTP/1.1 "), answer
    assert closed_after is not None and closed_after < 5, closed_after
    await still_serving(client)


UPGRADE = (
    "Upgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (f"POST /runs HTTP/1.1\r\nHost: x\r\n{UPGRADE}Content-Length: 5\r\n\r\n", b"401"),
        (f"GET /healthz HTTP/1.1\r\nHost: x\r\n{UPGRADE}\r\n", b"200"),
    ],
)
async def test_an_upgrade_request_is_answered_as_plain_http(
    clients: Callable[..., Any], request_: str, status: bytes
) -> None:
    """No route speaks WebSocket, yet uvicorn handed an Upgrade request to its WebSocket
    protocol, past every limit and timer of the HTTP one: a POST announcing a body got no
    answer at all, and held its connection (40 s and more)."""
    server, client = await clients()
    address = urlsplit(server.url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    try:
        writer.write(request_.encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(65536), 5)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 " + status), answer
    await still_serving(client)
