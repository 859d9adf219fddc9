"""Hostile and malformed input over real HTTP: a clear 4xx, nothing stored, still serving.

Each test sends the exact input a probe of a running server found answered with a 5xx,
stored, or let through, to a real ``tidegate serve --role api``, then checks the status,
that nothing was stored, and that the server answers the next request.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from tests.conftest import wait_until
from tests.http_fixtures import (
    ADMIN,
    ApiServer,
    assert_problem,
    counts,
    create_project,
    create_trigger,
)
from tidegate.api.kernel import ProblemType
from tidegate.signatures import sign

JSON = {"Content-Type": "application/json"}
SECRET = "whsec_" + base64.b64encode(b"a secret of thirty-two bytes!!!!").decode()
READ_TIMEOUT = 1.0


@pytest.fixture
def server(start_api: Callable[..., ApiServer]) -> ApiServer:
    """An API server whose slow-client timeout is short enough for a test."""
    return start_api(read_timeout_seconds=READ_TIMEOUT)


@pytest.fixture
async def client(server: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
        yield client


@pytest.fixture
async def hook(client: httpx.AsyncClient) -> dict[str, Any]:
    await create_project(client, "acme")
    return await create_trigger(client, "acme", "orders", mode="async", task="echo")


async def still_serving(client: httpx.AsyncClient, hook: dict[str, Any] | None = None) -> None:
    """The server answers the next request; a valid webhook is still accepted."""
    assert (await client.get("/healthz")).status_code == 200
    if hook is not None:
        accepted = await client.post(hook["url"], json={"ok": True})
        assert accepted.status_code == 202, accepted.text


async def raw(server: ApiServer, request: bytes, *, pause: float = 0.0) -> tuple[bytes, float]:
    """Send raw bytes on a new connection; return the answer and how long it took.

    ``pause``: then send nothing more for that long, as a slow or stalled client would.
    """
    address = urlsplit(server.url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    started = time.monotonic()
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(65536), 10 + pause)
        return answer, time.monotonic() - started
    finally:
        writer.close()


# -- 1. no body is read before the caller is known; every body has a limit -------------


@pytest.mark.parametrize("path", ["/runs/retry", "/admin/projects"])
async def test_a_caller_without_a_token_is_refused_before_its_body_is_read(
    server: ApiServer, client: httpx.AsyncClient, path: str
) -> None:
    # It announces 300 MB and sends none: the answer must not wait for them.
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    answer, took = await raw(server, (head + "Content-Length: 300000000\r\n\r\n").encode())
    assert answer.startswith(b"HTTP/1.1 401"), answer
    assert b"connection: close" in answer.lower()
    assert took < 2
    bad = f"{head}Authorization: Bearer nope\r\nContent-Length: 300000000\r\n\r\n"
    answer, took = await raw(server, bad.encode())
    assert answer.startswith(b"HTTP/1.1 403"), answer
    # A part of a body, then nothing: answered at once, not once the client gives up.
    answer, took = await raw(server, (head + 'Content-Length: 100\r\n\r\n{"a"').encode())
    assert answer.startswith(b"HTTP/1.1 401"), answer
    assert took < 2
    await still_serving(client)


async def test_an_answer_given_before_the_body_is_in_says_the_connection_ends(
    server: ApiServer, client: httpx.AsyncClient, hook: dict[str, Any]
) -> None:
    # An unknown trigger is answered before its body is read, and the server reads no
    # further: a client that reused the connection would find it closed under its next
    # request, so the answer must say "close".
    head = "POST /hooks/tgh_unknown HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    answer, took = await raw(server, (head + 'Content-Length: 100\r\n\r\n{"a"').encode())
    assert answer.startswith(b"HTTP/1.1 404"), answer
    assert b"connection: close" in answer.lower()
    assert took < 2
    await still_serving(client, hook)


async def test_every_json_route_has_a_body_limit(client: httpx.AsyncClient) -> None:
    big = json.dumps({"ids": list(range(300_000))}).encode()  # about 2 MB
    assert len(big) > 1024 * 1024
    response = await client.post("/runs/retry", content=big, headers={**ADMIN, **JSON})
    assert_problem(response, 413)

    async def streamed() -> AsyncIterator[bytes]:
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    response = await client.post("/runs/retry", content=streamed(), headers={**ADMIN, **JSON})
    assert_problem(response, 413)
    await still_serving(client)


async def test_a_client_that_stalls_is_cut_off(
    server: ApiServer, client: httpx.AsyncClient, hook: dict[str, Any]
) -> None:
    # Half a request head, then nothing.
    answer, took = await raw(server, b"POST /healthz HTTP/1.1\r\nHost: x\r\n", pause=READ_TIMEOUT)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert READ_TIMEOUT * 0.9 <= took < READ_TIMEOUT + 5
    # A whole head announcing a body, and half of the body.
    head = f"POST {hook['url']} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    answer, took = await raw(
        server, (head + 'Content-Length: 100\r\n\r\n{"a": ').encode(), pause=READ_TIMEOUT
    )
    assert answer.startswith(b"HTTP/1.1 408"), answer
    await still_serving(client, hook)


async def test_a_head_too_large_or_with_too_many_fields_gets_431(
    server: ApiServer, client: httpx.AsyncClient, hook: dict[str, Any], sql: psycopg.Connection
) -> None:
    # 40 kB of one header (the limit is 32 kB), sent whole: the server reads it all, so
    # its answer is not lost to a reset. Beyond that it would read no more.
    pad = "x" * 40 * 1024
    head = f"POST {hook['url']} HTTP/1.1\r\nHost: x\r\nX-Pad: {pad}\r\n"
    answer, _ = await raw(server, (head + "Content-Length: 2\r\n\r\n{}").encode())
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    many = {f"X-Field-{i}": "1" for i in range(200)}
    assert_problem(await client.post(hook["url"], json={}, headers=many), 431)
    assert counts(sql) == (0, 0)
    await still_serving(client, hook)


# -- 3, 4. JSON PostgreSQL cannot store, or nested past the limit -----------------------


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"a": "x\\u0000y"}', "NUL"),
        (b'{"a\\u0000": 1}', "NUL"),
        (b'{"a": "\\ud800"}', "lone surrogate"),
        (b'{"a": NaN}', "NaN is not a JSON number"),
        (b'{"a": Infinity}', "Infinity is not a JSON number"),
        (b'{"a": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"a": 1e309}', "out of range"),
        (b'{"a": ' + b"1" * 4301 + b"}", "more than 4300 digits"),
        (b"[" * 300 + b"]" * 300, "nested deeper than 64"),
        (b"[" * 990 + b"]" * 990, "nested deeper than 64"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 64"),
        (b'{"a": "\xff"}', "not UTF-8"),
    ],
)
async def test_a_body_postgresql_cannot_store_gets_400_with_the_reason(
    client: httpx.AsyncClient,
    hook: dict[str, Any],
    sql: psycopg.Connection,
    body: bytes,
    reason: str,
) -> None:
    response = await client.post(hook["url"], content=body, headers=JSON)
    assert reason in assert_problem(response, 400, ProblemType.MALFORMED_JSON)["detail"]
    assert counts(sql) == (0, 0)
    await still_serving(client, hook)


ENCODINGS = ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-be"]
"""Every encoding JSON bytes are read in: UTF-8, and UTF-16 and UTF-32 with a BOM or
without (RFC 4627's detection)."""


async def test_a_body_in_any_encoding_postgresql_cannot_store_gets_the_same_400(
    start_api: Callable[..., ApiServer], sql: psycopg.Connection, tmp_path: Path
) -> None:
    """A NUL or a lone surrogate is refused with a 400 that says so in every encoding,
    never a 422 "outside what the database can store" and a WARNING for the operator."""
    log = tmp_path / "serve.log"
    server = start_api(log=log)
    async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
        await create_project(client, "acme")
        hook = await create_trigger(client, "acme", "orders", mode="async", task="echo")
        for encoding in ENCODINGS:
            for text, reason in [
                ('{"a": "\\u0000"}', "contains a NUL character"),
                ('{"a": "\\ud800"}', "contains a lone surrogate"),
                ('{"\\u0000": 1}', "contains a NUL character"),
            ]:
                body = text.encode(encoding)
                response = await client.post(hook["url"], content=body, headers=JSON)
                title = assert_problem(response, 400, ProblemType.MALFORMED_JSON)["detail"]
                assert reason in title, (encoding, text, title)
        # Unescaped, in UTF-16: the surrogate's own two bytes.
        raw = '{"a": "x"}'.encode("utf-16-le").replace(b"x\x00", b"\x00\xd8")
        response = await client.post(hook["url"], content=raw, headers=JSON)
        assert (
            "lone surrogate" in assert_problem(response, 400, ProblemType.MALFORMED_JSON)["detail"]
        )
        assert counts(sql) == (0, 0)
        accepted = await client.post(
            hook["url"], content='{"caf\u00e9": 1}'.encode("utf-16"), headers=JSON
        )
        assert accepted.status_code == 202, accepted.text
        await still_serving(client, hook)
    text = log.read_text()
    assert "the database refused a value" not in text, text[-3000:]


async def test_a_body_nested_to_the_limit_is_stored_and_always_readable(
    client: httpx.AsyncClient, hook: dict[str, Any]
) -> None:
    deep: Any = "bottom"
    for _ in range(63):  # the body's own depth: 63 + 1 for the object around it = 64
        deep = [deep]
    accepted = await client.post(hook["url"], json={"deep": deep})
    assert accepted.status_code == 202, accepted.text
    run_id = accepted.json()["run_id"]
    shown = await client.get(f"/runs/{run_id}", headers=ADMIN)
    assert shown.status_code == 200 and shown.json()["args"]["body"] == {"deep": deep}
    listed = await client.get("/runs", headers=ADMIN)
    assert listed.status_code == 200 and listed.json()[0]["id"] == run_id
    await client.post(f"/runs/{run_id}/cancel", headers=ADMIN)
    retried = await client.post(f"/runs/{run_id}/retry", headers=ADMIN)
    assert retried.status_code == 200, retried.text


# -- 5, 6. parameters and numbers out of their bounds -----------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/hooks/%00", {}, 400),
        ("GET", "/runs?project=%00", None, 400),
        ("GET", "/runs?task=a%00b", None, 400),
        ("GET", "/admin/projects/%00", None, 400),
        ("PUT", "/admin/lanes/%00/keys/k", {"max_running": 1}, 400),
        ("PUT", "/admin/lanes/default/keys/k%00", {"max_running": 1}, 400),
        (
            "POST",
            "/admin/projects/acme/triggers",
            {"name": "t", "mode": "async", "task": "a\0"},
            422,
        ),
        ("POST", "/admin/projects", {"id": "big", "fast_lane_cap": 2**31}, 422),
        ("POST", "/admin/projects", {"id": "big", "backlog_cap": 2**31}, 422),
        ("POST", "/admin/projects", {"id": "big", "ingest_burst": 2**40}, 422),
        ("POST", "/admin/projects", {"id": "slow", "ingest_rate": 1e-320}, 422),
        ("POST", "/admin/projects", {"id": "default"}, 409),
        ("PATCH", "/admin/projects/acme", {"concurrency": 2**31}, 422),
        ("PUT", "/admin/lanes/default/keys/k", {"rate": 1e-20}, 422),
        ("PUT", "/admin/lanes/default/keys/k", {"weight": 1e-320}, 422),
        ("PUT", "/admin/lanes/default/keys/k", {"max_running": 2**31}, 422),
        ("PUT", "/admin/lanes/default/keys/" + "k" * 10_000, {"max_running": 1}, 422),
        ("PUT", "/admin/lanes/" + "l" * 10_000 + "/keys/k", {"max_running": 1}, 422),
        ("PUT", "/admin/lanes/default/keys/k", {"max_runing": 1}, 422),
        ("POST", "/runs/retry", {"ids": [2**63]}, 422),
        ("GET", f"/runs/{2**63}", None, 422),
        ("PATCH", f"/admin/triggers/{2**63}", {"enabled": False}, 422),
    ],
)
async def test_a_parameter_out_of_its_bounds_gets_a_4xx_never_a_5xx(
    client: httpx.AsyncClient,
    hook: dict[str, Any],
    sql: psycopg.Connection,
    method: str,
    path: str,
    body: Any,
    status: int,
) -> None:
    response = await client.request(method, path, json=body, headers=ADMIN)
    assert_problem(response, status)
    assert sql.execute("SELECT count(*) FROM key_policies").fetchone() == (0,)
    assert sql.execute("SELECT id FROM projects").fetchall() == [("acme",)]
    assert sql.execute("SELECT count(*) FROM triggers").fetchone() == (1,)
    await still_serving(client, hook)


async def test_an_infinite_ingest_rate_is_refused(
    client: httpx.AsyncClient, hook: dict[str, Any], sql: psycopg.Connection
) -> None:
    # JSON itself can carry 1e999, which a lenient parser reads as infinity.
    response = await client.patch(
        "/admin/projects/acme", content=b'{"ingest_rate": 1e999}', headers={**ADMIN, **JSON}
    )
    assert_problem(response, 422)
    assert sql.execute("SELECT ingest_rate FROM projects").fetchone() == (None,)
    await still_serving(client, hook)


# -- 7, 9, 10. signatures ---------------------------------------------------------------


def signed(body: bytes, webhook_id: str) -> dict[str, str]:
    """Headers of a request signed now with ``SECRET``, as a Standard Webhooks sender sends."""
    sent_at = int(time.time())
    return {
        **JSON,
        "webhook-id": webhook_id,
        "webhook-timestamp": str(sent_at),
        "webhook-signature": sign(SECRET, webhook_id, sent_at, body),
    }


async def test_a_captured_signed_webhook_cannot_be_replayed_with_a_fresh_idempotency_key(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(
        client, "acme", "signed", mode="async", task="echo", secret=SECRET
    )
    body = b'{"order": 1}'
    headers = signed(body, "msg_1")
    first = await client.post(trigger["url"], content=body, headers=headers)
    assert first.status_code == 202, first.text
    again = await client.post(
        trigger["url"], content=body, headers={**headers, "Idempotency-Key": "fresh"}
    )
    assert again.status_code == 202
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["run_id"] == first.json()["run_id"]
    assert counts(sql) == (1, 1)


@pytest.mark.parametrize("timestamp", ["9" * 400, "+1_700_000_000", "-1700000000", "1e9"])
async def test_a_webhook_timestamp_that_is_not_plain_digits_gets_401(
    client: httpx.AsyncClient, sql: psycopg.Connection, timestamp: str
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(
        client, "acme", "signed", mode="async", task="echo", secret=SECRET
    )
    body = b"{}"
    headers = {**signed(body, "msg_1"), "webhook-timestamp": timestamp}
    response = await client.post(trigger["url"], content=body, headers=headers)
    assert "Unix seconds" in assert_problem(response, 401, ProblemType.BAD_SIGNATURE)["detail"]
    assert counts(sql) == (0, 0)
    await still_serving(client)


@pytest.mark.parametrize(
    "secret",
    ["whsec_====", "whsec_not base64!", "whsec_" + base64.b64encode(b"short").decode(), "plain"],
)
async def test_an_invalid_signing_secret_is_refused_when_the_trigger_is_made(
    client: httpx.AsyncClient, sql: psycopg.Connection, secret: str
) -> None:
    await create_project(client, "acme")
    created = await client.post(
        "/admin/projects/acme/triggers",
        json={"name": "t", "mode": "async", "task": "echo", "secret": secret},
        headers=ADMIN,
    )
    assert_problem(created, 422)
    trigger = await create_trigger(client, "acme", "ok", mode="async", task="echo")
    changed = await client.patch(
        f"/admin/triggers/{trigger['id']}", json={"secret": secret}, headers=ADMIN
    )
    assert_problem(changed, 422)
    assert sql.execute("SELECT secret FROM triggers").fetchall() == [(None,)]


# -- 12. idempotency keys are per trigger; the API describes itself ---------------------


async def test_idempotency_keys_of_two_triggers_do_not_collide(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    await create_project(client, "acme")
    one = await create_trigger(client, "acme", "one", mode="async", task="echo")
    two = await create_trigger(client, "acme", "two", mode="async", task="echo")
    same = {"Idempotency-Key": "1"}
    first = await client.post(one["url"], json={"n": 1}, headers=same)
    second = await client.post(two["url"], json={"n": 2}, headers=same)
    assert first.json()["run_id"] != second.json()["run_id"]
    assert "idempotent-replayed" not in second.headers
    assert counts(sql) == (2, 2)


async def test_the_api_documents_its_security_and_serves_its_docs_offline(
    client: httpx.AsyncClient,
) -> None:
    document = (await client.get("/openapi.json")).json()
    schemes = document["components"]["securitySchemes"]
    # Bearer tokens: the admin's or a project's, and (the remote workers') worker tokens.
    assert {name: scheme["scheme"] for name, scheme in schemes.items()} == {
        "HTTPBearer": "bearer",
        "WorkerToken": "bearer",
    }
    assert document["paths"]["/runs/{run_id}"]["get"]["security"] == [{"HTTPBearer": []}]
    assert document["paths"]["/workers"]["post"]["security"] == [{"WorkerToken": []}]
    hook = document["paths"]["/hooks/{token}"]["post"]
    assert hook["requestBody"]["required"] is True
    assert {"400", "401", "404", "413", "415", "429", "503"} <= set(hook["responses"])
    page = (await client.get("/docs")).text
    assets = [part.split('"')[0] for part in page.split('src="')[1:]]
    assert assets and all(asset.startswith("/") for asset in assets), assets  # no CDN
    for asset in assets:
        assert (await client.get(asset)).status_code == 200


# -- the admin token: one rule, kept in the database ------------------------------------


async def test_the_admin_token_survives_restarts_and_rotates_for_running_servers(
    start_api: Callable[..., ApiServer], schema: str, database_url: str
) -> None:
    first = start_api()  # started with TIDEGATE_ADMIN_TOKEN: it is stored
    first.stop()
    # Restarted without TIDEGATE_ADMIN_TOKEN: the stored token still holds.
    second = start_api(admin_token="")
    async with httpx.AsyncClient(base_url=second.url, timeout=20) as client:
        assert (await client.get("/admin/projects", headers=ADMIN)).status_code == 200
        process = await asyncio.create_subprocess_exec(
            *("tidegate", "admin-token", "rotate", "--token", "tga_rotated"),
            env={**os.environ, "TIDEGATE_DATABASE_URL": database_url, "TIDEGATE_SCHEMA": schema},
            stdout=asyncio.subprocess.PIPE,
        )
        assert await process.wait() == 0
        # The running server honours the new token at once, and refuses the old one.
        assert_problem(await client.get("/admin/projects", headers=ADMIN), 403)
        rotated = {"Authorization": "Bearer tga_rotated"}
        assert (await client.get("/admin/projects", headers=rotated)).status_code == 200


async def test_a_client_that_hangs_up_mid_body_costs_one_debug_line_and_no_traceback(
    start_api: Callable[..., ApiServer], sql: psycopg.Connection, tmp_path: Path
) -> None:
    """Half a body, then the connection closed: on an admin route, on the webhook route
    (no token needed) and on the dashboard's sign-in (none either). Each is one DEBUG line
    at most, never an ERROR with a traceback, with which anyone could flood the log."""
    log = tmp_path / "serve.log"
    server = start_api(log=log, verbose=True)
    async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
        await create_project(client, "acme")
        hook = await create_trigger(client, "acme", "orders", mode="async", task="echo")
        address = urlsplit(server.url)
        for path, headers, part in [
            ("/admin/projects", {**JSON, **ADMIN}, b'{"id": "ac'),  # FastAPI reads it: 400
            (hook["url"], JSON, b'{"order": '),
            ("/ui/login", {"Content-Type": "application/x-www-form-urlencoded"}, b"token=tg"),
        ]:
            head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
            request = f"POST {path} HTTP/1.1\r\nHost: x\r\n{head}Content-Length: 1000\r\n\r\n"
            _, writer = await asyncio.open_connection(address.hostname, address.port)
            writer.write(request.encode() + part)
            await writer.drain()
            writer.close()
            await writer.wait_closed()

        def answered(path: str) -> bool:
            text = log.read_text()
            return f"POST {path}: the client went away" in text or "Traceback" in text

        await wait_until(lambda: answered(hook["url"]) and answered("/ui/login"), 10)
        text = log.read_text()
        assert "Traceback" not in text and " ERROR " not in text, text[-3000:]
        assert text.count("the client went away") == 2
        # The webhook is counted, as every answer is, and kept in the webhook log.
        await wait_until(
            lambda: (
                sql.execute("SELECT outcome, status FROM request_log").fetchall()
                == [("disconnected", 499)]
            ),
            10,
        )
        await still_serving(client, hook)
