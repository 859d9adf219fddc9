"""``GET /metrics`` on a real ``tidegate serve --role api``: the figures are the database's.

Each test puts runs, workers and projects in its schema, scrapes the server over HTTP
and compares what Prometheus would read (parsed with prometheus_client's own parser)
with what the tables hold.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_until
from tests.http_fixtures import ADMIN, ApiServer, assert_problem, create_project
from tidegate import NewRun, Tidegate

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
CLOCKED = ("tidegate_lane_lag_seconds", "tidegate_worker_heartbeat_age_seconds")
"""The figures that change with the clock alone, from one scrape to the next."""


def scrape(server: ApiServer) -> Samples:
    response = httpx.get(server.url + "/metrics", headers=ADMIN, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (metric, labels), value in samples.items() if metric == name}


def busy_slots(sql: psycopg.Connection) -> int:
    row = sql.execute(
        "SELECT coalesce(sum((l ->> 'busy')::integer), 0)"
        " FROM workers, jsonb_array_elements(workloops) AS l"
    ).fetchone()
    return int(row[0]) if row else 0


async def test_figures_match_the_database_with_a_live_worker(
    app: Tidegate,
    sql: psycopg.Connection,
    api: ApiServer,
    start_worker_process: Callable[..., subprocess.Popen[bytes]],
) -> None:
    # The worker takes only fast_lane, so every other lane stays as enqueued.
    start_worker_process("fast_lane:2", "--shutdown-grace-seconds", "0.5")
    app.enqueue_many(
        [NewRun("noop", lane="default") for _ in range(7)]
        + [NewRun("noop", lane="manual") for _ in range(3)]
        + [NewRun("noop", lane="bulk", delay=3600) for _ in range(4)]
        + [NewRun("async_sleep", {"seconds": 60}, lane="fast_lane")]
    )
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, state, vtime)"
        " SELECT 'p', 'bulk', 'k', 'nobody.has_it', 'pending', i FROM generate_series(1, 5) AS i"
    )
    # The oldest ready run of `default` has been due for a minute.
    sql.execute(
        "UPDATE runs SET scheduled_at = now() - interval '60 seconds'"
        " WHERE id = (SELECT min(id) FROM runs WHERE lane = 'default')"
    )
    await wait_until(lambda: busy_slots(sql) == 1, 20)

    samples = scrape(api)
    depths = series(samples, "tidegate_runs")
    truth = dict(
        ((("lane", lane), ("state", state)), count)
        for lane, state, count in sql.execute(
            "SELECT lane, state::text, count(*) FROM runs GROUP BY 1, 2"
        ).fetchall()
    )
    for labels, value in depths.items():
        assert value == truth.get(labels, 0), (labels, value)
    assert {labels for labels in truth} <= set(depths)
    assert depths[(("lane", "fast_lane"), ("state", "running"))] == 1
    assert depths[(("lane", "bulk"), ("state", "scheduled"))] == 4
    assert depths[(("lane", "bulk"), ("state", "pending"))] == 5

    lag = series(samples, "tidegate_lane_lag_seconds")
    assert 60 <= lag[(("lane", "default"),)] < 70
    assert 0 <= lag[(("lane", "manual"),)] < 10
    assert lag[(("lane", "bulk"),)] == 0  # nothing ready there

    assert samples[("tidegate_workers_live", ())] == 1
    assert 0 <= samples[("tidegate_worker_heartbeat_age_seconds", ())] < 3
    assert series(samples, "tidegate_workloop_slots") == {(("chain", "fast_lane"),): 2}
    assert series(samples, "tidegate_workloop_busy") == {(("chain", "fast_lane"),): 1}
    # Runs enqueued from code belong to the project `default`, which has no row: the
    # server's cap (10) is its cap.
    assert series(samples, "tidegate_fast_lane_in_flight") == {(("project", "default"),): 1}
    assert series(samples, "tidegate_fast_lane_cap") == {(("project", "default"),): 10}


def test_two_api_processes_report_the_same_figures(
    app: Tidegate, sql: psycopg.Connection, start_api: Callable[..., ApiServer]
) -> None:
    first, second = start_api(), start_api(processes=2)
    app.enqueue_many([NewRun("noop", lane=lane) for lane in ("default", "manual", "x") * 5])
    sql.execute(
        "INSERT INTO workers (id, host, pid, workloops) VALUES ('w', 'h', 1, %s)",
        [json.dumps([{"chain": ["manual", "*"], "slots": 4, "busy": 3}])],
    )
    scrapes = [scrape(server) for server in (first, second, second, second, first)]
    for samples in scrapes[1:]:
        assert {k: v for k, v in samples.items() if k[0] not in CLOCKED} == {
            k: v for k, v in scrapes[0].items() if k[0] not in CLOCKED
        }
        assert samples.keys() == scrapes[0].keys()
    assert series(scrapes[0], "tidegate_runs")[(("lane", "x"), ("state", "available"))] == 5
    assert series(scrapes[0], "tidegate_workloop_busy") == {(("chain", "manual>*"),): 3}


async def test_metrics_need_the_super_admin_token(app: Tidegate, api: ApiServer) -> None:
    async with httpx.AsyncClient(base_url=api.url) as client:
        project = await create_project(client, "acme")
        missing = await client.get("/metrics")
        body = assert_problem(missing, 401)
        assert missing.headers["www-authenticate"] == "Bearer"
        assert "tidegate_" not in json.dumps(body)
        unknown = await client.get("/metrics", headers={"Authorization": "Bearer tga_nope"})
        assert_problem(unknown, 403)
        as_project = await client.get(
            "/metrics", headers={"Authorization": f"Bearer {project['token']}"}
        )
        assert_problem(as_project, 403)
        allowed = await client.get("/metrics", headers=ADMIN)
        assert allowed.status_code == 200
        assert "tidegate_fast_lane_cap" in allowed.text


def fast_lane_runs(sql: psycopg.Connection, runs: dict[str, int]) -> None:
    """Put ``runs[project]`` fast-lane runs of each project in flight (no worker takes them)."""
    for project, count in runs.items():
        sql.execute(
            "INSERT INTO runs (project, lane, key, task, vtime)"
            " SELECT %s, 'fast_lane', %s, 'noop', i FROM generate_series(1, %s) AS i",
            [project, project, count],
        )


def test_project_series_stop_at_the_busiest_projects(
    app: Tidegate, sql: psycopg.Connection, start_api: Callable[..., ApiServer]
) -> None:
    api = start_api(metrics_max_projects=3, fast_lane_cap=7)
    sql.execute(
        "INSERT INTO projects (id, fast_lane_cap)"
        " SELECT 'p' || i, i FROM generate_series(1, 500) AS i"
    )
    # Without any run in flight, the first projects by name fill the places.
    idle = scrape(api)
    assert series(idle, "tidegate_fast_lane_in_flight") == {
        (("project", name),): 0 for name in ("p1", "p10", "p100")
    }
    fast_lane_runs(sql, {"p7": 2, "p300": 5, "p42": 1, "p9": 3, "unlisted": 4})
    busy = scrape(api)
    expected: dict[str, Any] = {"p300": (5, 300), "unlisted": (4, 7), "p9": (3, 9)}
    assert series(busy, "tidegate_fast_lane_in_flight") == {
        (("project", name),): runs for name, (runs, _) in expected.items()
    }
    assert series(busy, "tidegate_fast_lane_cap") == {
        (("project", name),): cap for name, (_, cap) in expected.items()
    }
    # Fewer busy projects than places: the busy one first, then idle ones by name.
    sql.execute("DELETE FROM runs WHERE project <> 'p42'")
    assert series(scrape(api), "tidegate_fast_lane_in_flight") == {
        (("project", "p42"),): 1,
        (("project", "p1"),): 0,
        (("project", "p10"),): 0,
    }
