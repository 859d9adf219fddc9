"""Unique webhooks: a trigger's webhooks alike within its period make one run.

Real ``tidegate serve`` processes, real HTTP, real PostgreSQL: the duplicates are
answered with the run that holds their key, and the webhook log keeps them.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
from click.testing import CliRunner

from tests.conftest import wait_until
from tests.http_fixtures import ADMIN, ApiServer, create_project, create_trigger
from tidegate import Tidegate
from tidegate.cli import main
from tidegate.limits import UNIQUE_PERIOD

YEAR = UNIQUE_PERIOD.high
"""A window no burst of a test crosses but once a year."""


async def test_webhooks_alike_at_once_on_two_api_processes_make_one_run(
    start_api: Callable[..., ApiServer], sql: psycopg.Connection
) -> None:
    api = start_api(processes=2)
    limits = httpx.Limits(max_connections=40, max_keepalive_connections=40)
    async with httpx.AsyncClient(base_url=api.url, timeout=30, limits=limits) as client:
        await create_project(client, "acme")
        trigger = await create_trigger(
            client,
            "acme",
            "accounts",
            mode="async",
            task="echo",
            unique_period=YEAR,
            unique_args=["account"],
        )
        answers = await asyncio.gather(
            *(client.post(trigger["url"], json={"account": 7, "n": n}) for n in range(20))
        )
        other = await client.post(trigger["url"], json={"account": 8, "n": 0})

    assert [r.status_code for r in answers] == [202] * 20
    run_ids = {r.json()["run_id"] for r in answers}
    assert len(run_ids) == 1, run_ids
    [run_id] = run_ids
    assert {r.headers["location"] for r in answers} == {f"/runs/{run_id}"}
    duplicates = [r for r in answers if r.headers.get("tidegate-duplicate") == "true"]
    assert len(duplicates) == 19
    assert other.status_code == 202 and other.json()["run_id"] != run_id
    assert "tidegate-duplicate" not in other.headers
    rows = sql.execute("SELECT id, args -> 'body' ->> 'account' FROM runs ORDER BY id").fetchall()
    assert [account for _, account in rows] == ["7", "8"] and rows[0][0] == run_id
    admitted = sql.execute("SELECT count(*) FROM requests").fetchone()
    assert admitted == (2,)

    def logged() -> Counter[tuple[str, int, int]]:
        found = sql.execute("SELECT outcome, status, run_id FROM request_log").fetchall()
        return Counter(found)

    await wait_until(lambda: logged() == {("duplicate", 202, run_id): 19}, 10)


async def test_a_webhook_in_the_next_window_makes_a_run_of_its_own(
    api: ApiServer, sql: psycopg.Connection
) -> None:
    period = UNIQUE_PERIOD.low
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
        await create_project(client, "acme")
        trigger = await create_trigger(
            client, "acme", "pings", mode="async", task="echo", unique_period=period
        )
        first = await client.post(trigger["url"], json={"ping": 1})
        answered = time.time()  # the key's window began at or before this
        # Until the clock is in the next window, whatever the machine's speed.
        await asyncio.sleep((math.floor(answered / period) + 1) * period - answered)
        later = await client.post(trigger["url"], json={"ping": 1})
    assert first.status_code == later.status_code == 202
    assert later.json()["run_id"] != first.json()["run_id"]
    assert "tidegate-duplicate" not in later.headers
    assert sql.execute("SELECT count(*) FROM runs").fetchone() == (2,)


async def test_a_sync_duplicate_is_answered_with_the_result_of_the_run_holding_its_key(
    start_api: Callable[..., ApiServer],
    start_worker_process: Callable[..., Any],
    sql: psycopg.Connection,
) -> None:
    api = start_api()
    start_worker_process("fast_lane:1")
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
        await create_project(client, "acme")
        trigger = await create_trigger(
            client,
            "acme",
            "quotes",
            mode="sync",
            task="echo",
            unique_period=YEAR,
            unique_args=["order"],
        )
        first = await client.post(trigger["url"], json={"order": 1, "n": 1})
        again = await client.post(trigger["url"], json={"order": 1, "n": 2})
    assert first.status_code == again.status_code == 200, again.text
    assert again.headers["tidegate-duplicate"] == "true"
    assert again.headers["location"] == first.headers["location"]
    assert again.json() == first.json() and first.json()["body"] == {"order": 1, "n": 1}
    assert sql.execute("SELECT count(*) FROM runs").fetchone() == (1,)


async def test_the_admin_api_sets_shows_bounds_and_clears_a_triggers_unique_fields(
    api: ApiServer,
) -> None:
    async with httpx.AsyncClient(base_url=api.url, timeout=30, headers=ADMIN) as client:
        await create_project(client, "acme")
        made = await create_trigger(
            client,
            "acme",
            "orders",
            mode="async",
            task="echo",
            unique_period=60,
            unique_args=["order", "customer", "order"],
            unique_states=["running", "pending", "available", "scheduled"],
        )
        assert made["unique_period"] == 60
        assert made["unique_args"] == ["customer", "order"]
        assert made["unique_states"] == ["scheduled", "available", "pending", "running"]
        [listed] = (await client.get("/admin/projects/acme/triggers")).json()
        assert {k: listed[k] for k in ("unique_period", "unique_args", "unique_states")} == {
            "unique_period": 60,
            "unique_args": ["customer", "order"],
            "unique_states": ["scheduled", "available", "pending", "running"],
        }

        refused = {
            "unique_period": [0, 0.5, YEAR + 1, "soon"],
            "unique_args": [["x"] * 33, "order", [""]],
            "unique_states": [["running"], ["done"], "running"],
        }
        for field, values in refused.items():
            for value in values:
                response = await client.patch(f"/admin/triggers/{made['id']}", json={field: value})
                assert response.status_code == 422, (field, value, response.text)
                assert field.removeprefix("unique_") in response.text

        plain = await create_trigger(client, "acme", "plain", mode="async", task="echo")
        assert plain["unique_period"] is None
        without = await client.patch(
            f"/admin/triggers/{plain['id']}", json={"unique_args": ["order"]}
        )
        assert without.status_code == 422
        assert "unique_args and unique_states need a unique_period" in without.text

        whole = await client.patch(f"/admin/triggers/{made['id']}", json={"unique_args": None})
        assert whole.json()["unique_args"] is None and whole.json()["unique_period"] == 60
        cleared = await client.patch(f"/admin/triggers/{made['id']}", json={"unique_period": None})
        assert cleared.status_code == 200, cleared.text
        assert [cleared.json()[k] for k in ("unique_period", "unique_args", "unique_states")] == [
            None,
            None,
            None,
        ]


def test_the_cli_sets_and_clears_a_triggers_unique_fields(app: Tidegate) -> None:
    settings = app.settings  # migrated
    env = {"TIDEGATE_DATABASE_URL": settings.database_url or "", "TIDEGATE_SCHEMA": settings.schema}

    def tidegate(*args: str) -> Any:
        result = CliRunner().invoke(main, list(args), env=env)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    tidegate("projects", "create", "acme")
    made = tidegate(
        "triggers", "create", "acme", "orders", "--mode", "async", "--task", "echo",
        "--unique-period", "60", "--unique-args", "order,customer",
    )  # fmt: skip
    assert made["unique_period"] == 60 and made["unique_args"] == ["customer", "order"]
    assert made["unique_states"] is None
    trigger_id = str(made["id"])
    none = tidegate("triggers", "update", trigger_id, "--unique-args", "")
    assert none["unique_args"] == []
    states = tidegate(
        "triggers", "update", trigger_id, "--unique-states", "scheduled,available,pending,running"
    )
    assert states["unique_states"] == ["scheduled", "available", "pending", "running"]
    [listed] = tidegate("triggers", "list", "acme")
    assert listed["unique_period"] == 60 and listed["unique_args"] == []
    cleared = tidegate("triggers", "update", trigger_id, "--no-unique")
    assert [cleared[k] for k in ("unique_period", "unique_args", "unique_states")] == [None] * 3

    too_short = CliRunner().invoke(
        main, ["triggers", "update", trigger_id, "--unique-period", "0"], env=env
    )
    assert too_short.exit_code == 2 and "1<=x<=31536000" in too_short.output
    both = CliRunner().invoke(
        main, ["triggers", "update", trigger_id, "--no-unique", "--unique-period", "5"], env=env
    )
    assert both.exit_code == 2 and "--no-unique" in both.output
