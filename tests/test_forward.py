"""Forwarding: a trigger's webhooks delivered to an HTTP endpoint by ``tidegate.forward``.

A real ``tidegate serve --role api`` admits the webhooks, real ``tidegate worker``
processes forward them, and the endpoint is a real HTTP server in this process
(``Downstream``), which records every request it gets and answers by path.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import Remote, running_worker, wait_until
from tests.http_fixtures import ADMIN, ApiServer, create_project, create_trigger
from tidegate import Discard, Run, RunState, Tidegate, forward
from tidegate.forward import breaker_key_of, retry_after
from tidegate.policies import set_key_policy
from tidegate.signatures import verify

SECRET = "whsec_" + base64.b64encode(b"the forwarding secret, 32 bytes!").decode()
BODY = b'{"order":  7,\n "note": "caf\\u00e9 \xe2\x98\x95"}'
"""Spacing and escapes a re-serialization would change: only the bytes as sent pass."""
PNG = b"\x89PNG\r\n\x1a\n\x00\xff\xfe"
"""A body that is not text."""
BOMB_BYTES = 200 * 1024 * 1024
"""What ``/bomb`` inflates to: its gzip body is about a thousandth of it."""


def gzip_bomb() -> bytes:
    """``BOMB_BYTES`` of ``a``, gzipped (about 200 KB), made a megabyte at a time."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    megabyte = b"a" * 1024 * 1024
    return b"".join(packer.compress(megabyte) for _ in range(BOMB_BYTES // len(megabyte))) + (
        packer.flush()
    )


@dataclass
class Hit:
    path: str
    method: str
    headers: dict[str, str]
    body: bytes
    at: float


class Downstream:
    """An HTTP endpoint on a free port that records requests and answers by path.

    ``/ok`` 201 with a JSON body; ``/fail`` 500; ``/slow`` answers after 5 s;
    ``/busy`` 429 with ``Retry-After: 1`` the first time, then 200; ``/binary`` 200 with
    bytes that are not UTF-8; ``/odd`` 503 with ``Retry-After: ²``; ``/bomb`` 200 with a
    gzip body that inflates to ``BOMB_BYTES``; any other path 404.
    """

    def __init__(self) -> None:
        self.hits: list[Hit] = []
        self.bomb = b""
        downstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                seen = [h for h in downstream.hits if h.path == self.path]
                downstream.hits.append(
                    Hit(
                        self.path,
                        self.command,
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                        time.monotonic(),
                    )
                )
                if self.path == "/ok":
                    self.answer(201, b'{"accepted": true}', {"X-Downstream": "yes"})
                elif self.path == "/fail":
                    self.answer(500, b"broken")
                elif self.path == "/slow":
                    time.sleep(5)
                    self.answer(200, b"late")
                elif self.path == "/busy" and not seen:
                    self.answer(429, b"slow down", {"Retry-After": "1"})
                elif self.path == "/busy":
                    self.answer(200, b"ok now")
                elif self.path == "/binary":
                    self.answer(200, PNG, {"Content-Type": "image/png"})
                elif self.path == "/odd":
                    self.answer(503, b"later", {"Retry-After": "\u00b2"})
                elif self.path == "/bomb":
                    self.answer(200, downstream.bomb, {"Content-Encoding": "gzip"})
                else:
                    self.answer(404, b'{"error": "no such thing"}')

            do_PUT = do_POST

            def answer(
                self, status: int, body: bytes, headers: dict[str, str] | None = None
            ) -> None:
                headers = {"Content-Type": "application/json", **(headers or {})}
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def at(self, path: str) -> list[Hit]:
        return [hit for hit in self.hits if hit.path == path]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    server = Downstream()
    yield server
    server.stop()


@pytest.fixture
def api(start_api: Callable[..., ApiServer]) -> ApiServer:
    return start_api(max_attempts=3)


@pytest.fixture
async def client(api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
        await create_project(client, "acme")
        yield client


def run_of(sql: psycopg.Connection, run_id: int) -> dict[str, Any]:
    cursor = sql.execute(
        "SELECT state, key, attempt, max_attempts, args, result, errors FROM runs WHERE id = %s",
        [run_id],
    )
    row = cursor.fetchone()
    assert row is not None
    return dict(zip([c.name for c in cursor.description or ()], row, strict=True))


async def finished(sql: psycopg.Connection, run_id: int, timeout: float = 30) -> dict[str, Any]:
    await wait_until(
        lambda: run_of(sql, run_id)["state"] in ("succeeded", "discarded", "cancelled"), timeout
    )
    return run_of(sql, run_id)


async def forward_to(
    client: httpx.AsyncClient, url: str, name: str = "orders", **fields: Any
) -> dict[str, Any]:
    return await create_trigger(client, "acme", name, mode="async", forward_url=url, **fields)


async def send(client: httpx.AsyncClient, trigger: dict[str, Any], **headers: str) -> int:
    response = await client.post(
        trigger["url"], content=BODY, headers={"content-type": "application/json", **headers}
    )
    assert response.status_code == 202, response.text
    run_id: int = response.json()["run_id"]
    return run_id


# -- delivery ----------------------------------------------------------------------------


async def test_forward_delivers_the_body_as_received_signed_with_the_listed_headers(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    downstream: Downstream,
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    trigger = await forward_to(
        client,
        downstream.url + "/ok",
        forward_method="PUT",
        forward_headers=["X-Shop"],
        forward_secret=SECRET,
    )
    assert trigger["task"] == "tidegate.forward"
    assert trigger["forward_secret_set"] is True
    assert "forward_secret" not in trigger and SECRET not in json.dumps(trigger)
    assert trigger["breaker_key"] == breaker_key_of(downstream.url)
    start_worker_process("manual>*:2", remote=worker_mode)

    response = await client.post(
        trigger["url"],
        content=BODY,
        headers={
            "content-type": "application/json; charset=utf-8",
            "x-shop": "one",
            "x-private": "not for them",
        },
    )
    assert response.status_code == 202, response.text
    run = await finished(sql, response.json()["run_id"])

    assert run["state"] == "succeeded", run["errors"]
    assert run["result"]["status"] == 201
    assert run["result"]["body"] == '{"accepted": true}'
    assert run["result"]["headers"]["x-downstream"] == "yes"
    assert run["result"]["truncated"] is False
    assert run["key"] == trigger["breaker_key"]
    [hit] = downstream.at("/ok")
    assert hit.method == "PUT"
    assert hit.body == BODY
    assert hit.headers["content-type"] == "application/json; charset=utf-8"
    assert hit.headers["x-shop"] == "one"
    assert "x-private" not in hit.headers
    verify(SECRET, hit.headers, hit.body)
    request_id = sql.execute(
        "SELECT id FROM requests WHERE run_id = %s", [response.json()["run_id"]]
    ).fetchone()
    assert request_id is not None and hit.headers["webhook-id"] == f"req_{request_id[0]}"
    # Nor does any listing or change of the trigger show the secret.
    listed = (await client.get("/admin/projects/acme/triggers", headers=ADMIN)).text
    changed = await client.patch(
        f"/admin/triggers/{trigger['id']}", json={"forward_timeout_seconds": 5}, headers=ADMIN
    )
    assert SECRET not in listed and SECRET not in changed.text
    assert changed.json()["forward_secret_set"] is True


async def test_sync_forward_replies_with_the_endpoints_status_headers_and_body(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    downstream: Downstream,
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    trigger = await create_trigger(
        client, "acme", "quote", mode="sync", forward_url=downstream.url + "/ok"
    )
    start_worker_process("fast_lane:1 manual>*:1", remote=worker_mode)

    response = await client.post(
        trigger["url"], content=BODY, headers={"content-type": "application/json"}
    )

    assert response.status_code == 201, response.text
    assert response.json() == {"accepted": True}
    assert response.headers["x-downstream"] == "yes"
    assert response.headers["content-type"] == "application/json"
    assert downstream.at("/ok")[0].body == BODY
    missing = await create_trigger(
        client, "acme", "gone", mode="sync", forward_url=downstream.url + "/missing"
    )
    refused = await client.post(missing["url"], json={})
    assert refused.status_code == 404
    assert refused.json() == {"error": "no such thing"}
    binary = await create_trigger(
        client, "acme", "image", mode="sync", forward_url=downstream.url + "/binary"
    )
    image = await client.post(binary["url"], json={})
    assert (image.status_code, image.content) == (200, PNG)
    assert image.headers["content-type"] == "image/png"


# -- what the endpoint answers -----------------------------------------------------------


async def test_429_with_retry_after_retries_after_it_without_spending_an_attempt(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    downstream: Downstream,
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    trigger = await forward_to(client, downstream.url + "/busy")
    start_worker_process("manual>*:1", remote=worker_mode)

    run = await finished(sql, await send(client, trigger))

    assert run["state"] == "succeeded" and run["result"]["body"] == "ok now"
    first, second = downstream.at("/busy")
    assert second.at - first.at >= 0.9  # Retry-After: 1, not the 0.05 s backoff
    assert (run["attempt"], run["max_attempts"]) == (2, 4)
    # Seen, and counted for the destination's circuit breaker, but no attempt spent.
    assert [e["error"] for e in run["errors"]] == [
        f"DownstreamFailing: POST {downstream.url}/busy answered 429"
    ]


@pytest.mark.parametrize(
    ("path", "error"), [("/fail", "answered 500"), ("/slow", "no answer within 0.5s")]
)
async def test_5xx_and_timeouts_fail_and_retry_with_backoff_until_discarded(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    downstream: Downstream,
    start_worker_process: Callable[..., Any],
    path: str,
    error: str,
    worker_mode: Remote | None,
) -> None:
    trigger = await forward_to(client, downstream.url + path, forward_timeout_seconds=0.5)
    start_worker_process("manual>*:1", remote=worker_mode)

    run = await finished(sql, await send(client, trigger))

    assert (run["state"], run["attempt"], run["max_attempts"]) == ("discarded", 3, 3)
    assert [e["attempt"] for e in run["errors"]] == [1, 2, 3]
    assert all(error in e["error"] and "ForwardError" in e["error"] for e in run["errors"])
    # The endpoint may record a request it took too long to answer only after the run ended.
    await wait_until(lambda: len(downstream.at(path)) == 3, 10)


async def test_404_is_discarded_at_once_with_the_response_kept(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    downstream: Downstream,
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    trigger = await forward_to(client, downstream.url + "/missing")
    start_worker_process("manual>*:1", remote=worker_mode)

    run = await finished(sql, await send(client, trigger))

    assert (run["state"], run["attempt"], run["max_attempts"]) == ("discarded", 1, 3)
    [entry] = run["errors"]
    assert entry["error"] == f"Discard: POST {downstream.url}/missing answered 404"
    assert entry["details"]["status"] == 404
    assert entry["details"]["body"] == '{"error": "no such thing"}'
    assert len(downstream.at("/missing")) == 1


async def test_a_retry_after_that_is_no_number_nor_date_counts_a_failure_and_backs_off(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    downstream: Downstream,
    start_worker_process: Callable[..., Any],
) -> None:
    """``Retry-After: ²`` (which ``str.isdigit`` takes) is no delay: the 503 is a failure
    of the endpoint like any other, retried with backoff, never the attempt's own error."""
    trigger = await forward_to(client, downstream.url + "/odd")
    start_worker_process("manual>*:1")

    run = await finished(sql, await send(client, trigger))

    assert (run["state"], run["attempt"]) == ("discarded", 3)
    assert [e["error"] for e in run["errors"]] == [
        f"ForwardError: POST {downstream.url}/odd answered 503"
    ] * 3


def peak_memory(pid: int) -> int:
    """The most resident memory process ``pid`` has held so far, in bytes (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def test_a_gzip_bomb_answer_is_decoded_only_as_far_as_is_kept(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    downstream: Downstream,
    start_worker_process: Callable[..., Any],
) -> None:
    """An answer of 200 KB that inflates to 200 MB: the worker decodes the first 64 KiB
    and a byte, keeps them, and its memory does not grow by the bomb's size (it went up
    by 64 MB and more when each piece read was decoded whole)."""
    downstream.bomb = gzip_bomb()
    worker = start_worker_process("manual>*:1")
    warm = await finished(sql, await send(client, await forward_to(client, downstream.url + "/ok")))
    assert warm["state"] == "succeeded"
    before = peak_memory(worker.pid)

    bombed = await forward_to(client, downstream.url + "/bomb", name="bomb")
    run = await finished(sql, await send(client, bombed))

    assert run["state"] == "succeeded", run["errors"]
    result = run["result"]
    assert result["truncated"] is True and result["body"] == "a" * forward.MAX_KEPT_BODY_BYTES
    assert "content-encoding" not in result["headers"]  # the body is kept decoded
    grown = peak_memory(worker.pid) - before
    assert grown < 32 * 1024 * 1024, f"the worker's peak memory grew by {grown >> 20} MB"


# -- configuration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"forward_url": "ftp://example.com/x"}, "http:// or https://"),
        ({"forward_url": "http:///nohost"}, "no host"),
        ({"forward_url": "https://user:pw@example.com/"}, "user or password"),
        ({"forward_url": "https://example.com:99999/"}, "invalid port"),
        ({"forward_url": "https://example.com/" + "a" * 2100}, "2048"),
        ({"forward_url": "https://example.com/", "forward_method": "GET"}, "forward_method"),
        ({"forward_url": "https://example.com/", "forward_secret": "whsec_short"}, "secret"),
        ({"forward_url": "https://example.com/", "forward_headers": ["Host"]}, "passed on"),
        ({"forward_url": "https://example.com/", "forward_headers": ["a b"]}, "header name"),
        ({"forward_url": "https://example.com/", "forward_timeout_seconds": 301}, "timeout"),
        ({"forward_url": "https://example.com/", "task": "echo"}, "tidegate.forward"),
    ],
)
async def test_bad_forward_settings_are_refused_with_422(
    client: httpx.AsyncClient, fields: dict[str, Any], says: str
) -> None:
    response = await client.post(
        "/admin/projects/acme/triggers",
        json={"name": "bad", "mode": "async", **fields},
        headers=ADMIN,
    )
    assert response.status_code == 422, response.text
    assert says in response.text


async def test_a_forward_url_to_a_hook_of_this_tidegate_is_refused_with_422(
    client: httpx.AsyncClient, api: ApiServer
) -> None:
    """Forwarding to a trigger's own hook, another trigger's, or any ``/hooks/`` path on
    this server's address would feed every delivery back in as a new webhook."""
    orders = await create_trigger(client, "acme", "orders", mode="async", task="echo")
    port = api.url.rsplit(":", 1)[1]
    loops = [
        api.url + orders["url"],  # another trigger of this tidegate
        f"http://proxy.example{orders['url']}/",  # the same, by another name
        f"http://localhost:{port}/hooks/tgh_no-such-trigger",  # any hook of this server
        f"http://[::1]:{port}/hooks/x",
    ]
    for url in loops:
        refused = await client.post(
            "/admin/projects/acme/triggers",
            json={"name": "loop", "mode": "async", "forward_url": url},
            headers=ADMIN,
        )
        assert refused.status_code == 422, (url, refused.text)
        assert "would loop" in refused.json()["detail"], refused.text
    itself = await client.patch(
        f"/admin/triggers/{orders['id']}",
        json={"forward_url": api.url + orders["url"]},
        headers=ADMIN,
    )
    assert itself.status_code == 422 and "would loop" in itself.json()["detail"], itself.text
    assert (await client.get("/admin/projects/acme/triggers", headers=ADMIN)).json()[0][
        "forward_url"
    ] is None
    # A hook of another server is only a URL.
    elsewhere = await forward_to(client, "https://other.example/hooks/tgh_theirs", name="out")
    assert elsewhere["forward_url"] == "https://other.example/hooks/tgh_theirs"


async def test_a_trigger_starts_and_stops_forwarding_by_update(
    client: httpx.AsyncClient,
) -> None:
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")
    assert (trigger["forward_url"], trigger["forward_secret_set"]) == (None, False)

    patched = await client.patch(
        f"/admin/triggers/{trigger['id']}",
        json={"forward_url": "https://Example.com/in", "breaker_key": "example"},
        headers=ADMIN,
    )
    assert patched.status_code == 200, patched.text
    assert (patched.json()["task"], patched.json()["breaker_key"]) == (
        "tidegate.forward",
        "example",
    )
    assert patched.json()["forward_method"] == "POST"

    unkeyed = await client.patch(
        f"/admin/triggers/{trigger['id']}", json={"breaker_key": None}, headers=ADMIN
    )
    assert unkeyed.json()["breaker_key"] == "https://example.com:443"
    cleared = await client.patch(
        f"/admin/triggers/{trigger['id']}", json={"forward_url": None}, headers=ADMIN
    )
    assert cleared.status_code == 422  # which task do its webhooks go to now?
    cleared = await client.patch(
        f"/admin/triggers/{trigger['id']}",
        json={"forward_url": None, "task": "echo"},
        headers=ADMIN,
    )
    assert (cleared.json()["forward_url"], cleared.json()["task"]) == (None, "echo")


def test_breaker_key_is_the_destination_with_its_port() -> None:
    assert breaker_key_of("https://API.example.com/a/b?c") == "https://api.example.com:443"
    assert breaker_key_of("http://example.com:8080/x") == "http://example.com:8080"
    assert breaker_key_of("http://[::1]/x") == "http://[::1]:80"


def test_retry_after_reads_seconds_and_dates_within_bounds() -> None:
    assert retry_after("7") == 7.0
    assert retry_after(None) is None and retry_after("soon") is None
    # Strictly: ASCII digits, or one of HTTP's three date forms; anything else is none.
    for odd in (
        "\u00b2",
        "\u0661",
        "1.5",
        "-3",
        "21 Oct 2015 07:28",
        "Wed, 31 Feb 2015 07:28:00 GMT",
    ):
        assert retry_after(odd) is None, odd
    for old in ("Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"):
        assert retry_after(old) == 0.0, old
    assert retry_after("999999") == 3600.0
    in_a_minute = retry_after(formatdate(time.time() + 60, usegmt=True))
    assert in_a_minute is not None and 55 <= in_a_minute <= 60
    assert retry_after(formatdate(time.time() - 60, usegmt=True)) == 0.0


# -- Discard, for any handler --------------------------------------------------------------


async def test_discard_from_a_handler_ends_the_run_at_once_with_its_details(
    app: Tidegate,
) -> None:
    @app.task(name="refused", max_attempts=5)
    async def refused(**_: Any) -> None:
        raise Discard("the other side refused it", details={"status": 422})

    run = app.enqueue("refused")
    async with running_worker(app, "manual>*:1"):
        await wait_until(lambda: app.get_run(run.id).state.finished, 10)  # type: ignore[union-attr]

    done = app.get_run(run.id)
    assert done is not None
    assert (done.state, done.attempt, done.max_attempts) == (RunState.DISCARDED, 1, 5)
    [entry] = done.errors
    assert entry["error"] == "Discard: the other side refused it"
    assert entry["details"] == {"status": 422}


async def test_a_request_that_cannot_be_read_is_sent_again_later_with_no_attempt_spent(
    app: Tidegate, sql: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database or the API (a remote worker's) out of reach is not the endpoint
    failing: the attempt is given back, and its breaker counts nothing."""
    reads: list[int] = []

    async def unreachable(run: Run) -> None:
        reads.append(run.attempt)
        if len(reads) < 3:
            raise psycopg.OperationalError("the server cannot be reached")
        return None  # then it is read: the trigger no longer forwards

    monkeypatch.setattr(forward, "FIND_RETRY_SECONDS", 0.05)
    task = app.tasks[forward.FORWARD_TASK]
    app.tasks[forward.FORWARD_TASK] = replace(task, fn=forward.handler(unreachable))
    app.execute(set_key_policy("default", "k", breaker_failures=1))
    run = app.enqueue(forward.FORWARD_TASK, key="k", max_attempts=1)
    async with running_worker(app, "manual>*:1"):
        await wait_until(lambda: app.get_run(run.id).state.finished, 10)  # type: ignore[union-attr]

    done = app.get_run(run.id)
    assert done is not None and reads == [1, 2, 3]
    assert (done.state, done.attempt, done.max_attempts) == (RunState.DISCARDED, 3, 3)
    assert [e["error"].split(":")[0] for e in done.errors] == ["Discard"]
    assert sql.execute("SELECT count(*) FROM key_breakers").fetchone() == (0,)
