"""Triggers that key their runs from the webhook (``key_from``): a field of the body or a
header names the run's key, and every per-key policy acts on it.

Real ``tidegate serve`` processes, real HTTP, real PostgreSQL, as the other webhook tests.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner

from tests.conftest import wait_until
from tests.http_fixtures import (
    ADMIN,
    ApiServer,
    assert_problem,
    counts,
    create_project,
    create_trigger,
)
from tidegate import Tidegate, projects
from tidegate.cli import main
from tidegate.errors import InputError
from tidegate.webhooks import KeyFrom


@pytest.fixture
async def client(api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
        yield client


def run_keys(sql: psycopg.Connection) -> list[str]:
    return [row[0] for row in sql.execute("SELECT key FROM runs ORDER BY id").fetchall()]


def most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most of ``[start, end)`` intervals open at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


async def test_runs_take_the_key_the_body_or_a_header_carries(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    await create_project(client, "acme")
    orders = await create_trigger(
        client, "acme", "orders", mode="async", task="echo", key_from="/data/order/id"
    )
    shops = await create_trigger(
        client, "acme", "shops", mode="async", task="echo", key_from="header:X-Shop-Domain"
    )
    assert orders["key_from"] == "/data/order/id"
    sent = [
        await client.post(orders["url"], json={"data": {"order": {"id": "o-1"}}}),
        await client.post(orders["url"], json={"data": {"order": {"id": 42}}}),
        await client.post(shops["url"], json={}, headers={"X-Shop-Domain": "a.example"}),
        await client.post(shops["url"], json={}, headers={"x-shop-domain": "b.example"}),
    ]
    assert [r.status_code for r in sent] == [202] * 4, [r.text for r in sent]
    assert run_keys(sql) == ["o-1", "42", "a.example", "b.example"]

    # A pointer's escapes and an array's element, as RFC 6901 reads them.
    escaped = await client.patch(
        f"/admin/triggers/{orders['id']}", json={"key_from": "/a~1b/~0/1"}, headers=ADMIN
    )
    assert escaped.status_code == 200 and escaped.json()["key_from"] == "/a~1b/~0/1"
    third = await client.post(orders["url"], json={"a/b": {"~": ["x", 4.5]}})
    assert third.status_code == 202, third.text
    assert run_keys(sql)[-1] == "4.5"

    # Cleared: the project's key again.
    cleared = await client.patch(
        f"/admin/triggers/{orders['id']}", json={"key_from": None}, headers=ADMIN
    )
    assert cleared.json()["key_from"] is None
    plain = await client.post(orders["url"], json={"data": {}})
    assert plain.status_code == 202, plain.text
    assert run_keys(sql)[-1] == "acme"


async def test_max_running_1_holds_per_key_the_webhooks_carry(
    start_api: Callable[..., ApiServer],
    start_worker_process: Callable[..., Any],
    sql: psycopg.Connection,
) -> None:
    """Two API processes take a burst for two shops at once; a policy of one run in flight
    per key runs each shop's webhooks one at a time, and the two shops side by side."""
    api = start_api(processes=2)
    start_worker_process("manual>*:4")
    limits = httpx.Limits(max_connections=20, max_keepalive_connections=20)
    async with httpx.AsyncClient(base_url=api.url, timeout=30, limits=limits) as client:
        await create_project(client, "acme")
        policy = await client.put(
            "/admin/lanes/default/keys/*", json={"max_running": 1}, headers=ADMIN
        )
        assert policy.status_code == 200, policy.text
        trigger = await create_trigger(
            client, "acme", "orders", mode="async", task="hook_sleep", key_from="/shop"
        )
        answers = await asyncio.gather(
            *(
                client.post(trigger["url"], json={"shop": shop, "seconds": 0.4, "n": n})
                for n in range(5)
                for shop in ("a.example", "b.example")
            )
        )
    assert [r.status_code for r in answers] == [202] * 10, [r.text for r in answers]
    await wait_until(
        lambda: (
            sql.execute("SELECT count(*) FROM runs WHERE state = 'succeeded'").fetchone() == (10,)
        ),
        60,
    )
    rows = sql.execute(
        "SELECT runs.key, executions.started_at, executions.finished_at"
        " FROM executions JOIN runs ON runs.id = executions.run_id"
    ).fetchall()
    by_key: dict[str, list[tuple[datetime, datetime]]] = {}
    for key, started, finished in rows:
        by_key.setdefault(key, []).append((started, finished))
    assert {key: len(runs) for key, runs in by_key.items()} == {"a.example": 5, "b.example": 5}
    assert {key: most_at_once(runs) for key, runs in by_key.items()} == {
        "a.example": 1,
        "b.example": 1,
    }
    assert most_at_once([run for runs in by_key.values() for run in runs]) == 2


async def test_a_webhook_without_its_key_is_refused_422_stores_no_run_and_is_logged(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    await create_project(client, "acme")
    orders = await create_trigger(
        client, "acme", "orders", mode="async", task="echo", key_from="/order/id"
    )
    shops = await create_trigger(
        client, "acme", "shops", mode="sync", task="echo", key_from="header:X-Shop-Domain"
    )
    bodies = {
        "the body has no '/order/id'": [{}, {"order": {}}, {"order": [1]}, [1], "text", 5],
        "is null": [{"order": {"id": None}}],
        "is a boolean": [{"order": {"id": True}}],
        "is an object": [{"order": {"id": {"n": 1}}}],
        "is an array": [{"order": {"id": [1]}}],
        "is 256 characters; a key is 1 to 255": [{"order": {"id": "x" * 256}}],
        "is 0 characters": [{"order": {"id": ""}}],
    }
    refused = []
    for reason, values in bodies.items():
        for value in values:
            answer = await client.post(orders["url"], json=value)
            problem = assert_problem(answer, 422)
            assert reason in problem["detail"], (value, problem)
            assert problem["key_from"] == "/order/id"
            refused.append(answer)
    headers: list[Any] = [
        {},
        [("X-Shop-Domain", "a.example"), ("X-Shop-Domain", "b.example")],
        {"X-Shop-Domain": "y" * 256},
    ]
    for sent in headers:
        answer = await client.post(shops["url"], json={"n": 1}, headers=sent)
        assert "x-shop-domain" in assert_problem(answer, 422)["detail"]
        refused.append(answer)
    assert counts(sql) == (0, 0)

    def logged() -> Counter[tuple[str, int]]:
        found = sql.execute("SELECT outcome, status FROM request_log").fetchall()
        return Counter(found)

    await wait_until(lambda: logged() == {("no_run_key", 422): len(refused)}, 10)
    details = {row[0] for row in sql.execute("SELECT detail FROM request_log").fetchall()}
    assert "header 'x-shop-domain' was sent 2 times" in details

    # The same trigger admits a webhook that carries its key.
    admitted = await client.post(orders["url"], json={"order": {"id": 7}})
    assert admitted.status_code == 202, admitted.text
    assert run_keys(sql) == ["7"]


async def test_a_keys_backlog_cap_and_breaker_hold_only_the_key_the_webhook_carries(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    """Without a worker: the backlog cap (1) fills per shop, and a sync webhook of a shop
    whose breaker is forced open gets 503 while another shop's goes on to the next check
    (no worker: 503 of its own)."""
    await create_project(client, "acme", backlog_cap=1)
    orders = await create_trigger(
        client, "acme", "orders", mode="async", task="echo", key_from="/shop"
    )
    first = await client.post(orders["url"], json={"shop": "a"})
    again = await client.post(orders["url"], json={"shop": "a"})
    other = await client.post(orders["url"], json={"shop": "b"})
    assert (first.status_code, other.status_code) == (202, 202), (first.text, other.text)
    assert "backlog" in assert_problem(again, 503)["detail"]
    assert run_keys(sql) == ["a", "b"]

    forced = await client.put(
        "/admin/lanes/fast_lane/breakers/shop-a", json={"force": "open"}, headers=ADMIN
    )
    assert forced.status_code == 200, forced.text
    quotes = await create_trigger(
        client, "acme", "quotes", mode="sync", task="echo", key_from="header:X-Shop"
    )
    broken = await client.post(quotes["url"], json={}, headers={"X-Shop": "shop-a"})
    fine = await client.post(quotes["url"], json={}, headers={"X-Shop": "shop-b"})
    assert "circuit breaker of key 'shop-a'" in assert_problem(broken, 503)["detail"]
    assert "no live worker" in assert_problem(fine, 503)["detail"]


async def test_the_admin_api_bounds_key_from_and_the_openapi_document_shows_it(
    client: httpx.AsyncClient,
) -> None:
    await create_project(client, "acme")
    made = await create_trigger(client, "acme", "orders", mode="async", task="echo")
    assert made["key_from"] is None
    refused = [
        "",
        "order",
        "/~2",
        "/a" * 33,
        "header:",
        "header:X Shop",
        "header:" + "h" * 65,
        "header:Authorization",
        "/" + "x" * 255,
        7,
    ]
    for value in refused:
        answer = await client.patch(
            f"/admin/triggers/{made['id']}", json={"key_from": value}, headers=ADMIN
        )
        assert answer.status_code == 422, (value, answer.text)
        assert "key_from" in answer.text

    both = await client.post(
        "/admin/projects/acme/triggers",
        json={
            "name": "out",
            "mode": "async",
            "forward_url": "https://example.com/in",
            "key_from": "/id",
        },
        headers=ADMIN,
    )
    assert both.status_code == 422 and "key_from" in both.text, both.text
    keyed = await client.patch(
        f"/admin/triggers/{made['id']}", json={"key_from": "/id"}, headers=ADMIN
    )
    assert keyed.status_code == 200
    forwarded = await client.patch(
        f"/admin/triggers/{made['id']}",
        json={"forward_url": "https://example.com/in"},
        headers=ADMIN,
    )
    assert forwarded.status_code == 422 and "key_from" in forwarded.text, forwarded.text

    document = (await client.get("/openapi.json")).json()
    for model in ("TriggerFields", "NewTrigger"):
        field = document["components"]["schemas"][model]["properties"]["key_from"]
        assert "JSON pointer" in json.dumps(field), field


VALID = [
    "/",
    "/id",
    "/data/order/id",
    "/a~0b/~1/0",
    "/a" * 32,
    "/" + "x" * 254,
    "header:X-Shop-Domain",
    "header:x",
    "header:" + "h" * 64,
    "header:!#$%&'*+.^_`|~-9",
]
INVALID = [
    "",
    "id",
    "/~",
    "/~2",
    "/a~",
    "/a" * 33,
    "/" + "x" * 255,
    "header:",
    "header:X Shop",
    "header:a:b",
    "header:" + "h" * 65,
    "header:Authorization",
    "header:cookie",
    "header:Proxy-Authorization",
    "Header:X",
    "header:X\n",
]


def test_the_database_takes_exactly_the_key_from_the_library_takes(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    for value in VALID:
        KeyFrom.parse(value)
    for value in INVALID:
        with pytest.raises(InputError):
            KeyFrom.parse(value)
    app.execute(projects.create_project("acme"))
    app.execute(projects.create_trigger("acme", "orders", mode="async", task="echo"))
    for value in VALID + INVALID:
        try:
            sql.execute("UPDATE triggers SET key_from = %s", [value])
            taken = True
        except psycopg.errors.CheckViolation:
            taken = False
        assert taken == (value in VALID), value


def test_the_cli_sets_and_clears_key_from(app: Tidegate) -> None:
    settings = app.settings  # migrated
    env = {"TIDEGATE_DATABASE_URL": settings.database_url or "", "TIDEGATE_SCHEMA": settings.schema}

    def tidegate(*args: str, code: int = 0) -> Any:
        result = CliRunner().invoke(main, list(args), env=env)
        assert result.exit_code == code, result.output
        return json.loads(result.stdout) if code == 0 else result.output

    tidegate("projects", "create", "acme")
    made = tidegate(
        "triggers", "create", "acme", "orders", "--mode", "async", "--task", "echo",
        "--key-from", "header:X-Shop-Domain",
    )  # fmt: skip
    assert made["key_from"] == "header:X-Shop-Domain"
    trigger_id = str(made["id"])
    assert "key_from" in tidegate("triggers", "update", trigger_id, "--key-from", "x", code=1)
    changed = tidegate("triggers", "update", trigger_id, "--key-from", "/order/id")
    assert changed["key_from"] == "/order/id"
    [listed] = tidegate("triggers", "list", "acme")
    assert listed["key_from"] == "/order/id"
    cleared = tidegate("triggers", "update", trigger_id, "--no-key-from")
    assert cleared["key_from"] is None


async def test_replay_takes_the_key_from_the_logged_request_as_ingress_does(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(
        client, "acme", "orders", mode="async", task="echo", key_from="header:X-Shop"
    )
    accepted = await client.post(trigger["url"], json={"n": 1}, headers={"X-Shop": "s1"})
    assert accepted.status_code == 202, accepted.text
    refused = await client.post(trigger["url"], json={"n": 2})
    assert_problem(refused, 422)
    [(request_id, original)] = sql.execute("SELECT id, run_id FROM requests").fetchall()
    await wait_until(lambda: counts(sql) == (1, 1) and logged_ids(sql) != [], 10)

    signed_in = await client.post("/ui/login", data={"token": ADMIN["Authorization"][7:]})
    assert signed_in.status_code == 303, signed_in.text
    page = (await client.get("/ui/runs")).text
    csrf = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
    assert csrf, page
    log_page = (await client.get(f"/ui/triggers/{trigger['id']}/log")).text
    assert '<code id="key-from">header:X-Shop</code>' in log_page
    path = f"/ui/triggers/{trigger['id']}/log/admitted/{request_id}"
    replayed = await client.post(path + "/replay", data={"csrf_token": csrf.group(1)})
    assert replayed.status_code == 303, replayed.text
    new_id = int(replayed.headers["location"].rsplit("/", 1)[1])
    keys = sql.execute("SELECT id, key FROM runs ORDER BY id").fetchall()
    assert keys == [(original, "s1"), (new_id, "s1")]

    # A request refused for want of its key would be refused again.
    [refused_id] = logged_ids(sql)
    shown = (await client.get(f"/ui/triggers/{trigger['id']}/log/refused/{refused_id}")).text
    assert "refused for what it is (no_run_key)" in shown
    # Keyed elsewhere now: the admitted request carries no key there, and is not replayed.
    moved = await client.patch(
        f"/admin/triggers/{trigger['id']}", json={"key_from": "/shop"}, headers=ADMIN
    )
    assert moved.status_code == 200, moved.text
    again = await client.post(path + "/replay", data={"csrf_token": csrf.group(1)})
    assert again.status_code == 409 and "/shop" in again.text, again.text
    assert "to key its run by" in again.text
    assert counts(sql) == (2, 1)


def logged_ids(sql: psycopg.Connection) -> list[int]:
    return [row[0] for row in sql.execute("SELECT id FROM request_log ORDER BY id").fetchall()]
