"""The webhook ingress through a real server: HTTP on a port, PostgreSQL, worker processes.

Every test starts ``tidegate serve --role api`` (``api`` / ``start_api``) on its own
schema and creates its projects and triggers through the admin API, as an operator
would. Where a run must execute, ``tidegate worker`` processes run ``tests/apps.py``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import admission, wait_until
from tests.http_fixtures import (
    ADMIN,
    ApiServer,
    PrivatePostgres,
    assert_problem,
    counts,
    create_project,
    create_trigger,
)
from tidegate import Settings, Tidegate, projects
from tidegate.api.kernel import ProblemType
from tidegate.signatures import sign
from tidegate.storage.sql import query

SECRET = "whsec_" + base64.b64encode(b"a secret of thirty-two bytes!!!!").decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"the secret before the rotation!!").decode()


@pytest.fixture
async def client(api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        yield client


def run_row(sql: psycopg.Connection, run_id: int) -> dict[str, Any]:
    cursor = sql.execute(
        "SELECT id, project, lane, task, state, args, result, errors, max_attempts"
        " FROM runs WHERE id = %s",
        [run_id],
    )
    row = cursor.fetchone()
    assert row is not None, f"no run {run_id}"
    names = [column.name for column in cursor.description or ()]
    return dict(zip(names, row, strict=True))


async def healthy(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


# -- async triggers -------------------------------------------------------------------


async def test_async_webhook_is_committed_before_202_then_runs(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    start_worker_process: Callable[..., Any],
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")

    response = await client.post(trigger["url"], json={"order": 7}, headers={"X-Shop": "one"})

    assert response.status_code == 202, response.text
    body = response.json()
    run_id = body["run_id"]
    assert response.headers["location"] == f"/runs/{run_id}"
    assert body["status_url"] == f"/runs/{run_id}"
    # Durable before the answer: both rows are visible to another connection right away.
    run = run_row(sql, run_id)
    assert (run["project"], run["lane"], run["task"], run["state"]) == (
        "acme",
        "default",
        "echo",
        "available",
    )
    assert run["args"]["body"] == {"order": 7}
    assert run["args"]["trigger"] == "orders"
    assert run["args"]["headers"]["x-shop"] == "one"
    request = sql.execute(
        "SELECT id, project, trigger_id, content_type, body FROM requests WHERE run_id = %s",
        [run_id],
    ).fetchone()
    assert request is not None
    assert request[0] == body["request_id"]
    assert (request[1], request[2]) == ("acme", trigger["id"])
    assert request[3] == "application/json"
    assert json.loads(bytes(request[4])) == {"order": 7}

    start_worker_process("manual>*:2")
    await wait_until(lambda: run_row(sql, run_id)["state"] == "succeeded", timeout=15)
    assert run_row(sql, run_id)["result"]["body"] == {"order": 7}
    status = await client.get(f"/runs/{run_id}", headers=ADMIN)
    assert status.status_code == 200
    assert status.json()["state"] == "succeeded"


# -- bad input: a clear 4xx, nothing stored, the server unharmed ------------------------


async def test_a_hot_tenants_webhooks_do_not_starve_a_cold_tenants(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    start_worker_process: Callable[..., Any],
) -> None:
    """Webhook runs take their key's turn like enqueued ones: round-robin across tenants."""
    await create_project(client, "hot")
    await create_project(client, "cold")
    hot = await create_trigger(client, "hot", "orders", mode="async", task="echo")
    cold = await create_trigger(client, "cold", "orders", mode="async", task="echo")
    sent = await asyncio.gather(*(client.post(hot["url"], json={"n": n}) for n in range(60)))
    assert {r.status_code for r in sent} == {202}
    response = await client.post(cold["url"], json={"n": 0})
    assert response.status_code == 202, response.text
    cold_run = response.json()["run_id"]

    start_worker_process("manual>*:1")  # one slot: runs start one at a time, in claim order
    await wait_until(
        lambda: (
            sql.execute("SELECT count(*) FROM runs WHERE state = 'succeeded'").fetchone() == (61,)
        ),
        timeout=30,
    )
    assert run_row(sql, cold_run)["project"] == "cold"
    order = [
        project for (project,) in sql.execute("SELECT project FROM runs ORDER BY attempted_at, id")
    ]
    # The cold tenant's only webhook came after 60 of the hot one's; first in first out it
    # would run 61st. It takes the hot tenant's second step: after the hot runs stamped at
    # the first two steps, which can be several each, since admissions running at once
    # (on the server's pool of 8 connections) read the same clock.
    assert order.count("cold") == 1
    assert order.index("cold") < 2 * 8 + 1, order


async def test_unknown_token_gets_404(client: httpx.AsyncClient, sql: psycopg.Connection) -> None:
    response = await client.post("/hooks/tgh_no-such-token", json={"a": 1})

    assert_problem(response, 404)
    assert counts(sql) == (0, 0)
    await healthy(client)


async def test_disabled_trigger_gets_404(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")
    accepted = await client.post(trigger["url"], json={"a": 0})  # the API now knows it
    assert accepted.status_code == 202, accepted.text
    patched = await client.patch(
        f"/admin/triggers/{trigger['id']}", json={"enabled": False}, headers=ADMIN
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["enabled"] is False

    response = await client.post(trigger["url"], json={"a": 1})

    assert_problem(response, 404)
    assert counts(sql) == (1, 1)
    await healthy(client)


async def test_a_trigger_disabled_elsewhere_is_refused_within_a_second(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    """An API process keeps a trigger it looked up for up to a second: a change made
    through another process (the CLI, another API process) applies within that."""
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")
    assert (await client.post(trigger["url"], json={"a": 0})).status_code == 202
    sql.execute("UPDATE triggers SET enabled = false WHERE id = %s", [trigger["id"]])
    disabled_at = time.monotonic()

    statuses = []
    while not statuses or statuses[-1] != 404:
        statuses.append((await client.post(trigger["url"], json={"a": 1})).status_code)
        assert time.monotonic() - disabled_at < 1.5, statuses

    assert set(statuses) <= {202, 404}
    assert counts(sql) == (statuses.count(202) + 1,) * 2


async def test_body_over_the_limit_gets_413(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    """The limit holds for the body and the headers kept with it, together."""
    await create_project(client, "acme")
    trigger = await create_trigger(
        client, "acme", "small", mode="async", task="echo", max_body_bytes=1000
    )
    big = json.dumps({"pad": "x" * 1000}).encode()

    response = await client.post(
        trigger["url"], content=big, headers={"Content-Type": "application/json"}
    )

    assert response.request.headers["content-length"] == str(len(big))
    problem = assert_problem(response, 413)
    assert problem["max_bytes"] == 1000

    # Exactly at the limit is fine: what the server keeps of the headers, plus the body.
    def kept(body: bytes) -> int:
        request = client.build_request(
            "POST", trigger["url"], content=body, headers={"Content-Type": "application/json"}
        )
        headers = request.headers.items()
        return len(body) + sum(len(name) + len(value) for name, value in headers)

    exact = b'{"pad": ""}'
    while kept(exact) < 1000:
        exact = exact.replace(b'"}', b'x"}')
    assert kept(exact) == 1000
    accepted = await client.post(
        trigger["url"], content=exact, headers={"Content-Type": "application/json"}
    )
    assert accepted.status_code == 202, accepted.text
    over = exact.replace(b'"}', b'x"}')
    assert_problem(
        await client.post(
            trigger["url"], content=over, headers={"Content-Type": "application/json"}
        ),
        413,
    )
    assert counts(sql) == (1, 1)
    await healthy(client)


async def test_streamed_body_without_length_over_the_limit_gets_413(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    """A client that sends no Content-Length cannot push more than the limit."""
    await create_project(client, "acme")
    trigger = await create_trigger(
        client, "acme", "small", mode="async", task="echo", max_body_bytes=1000
    )

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"pad": "'
        for _ in range(64):
            yield b"x" * 1024
        yield b'"}'

    response = await client.post(
        trigger["url"], content=chunks(), headers={"Content-Type": "application/json"}
    )

    assert response.request.headers["transfer-encoding"] == "chunked"
    assert "content-length" not in response.request.headers
    assert_problem(response, 413)
    assert counts(sql) == (0, 0)
    await healthy(client)

    async def small() -> AsyncIterator[bytes]:
        yield b'{"pad": '
        yield b'"x"}'

    accepted = await client.post(
        trigger["url"], content=small(), headers={"Content-Type": "application/json"}
    )
    assert accepted.status_code == 202, accepted.text
    assert counts(sql) == (1, 1)


async def test_content_type_that_is_not_json_gets_415(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")

    response = await client.post(
        trigger["url"], content=b'{"a": 1}', headers={"Content-Type": "text/plain"}
    )

    problem = assert_problem(response, 415)
    assert "text/plain" in problem["detail"]
    assert problem["accepts"] == ["application/json"]
    # A +json media type with parameters is JSON.
    accepted = await client.post(
        trigger["url"],
        content=b'{"a": 1}',
        headers={"Content-Type": "application/cloudevents+json; charset=utf-8"},
    )
    assert accepted.status_code == 202, accepted.text
    assert counts(sql) == (1, 1)
    await healthy(client)


async def test_malformed_json_gets_400(client: httpx.AsyncClient, sql: psycopg.Connection) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")

    for body in [b'{"a": 1', b"", b"\xff\xfe{}", b"{'a': 1}", b'{"a": 1} trailing']:
        response = await client.post(
            trigger["url"], content=body, headers={"Content-Type": "application/json"}
        )
        problem = assert_problem(response, 400, ProblemType.MALFORMED_JSON)
        assert "malformed JSON" in problem["detail"], body

    assert counts(sql) == (0, 0)
    await healthy(client)


def signed(
    body: bytes, *secrets: str, webhook_id: str = "msg_1", at: int | None = None
) -> dict[str, str]:
    timestamp = int(time.time()) if at is None else at
    return {
        "Content-Type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(s, webhook_id, timestamp, body) for s in secrets),
    }


async def test_bad_signatures_get_401_and_valid_ones_are_accepted(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(
        client, "acme", "signed", mode="async", task="echo", secret=SECRET
    )
    body = b'{"event": "paid"}'
    url = trigger["url"]
    good = signed(body, SECRET)

    refused = {
        "no signature headers": {"Content-Type": "application/json"},
        "no signature": {k: v for k, v in good.items() if k != "webhook-signature"},
        "no timestamp": {k: v for k, v in good.items() if k != "webhook-timestamp"},
        "no id": {k: v for k, v in good.items() if k != "webhook-id"},
        "wrong secret": signed(body, OLD_SECRET),
        "signed another body": signed(b'{"event": "refunded"}', SECRET),
        "another id": {**good, "webhook-id": "msg_2"},
        "stale timestamp": signed(body, SECRET, at=int(time.time()) - 600),
        "future timestamp": signed(body, SECRET, at=int(time.time()) + 600),
        "timestamp not a number": {**good, "webhook-timestamp": "yesterday"},
        "garbage signature": {**good, "webhook-signature": "v1,bm90IGEgc2lnbmF0dXJl"},
    }
    for case, headers in refused.items():
        response = await client.post(url, content=body, headers=headers)
        problem = assert_problem(response, 401, ProblemType.BAD_SIGNATURE)
        assert problem["detail"].startswith("bad signature"), case
    assert counts(sql) == (0, 0)
    await healthy(client)

    accepted = await client.post(url, content=body, headers=good)
    assert accepted.status_code == 202, accepted.text
    # During a rotation the sender signs with both secrets; either entry may match.
    rotated = signed(body, OLD_SECRET, SECRET, webhook_id="msg_3")
    assert len(rotated["webhook-signature"].split()) == 2
    accepted_rotated = await client.post(url, content=body, headers=rotated)
    assert accepted_rotated.status_code == 202, accepted_rotated.text
    assert accepted_rotated.json()["run_id"] != accepted.json()["run_id"]
    assert counts(sql) == (2, 2)
    keys = sql.execute("SELECT idempotency_key FROM requests ORDER BY id").fetchall()
    assert [k for (k,) in keys] == ["msg_1", "msg_3"]


# -- idempotency --------------------------------------------------------------------


@pytest.mark.parametrize("header", ["Idempotency-Key", "webhook-id"])
async def test_repeat_of_an_admitted_webhook_gets_the_original_answer(
    client: httpx.AsyncClient, sql: psycopg.Connection, header: str
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")

    first = await client.post(trigger["url"], json={"n": 1}, headers={header: "order-7"})
    second = await client.post(trigger["url"], json={"n": 1}, headers={header: "order-7"})
    other = await client.post(trigger["url"], json={"n": 1}, headers={header: "order-8"})

    assert first.status_code == second.status_code == 202
    assert "idempotent-replayed" not in first.headers
    assert second.headers["idempotent-replayed"] == "true"
    assert second.json()["run_id"] == first.json()["run_id"]
    assert second.json()["request_id"] == first.json()["request_id"]
    assert second.headers["location"] == first.headers["location"]
    assert other.json()["run_id"] != first.json()["run_id"]
    assert counts(sql) == (2, 2)
    too_long = await client.post(trigger["url"], json={"n": 1}, headers={header: "k" * 256})
    assert_problem(too_long, 400)
    assert counts(sql) == (2, 2)
    # The same key with another body: 422 (the IETF idempotency-key draft), no run; the
    # original body still gets the original answer.
    changed = await client.post(trigger["url"], json={"n": 2}, headers={header: "order-7"})
    problem = assert_problem(changed, 422, ProblemType.IDEMPOTENCY_KEY_REUSED)
    assert "'order-7'" in problem["detail"]
    assert "idempotent-replayed" not in changed.headers and "retry-after" not in changed.headers
    assert counts(sql) == (2, 2)
    third = await client.post(trigger["url"], json={"n": 1}, headers={header: "order-7"})
    assert third.json()["run_id"] == first.json()["run_id"]
    # The webhook log keeps it with what the answer said.
    await wait_until(
        lambda: (
            ("key_reused", 422, problem["detail"])
            in sql.execute("SELECT outcome, status, detail FROM request_log").fetchall()
        ),
        10,
    )


async def test_an_idempotency_key_sent_as_a_structured_field_string_is_its_content(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    """The IETF draft sends ``Idempotency-Key: "k"``; many senders send ``k``: one key."""
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")

    bare = await client.post(trigger["url"], json={"n": 1}, headers={"Idempotency-Key": 'a"b'})
    quoted = await client.post(
        trigger["url"], json={"n": 1}, headers={"Idempotency-Key": '"a\\"b"'}
    )

    assert quoted.headers["idempotent-replayed"] == "true", quoted.text
    assert quoted.json()["run_id"] == bare.json()["run_id"]
    assert sql.execute("SELECT idempotency_key FROM requests").fetchall() == [('a"b',)]


def admissions_waiting(sql: psycopg.Connection) -> int:
    """Count admissions that wait on a lock (in this database)."""
    row = sql.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        " AND query LIKE %s",
        ["%admit_webhook(%"],
    ).fetchone()
    return int(row[0]) if row else 0


async def test_concurrent_duplicates_on_two_servers_make_one_run(
    start_api: Callable[..., ApiServer], sql: psycopg.Connection, settings: Settings
) -> None:
    """Ten copies at once, spread over two servers on one schema: one run, one answer.

    To make the copies overlap for sure, the test holds a lock that stalls every insert
    into ``requests`` (as a slow disk would) until all ten admissions are in flight.
    """
    copies = 10
    servers = [start_api(), start_api()]
    async with (
        httpx.AsyncClient(base_url=servers[0].url, timeout=20) as one,
        httpx.AsyncClient(base_url=servers[1].url, timeout=20) as two,
    ):
        await create_project(one, "acme")
        trigger = await create_trigger(one, "acme", "orders", mode="async", task="echo")
        assert settings.database_url
        with psycopg.connect(
            settings.database_url, options=f"-c search_path={settings.schema}"
        ) as stall:
            stall.execute("LOCK TABLE requests IN SHARE ROW EXCLUSIVE MODE")
            sent = [
                asyncio.create_task(
                    client.post(trigger["url"], json={"n": 1}, headers={"Idempotency-Key": "dup"})
                )
                for client in [one, two] * (copies // 2)
            ]
            await wait_until(lambda: admissions_waiting(sql) >= copies, timeout=10)
            stall.commit()
        responses = await asyncio.gather(*sent)

    assert [r.status_code for r in responses] == [202] * copies, [r.text for r in responses]
    assert len({r.json()["run_id"] for r in responses}) == 1
    assert len({r.headers["location"] for r in responses}) == 1
    replayed = [r for r in responses if r.headers.get("idempotent-replayed") == "true"]
    assert len(replayed) == copies - 1
    assert counts(sql) == (1, 1)


# -- sync triggers ------------------------------------------------------------------


@pytest.fixture
async def sync_worker(start_worker_process: Callable[..., Any]) -> None:
    start_worker_process("fast_lane:1 manual>*:2")


async def test_sync_webhook_replies_with_the_result(
    client: httpx.AsyncClient, sql: psycopg.Connection, sync_worker: None
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "quote", mode="sync", task="echo")

    response = await client.post(trigger["url"], json={"item": "tea"})

    assert response.status_code == 200, response.text
    assert response.json()["body"] == {"item": "tea"}
    assert response.json()["trigger"] == "quote"
    run_id = int(response.headers["location"].removeprefix("/runs/"))
    run = run_row(sql, run_id)
    assert (run["lane"], run["state"], run["max_attempts"]) == ("fast_lane", "succeeded", 1)
    assert counts(sql) == (1, 1)
    # A repeat replies with the finished run's result at once.
    again = await client.post(
        trigger["url"], json={"item": "tea"}, headers={"Idempotency-Key": "k"}
    )
    repeat = await client.post(
        trigger["url"], json={"item": "tea"}, headers={"Idempotency-Key": "k"}
    )
    assert again.status_code == repeat.status_code == 200
    assert repeat.headers["idempotent-replayed"] == "true"
    assert repeat.json() == again.json()


async def test_sync_handler_can_shape_its_reply(
    client: httpx.AsyncClient, sync_worker: None
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "create", mode="sync", task="hook_reply")

    response = await client.post(trigger["url"], json={"name": "x"})

    assert response.status_code == 201, response.text
    assert response.headers["x-a"] == "b"
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"got": {"name": "x"}}


async def test_sync_handler_that_fails_gets_5xx_with_the_run_and_no_error_details(
    client: httpx.AsyncClient, sql: psycopg.Connection, sync_worker: None
) -> None:
    project = await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "broken", mode="sync", task="fail")

    response = await client.post(trigger["url"], json={})

    problem = assert_problem(response, 502)
    assert (problem["detail"], problem["state"]) == ("the run ended discarded", "discarded")
    assert "boom" not in response.text  # the sender is not told what the handler said
    run = run_row(sql, problem["run_id"])
    assert (run["state"], run["max_attempts"], len(run["errors"])) == ("discarded", 1, 1)
    # The project sees the error, without the traceback; the super admin sees both.
    mine = {"Authorization": f"Bearer {project['token']}"}
    seen = (await client.get(f"/runs/{problem['run_id']}", headers=mine)).json()
    assert seen["errors"] == [
        {"attempt": 1, "at": run["errors"][0]["at"], "error": "ValueError: boom on attempt 1"}
    ]
    listed = (await client.get("/runs", headers=mine)).json()
    assert "traceback" not in listed[0]["errors"][0]
    admin = (await client.get(f"/runs/{problem['run_id']}", headers=ADMIN)).json()
    assert "ValueError: boom on attempt 1" in admin["errors"][0]["traceback"]


async def test_sync_webhook_past_its_timeout_gets_202_and_the_run_goes_on(
    client: httpx.AsyncClient, sql: psycopg.Connection, sync_worker: None
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(
        client, "acme", "slow", mode="sync", task="hook_sleep", sync_timeout_seconds=0.5
    )

    response = await client.post(trigger["url"], json={"seconds": 2})

    assert response.status_code == 202, response.text
    run_id = response.json()["run_id"]
    assert response.headers["location"] == f"/runs/{run_id}"
    assert response.json()["state"] in ("available", "running")
    await wait_until(lambda: run_row(sql, run_id)["state"] == "succeeded", timeout=15)
    assert run_row(sql, run_id)["result"] == {"slept": 2.0}


def test_every_admission_sync_or_async_commits_through_the_wal_flush(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """A sync webhook's run must be on disk before a worker can start it
    (docs/guarantees.md): admit_webhook.sql leaves the connection's synchronous_commit
    on, for the fast lane as for any other."""
    app.execute(projects.create_project("acme"))
    for mode in ("async", "sync"):
        trigger = app.execute(projects.create_trigger("acme", mode, mode=mode, task="noop"))
        lane = "fast_lane" if mode == "sync" else "default"
        with sql.transaction(force_rollback=True):
            params = {**admission(trigger, "acme"), "lane": lane}
            decision = sql.execute(query("admit_webhook"), params).fetchone()
            assert decision is not None and decision[0] in ("admitted", "no_worker")
            assert sql.execute("SHOW synchronous_commit").fetchone() == ("on",)


async def test_cancelling_a_sync_run_answers_its_waiting_caller(
    client: httpx.AsyncClient, sql: psycopg.Connection, sync_worker: None
) -> None:
    """The caller hears of the cancel at once, not at its sync timeout."""
    await create_project(client, "acme")
    trigger = await create_trigger(
        client, "acme", "slow", mode="sync", task="hook_sleep", sync_timeout_seconds=15
    )
    waiting = asyncio.create_task(client.post(trigger["url"], json={"seconds": 2}))
    await wait_until(
        lambda: sql.execute("SELECT id FROM runs WHERE state = 'running'").fetchone() is not None,
        timeout=10,
    )
    (run_id,) = sql.execute("SELECT id FROM runs").fetchone() or ()

    cancelled = await client.post(f"/runs/{run_id}/cancel", headers=ADMIN)
    assert cancelled.status_code == 200, cancelled.text
    response = await asyncio.wait_for(waiting, 20)

    # Answered before the handler (which is not interrupted) got to its end.
    assert sql.execute("SELECT count(*) FROM executions").fetchone() == (0,)
    problem = assert_problem(response, 502)
    assert (problem["run_id"], problem["state"]) == (run_id, "cancelled")


# -- the runs API ---------------------------------------------------------------------


async def test_runs_api_shows_retries_and_cancels_runs_per_project(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    acme = await create_project(client, "acme")
    other = await create_project(client, "other")
    orders = await create_trigger(client, "acme", "orders", mode="async", task="echo")
    pings = await create_trigger(client, "acme", "pings", mode="async", task="noop")
    theirs = await create_trigger(client, "other", "x", mode="async", task="echo")
    ids = []
    for trigger in (orders, orders, pings, theirs):
        response = await client.post(trigger["url"], json={})
        assert response.status_code == 202
        ids.append(response.json()["run_id"])
    r1, r2, r3, r4 = ids
    as_acme = {"Authorization": f"Bearer {acme['token']}"}
    as_other = {"Authorization": f"Bearer {other['token']}"}
    assert acme["token"] != other["token"]

    # One run: the super admin and its own project see it; other callers do not.
    seen = await client.get(f"/runs/{r1}", headers=ADMIN)
    assert seen.status_code == 200
    assert {k: seen.json()[k] for k in ("id", "project", "lane", "task", "state", "attempt")} == {
        "id": r1,
        "project": "acme",
        "lane": "default",
        "task": "echo",
        "state": "available",
        "attempt": 0,
    }
    assert (await client.get(f"/runs/{r1}", headers=as_acme)).json() == seen.json()
    assert_problem(await client.get(f"/runs/{r1}", headers=as_other), 404)
    assert_problem(await client.get("/runs/999999", headers=ADMIN), 404)
    unauthenticated = await client.get(f"/runs/{r1}")
    assert_problem(unauthenticated, 401)
    assert unauthenticated.headers["www-authenticate"] == "Bearer"
    assert_problem(await client.get(f"/runs/{r1}", headers={"Authorization": "Bearer x"}), 403)
    # A project token is not an admin token.
    assert_problem(await client.get("/admin/projects", headers=as_acme), 403)

    async def listed(headers: dict[str, str], **filters: Any) -> list[int]:
        response = await client.get("/runs", params=filters, headers=headers)
        assert response.status_code == 200, response.text
        return [run["id"] for run in response.json()]

    assert await listed(ADMIN) == [r4, r3, r2, r1]
    assert await listed(ADMIN, project="acme") == [r3, r2, r1]
    assert await listed(ADMIN, project="acme", task="noop") == [r3]
    assert await listed(ADMIN, lane="default", state="available", limit=2) == [r4, r3]
    assert await listed(ADMIN, lane="manual") == []
    assert await listed(as_acme) == [r3, r2, r1]
    assert await listed(as_other) == [r4]
    assert_problem(await client.get("/runs", params={"project": "other"}, headers=as_acme), 403)
    assert_problem(await client.get("/runs", params={"state": "nonsense"}, headers=ADMIN), 422)

    # Cancel, then retry one: it comes back in the manual lane.
    cancelled = await client.post(f"/runs/{r1}/cancel", headers=as_acme)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["state"] == "cancelled"
    assert_problem(await client.post(f"/runs/{r1}/cancel", headers=as_acme), 409)
    assert_problem(await client.post(f"/runs/{r4}/cancel", headers=as_acme), 404)
    assert await listed(ADMIN, state="cancelled") == [r1]
    retried = await client.post(f"/runs/{r1}/retry", headers=as_acme)
    assert retried.status_code == 200, retried.text
    assert (retried.json()["state"], retried.json()["lane"]) == ("available", "manual")
    assert_problem(await client.post(f"/runs/{r2}/retry", headers=ADMIN), 409)

    # Bulk retry: the default lane; a project retries only its own finished runs.
    for run_id in (r1, r2, r4):
        assert (await client.post(f"/runs/{run_id}/cancel", headers=ADMIN)).status_code == 200
    bulk = await client.post("/runs/retry", json={"ids": [r1, r2, r3, r4]}, headers=as_acme)
    assert bulk.status_code == 200, bulk.text
    assert bulk.json() == {"retried": [r1, r2]}  # r3 has not finished, r4 is not theirs
    lanes: dict[int, str] = dict(
        sql.execute("SELECT id, lane FROM runs WHERE state = 'available'").fetchall()
    )
    assert lanes == {r1: "default", r2: "default", r3: "default"}
    assert run_row(sql, r4)["state"] == "cancelled"
    everything = await client.post("/runs/retry", json={"ids": [r4]}, headers=ADMIN)
    assert everything.json() == {"retried": [r4]}
    assert_problem(await client.post("/runs/retry", json={"ids": []}, headers=ADMIN), 422)


# -- the database goes away -----------------------------------------------------------


async def test_readyz_stays_ready_without_workers_and_the_workers_health_says_so(
    client: httpx.AsyncClient, sql: psycopg.Connection, start_worker_process: Callable[..., Any]
) -> None:
    """An API process that can accept is ready, whatever the workers do: with none alive,
    async webhooks get 202 and are kept, sync ones the API's own 503 + Retry-After; the
    workers' health answers 503 until one beats, and again once it is gone."""
    ready = await client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["status"] == "ready"
    await create_project(client, "acme")
    orders = await create_trigger(client, "acme", "orders", mode="async", task="echo")
    quote = await create_trigger(client, "acme", "quote", mode="sync", task="echo")
    assert (await client.post(orders["url"], json={"n": 1})).status_code == 202
    refused = await client.post(quote["url"], json={"q": 1})
    assert assert_problem(refused, 503) and int(refused.headers["retry-after"]) >= 1
    assert counts(sql) == (1, 1)  # the async one, kept until a worker comes
    unhealthy = assert_problem(await client.get("/readyz/workers"), 503)
    assert unhealthy["detail"] == "no live worker"
    assert (unhealthy["workers"], unhealthy["slots"], unhealthy["busy"]) == (0, 0, 0)

    worker = start_worker_process("manual>*:3")
    healthy = await client.get("/readyz/workers")
    assert healthy.status_code == 200, healthy.text
    assert (healthy.json()["workers"], healthy.json()["slots"]) == (1, 3)
    worker.kill()  # gone without a word: it stops beating
    worker.wait(10)
    deadline = time.monotonic() + 10
    while (await client.get("/readyz/workers")).status_code == 200:
        assert time.monotonic() < deadline, "a worker still live 10 s after the only one died"
        await asyncio.sleep(0.2)
    assert (await client.get("/readyz")).status_code == 200


async def test_unreachable_database_gets_503_then_recovers_by_itself(
    start_api: Callable[..., ApiServer], settings: Settings, tmp_path: Path
) -> None:
    """503 + Retry-After while the database is down; back to 202 soon after it returns.

    The outage lasts about nine seconds: long enough that a connection pool backing off
    without a ceiling would still be asleep when the database is back.
    """
    database = PrivatePostgres(tmp_path)
    try:
        private = settings.replace(database_url=database.start())
        Tidegate(settings=private).migrate()
        server = start_api(settings=private)
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            await create_project(client, "acme")
            trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")
            assert (await client.post(trigger["url"], json={})).status_code == 202

            database.stop()
            down = time.monotonic()
            while time.monotonic() - down < 5:
                started = time.monotonic()
                response = await client.post(trigger["url"], json={})
                assert time.monotonic() - started < 10, "the answer must not hang"
                assert_problem(response, 503)
                assert int(response.headers["retry-after"]) >= 1
            assert assert_problem(await client.get("/readyz"), 503)["detail"] == (
                "database unavailable"
            )
            await healthy(client)

            database.start()
            back = time.monotonic()
            while True:
                response = await client.post(trigger["url"], json={})
                if response.status_code == 202:
                    break
                assert_problem(response, 503)  # never a 500 on the way back
                assert time.monotonic() - back < 3, "still 503 three seconds after recovery"
                await asyncio.sleep(0.1)
            # The database and schema are right again: ready, though no worker was ever
            # started (that is /readyz/workers' answer).
            assert (await client.get("/readyz")).status_code == 200
        server.stop()
        with psycopg.connect(database.url, options=f"-c search_path={settings.schema}") as conn:
            assert counts(conn) == (2, 2)
    finally:
        database.stop()


# -- the admin API --------------------------------------------------------------------


async def test_admin_api_refuses_bad_changes_with_clear_errors(client: httpx.AsyncClient) -> None:
    created = await create_project(client, "acme", fast_lane_cap=2, ingest_rate=5)
    assert (created["id"], created["fast_lane_cap"], created["ingest_rate"]) == ("acme", 2, 5)
    assert created["token"].startswith("tgp_")
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")

    assert_problem(await client.get("/admin/projects"), 401)
    assert_problem(await client.post("/admin/projects", json={"id": "acme"}, headers=ADMIN), 409)
    assert_problem(await client.post("/admin/projects", json={"id": "a b"}, headers=ADMIN), 422)
    assert_problem(
        await client.post("/admin/projects", json={"id": "x", "fast_lane_cap": -1}, headers=ADMIN),
        422,
    )
    assert_problem(await client.patch("/admin/projects/nope", json={}, headers=ADMIN), 404)
    assert_problem(
        await client.post(
            "/admin/projects/nope/triggers",
            json={"name": "t", "mode": "async", "task": "echo"},
            headers=ADMIN,
        ),
        404,
    )
    for bad in ({"mode": "later"}, {"secret": "not-whsec"}, {"max_body_bytes": 0}):
        body = {"name": "t", "mode": "async", "task": "echo", **bad}
        response = await client.post("/admin/projects/acme/triggers", json=body, headers=ADMIN)
        assert_problem(response, 422)
    duplicate = {"name": "orders", "mode": "async", "task": "echo"}
    assert_problem(
        await client.post("/admin/projects/acme/triggers", json=duplicate, headers=ADMIN), 409
    )
    assert_problem(await client.patch("/admin/triggers/999999", json={}, headers=ADMIN), 404)

    # Only what was sent changes; null clears a limit.
    patched = await client.patch(
        "/admin/projects/acme", json={"ingest_rate": None, "backlog_cap": 7}, headers=ADMIN
    )
    assert patched.status_code == 200, patched.text
    assert (patched.json()["fast_lane_cap"], patched.json()["ingest_rate"]) == (2, None)
    assert patched.json()["backlog_cap"] == 7
    listed = await client.get("/admin/projects/acme/triggers", headers=ADMIN)
    assert [t["url"] for t in listed.json()] == [trigger["url"]]
    assert "token_hash" not in (await client.get("/admin/projects/acme", headers=ADMIN)).json()
