"""Pausing a lane: no claim takes its runs, on any worker, until it is resumed.

Real PostgreSQL; workers in this process (local, and remote through a real API server)
and in separate processes; webhooks, the admin API, the metrics and the dashboard over
real HTTP; the CLI through click's runner on the test's schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner

from tests.conftest import WorkerOf, wait_until
from tests.http_fixtures import ADMIN, ADMIN_TOKEN, ApiServer, create_project, create_trigger
from tests.test_claim_plan import claim_plans, scans_of
from tidegate import NewRun, Tidegate
from tidegate.admission import PAUSED_RETRY_SECONDS
from tidegate.cli import main
from tidegate.lanes import MAX_PAUSED_LANES, LaneError, pause_lane, paused_lanes, resume_lane
from tidegate.policies import set_key_policy
from tidegate.testing import Harness


def states(sql: psycopg.Connection, lane: str) -> dict[str, int]:
    rows = sql.execute(
        "SELECT state::text, count(*) FROM runs WHERE lane = %s GROUP BY state", [lane]
    ).fetchall()
    return dict(rows)


@pytest.fixture
async def client(api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        yield client


@pytest.mark.parametrize("path", ["plain", "limits"])
async def test_a_paused_lane_is_not_claimed_while_other_lanes_flow_and_resume_wakes_it(
    app: Tidegate, sql: psycopg.Connection, worker_of: WorkerOf, path: str
) -> None:
    if path == "limits":  # a key policy anywhere: the claim is claim_runs_keyed
        app.execute(set_key_policy("flow", "*", max_running=100))
    app.execute(pause_lane("hold", by="tests", reason="deploy"))
    held = app.enqueue_many([NewRun("record", lane="hold") for _ in range(3)])
    # The polls are far apart: only the resumption's NOTIFY can wake the worker in time.
    async with worker_of(app, "hold>flow:1 manual>*:1", poll_seconds=60):
        # Every claim asks `hold` first, and `*` would find it too: each of these runs
        # was claimed past the paused lane's older runs.
        for _ in range(3):
            app.enqueue("record", lane="flow")
            app.enqueue("record", lane="other")
        await wait_until(lambda: states(sql, "flow") == {"succeeded": 3})
        await wait_until(lambda: states(sql, "other") == {"succeeded": 3})
        assert states(sql, "hold") == {"available": 3}
        run = app.get_run(held[0].id)
        assert run is not None and run.reason == "lane 'hold' is paused"

        assert app.execute(resume_lane("hold", channel=app.available_channel))
        await wait_until(lambda: states(sql, "hold") == {"succeeded": 3}, timeout=30)
    assert not app.execute(resume_lane("hold", channel=app.available_channel))
    run = app.get_run(held[0].id)
    assert run is not None and run.reason is None


async def test_after_pause_returns_no_worker_process_starts_a_claim_of_the_lane(
    app: Tidegate,
    sql: psycopg.Connection,
    start_worker_process: Callable[..., Any],
) -> None:
    start_worker_process("hold>flow:4")
    start_worker_process("manual>*:4")
    app.enqueue_many([NewRun("sleep", {"seconds": 0.05}, lane="hold") for _ in range(600)])
    await wait_until(lambda: states(sql, "hold").get("succeeded", 0) >= 20, timeout=60)

    app.execute(pause_lane("hold", by="tests"))
    [(paused_at,)] = sql.execute("SELECT clock_timestamp()").fetchall()
    app.enqueue_many([NewRun("record", lane="flow") for _ in range(20)])
    await wait_until(lambda: states(sql, "flow") == {"succeeded": 20}, timeout=60)
    # Runs claimed before the pause go on to their end; none is claimed after it.
    await wait_until(lambda: "running" not in states(sql, "hold"), timeout=60)
    [(late,)] = sql.execute(
        "SELECT count(*) FROM runs WHERE lane = 'hold' AND attempted_at >= %s", [paused_at]
    ).fetchall()
    assert late == 0
    waiting = states(sql, "hold").get("available", 0)
    assert waiting > 0

    app.execute(resume_lane("hold", channel=app.available_channel))
    await wait_until(lambda: states(sql, "hold") == {"succeeded": 600}, timeout=120)
    [(twice,)] = sql.execute(
        "SELECT count(*) FROM (SELECT run_id FROM executions GROUP BY run_id"
        " HAVING count(*) > 1) AS repeated"
    ).fetchall()
    assert twice == 0


async def test_a_sync_webhook_of_a_paused_fast_lane_gets_503_naming_it_and_async_ones_wait(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    start_worker_process: Callable[..., Any],
) -> None:
    await create_project(client, "acme")
    sync = await create_trigger(client, "acme", "now", mode="sync", task="echo")
    later = await create_trigger(client, "acme", "later", mode="async", task="record")
    start_worker_process("fast_lane:1 manual>*:1")
    paused = await client.post(
        "/admin/lanes/fast_lane/pause", json={"reason": "upstream migration"}, headers=ADMIN
    )
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] and paused.json()["reason"] == "upstream migration"
    assert paused.json()["paused_by"] == "admin API"
    await client.post("/admin/lanes/default/pause", headers=ADMIN)

    refused = await client.post(sync["url"], json={"n": 1})
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == str(PAUSED_RETRY_SECONDS)
    problem = refused.json()
    assert problem["lane"] == "fast_lane" and "'fast_lane' is paused" in problem["detail"]
    assert "upstream migration" not in refused.text  # the operator's words stay inside
    accepted = await client.post(later["url"], json={"n": 2})
    assert accepted.status_code == 202, accepted.text
    run_id = int(accepted.headers["location"].rsplit("/", 1)[1])
    assert states(sql, "fast_lane") == {}  # the refusal made no run

    shown = (await client.get(f"/runs/{run_id}", headers=ADMIN)).json()
    assert (shown["state"], shown["reason"]) == ("available", "lane 'default' is paused")
    listed = {
        lane["lane"]: lane for lane in (await client.get("/admin/lanes", headers=ADMIN)).json()
    }
    assert listed["fast_lane"]["paused"] and listed["default"]["paused"]
    assert listed["manual"]["paused"] is False
    assert listed["default"]["depth"]["available"] == 1
    metrics = (await client.get("/metrics", headers=ADMIN)).text
    assert 'tidegate_lane_paused{lane="fast_lane"} 1.0' in metrics
    assert 'tidegate_lane_paused{lane="manual"} 0.0' in metrics
    await wait_until(
        lambda: (
            sql.execute(
                "SELECT outcome, status FROM request_log WHERE trigger_id = %s", [sync["id"]]
            ).fetchall()
            == [("lane_paused", 503)]
        )
    )

    for lane in ("fast_lane", "default"):
        resumed = await client.post(f"/admin/lanes/{lane}/resume", headers=ADMIN)
        assert resumed.json() == {"lane": lane, "paused": False, "resumed": True}
    await wait_until(lambda: states(sql, "default") == {"succeeded": 1})
    again = await client.post("/admin/lanes/default/resume", headers=ADMIN)
    assert again.json() == {"lane": "default", "paused": False, "resumed": False}
    answered = await client.post(sync["url"], json={"n": 3})
    assert answered.status_code == 200, answered.text
    metrics = (await client.get("/metrics", headers=ADMIN)).text
    assert 'tidegate_lane_paused{lane="fast_lane"} 0.0' in metrics


async def test_pause_input_out_of_bounds_gets_422_and_pauses_nothing(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    too_long = await client.post(
        "/admin/lanes/default/pause", json={"reason": "x" * 256}, headers=ADMIN
    )
    nul = await client.post("/admin/lanes/default/pause", json={"reason": "a\x00b"}, headers=ADMIN)
    bad_lane = await client.post("/admin/lanes/no-dash/pause", headers=ADMIN)
    extra = await client.post("/admin/lanes/default/pause", json={"why": "x"}, headers=ADMIN)
    assert [r.status_code for r in (too_long, nul, bad_lane, extra)] == [422] * 4
    sql.execute(
        "INSERT INTO paused_lanes (lane, paused_by)"
        " SELECT 'lane' || i, 'tests' FROM generate_series(1, %s) AS i",
        [MAX_PAUSED_LANES],
    )
    over = await client.post("/admin/lanes/default/pause", headers=ADMIN)
    assert over.status_code == 422 and "resume one first" in over.json()["detail"]
    again = await client.post("/admin/lanes/lane1/pause", json={"reason": "still"}, headers=ADMIN)
    assert again.status_code == 200 and again.json()["reason"] == "still"  # paused already
    assert sql.execute("SELECT count(*) FROM paused_lanes").fetchone() == (MAX_PAUSED_LANES,)
    unauthorized = await client.post("/admin/lanes/default/pause")
    assert unauthorized.status_code == 401


def test_the_cli_pauses_lists_and_resumes_a_lane(app: Tidegate, settings: Any) -> None:
    env = {"TIDEGATE_DATABASE_URL": settings.database_url, "TIDEGATE_SCHEMA": settings.schema}
    runner = CliRunner()
    app.enqueue("noop", lane="bulk")
    paused = runner.invoke(main, ["lanes", "pause", "bulk", "--reason", "a bad deploy"], env=env)
    assert paused.exit_code == 0, paused.output
    shown = json.loads(paused.output)
    assert (shown["lane"], shown["paused"], shown["reason"]) == ("bulk", True, "a bad deploy")
    assert shown["paused_by"].startswith("cli (")

    table = runner.invoke(main, ["lanes"], env=env)
    assert table.exit_code == 0, table.output
    header, *rows = table.output.splitlines()
    assert header.split()[:2] == ["LANE", "SCHEDULED"] and header.split()[-1] == "PAUSED"
    [bulk] = [row for row in rows if row.startswith("bulk ")]
    assert bulk.split()[2] == "1" and bulk.endswith(": a bad deploy")
    [manual] = [row for row in rows if row.startswith("manual ")]
    assert "since" not in manual
    listed = json.loads(runner.invoke(main, ["lanes", "--json"], env=env).output)
    assert [lane["lane"] for lane in listed if lane["paused"]] == ["bulk"]

    resumed = runner.invoke(main, ["lanes", "resume", "bulk"], env=env)
    assert resumed.exit_code == 0 and "resumed" in resumed.output
    again = runner.invoke(main, ["lanes", "resume", "bulk"], env=env)
    assert again.exit_code == 0 and "was not paused" in again.output
    bad = runner.invoke(main, ["lanes", "pause", "no-dash"], env=env)
    assert bad.exit_code == 1 and "lane name must match" in bad.output
    long = runner.invoke(main, ["lanes", "pause", "bulk", "--reason", "x" * 256], env=env)
    assert long.exit_code == 1 and "reason must be 1 to 255 characters" in long.output
    assert app.execute(paused_lanes()) == {}


async def test_the_overview_pauses_and_resumes_a_lane_behind_the_session_and_csrf(
    app: Tidegate, api: ApiServer, sql: psycopg.Connection
) -> None:
    app.enqueue("noop", lane="bulk")
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as browser:
        assert (await browser.post("/ui/login", data={"token": ADMIN_TOKEN})).status_code == 303
        page = (await browser.get("/ui/")).text
        csrf = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
        assert csrf and '<form id="pause-lane" method="post" action="/ui/lanes/pause">' in page
        token = csrf.group(1)

        refused = await browser.post("/ui/lanes/pause", data={"lane": "bulk", "csrf_token": "x"})
        assert refused.status_code == 403
        assert sql.execute("SELECT count(*) FROM paused_lanes").fetchone() == (0,)
        form = {"lane": "bulk", "reason": "too hot", "csrf_token": token}
        done = await browser.post("/ui/lanes/pause", data=form)
        assert done.status_code == 303 and done.headers["location"] == "/ui/"
        assert sql.execute("SELECT paused_by, reason FROM paused_lanes").fetchall() == [
            ("dashboard", "too hot")
        ]
        fragment = (await browser.get("/ui/fragments/lanes")).text
        row = re.search(r'<tr data-lane="bulk" class="paused">(.*?)</tr>', fragment, re.S)
        assert row and "too hot" in row.group(1) and 'action="/ui/lanes/resume"' in row.group(1)
        bad = await browser.post("/ui/lanes/pause", data={"lane": "a b", "csrf_token": token})
        assert bad.status_code == 422

        resumed = await browser.post("/ui/lanes/resume", data={"lane": "bulk", "csrf_token": token})
        assert resumed.status_code == 303
        assert sql.execute("SELECT count(*) FROM paused_lanes").fetchone() == (0,)
        fragment = (await browser.get("/ui/fragments/lanes")).text
        assert '<tr data-lane="bulk">' in fragment and 'action="/ui/lanes/pause"' in fragment

    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        project_token = (await create_project(client, "acme"))["token"]
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as project:
        assert (await project.post("/ui/login", data={"token": project_token})).status_code == 303
        page = (await project.get("/ui/runs")).text
        csrf = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
        assert csrf
        data = {"lane": "bulk", "csrf_token": csrf.group(1)}
        assert (await project.post("/ui/lanes/pause", data=data)).status_code == 404
    assert sql.execute("SELECT count(*) FROM paused_lanes").fetchone() == (0,)


@pytest.mark.parametrize("limits", [False, True])
def test_the_claim_leaves_paused_lanes_out_and_still_probes_its_indexes(
    app: Tidegate, sql: psycopg.Connection, limits: bool
) -> None:
    if limits:
        app.execute(set_key_policy("default", "*", max_running=1000))
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p', l, 'k' || (i % 50), 'noop', i FROM generate_series(1, 5000) AS i,"
        " unnest(ARRAY['default', 'hold', 'also_held']) AS l"
    )
    sql.execute("ANALYZE runs")
    app.execute(pause_lane("hold", by="tests"))
    app.execute(pause_lane("also_held", by="tests"))
    plans, claimed = claim_plans(sql, ["hold", "manual"], True)
    lanes = sql.execute(
        "SELECT DISTINCT lane FROM runs WHERE id = ANY(%s)", [[row[0] for row in claimed]]
    ).fetchall()
    assert len(claimed) == 8 and lanes == [("default",)]
    scans = scans_of(plans)
    assert not any(kind == "Seq Scan" and rel == "runs" for kind, _, rel in scans), scans
    assert any(index == "runs_claim_lane" for _, index, _ in scans), scans


def test_pause_refuses_a_malformed_lane_or_reason_before_the_database(app: Tidegate) -> None:
    for lane, reason in [("a-b", None), ("x" * 65, None), ("ok", ""), ("ok", "x" * 256)]:
        with pytest.raises(LaneError):
            app.execute(pause_lane(lane, by="tests", reason=reason))
    with pytest.raises(LaneError):
        app.execute(resume_lane("a b", channel=app.available_channel))


def test_drain_leaves_the_runs_of_a_paused_lane_waiting(app: Tidegate) -> None:
    app.pause_lane("hold", reason="not now")
    held = app.enqueue("echo", {"n": 1}, lane="hold")
    flowing = app.enqueue("echo", {"n": 2})
    assert [run.id for run in Harness(app).drain()] == [flowing.id]
    waiting = app.get_run(held.id)
    assert waiting is not None and waiting.reason == "lane 'hold' is paused"
    assert app.resume_lane("hold")
    assert [run.id for run in Harness(app).drain()] == [held.id]
