"""The dashboard, ``/ui``, on a real ``tidegate serve --role api`` over HTTP.

Sessions and CSRF, the pages' figures against the tables, the buttons (retry, cancel,
replay) against the runs they change, keyset pagination, and the rule that a project's
session sees its own project only, through every page and fragment and by any id.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import psycopg
import pytest

from tests.conftest import running_worker, wait_until
from tests.http_fixtures import ADMIN, ADMIN_TOKEN, ApiServer, create_project, create_trigger
from tidegate import NewRun, Tidegate
from tidegate.runs import BulkAction, RunState, bulk_runs
from tidegate.schedules import create_schedule
from tidegate.signatures import sign

FORM = {"content-type": "application/x-www-form-urlencoded"}


@pytest.fixture
async def client(api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the API (admin calls, webhooks), signed in to nothing."""
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        yield client


class Browser:
    """A signed-in dashboard session: its client (which holds the cookie) and CSRF token."""

    def __init__(self, client: httpx.AsyncClient, csrf: str) -> None:
        self.client = client
        self.csrf = csrf

    async def page(self, path: str, status: int = 200, **headers: str) -> str:
        response = await self.client.get(path, headers=headers)
        assert response.status_code == status, (path, response.status_code, response.text)
        return response.text

    async def post(self, path: str, **fields: str) -> httpx.Response:
        return await self.client.post(path, data={"csrf_token": self.csrf, **fields})


@pytest.fixture
async def sign_in(api: ApiServer) -> AsyncIterator[Callable[..., Any]]:
    clients: list[httpx.AsyncClient] = []

    async def open_session(token: str) -> Browser:
        client = httpx.AsyncClient(base_url=api.url, timeout=20)
        clients.append(client)
        response = await client.post("/ui/login", data={"token": token})
        assert response.status_code == 303, response.text
        page = (await client.get("/ui/runs")).text
        found = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
        assert found, page
        return Browser(client, found.group(1))

    yield open_session
    for client in clients:
        await client.aclose()


def cells(page: str, row_attribute: str, value: str) -> str:
    """The HTML of the table row whose ``row_attribute`` is ``value``."""
    found = re.search(rf'<tr {row_attribute}="{re.escape(value)}"[^>]*>(.*?)</tr>', page, re.S)
    assert found, f"no row {row_attribute}={value!r} in the page"
    return found.group(1)


def attribute_values(page: str, attribute: str) -> list[str]:
    return re.findall(rf'<tr {attribute}="([^"]*)"', page)


def run_state(sql: psycopg.Connection, run_id: int) -> tuple[str, str]:
    row = sql.execute("SELECT state::text, lane FROM runs WHERE id = %s", [run_id]).fetchone()
    assert row is not None
    return row[0], row[1]


# -- sessions ---------------------------------------------------------------------------


async def test_sign_in_sets_a_strict_cookie_and_sign_out_ends_the_session(
    api: ApiServer, sql: psycopg.Connection
) -> None:
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        form = await client.get("/ui/login")
        assert form.status_code == 200
        assert '<form id="login"' in form.text and 'name="token" type="password"' in form.text
        response = await client.post("/ui/login", data={"token": ADMIN_TOKEN})
        assert response.status_code == 303 and response.headers["location"] == "/ui/"
        cookie = response.headers["set-cookie"]
        flags = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/ui"} <= flags
        assert "secure" not in flags  # plain http; over https it is Secure
        session_id = cookie.split(";")[0].split("=", 1)[1]
        # The table holds the id's sha256, never the id itself.
        stored = sql.execute("SELECT id_hash, project FROM ui_sessions").fetchall()
        assert len(stored) == 1 and stored[0][0] != session_id and stored[0][1] is None

        overview = await client.get("/ui/")
        assert overview.status_code == 200
        for label in ("Overview", "Workers", "Projects", "Keys", "Runs", "Sign out"):
            assert label in overview.text
        csrf = re.search(r'name="csrf-token" content="([^"]+)"', overview.text)
        assert csrf
        out = await client.post("/ui/logout", data={"csrf_token": csrf.group(1)})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        assert (
            'tidegate_session=""' in out.headers["set-cookie"]
            or "Max-Age=0" in (out.headers["set-cookie"])
        )
        assert sql.execute("SELECT count(*) FROM ui_sessions").fetchone() == (0,)
    # The old cookie, sent again, is no session.
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as other:
        again = await other.get("/ui/", headers={"Cookie": f"tidegate_session={session_id}"})
        assert again.status_code == 303 and again.headers["location"] == "/ui/login"


async def test_a_wrong_token_gets_401_and_the_form(client: httpx.AsyncClient) -> None:
    for token in ("tga_wrong", "", "x" * 5000):
        response = await client.post("/ui/login", data={"token": token})
        assert response.status_code == 401
        assert '<form id="login"' in response.text and "Unknown token" in response.text
        assert "set-cookie" not in response.headers


async def test_a_post_from_another_origin_is_403_before_anything_happens(
    client: httpx.AsyncClient, sign_in: Any, sql: psycopg.Connection
) -> None:
    other = {"Origin": "https://elsewhere.example"}
    response = await client.post("/ui/login", data={"token": ADMIN_TOKEN}, headers=other)
    assert response.status_code == 403 and "set-cookie" not in response.headers
    assert sql.execute("SELECT count(*) FROM ui_sessions").fetchone() == (0,)
    # The same form from the dashboard's own page (Origin = Host) signs in.
    own = {"Origin": str(client.base_url).rstrip("/")}
    response = await client.post("/ui/login", data={"token": ADMIN_TOKEN}, headers=own)
    assert response.status_code == 303
    session = await sign_in(ADMIN_TOKEN)
    out = await session.client.post("/ui/logout", data={"csrf_token": session.csrf}, headers=other)
    assert out.status_code == 403
    assert (await session.client.get("/ui/")).status_code == 200


async def test_without_a_session_pages_go_to_sign_in_and_the_rest_gets_401(
    api: ApiServer, client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    for path in ("/ui", "/ui/", "/ui/runs", "/ui/keys", "/ui/runs/1"):
        response = await client.get(path)
        assert response.status_code == 303, path
        assert response.headers["location"] == "/ui/login"
    for path in ("/ui/fragments/lanes", "/ui/api/activity", "/ui/fragments/runs/1"):
        assert (await client.get(path)).status_code == 401, path
    htmx = await client.get("/ui/runs", headers={"HX-Request": "true"})
    assert htmx.status_code == 401
    assert (await client.get("/ui/static/htmx.min.js")).status_code == 200

    # A POST without a session is refused from its head: the body it announces is never
    # waited for.
    address = urlsplit(api.url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    writer.write(
        b"POST /ui/runs/1/cancel HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\ncsrf"
    )
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(65536), 2)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 401"), answer
    assert b"connection: close" in answer.lower()

    # An expired session is no session.
    browser = await sign_in(ADMIN_TOKEN)
    assert (await browser.client.get("/ui/")).status_code == 200
    sql.execute("UPDATE ui_sessions SET expires_at = now() - interval '1 second'")
    assert (await browser.client.get("/ui/")).status_code == 303


async def test_a_missing_or_wrong_csrf_token_is_403_and_changes_nothing(
    app: Tidegate, sql: psycopg.Connection, sign_in: Any
) -> None:
    run = app.enqueue("noop")
    browser = await sign_in(ADMIN_TOKEN)
    client = browser.client
    path = f"/ui/runs/{run.id}/cancel"
    refused = [
        await client.post(path),
        await client.post(path, data={"csrf_token": "wrong"}),
        await client.post(path, data={"csrf_token": ""}),
        await client.post(path, headers={"X-CSRF-Token": "wrong", **FORM}),
        await client.post("/ui/logout", data={"csrf_token": "wrong"}),
    ]
    assert [response.status_code for response in refused] == [403] * len(refused)
    assert run_state(sql, run.id) == ("available", "default")
    assert sql.execute("SELECT count(*) FROM ui_sessions").fetchone() == (1,)
    # htmx sends the token as a header (ui.js); that is as good as the form field.
    accepted = await client.post(path, headers={"X-CSRF-Token": browser.csrf, **FORM})
    assert accepted.status_code == 303
    assert run_state(sql, run.id)[0] == "cancelled"


# -- runs -------------------------------------------------------------------------------


async def test_cancel_and_retry_are_confirmed_then_change_the_run(
    app: Tidegate, sql: psycopg.Connection, sign_in: Any
) -> None:
    run = app.enqueue("noop", {"n": 1})
    browser = await sign_in(ADMIN_TOKEN)
    page = await browser.page(f"/ui/runs/{run.id}")
    assert '<dd id="run-state" data-state="available">available' in page
    assert f'<a class="button" href="/ui/runs/{run.id}/cancel">Cancel…</a>' in page
    assert 'class="retry"' not in page
    confirm = await browser.page(f"/ui/runs/{run.id}/cancel")
    assert f'<form class="confirm cancel" method="post" action="/ui/runs/{run.id}/cancel">' in (
        confirm
    )
    assert run_state(sql, run.id) == ("available", "default")  # asking changes nothing
    await browser.page(f"/ui/runs/{run.id}/retry", 409)
    assert f'hx-get="/ui/fragments/runs/{run.id}" hx-trigger="every 2s"' in page
    assert "&#34;n&#34;: 1" in page.split('<pre id="run-args">')[1]

    cancelled = await browser.post(f"/ui/runs/{run.id}/cancel")
    assert cancelled.status_code == 303
    assert cancelled.headers["location"] == f"/ui/runs/{run.id}"
    assert run_state(sql, run.id) == ("cancelled", "default")
    page = await browser.page(f"/ui/runs/{run.id}")
    assert f'<a class="button" href="/ui/runs/{run.id}/retry">Retry…</a>' in page
    assert 'class="cancel"' not in page
    confirm = await browser.page(f"/ui/runs/{run.id}/retry")
    assert f'<form class="confirm retry" method="post" action="/ui/runs/{run.id}/retry">' in confirm
    await browser.page(f"/ui/runs/{run.id}/cancel", 409)
    assert "hx-trigger" not in page.split('<div id="run-live"')[1].split(">")[0]  # finished

    retried = await browser.post(f"/ui/runs/{run.id}/retry")
    assert retried.status_code == 303
    assert run_state(sql, run.id) == ("available", "manual")
    assert (await browser.post(f"/ui/runs/{run.id}/retry")).status_code == 409
    fragment = await browser.page(f"/ui/fragments/runs/{run.id}", **{"HX-Request": "true"})
    assert fragment.startswith('<div id="run-live"') and "available" in fragment


async def test_a_failed_runs_errors_are_listed_with_tracebacks_for_the_admin_only(
    app: Tidegate, sql: psycopg.Connection, sign_in: Any
) -> None:
    project_token = _project_token(sql, "acme")
    run = app.enqueue("noop", project="acme")
    errors = [
        {"attempt": 1, "at": "2026-01-01T00:00:00+00:00", "error": "ValueError: first"},
        {
            "attempt": 2,
            "at": "2026-01-01T00:00:01+00:00",
            "error": "KeyError: second",
            "traceback": "Traceback: in /srv/secret_file.py",
        },
    ]
    sql.execute(
        "UPDATE runs SET state = 'discarded', errors = %s, result = %s, completed_at = now()"
        " WHERE id = %s",
        [json.dumps(errors), json.dumps({"partial": True}), run.id],
    )
    admin = await sign_in(ADMIN_TOKEN)
    page = await admin.page(f"/ui/runs/{run.id}")
    listed = page.split('<ol id="run-errors">')[1].split("</ol>")[0]
    assert listed.count("<li>") == 2 and "first" in listed and "second" in listed
    assert "secret_file.py" in listed
    assert "&#34;partial&#34;: true" in page.split('<pre id="run-result">')[1]
    project = await sign_in(project_token)
    page = await project.page(f"/ui/runs/{run.id}")
    assert "second" in page and "secret_file.py" not in page


async def test_the_run_list_pages_back_through_every_run_once(app: Tidegate, sign_in: Any) -> None:
    made = app.enqueue_many(
        [NewRun("noop", lane="default") for _ in range(75)]
        + [NewRun("record", lane="bulk", key="k1") for _ in range(60)]
    )
    browser = await sign_in(ADMIN_TOKEN)

    async def walk(path: str) -> list[int]:
        seen: list[int] = []
        while path:
            page = await browser.page(path)
            seen += [int(value) for value in attribute_values(page, "data-run")]
            older = re.search(r'<a class="older" href="([^"]+)">Older</a>', page)
            path = older.group(1).replace("&amp;", "&") if older else ""
        return seen

    every = await walk("/ui/runs")
    assert every == sorted((run.id for run in made), reverse=True)
    assert await walk("/ui/runs?lane=bulk&task=record") == sorted(
        (run.id for run in made[75:]), reverse=True
    )
    assert await walk("/ui/runs?key=k1&state=available") == sorted(
        (run.id for run in made[75:]), reverse=True
    )
    assert await walk("/ui/runs?state=running") == []
    row = cells(await browser.page("/ui/runs?lane=bulk"), "data-run", str(made[-1].id))
    assert '<td class="state" data-state="available">available</td>' in row
    assert "record" in row and "k1" in row and "0, 20 left" in row
    response = await browser.client.get("/ui/runs?state=nonsense")
    assert response.status_code == 422


# -- security headers ---------------------------------------------------------------------

INLINE = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>|<style\b|\sstyle=|\son[a-z]+=|javascript:", re.I)
"""What the Content-Security-Policy would refuse in a page: inline scripts, styles and
event handlers."""


async def test_every_dashboard_answer_forbids_framing_and_sniffing_and_pages_need_no_inline(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="noop")
    run_id = (await client.post(trigger["url"], json={"n": 1})).json()["run_id"]
    request_id = sql.execute("SELECT id FROM requests").fetchone()
    assert request_id
    browser = await sign_in(ADMIN_TOKEN)
    pages = [
        "/ui/",
        "/ui/workers",
        "/ui/projects",
        "/ui/projects/acme",
        "/ui/keys",
        "/ui/keys/policy?lane=default&key=acme",
        "/ui/keys/breaker?lane=default&key=acme",
        "/ui/tasks",
        "/ui/schedules",
        "/ui/runs",
        f"/ui/runs/{run_id}",
        f"/ui/fragments/runs/{run_id}",
        "/ui/fragments/lanes",
        f"/ui/triggers/{trigger['id']}/log",
        f"/ui/triggers/{trigger['id']}/log/admitted/{request_id[0]}",
    ]
    answers = [await browser.client.get(path) for path in pages]
    answers += [
        await browser.client.get("/ui/api/activity"),
        await browser.client.get("/ui/runs/999999"),  # 404
        await browser.client.get("/ui/static/ui.js"),
        await browser.client.get("/ui/static/uPlot.min.css"),
        await client.get("/ui/login"),
        await client.get("/ui/runs"),  # no session: to the sign-in page
        await client.get("/ui/fragments/lanes", headers={"HX-Request": "true"}),  # 401
        await browser.post(f"/ui/runs/{run_id}/cancel"),  # a redirect
    ]
    assert [a.status_code for a in answers[: len(pages)]] == [200] * len(pages)
    assert [a.status_code for a in answers[len(pages) :]] == [
        200,
        404,
        200,
        200,
        200,
        303,
        401,
        303,
    ]
    for answer in answers:
        where = f"{answer.request.method} {answer.request.url.path}"
        policy = answer.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy, where
        assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy, where
        assert answer.headers.get("x-frame-options") == "DENY", where
        assert answer.headers.get("x-content-type-options") == "nosniff", where
        if answer.headers.get("content-type", "").startswith("text/html"):
            assert not INLINE.search(answer.text), (where, INLINE.search(answer.text))
    # The rest of the server is not the dashboard's to frame or not.
    assert "content-security-policy" not in (await client.get("/healthz")).headers


# -- the webhook log and replay -----------------------------------------------------------


async def test_the_webhook_log_merges_admitted_and_refused_requests_newest_first(
    client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="noop")
    for n in range(40):
        assert (await client.post(trigger["url"], json={"n": n})).status_code == 202
    # Refused requests, as the ingress ledger writes them, at the same times as some
    # admitted ones (ties are broken by kind, then id) and between them.
    sql.execute(
        "INSERT INTO request_log (trigger_id, project, outcome, status, detail, headers, body,"
        " body_truncated, received_at)"
        " SELECT %(trigger)s, 'acme', 'rate_limited', 429, 'the project''s ingest rate',"
        " '{}'::jsonb, '{}'::bytea, false, received_at FROM requests WHERE id %% 3 = 0"
        " UNION ALL"
        " SELECT %(trigger)s, 'acme', 'bad_json', 400, 'malformed', '{}', 'nope', false,"
        " received_at + interval '1 microsecond' FROM requests WHERE id %% 4 = 0",
        {"trigger": trigger["id"]},
    )
    truth = sql.execute(
        "SELECT kind, id FROM ("
        " SELECT 'admitted' AS kind, id, received_at FROM requests"
        " UNION ALL SELECT 'refused', id, received_at FROM request_log) AS merged"
        " ORDER BY received_at DESC, kind DESC, id DESC"
    ).fetchall()
    browser = await sign_in(ADMIN_TOKEN)
    seen: list[tuple[str, int]] = []
    path = f"/ui/triggers/{trigger['id']}/log"
    while path:
        page = await browser.page(path)
        seen += [
            (kind, int(number))
            for kind, number in re.findall(
                rf'href="/ui/triggers/{trigger["id"]}/log/(admitted|refused)/(\d+)"', page
            )
        ]
        older = re.search(r'<a class="older" href="([^"]+)">Older</a>', page)
        path = older.group(1).replace("&amp;", "&") if older else ""
    assert seen == [tuple(row) for row in truth] and len(seen) == 40 + 13 + 10
    first = await browser.page(f"/ui/triggers/{trigger['id']}/log")
    assert '<tr data-outcome="admitted" data-status="202">' in first
    assert '<tr data-outcome="rate_limited" data-status="429">' in first


async def test_replay_enqueues_the_trigger_task_with_the_same_args(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    sign_in: Any,
    start_worker_process: Callable[..., subprocess.Popen[bytes]],
) -> None:
    start_worker_process("fast_lane:1 manual>*:1")
    await create_project(client, "acme")
    orders = await create_trigger(client, "acme", "orders", mode="async", task="noop")
    quote = await create_trigger(client, "acme", "quote", mode="sync", task="echo")
    accepted = await client.post(orders["url"], json={"order": 1}, headers={"X-Shop": "s1"})
    assert accepted.status_code == 202
    answered = await client.post(quote["url"], json={"q": "hi"})
    assert answered.status_code == 200, answered.text
    browser = await sign_in(ADMIN_TOKEN)

    for trigger, reply in ((orders, accepted), (quote, answered)):
        original = int(reply.headers["location"].rsplit("/", 1)[1])
        request_id = sql.execute("SELECT id FROM requests WHERE run_id = %s", [original]).fetchone()
        assert request_id
        path = f"/ui/triggers/{trigger['id']}/log/admitted/{request_id[0]}"
        page = await browser.page(path)
        assert '<form class="replay" method="post"' in page and "disabled" not in page
        assert "x-shop" in page or trigger is quote
        replayed = await browser.post(path + "/replay")
        assert replayed.status_code == 303
        new_id = int(replayed.headers["location"].rsplit("/", 1)[1])
        assert new_id != original
        rows = sql.execute(
            "SELECT args, task, project, key, lane FROM runs WHERE id IN (%s, %s) ORDER BY id",
            [original, new_id],
        ).fetchall()
        assert rows[1][0] == rows[0][0]  # the same {"body", "headers", "trigger"}
        assert rows[1][0]["trigger"] == trigger["name"]
        assert rows[1][1:4] == rows[0][1:4]
        assert rows[1][4] == "default"  # a sync trigger's replay too: nobody waits for it

    # A refused request whose body was kept truncated cannot be replayed.
    sql.execute(
        "INSERT INTO request_log (trigger_id, project, outcome, status, detail, headers, body,"
        " body_truncated, received_at)"
        " VALUES (%s, 'acme', 'too_large', 413, 'body over', '{}', '{\"a\": 1', true, now())",
        [orders["id"]],
    )
    logged = sql.execute("SELECT max(id) FROM request_log").fetchone()
    assert logged
    path = f"/ui/triggers/{orders['id']}/log/refused/{logged[0]}"
    page = await browser.page(path)
    assert '<button type="submit" disabled>Replay</button>' in page
    assert 'id="replay-reason"' in page
    before = sql.execute("SELECT count(*) FROM runs").fetchone()
    assert (await browser.post(path + "/replay")).status_code == 409
    assert sql.execute("SELECT count(*) FROM runs").fetchone() == before


async def test_replay_runs_only_a_request_ingress_let_through_never_past_the_signature(
    client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    """A forged unsigned body to a signed trigger is refused (401); its Replay is refused
    too (409), as is one refused for its content type. A signed request refused by a
    limit (429) replays into a run."""
    project = await create_project(client, "acme", ingest_rate=0.001, ingest_burst=1)
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
    signed = await create_trigger(
        client, "acme", "signed", mode="async", task="noop", secret=secret
    )

    def signature(webhook_id: str, body: bytes) -> dict[str, str]:
        now = int(time.time())
        return {
            "content-type": "application/json",
            "webhook-id": webhook_id,
            "webhook-timestamp": str(now),
            "webhook-signature": sign(secret, webhook_id, now, body),
        }

    body = b'{"order": 1}'
    admitted = await client.post(signed["url"], content=body, headers=signature("m1", body))
    assert admitted.status_code == 202, admitted.text
    limited = await client.post(signed["url"], content=body, headers=signature("m2", body))
    assert limited.status_code == 429, limited.text
    forged = await client.post(signed["url"], json={"forged": True})
    assert forged.status_code == 401, forged.text
    plain = await client.post(
        signed["url"], content=body, headers={**signature("m3", body), "content-type": "text/plain"}
    )
    assert plain.status_code == 415, plain.text

    def logged() -> dict[str, int]:
        found = sql.execute("SELECT outcome, id FROM request_log").fetchall()
        return dict(found)  # type: ignore[arg-type]

    await wait_until(lambda: len(logged()) == 3)  # the ledger writes about once a second
    ids = logged()
    assert set(ids) == {"rate_limited", "bad_signature", "not_json"}
    browser = await sign_in(project["token"])
    runs_before = sql.execute("SELECT count(*) FROM runs").fetchone()
    for outcome in ("bad_signature", "not_json"):
        path = f"/ui/triggers/{signed['id']}/log/refused/{ids[outcome]}"
        refused = await browser.post(path + "/replay")
        assert refused.status_code == 409, (outcome, refused.status_code, refused.text)
        page = await browser.page(path)
        assert '<button type="submit" disabled>Replay</button>' in page, outcome
        assert f"refused for what it is ({outcome})" in page
    assert sql.execute("SELECT count(*) FROM runs").fetchone() == runs_before

    path = f"/ui/triggers/{signed['id']}/log/refused/{ids['rate_limited']}"
    assert '<button type="submit">Replay</button>' in await browser.page(path)
    replayed = await browser.post(path + "/replay")
    assert replayed.status_code == 303, replayed.text
    new_id = int(replayed.headers["location"].rsplit("/", 1)[1])
    args = sql.execute("SELECT args FROM runs WHERE id = %s", [new_id]).fetchone()
    assert args and args[0]["body"] == {"order": 1}

    # The trigger's secret changes: what was signed with the old one replays no more.
    changed = await client.patch(
        f"/admin/triggers/{signed['id']}",
        json={"secret": "whsec_" + base64.b64encode(b"x" * 32).decode()},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert changed.status_code == 200, changed.text
    request_id = sql.execute("SELECT id FROM requests").fetchone()
    assert request_id
    path = f"/ui/triggers/{signed['id']}/log/admitted/{request_id[0]}"
    refused = await browser.post(path + "/replay")
    assert refused.status_code == 409 and "bad signature" in refused.text, refused.text


# -- the cluster pages --------------------------------------------------------------------


async def test_the_overview_shows_each_lanes_depth_and_the_activity_counts(
    app: Tidegate, sql: psycopg.Connection, sign_in: Any
) -> None:
    app.enqueue_many([NewRun("noop", lane="bulk") for _ in range(4)])
    app.enqueue_many([NewRun("noop", lane="bulk", delay=3600) for _ in range(2)])
    sql.execute(
        "INSERT INTO minute_counts (minute, source, project, lane, outcome, count) VALUES"
        " (date_trunc('minute', now()), 'attempt', '', 'bulk', 'succeeded', 7),"
        " (date_trunc('minute', now()), 'attempt', '', 'bulk', 'failed', 2),"
        " (date_trunc('minute', now()) - interval '5 minutes', 'admission', 'acme', '',"
        "  'admitted', 3),"
        " (date_trunc('minute', now()) - interval '2 hours', 'admission', 'acme', '',"
        "  'admitted', 100)"
    )
    browser = await sign_in(ADMIN_TOKEN)
    page = await browser.page("/ui/")
    assert '<table id="lanes">' in page
    assert 'hx-get="/ui/fragments/lanes" hx-trigger="every 2s"' in page
    assert '<div id="throughput-chart"' in page and '<div id="admissions-chart"' in page
    row = cells(page, "data-lane", "bulk")
    assert '<td data-state="available" class="num">4</td>' in row
    assert '<td data-state="scheduled" class="num">2</td>' in row
    assert '<td class="lag num">' in row
    fragment = await browser.page("/ui/fragments/lanes", **{"HX-Request": "true"})
    assert '<tr data-lane="bulk">' in fragment and "<html" not in fragment

    activity = (await browser.client.get("/ui/api/activity")).json()
    assert len(activity["minutes"]) == 30
    assert activity["throughput"]["series"] == ["bulk"]
    [attempts] = activity["throughput"]["counts"]
    # The minute just ended, or this one (a minute may turn between insert and read).
    assert sum(attempts) == 9 and attempts[-1] + attempts[-2] == 9
    assert activity["admissions"]["series"] == ["admitted"]
    [admitted] = activity["admissions"]["counts"]
    assert admitted[24] + admitted[23] == 3
    assert sum(admitted) == 3  # two hours ago is out


async def test_the_workers_page_lists_each_worker_and_its_workloops(
    sql: psycopg.Connection, sign_in: Any
) -> None:
    loops = [
        {"chain": ["fast_lane"], "slots": 1, "busy": 0},
        {"chain": ["manual", "*"], "slots": 4, "busy": 3},
    ]
    sql.execute(
        "INSERT INTO workers (id, host, pid, workloops, tasks) VALUES"
        " ('w-1', 'host-a', 41, %s, '{noop,echo}')",
        [json.dumps(loops)],
    )
    browser = await sign_in(ADMIN_TOKEN)
    row = cells(await browser.page("/ui/workers"), "data-worker", "w-1")
    assert "host-a/41" in row and "<code>manual&gt;*</code> 3/4" in row
    assert "<code>fast_lane</code> 0/1" in row and "noop, echo" in row


async def test_the_projects_page_counts_refusals_by_status_class(
    client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    await create_project(client, "acme", fast_lane_cap=3, ingest_rate=5, ingest_burst=10)
    sql.execute(
        "INSERT INTO minute_counts (minute, source, project, lane, outcome, count)"
        " SELECT date_trunc('minute', now()) - make_interval(mins => m), 'admission', 'acme',"
        " '', outcome, n FROM (VALUES (0, 'rate_limited', 2), (3, 'over_cap', 1),"
        " (1, 'no_worker', 4), (2, 'backlog_full', 1), (0, 'bad_request', 5),"
        " (0, 'breaker_open', 7), (0, 'admitted', 50), (0, 'replayed', 6),"
        " (30, 'rate_limited', 100)) AS c(m, outcome, n)"
    )
    browser = await sign_in(ADMIN_TOKEN)
    page = await browser.page("/ui/projects")
    row = cells(page, "data-project", "acme")
    figures = re.findall(r'<td class="num">([^<]*)</td>', row)
    assert figures == ["0 / 3", "5", "10", "none", "3", "12", "5"]


async def test_the_projects_page_shows_who_waits_in_the_waiting_room_and_for_how_long(
    client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    await create_project(client, "acme", ingest_rate=0.01, ingest_burst=1)
    await create_project(client, "quiet")
    url = (await create_trigger(client, "acme", "orders", mode="async", task="echo"))["url"]
    assert (await client.post(url, json={})).status_code == 202
    refused = [await client.post(url, json={"n": n}) for n in range(2)]
    assert [r.status_code for r in refused] == [429, 429]
    (due,) = sql.execute(
        "SELECT extract(epoch FROM max(due_at) - clock_timestamp()) FROM waiting_places"
    ).fetchone() or (None,)
    page = await (await sign_in(ADMIN_TOKEN)).page("/ui/projects")
    shown = re.search(
        r'<td class="waiting">ingest: 2, ([0-9.]+) s</td>', cells(page, "data-project", "acme")
    )
    assert shown, cells(page, "data-project", "acme")
    # Read after the table, so no later; compared as decimals (the database's extract()
    # is numeric: the float 199.9 is above the decimal 199.9).
    assert 0 < Decimal(shown[1]) <= round(due, 1)
    assert '<td class="waiting"></td>' in cells(page, "data-project", "quiet")


async def test_the_keys_page_shows_policies_and_what_holds_each_key(
    app: Tidegate, sql: psycopg.Connection, sign_in: Any
) -> None:
    app.set_key_policy("default", "*", weight=2)
    app.set_key_policy("default", "capped", max_running=1)
    app.set_key_policy("default", "slow", rate=0.01, rate_burst=1)
    app.set_key_policy("default", "partner", breaker_failures=3)
    app.enqueue_many(
        [NewRun("noop", key="capped") for _ in range(3)]
        + [NewRun("noop", key="slow") for _ in range(2)]
        + [NewRun("noop", key="free") for _ in range(5)]
        + [NewRun("noop", key="partner") for _ in range(4)]
    )
    sql.execute(
        "UPDATE runs SET state = 'running' WHERE id = (SELECT min(id) FROM runs"
        " WHERE key = 'capped')"
    )
    sql.execute("INSERT INTO key_rates (lane, key, tat) VALUES ('default', 'slow', now() + '1h')")
    sql.execute(
        "INSERT INTO key_breakers (lane, key, state, open_until)"
        " VALUES ('default', 'partner', 'open', now() + '10 min')"
    )
    browser = await sign_in(ADMIN_TOKEN)
    page = await browser.page("/ui/keys")

    def figures(key: str) -> list[str]:
        row = cells(page, 'data-lane="default" data-key', key)
        return re.findall(r'<td class="(?:num|held)">([^<]*)</td>', row)

    # max running, weight, rate, burst, in flight, waiting, held by
    assert figures("capped") == ["1", "2", "", "1", "1", "2", "cap"]
    assert figures("slow") == ["", "2", "0.01", "1", "0", "2", "rate"]
    assert figures("free") == ["", "2", "", "1", "0", "5", ""]
    assert figures("*") == ["", "2", "", "1", "", "", ""]
    assert figures("partner") == ["", "2", "", "1", "0", "4", "breaker"]
    assert re.search(
        r'<td class="breaker">open until <time [^>]+>in [^<]+</time></td>',
        cells(page, 'data-lane="default" data-key', "partner"),
    )
    assert '<td class="breaker"></td>' in cells(page, 'data-lane="default" data-key', "free")


# -- isolation ----------------------------------------------------------------------------


def _project_token(sql: psycopg.Connection, project: str) -> str:
    from tidegate.projects import hash_token

    token = f"tgp_{project}-token"
    sql.execute(
        "INSERT INTO projects (id, token_hash) VALUES (%s, %s)"
        " ON CONFLICT (id) DO UPDATE SET token_hash = excluded.token_hash",
        [project, hash_token(token)],
    )
    return token


async def test_a_project_session_sees_its_own_project_only(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    alpha = await create_project(client, "alpha")
    await create_project(client, "bravo-corp")
    alpha_hook = await create_trigger(client, "alpha", "alpha-orders", mode="async", task="noop")
    bravo_hook = await create_trigger(
        client, "bravo-corp", "bravo-secret-trigger", mode="async", task="noop"
    )
    assert (await client.post(alpha_hook["url"], json={"alpha": "hello"})).status_code == 202
    reply = await client.post(bravo_hook["url"], json={"bravo": "bravo-secret-body"})
    assert reply.status_code == 202
    bravo_request = sql.execute("SELECT id FROM requests WHERE project = 'bravo-corp'").fetchone()
    alpha_request = sql.execute("SELECT id FROM requests WHERE project = 'alpha'").fetchone()
    assert bravo_request and alpha_request
    sql.execute(
        "INSERT INTO request_log (trigger_id, project, outcome, status, detail, headers, body,"
        " body_truncated, received_at) VALUES"
        " (%s, 'bravo-corp', 'bad_json', 400, 'x', '{}', 'bravo-secret-body', false, now())",
        [bravo_hook["id"]],
    )
    bravo_logged = sql.execute("SELECT id FROM request_log").fetchone()
    assert bravo_logged
    app.set_key_policy("default", "*", weight=1)
    app.set_key_policy("default", "alpha-key", max_running=2)
    app.set_key_policy("default", "bravo-secret-key", max_running=1)
    app.set_key_policy("bravo_lane", "bravo-other-key", max_running=1)
    alpha_runs = app.enqueue_many(
        [NewRun("noop", project="alpha", key="alpha-key") for _ in range(3)]
    )
    bravo_runs = app.enqueue_many(
        [NewRun("noop", project="bravo-corp", key="bravo-secret-key") for _ in range(3)]
        + [NewRun("noop", project="bravo-corp", key="bravo-other-key", lane="bravo_lane")]
    )
    sql.execute("UPDATE runs SET state = 'running' WHERE id = %s", [bravo_runs[0].id])
    sql.execute("UPDATE runs SET state = 'discarded' WHERE id = %s", [bravo_runs[1].id])
    sql.execute(
        "INSERT INTO minute_counts (minute, source, project, lane, outcome, count) VALUES"
        " (date_trunc('minute', now()), 'admission', 'alpha', '', 'admitted', 1),"
        " (date_trunc('minute', now()), 'admission', 'bravo-corp', '', 'bad_signature', 9),"
        " (date_trunc('minute', now()), 'attempt', '', 'bravo_lane', 'succeeded', 4)"
    )
    secrets = [
        "bravo-corp",
        "bravo-secret-trigger",
        "bravo-secret-body",
        "bravo-secret-key",
        "bravo-other-key",
        "bravo_lane",
        "bad_signature",
    ]
    secrets += [f'data-run="{run.id}"' for run in bravo_runs]
    secrets += [f'/ui/runs/{run.id}"' for run in bravo_runs]

    # The super admin sees B's things: the checks below are not vacuous.
    admin = await sign_in(ADMIN_TOKEN)
    seen_by_admin = "".join(
        [
            await admin.page("/ui/runs"),
            await admin.page("/ui/keys"),
            await admin.page("/ui/projects"),
            await admin.page(f"/ui/triggers/{bravo_hook['id']}/log"),
            await admin.page(f"/ui/triggers/{bravo_hook['id']}/log/admitted/{bravo_request[0]}"),
            (await admin.client.get("/ui/api/activity")).text,
        ]
    )
    for secret in secrets:
        assert secret in seen_by_admin, secret

    browser = await sign_in(alpha["token"])
    b_run = bravo_runs[2].id
    pages = [
        "/ui/",
        "/ui/api/activity",
        "/ui/projects",
        "/ui/projects/alpha",
        "/ui/keys",
        "/ui/runs",
        "/ui/runs?project=bravo-corp",  # held to its own project whatever it asks
        f"/ui/runs?before={b_run + 1}",
        f"/ui/runs/{alpha_runs[0].id}",
        f"/ui/fragments/runs/{alpha_runs[0].id}",
        f"/ui/triggers/{alpha_hook['id']}/log",
        f"/ui/triggers/{alpha_hook['id']}/log/admitted/{alpha_request[0]}",
    ]
    seen = ""
    for path in pages:
        seen += await browser.page(path)
    # Filters naming B's key or lane find nothing (the form shows them back: not counted).
    for path in ("/ui/runs?key=bravo-secret-key", "/ui/runs?lane=bravo_lane&state=available"):
        assert attribute_values(await browser.page(path), "data-run") == []
    not_found = [
        "/ui/workers",
        "/ui/fragments/lanes",
        "/ui/projects/bravo-corp",
        f"/ui/runs/{b_run}",
        f"/ui/fragments/runs/{b_run}",
        f"/ui/triggers/{bravo_hook['id']}/log",
        f"/ui/triggers/{bravo_hook['id']}/log/admitted/{bravo_request[0]}",
        f"/ui/triggers/{bravo_hook['id']}/log/refused/{bravo_logged[0]}",
        # B's request named under A's trigger: still not A's.
        f"/ui/triggers/{alpha_hook['id']}/log/admitted/{bravo_request[0]}",
        f"/ui/triggers/{alpha_hook['id']}/log/refused/{bravo_logged[0]}",
    ]
    for path in not_found:
        response = await browser.client.get(path)
        assert response.status_code == 404, (path, response.status_code)
        assert set(response.json()) == {
            "type",
            "title",
            "status",
            "detail",
        }  # says what was asked, no more
    for path in (
        f"/ui/runs/{b_run}/cancel",
        f"/ui/runs/{bravo_runs[1].id}/retry",
        f"/ui/triggers/{bravo_hook['id']}/log/admitted/{bravo_request[0]}/replay",
        f"/ui/triggers/{alpha_hook['id']}/log/admitted/{bravo_request[0]}/replay",
    ):
        response = await browser.post(path)
        assert response.status_code == 404, (path, response.status_code)
        assert set(response.json()) == {"type", "title", "status", "detail"}
    for secret in secrets:
        assert secret not in seen, secret
    assert run_state(sql, b_run)[0] == "available"
    assert run_state(sql, bravo_runs[1].id)[0] == "discarded"

    # What A does see is A's.
    assert attribute_values(await browser.page("/ui/runs"), "data-run") == [
        str(row[0])
        for row in sql.execute("SELECT id FROM runs WHERE project = 'alpha' ORDER BY id DESC")
    ]
    assert attribute_values(await browser.page("/ui/projects"), "data-project") == ["alpha"]
    keys = re.findall(r'<tr data-lane="([^"]*)" data-key="([^"]*)"', await browser.page("/ui/keys"))
    assert keys == [("default", "*"), ("default", "alpha-key"), ("default", "alpha")]
    activity = (await browser.client.get("/ui/api/activity")).json()
    assert activity["throughput"] is None
    assert activity["admissions"]["series"] == ["admitted"]


async def test_the_schedules_page_shows_timing_last_run_and_errors_and_a_project_its_own(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    alpha = await create_project(client, "alpha")
    await create_project(client, "bravo")
    app.execute(
        create_schedule("alpha", "nightly", "noop", cron="30 2 * * *", timezone="Europe/Berlin")
    )
    app.execute(create_schedule("bravo", "bravo-secret-schedule", "noop", interval_seconds=90))
    run = app.enqueue("noop", project="alpha")
    sql.execute(
        "UPDATE schedules SET last_run_id = %s, last_tick = now(), missed_ticks = 3,"
        " last_error = 'KeyError: tenant' WHERE name = 'nightly'",
        [run.id],
    )
    admin = await sign_in(ADMIN_TOKEN)
    page = await admin.page("/ui/schedules")
    assert attribute_values(page, "data-project") == ["alpha", "bravo"]
    nightly = cells(page, 'data-project="alpha" data-name', "nightly")
    assert "<code>30 2 * * *</code> Europe/Berlin" in nightly
    assert f'<a href="/ui/runs/{run.id}">{run.id}</a> available' in nightly
    assert '<td class="num">3</td>' in nightly and "KeyError: tenant" in nightly
    assert "every 90 s" in cells(page, 'data-project="bravo" data-name', "bravo-secret-schedule")

    own = await (await sign_in(alpha["token"])).page("/ui/schedules")
    assert attribute_values(own, "data-project") == ["alpha"]
    assert "bravo-secret-schedule" not in own


# -- the operator's console -------------------------------------------------------------

HTML = {"Accept": "text/html,application/xhtml+xml"}
"""What a browser's navigation sends."""


async def test_the_run_list_has_state_tabs_with_counts_and_searches_by_key_and_args(
    app: Tidegate, sql: psycopg.Connection, sign_in: Any
) -> None:
    made = app.enqueue_many(
        [NewRun("ship", {"order": n, "shop": {"city": "north"}}, key=f"k{n % 2}") for n in range(6)]
    )
    sql.execute(
        "UPDATE runs SET state = 'discarded', completed_at = now() WHERE id = %s", [made[0].id]
    )
    browser = await sign_in(ADMIN_TOKEN)

    page = await browser.page("/ui/runs")
    tabs = dict(re.findall(r'data-state="(\w+)"[^>]*>\w+ <span class="count">(\d+)', page))
    assert tabs == {
        "scheduled": "0",
        "available": "5",
        "pending": "0",
        "running": "0",
        "succeeded": "0",
        "discarded": "1",
        "cancelled": "0",
    }  # one tab per state, in RunState's order
    assert list(tabs) == [state.value for state in RunState]
    # A tab keeps the search; the counts are those of the search.
    page = await browser.page("/ui/runs?key=k0")
    assert 'href="/ui/runs?key=k0&amp;state=discarded"' in page
    tabs = dict(re.findall(r'data-state="(\w+)"[^>]*>\w+ <span class="count">(\d+)', page))
    assert (tabs["available"], tabs["discarded"]) == ("2", "1")

    found = await browser.page("/ui/runs?" + urlencode({"args": '{"order": 3}'}))
    assert attribute_values(found, "data-run") == [str(made[3].id)]
    nested = await browser.page(
        "/ui/runs?" + urlencode({"args": '{"shop": {"city": "north"}}', "key": "k1"})
    )
    assert attribute_values(nested, "data-run") == [str(r.id) for r in reversed(made[1::2])]
    for wrong in ("[1]", "not json", '{"a": "' + "x" * 1000 + '"}', '{"a":' * 9 + "1" + "}" * 9):
        response = await browser.client.get("/ui/runs", params={"args": wrong})
        assert response.status_code == 422, (wrong, response.text)


async def test_the_runs_api_searches_by_key_and_args_within_bounds(
    app: Tidegate, client: httpx.AsyncClient
) -> None:
    made = app.enqueue_many(
        [NewRun("ship", {"order": n}, key=key) for n, key in enumerate(["a", "b", "a"])]
    )
    listed = await client.get("/runs", params={"key": "a", "args": '{"order": 2}'}, headers=ADMIN)
    assert listed.status_code == 200, listed.text
    assert [run["id"] for run in listed.json()] == [made[2].id]
    by_key = await client.get("/runs", params={"key": "a"}, headers=ADMIN)
    assert [run["id"] for run in by_key.json()] == [made[2].id, made[0].id]
    for wrong in ("[1]", "{", "x" * 1001):
        response = await client.get("/runs", params={"args": wrong}, headers=ADMIN)
        assert response.status_code == 422, (wrong, response.text)


async def test_a_breaker_that_holds_a_run_is_its_reason_and_attempts_left_are_told(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    held = app.enqueue("noop", key="partner")
    retried = app.enqueue("noop", key="other")
    sql.execute(
        "INSERT INTO key_breakers (lane, key, state, opened_at, open_until)"
        " VALUES ('default', 'partner', 'open', now(), now() + interval '10 minutes')"
    )
    # Two attempts made, one given back by Retry(): 20 allowed, 19 left.
    sql.execute("UPDATE runs SET attempt = 2, max_attempts = 21 WHERE id = %s", [retried.id])

    shown = (await client.get(f"/runs/{held.id}", headers=ADMIN)).json()
    assert shown["reason"].startswith("key 'partner' has its circuit breaker open until")
    listed = (await client.get("/runs", params={"key": "partner"}, headers=ADMIN)).json()
    assert listed[0]["reason"] == shown["reason"]
    browser = await sign_in(ADMIN_TOKEN)
    page = await browser.page(f"/ui/runs/{held.id}")
    assert "has its circuit breaker open until" in page.split('id="run-state"')[1].split("</dd>")[0]
    page = await browser.page(f"/ui/runs/{retried.id}")
    assert '<dd id="run-attempts">2, 19 left</dd>' in page
    assert "2/21" not in page
    row = cells(await browser.page("/ui/runs"), "data-run", str(retried.id))
    assert '<td class="attempts">2, 19 left</td>' in row

    sql.execute("UPDATE key_breakers SET state = 'closed', open_until = NULL")
    assert (await client.get(f"/runs/{held.id}", headers=ADMIN)).json()["reason"] is None


async def test_times_read_relative_with_the_utc_time_in_a_title(
    app: Tidegate, sql: psycopg.Connection, sign_in: Any
) -> None:
    run = app.enqueue("noop")
    sql.execute(
        "UPDATE runs SET state = 'succeeded', attempt = 1,"
        " attempted_at = '2026-01-01 10:00:00+00', completed_at = '2026-01-01 10:00:01.2+00',"
        ' errors = \'[{"attempt": 1, "at": "2026-01-01T09:59:00+00:00", "error": "E"}]\''
        " WHERE id = %s",
        [run.id],
    )
    browser = await sign_in(ADMIN_TOKEN)
    page = await browser.page(f"/ui/runs/{run.id}")
    assert (
        '<time datetime="2026-01-01T10:00:01.200000+00:00" title="2026-01-01 10:00:01 UTC">' in page
    )
    assert "took 1.2 s" in page
    errors = page.split('<ol id="run-errors">')[1]
    assert (
        'title="2026-01-01 09:59:00 UTC">' in errors and "2026-01-01T09:59:00+00:00<" not in errors
    )
    future = app.enqueue("noop", delay=3600)
    row = cells(await browser.page("/ui/runs"), "data-run", str(future.id))
    assert re.search(r'<td class="due"><time [^>]+>in (59|60)\.\d min</time></td>', row), row


async def test_a_project_session_has_no_workers_link_and_dashboard_errors_are_pages(
    app: Tidegate, sql: psycopg.Connection, sign_in: Any
) -> None:
    project = await sign_in(_project_token(sql, "acme"))
    admin = await sign_in(ADMIN_TOKEN)
    assert 'href="/ui/workers"' not in await project.page("/ui/runs")
    assert 'href="/ui/workers"' in await admin.page("/ui/runs")

    for path in ("/ui/workers", "/ui/no-such-page", "/ui/runs/999999"):
        page = await project.client.get(path, headers=HTML)
        assert page.status_code == 404, path
        assert page.headers["content-type"].startswith("text/html"), path
        assert "<h1>404 Not Found</h1>" in page.text and "<nav>" in page.text, page.text
        assert page.headers["content-security-policy"]  # the dashboard's headers, as ever
        assert (await project.client.get(path)).headers["content-type"] == (
            "application/problem+json"
        )  # any other client gets the problem's JSON
    invalid = await admin.client.get("/ui/runs/not-a-number", headers=HTML)
    assert invalid.status_code == 422 and "<h1>422 Unprocessable" in invalid.text
    run = app.enqueue("noop")
    again = await admin.client.post(
        f"/ui/runs/{run.id}/retry", data={"csrf_token": admin.csrf}, headers=HTML
    )
    assert again.status_code == 409 and "has not finished" in again.text


async def test_pages_link_a_favicon_of_their_own_and_redoc_loads_nothing_from_elsewhere(
    client: httpx.AsyncClient, sign_in: Any
) -> None:
    page = await (await sign_in(ADMIN_TOKEN)).page("/ui/")
    assert '<link rel="icon" href="/ui/static/favicon.svg" type="image/svg+xml">' in page
    icon = await client.get("/ui/static/favicon.svg")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    redoc = await client.get("/redoc")
    assert redoc.status_code == 200
    policy = redoc.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "img-src 'self' data:" in policy
    assert "https://" not in redoc.text


async def test_a_bulk_retry_and_cancel_act_on_what_the_list_shows_once_confirmed(
    app: Tidegate, sql: psycopg.Connection, sign_in: Any
) -> None:
    project_token = _project_token(sql, "acme")
    made = app.enqueue_many(
        [NewRun("ship", {"order": n}, project="acme") for n in range(5)]
        + [NewRun("ship", {"order": 9}, project="other")]
    )
    ids = [run.id for run in made]
    sql.execute(
        "UPDATE runs SET state = 'discarded', completed_at = now() WHERE id = ANY(%s)",
        [[ids[0], ids[1], ids[5]]],
    )
    browser = await sign_in(project_token)
    page = await browser.page("/ui/runs?state=discarded")
    assert '<a class="button" href="/ui/bulk/retry?state=discarded">Retry 2 finished…</a>' in page
    assert "/ui/bulk/cancel" not in page
    confirm = await browser.page("/ui/bulk/retry?state=discarded")
    assert '<strong id="bulk-matching">2</strong>' in confirm
    none = await browser.page("/ui/bulk/retry?state=cancelled")  # the search's state only
    assert '<strong id="bulk-matching">0</strong>' in none
    assert run_state(sql, ids[0]) == ("discarded", "default")  # asking changes nothing

    done = await browser.post("/ui/bulk/retry?state=discarded")
    assert done.status_code == 200 and "Retried 2 runs" in done.text
    assert [run_state(sql, i)[0] for i in ids] == ["available"] * 5 + ["discarded"]  # not B's
    assert (await browser.post("/ui/bulk/retry?state=discarded")).text.count("Retried 0 runs")

    cancelled = await browser.post("/ui/bulk/cancel?" + urlencode({"args": '{"order": 3}'}))
    assert "Cancelled 1 runs" in cancelled.text
    assert run_state(sql, ids[3])[0] == "cancelled"
    refused = await browser.client.post("/ui/bulk/cancel", data={"csrf_token": "wrong"})
    assert refused.status_code == 403
    deleted = await browser.post("/ui/bulk/delete?" + urlencode({"args": '{"order": 3}'}))
    assert "Deleted 1 runs" in deleted.text
    gone = sql.execute("SELECT id FROM runs WHERE id = ANY(%s)", [ids]).fetchall()
    assert {row[0] for row in gone} == set(ids) - {ids[3]}  # B's discarded run stays
    assert (await browser.client.get("/ui/bulk/purge")).status_code == 422


async def test_the_runs_api_retries_and_cancels_what_a_filter_matches_in_batches(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    made = app.enqueue_many([NewRun("ship", {"n": n}, key="k") for n in range(8)])
    ids = [run.id for run in made]
    # Newest first, three a batch, at most seven: 3 + 3 + 1, and one left over.
    done = app.execute(
        bulk_runs(
            BulkAction.CANCEL,
            {
                "project": None,
                "lane": None,
                "state": None,
                "task": "ship",
                "key": "k",
                "args": None,
            },
            7,
            available_channel=app.available_channel,
            completed_channel=app.completed_channel,
            batch=3,
        )
    )
    assert (done.changed, done.more) == (7, True)
    assert run_state(sql, ids[0])[0] == "available"
    assert {run_state(sql, i)[0] for i in ids[1:]} == {"cancelled"}

    retried = await client.post(
        "/runs/retry-matching", json={"task": "ship", "state": "cancelled"}, headers=ADMIN
    )
    assert retried.json() == {"retried": 7, "more": False}, retried.text
    assert {run_state(sql, i) for i in ids[1:]} == {("available", "default")}
    cancelled = await client.post(
        "/runs/cancel-matching", json={"args": {"n": 4}, "limit": 5}, headers=ADMIN
    )
    assert cancelled.json() == {"cancelled": 1, "more": False}
    ship = "SELECT id, state::text FROM runs WHERE task = 'ship'"
    before = dict(sql.execute(ship).fetchall())
    finished = {
        i for i, state in before.items() if state in ("succeeded", "discarded", "cancelled")
    }
    deleted = await client.post("/runs/delete-matching", json={"task": "ship"}, headers=ADMIN)
    assert deleted.json() == {"deleted": len(finished), "more": False}, deleted.text
    assert finished and set(dict(sql.execute(ship).fetchall())) == set(before) - finished
    for wrong in ({"limit": 0}, {"limit": 100_001}, {"args": [1]}, {"ids": [1]}):
        response = await client.post("/runs/retry-matching", json=wrong, headers=ADMIN)
        assert response.status_code == 422, (wrong, response.text)
    token = _project_token(sql, "acme")
    other = {"Authorization": f"Bearer {token}"}
    mine = await client.post("/runs/cancel-matching", json={}, headers=other)
    assert mine.json() == {"cancelled": 0, "more": False}  # none of acme's: none changed
    theirs = await client.post("/runs/cancel-matching", json={"project": "default"}, headers=other)
    assert theirs.status_code == 403
    theirs = await client.post("/runs/delete-matching", json={"project": "default"}, headers=other)
    assert theirs.status_code == 403


# -- acting on limits, live lists, what workers run, tasks over time --------------------


def _policy(sql: psycopg.Connection, lane: str, key: str) -> tuple[Any, ...] | None:
    return sql.execute(
        "SELECT max_running, weight, rate, rate_burst, breaker_failures FROM key_policies"
        " WHERE lane = %s AND key = %s",
        [lane, key],
    ).fetchone()


async def test_a_key_policy_is_changed_and_cleared_once_confirmed_by_the_admin_only(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    alpha = await create_project(client, "alpha")
    app.set_key_policy("default", "capped", max_running=1, breaker_failures=5)
    app.enqueue("noop", key="capped", project="alpha")
    admin = await sign_in(ADMIN_TOKEN)
    keys = await admin.page("/ui/keys")
    row = cells(keys, 'data-lane="default" data-key', "capped")
    assert '<a href="/ui/keys/policy?lane=default&amp;key=capped">Policy…</a>' in row
    assert '<a href="/ui/keys/breaker?lane=default&amp;key=capped">Breaker…</a>' in row
    form = await admin.page("/ui/keys/policy?lane=default&key=capped")
    assert re.search(r'<input name="max_running" type="number"[^>]* value="1"', form)
    assert re.search(r'<input name="weight" type="number"[^>]* value=""', form)

    path = "/ui/keys/policy"
    fields = {"lane": "default", "key": "capped", "max_running": "3", "weight": "2.5"}
    refused = [
        await admin.client.post(path, data=fields),
        await admin.client.post(path, data={**fields, "csrf_token": "wrong"}),
    ]
    assert [r.status_code for r in refused] == [403, 403]
    assert _policy(sql, "default", "capped") == (1, None, None, None, 5)
    for bad in ({"weight": "0"}, {"max_running": "1.5"}, {"rate": "nan"}, {"rate": "x"}):
        answer = await admin.post(path, **{**fields, **bad})
        assert answer.status_code == 422, (bad, answer.text)
    assert (await admin.post(path, **{**fields, "lane": "no such lane"})).status_code == 422
    assert _policy(sql, "default", "capped") == (1, None, None, None, 5)

    changed = await admin.post(path, **fields, rate="0.5", rate_burst="")
    assert changed.status_code == 303 and changed.headers["location"] == "/ui/keys"
    # The form's fields change; the breaker's, which it does not show, stay.
    assert _policy(sql, "default", "capped") == (3, 2.5, 0.5, None, 5)
    figures = cells(await admin.page("/ui/keys"), 'data-lane="default" data-key', "capped")
    assert re.findall(r'<td class="num">([^<]*)</td>', figures)[:3] == ["3", "2.5", "0.5"]
    # Strict order: on, then back to the lane's default; an unknown choice is no value.
    ordered = "SELECT ordered FROM key_policies WHERE lane = 'default' AND key = 'capped'"
    assert (await admin.post(path, **fields, rate="0.5", ordered="yes")).status_code == 303
    assert sql.execute(ordered).fetchone() == (True,)
    form = await admin.page("/ui/keys/policy?lane=default&key=capped")
    assert '<option value="yes" selected>' in form
    assert (await admin.post(path, **fields, rate="0.5", ordered="maybe")).status_code == 303
    assert sql.execute(ordered).fetchone() == (None,)

    confirm = await admin.page("/ui/keys/policy/clear?lane=default&key=capped")
    assert '<form class="confirm clear-policy" method="post"' in confirm
    assert _policy(sql, "default", "capped") is not None  # asking changes nothing
    cleared = await admin.post("/ui/keys/policy/clear", lane="default", key="capped")
    assert cleared.status_code == 303 and _policy(sql, "default", "capped") is None
    assert (
        await admin.post("/ui/keys/policy/clear", lane="default", key="capped")
    ).status_code == 404
    await admin.page("/ui/keys/policy/clear?lane=default&key=capped", 404)
    # A key with no policy yet gets one from the same form (the keys page's lookup).
    assert "has no policy of its own yet" in await admin.page("/ui/keys/policy?lane=bulk&key=new")
    assert (await admin.post(path, lane="bulk", key="new", max_running="2")).status_code == 303
    assert _policy(sql, "bulk", "new") == (2, None, None, None, None)

    # A project's session sees its keys, and no way to change them.
    app.set_key_policy("default", "capped", max_running=1)
    own = await sign_in(alpha["token"])
    keys = await own.page("/ui/keys")
    assert "capped" in keys and "/ui/keys/policy" not in keys and "Breaker…" not in keys
    await own.page("/ui/keys/policy?lane=default&key=capped", 404)
    await own.page("/ui/keys/policy/clear?lane=default&key=capped", 404)
    assert (await own.post(path, **fields)).status_code == 404
    assert (
        await own.post("/ui/keys/policy/clear", lane="default", key="capped")
    ).status_code == 404
    assert _policy(sql, "default", "capped") == (1, None, None, None, None)


def _breaker(sql: psycopg.Connection, key: str) -> str | None:
    row = sql.execute(
        "SELECT breaker_state(b)::text FROM key_breakers b WHERE lane = 'default' AND key = %s",
        [key],
    ).fetchone()
    return row[0] if row else None


async def test_a_breaker_is_forced_open_closed_and_auto_from_its_page_by_the_admin_only(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    alpha = await create_project(client, "alpha")
    app.set_key_policy("default", "partner", breaker_failures=3)
    run = app.enqueue("noop", key="partner", project="alpha")
    admin = await sign_in(ADMIN_TOKEN)
    page = await admin.page("/ui/keys/breaker?lane=default&key=partner")
    assert 'data-state="closed">closed, counting nothing' in page
    for force in ("open", "closed", "auto"):
        assert f'<input type="hidden" name="force" value="{force}">' in page
    assert _breaker(sql, "partner") is None  # the page is the confirmation: nothing yet

    path = "/ui/keys/breaker"
    refused = await admin.client.post(
        path, data={"lane": "default", "key": "partner", "force": "open"}
    )
    assert refused.status_code == 403 and _breaker(sql, "partner") is None
    assert (await admin.post(path, lane="default", key="partner", force="ajar")).status_code == 422
    assert _breaker(sql, "partner") is None

    opened = await admin.post(path, lane="default", key="partner", force="open")
    assert opened.status_code == 303
    assert opened.headers["location"] == "/ui/keys/breaker?lane=default&key=partner"
    assert _breaker(sql, "partner") == "forced_open"
    row = cells(await admin.page("/ui/keys"), 'data-lane="default" data-key', "partner")
    assert '<td class="breaker">forced open</td>' in row and '<td class="held">breaker</td>' in row
    assert 'data-state="forced_open">forced open' in await admin.page(opened.headers["location"])
    # The run it holds says so, and leads to it.
    held = await admin.page(f"/ui/runs/{run.id}")
    assert '<a class="breaker" href="/ui/keys/breaker?lane=default&amp;key=partner">' in held
    assert 'class="breaker"' not in await (await sign_in(alpha["token"])).page(f"/ui/runs/{run.id}")
    assert (
        await admin.post(path, lane="default", key="partner", force="closed")
    ).status_code == 303
    assert _breaker(sql, "partner") == "forced_closed"

    own = await sign_in(alpha["token"])
    await own.page("/ui/keys/breaker?lane=default&key=partner", 404)
    assert (await own.post(path, lane="default", key="partner", force="auto")).status_code == 404
    assert _breaker(sql, "partner") == "forced_closed"

    assert (await admin.post(path, lane="default", key="partner", force="auto")).status_code == 303
    assert _breaker(sql, "partner") is None


def _paused(sql: psycopg.Connection, name: str) -> tuple[bool, Any]:
    row = sql.execute(
        "SELECT paused, next_tick > now() FROM schedules WHERE name = %s", [name]
    ).fetchone()
    assert row is not None
    return row[0], row[1]


async def test_a_schedule_is_paused_and_resumed_from_the_schedules_page_by_the_admin_only(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    alpha = await create_project(client, "alpha")
    app.execute(create_schedule("alpha", "nightly", "noop", cron="30 2 * * *"))
    admin = await sign_in(ADMIN_TOKEN)
    row = cells(await admin.page("/ui/schedules"), 'data-project="alpha" data-name', "nightly")
    assert '<form class="pause" method="post" action="/ui/schedules/pause">' in row
    fields = {"project": "alpha", "name": "nightly"}
    refused = await admin.client.post("/ui/schedules/pause", data=fields)
    assert refused.status_code == 403 and _paused(sql, "nightly") == (False, True)

    paused = await admin.post("/ui/schedules/pause", **fields)
    assert paused.status_code == 303 and paused.headers["location"] == "/ui/schedules"
    assert _paused(sql, "nightly")[0] is True
    row = cells(await admin.page("/ui/schedules"), 'data-project="alpha" data-name', "nightly")
    assert "<em>paused</em>" in row and 'action="/ui/schedules/resume"' in row

    own = await sign_in(alpha["token"])
    row = cells(await own.page("/ui/schedules"), 'data-project="alpha" data-name', "nightly")
    assert "<form" not in row
    assert (await own.post("/ui/schedules/resume", **fields)).status_code == 404
    assert _paused(sql, "nightly")[0] is True

    assert (await admin.post("/ui/schedules/resume", **fields)).status_code == 303
    assert _paused(sql, "nightly") == (False, True)
    missing = await admin.post("/ui/schedules/pause", project="alpha", name="weekly")
    assert missing.status_code == 404
    assert (await admin.post("/ui/schedules/pause", project="no such", name="x")).status_code == 422


async def test_every_list_page_polls_its_own_address_for_its_rows(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")
    run = app.enqueue("noop", key="k1")
    admin = await sign_in(ADMIN_TOKEN)
    lists = {
        "/ui/runs?task=noop&key=k1": "runs",
        "/ui/keys": "keys",
        "/ui/workers": "workers",
        "/ui/schedules": "schedules",
        "/ui/tasks": "tasks",
        f"/ui/triggers/{trigger['id']}/log": "requests",
    }
    for path, table in lists.items():
        page = await admin.page(path)
        shown = path.replace("&", "&amp;")
        assert (
            f'<tbody data-live hx-get="{shown}" hx-select="#{table} > tbody"'
            ' hx-trigger="every 5s" hx-swap="outerHTML">'
        ) in page, path
        # What the poll gets: the same page, whose rows it takes.
        polled = await admin.page(path, **{"HX-Request": "true"})
        assert f'<table id="{table}">' in polled
    other = app.enqueue("noop", key="k2")
    runs = await admin.page("/ui/runs?task=noop&key=k1", **{"HX-Request": "true"})
    assert attribute_values(runs, "data-run") == [str(run.id)]  # the filter holds
    assert str(other.id) in await admin.page("/ui/runs?task=noop", **{"HX-Request": "true"})


async def test_the_workers_page_lists_what_each_worker_runs_now_the_longest_first(
    app: Tidegate, sql: psycopg.Connection, sign_in: Any
) -> None:
    for worker in ("w-1", "w-2", "w-3"):
        sql.execute(
            "INSERT INTO workers (id, host, pid, workloops, tasks) VALUES"
            " (%s, 'host-a', 41, '[]', '{noop}')",
            [worker],
        )
    runs = app.enqueue_many(
        [NewRun("noop", key=f"k{i}", lane="bulk") for i in range(53)] + [NewRun("echo")]
    )
    ids = [run.id for run in runs]
    # w-1 holds 52 runs, started 52 s ago to 1 s ago; w-2 holds one; w-3 none; one waits.
    for i, run_id in enumerate(ids[:52]):
        sql.execute(
            "UPDATE runs SET state = 'running', worker_id = 'w-1',"
            " attempted_at = now() - make_interval(secs => %s) WHERE id = %s",
            [52 - i, run_id],
        )
    sql.execute(
        "UPDATE runs SET state = 'running', worker_id = 'w-2', attempted_at = now()"
        " - interval '3.2 seconds' WHERE id = %s",
        [ids[53]],
    )
    page = await (await sign_in(ADMIN_TOKEN)).page("/ui/workers")
    first = cells(page, "data-worker", "w-1")
    listed = re.findall(r'<li data-run="(\d+)">', first)
    assert listed == [str(i) for i in ids[:50]]  # at most 50, the longest running first
    assert "the 50 running longest" in first
    assert re.search(
        rf'<li data-run="{ids[0]}"><a href="/ui/runs/{ids[0]}">{ids[0]}</a> <code>noop</code>'
        r" key k0, bulk, started <time [^>]+>\d+ s ago</time></li>",
        first,
    ), first
    second = cells(page, "data-worker", "w-2")
    assert re.findall(r'<li data-run="(\d+)">', second) == [str(ids[53])]
    assert re.search(r"key default, default, started <time [^>]+>[\d.]+ s ago</time>", second)
    assert "running longest" not in second
    assert '<td class="running"></td>' in cells(page, "data-worker", "w-3")
    assert f'data-run="{ids[52]}"' not in page  # waiting, not running


async def test_the_tasks_page_charts_completed_and_failed_attempts_per_task_per_minute(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection, sign_in: Any
) -> None:
    alpha = await create_project(client, "alpha")
    app.enqueue_many(
        [NewRun("noop") for _ in range(5)]
        + [NewRun("fail", max_attempts=1) for _ in range(2)]
        + [NewRun("fail", {"until_attempt": 1}) for _ in range(1)]
    )
    async with running_worker(app, "manual>*:2"):
        await wait_until(
            lambda: (
                sql.execute(
                    "SELECT count(*) FROM runs WHERE state IN ('succeeded', 'discarded')"
                ).fetchone()
                == (8,)
            ),
            timeout=60,
        )
    # Counted by heartbeats (the last one as the worker stops), by task.
    counted = sql.execute(
        "SELECT task, outcome, sum(count)::int FROM minute_counts WHERE source = 'attempt'"
        " GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()
    assert counted == [("fail", "discarded", 2), ("fail", "succeeded", 1), ("noop", "succeeded", 5)]
    sql.execute(
        "INSERT INTO minute_counts (minute, source, project, lane, task, outcome, count) VALUES"
        " (date_trunc('minute', now()) - interval '10 minutes', 'attempt', '', 'bulk', 'noop',"
        "  'failed', 4),"
        " (date_trunc('minute', now()) - interval '10 minutes', 'attempt', '', 'bulk', 'noop',"
        "  'rescued', 1),"
        " (date_trunc('minute', now()) - interval '10 minutes', 'attempt', '', 'bulk', 'noop',"
        "  'retry_requested', 9),"
        " (date_trunc('minute', now()) - interval '61 minutes', 'attempt', '', 'bulk', 'noop',"
        "  'succeeded', 100)"
    )
    admin = await sign_in(ADMIN_TOKEN)
    page = await admin.page("/ui/tasks")
    assert attribute_values(page, "data-task") == ["noop", "fail"]  # the most attempts first
    assert re.findall(r'<td class="num">([^<]*)</td>', cells(page, "data-task", "noop")) == [
        "5",
        "5",
        "50.0",
    ]
    assert re.findall(r'<td class="num">([^<]*)</td>', cells(page, "data-task", "fail")) == [
        "1",
        "2",
        "66.7",
    ]
    assert '<div id="task-charts" class="charts"' in page

    activity = (await admin.client.get("/ui/api/tasks")).json()
    assert len(activity["minutes"]) == 60
    assert [t["task"] for t in activity["tasks"]] == ["noop", "fail"]
    noop = activity["tasks"][0]
    assert noop["series"] == ["completed", "failed"]
    completed, failed = noop["counts"]
    assert sum(completed) == 5 and completed[-1] + completed[-2] == 5
    assert sum(failed) == 5 and failed[49] + failed[48] == 5  # ten minutes ago

    own = await sign_in(alpha["token"])
    await own.page("/ui/tasks", 404)
    assert (await own.client.get("/ui/api/tasks")).status_code == 404
    assert "/ui/tasks" not in await own.page("/ui/runs")
