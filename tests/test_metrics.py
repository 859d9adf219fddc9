"""``GET /metrics`` on a real ``tidegate serve --role api``: the figures are the database's.

Each test puts runs, workers and projects in its schema, scrapes the server over HTTP
and compares what Prometheus would read (parsed with prometheus_client's own parser)
with what the tables hold.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import running_worker, wait_until
from tests.http_fixtures import (
    ADMIN,
    ApiServer,
    assert_problem,
    create_project,
    create_trigger,
)
from tidegate import NewRun, RunState, Tidegate
from tidegate.admission import PLACE_FIELD
from tidegate.schedules import create_schedule, update_schedule

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
CLOCKED = (
    "tidegate_lane_lag_seconds",
    "tidegate_worker_heartbeat_age_seconds",
    "tidegate_schedule_lag_seconds",
    "tidegate_waiting_seconds",
)
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
    # The cluster's figures, not each process's own series (process_*, python_*).
    scrapes = [
        {k: v for k, v in scrape(server).items() if k[0].startswith("tidegate_")}
        for server in (first, second, second, second, first)
    ]
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


def test_metrics_carry_the_answering_processs_own_series(api: ApiServer) -> None:
    """prometheus-client's process and platform series, as every Python exporter has:
    the API process's memory, CPU, open files and start time, and its Python."""
    samples = scrape(api)
    for name in (
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_start_time_seconds",
    ):
        assert series(samples, name)[()] > 0, name
    [labels] = series(samples, "python_info")
    assert dict(labels)["implementation"] == "CPython"
    assert series(samples, "python_gc_collections_total")


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


async def test_waiting_callers_and_the_predicted_wait_are_the_waiting_rooms(
    sql: psycopg.Connection, api: ApiServer
) -> None:
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        await create_project(client, "acme", ingest_rate=0.01, ingest_burst=1)
        await create_project(client, "quiet")
        url = (await create_trigger(client, "acme", "orders", mode="async", task="echo"))["url"]
        assert (await client.post(url, json={})).status_code == 202
        refused = [await client.post(url, json={"n": n}) for n in range(3)]
        # One caller gives up its place; another sends its ticket back: still one place.
        sql.execute(
            "UPDATE waiting_places SET lapses_at = now() - interval '1 second' WHERE ticket = %s",
            [refused[0].headers[PLACE_FIELD].split('"')[1]],
        )
        ticket = {PLACE_FIELD: refused[2].headers[PLACE_FIELD]}
        again = await client.post(url, json={"n": 2}, headers=ticket)
    assert_problem(again, 429)
    samples = scrape(api)
    assert series(samples, "tidegate_waiting_callers") == {
        (("limit", "ingest"), ("project", "acme")): 2
    }
    # The last in line is due when it was told: at most its Retry-After from now.
    wait = series(samples, "tidegate_waiting_seconds")[(("limit", "ingest"), ("project", "acme"))]
    assert 0 < wait <= int(again.headers["retry-after"])


FINISHED = {RunState.SUCCEEDED, RunState.DISCARDED, RunState.CANCELLED}


def attempts(samples: Samples) -> dict[tuple[str, str, str], float]:
    """``tidegate_attempts_total`` by (task, lane, outcome)."""
    return {
        (labels["task"], labels["lane"], labels["outcome"]): value
        for labels, value in (
            (dict(labels), value)
            for labels, value in series(samples, "tidegate_attempts_total").items()
        )
    }


async def scraped_attempts(api: ApiServer, expected: dict[tuple[str, str, str], float]) -> Samples:
    """Scrape until the attempts are ``expected`` (within a few heartbeats); return it."""
    latest: list[Samples] = []

    def counted() -> bool:
        latest[:] = [scrape(api)]
        return attempts(latest[0]) == expected

    try:
        await wait_until(counted, 10, interval=0.2)
    except AssertionError:
        raise AssertionError(f"{attempts(latest[0])} != {expected}") from None
    return latest[0]


async def test_attempts_and_durations_count_what_the_workers_finished(
    app: Tidegate, sql: psycopg.Connection, api: ApiServer
) -> None:
    runs = app.enqueue_many(
        [NewRun("noop") for _ in range(5)]
        + [NewRun("fail", {"until_attempt": 2}), NewRun("fail"), NewRun("slow")]
        + [NewRun("retry_once", lane="manual"), NewRun("cancel_me")]
    )
    async with running_worker(app, "manual>*:4"):
        # Cancelled while its handler runs: the worker stops it at its next heartbeat,
        # and counts the attempt late.
        sleeper = app.enqueue("async_sleep", {"seconds": 1.0})
        await wait_until(lambda: app.get_run(sleeper.id).state is RunState.RUNNING)  # type: ignore[union-attr]
        app.cancel(sleeper.id)

        def finished() -> bool:
            return all(app.get_run(run.id).state in FINISHED for run in runs)  # type: ignore[union-attr]

        await wait_until(finished, 20)
        samples = await scraped_attempts(
            api,
            {
                ("noop", "default", "succeeded"): 5,
                # until_attempt=2 fails once then succeeds; the other fails all three.
                ("fail", "default", "failed"): 3,
                ("fail", "default", "succeeded"): 1,
                ("fail", "default", "discarded"): 1,
                ("slow", "default", "discarded"): 1,
                ("retry_once", "manual", "retry_requested"): 1,
                ("retry_once", "manual", "succeeded"): 1,
                ("cancel_me", "default", "cancelled"): 1,
                ("async_sleep", "default", "late"): 1,
            },
        )
    counts = series(samples, "tidegate_run_duration_seconds_count")
    assert counts == {
        (("task", "noop"),): 5,
        (("task", "fail"),): 5,
        (("task", "slow"),): 1,
        (("task", "retry_once"),): 2,
        (("task", "cancel_me"),): 1,
        (("task", "async_sleep"),): 1,
    }
    buckets = series(samples, "tidegate_run_duration_seconds_bucket")
    for (task,), count in counts.items():
        assert buckets[(("le", "+Inf"), task)] == count
    # slow's handler is cut off at its 0.2 s timeout: above 0.1 s, and in the sum.
    assert buckets[(("le", "0.1"), ("task", "slow"))] == 0
    assert buckets[(("le", "0.1"), ("task", "noop"))] == 5
    sums = series(samples, "tidegate_run_duration_seconds_sum")
    assert 0.2 <= sums[(("task", "slow"),)] < 5
    # A clean stop folds the worker's rows into 'retired'.
    assert sql.execute("SELECT DISTINCT worker_id FROM worker_counters").fetchall() == [
        ("retired",)
    ]
    assert attempts(scrape(api)) == attempts(samples)


async def test_attempts_add_up_across_workers_restarts_and_dead_workers(
    app: Tidegate, sql: psycopg.Connection, api: ApiServer
) -> None:
    async with running_worker(app, "*:2"):
        app.enqueue_many([NewRun("noop") for _ in range(3)])
        await scraped_attempts(api, {("noop", "default", "succeeded"): 3})
    # Two workers of two slots each, four runs that take a while: each runs two.
    async with running_worker(app, "*:2"), running_worker(app, "*:2"):
        app.enqueue_many([NewRun("async_sleep", {"seconds": 0.5}) for _ in range(4)])
        await scraped_attempts(
            api,
            {("noop", "default", "succeeded"): 3, ("async_sleep", "default", "succeeded"): 4},
        )
        rows = sql.execute(
            "SELECT worker_id, attempts FROM worker_counters"
            " WHERE task = 'async_sleep' AND outcome = 'succeeded'"
        ).fetchall()
        assert sorted(attempts for _, attempts in rows) == [2, 2], rows
        # A worker that died without a word left its rows: a live worker folds them.
        sql.execute(
            "INSERT INTO worker_counters VALUES"
            " ('gone:1:abc', 'noop', 'default', 'succeeded', 7, 0.5, %s)",
            [[7] + [0] * 13],
        )
        await wait_until(
            lambda: (
                not sql.execute(
                    "SELECT FROM worker_counters WHERE worker_id = 'gone:1:abc'"
                ).fetchall()
            ),
            10,
        )
        await scraped_attempts(
            api,
            {("noop", "default", "succeeded"): 10, ("async_sleep", "default", "succeeded"): 4},
        )
    samples = scrape(api)
    assert attempts(samples) == {
        ("noop", "default", "succeeded"): 10,
        ("async_sleep", "default", "succeeded"): 4,
    }
    assert series(samples, "tidegate_run_duration_seconds_count") == {
        (("task", "noop"),): 10,
        (("task", "async_sleep"),): 4,
    }
    assert sql.execute("SELECT DISTINCT worker_id FROM worker_counters").fetchall() == [
        ("retired",)
    ]


async def test_waits_from_due_to_claimed_and_rescued_attempts_are_counted(
    app: Tidegate, sql: psycopg.Connection, api: ApiServer
) -> None:
    app.enqueue_many([NewRun("noop") for _ in range(4)])
    # A run whose worker died holding it: its lease has lapsed.
    stuck = app.enqueue("noop", lane="manual")
    sql.execute(
        "UPDATE runs SET state = 'running', worker_id = 'gone:1:x', attempt = 1,"
        " attempted_at = now(), lease_expires_at = now() - interval '1 second'"
        " WHERE id = %s",
        [stuck.id],
    )
    await asyncio.sleep(0.3)  # the runs wait at least this long before a worker is there
    async with running_worker(app, "*:2"):
        samples = await scraped_attempts(
            api,
            {
                ("noop", "default", "succeeded"): 4,
                ("noop", "manual", "rescued"): 1,
                ("noop", "manual", "succeeded"): 1,
            },
        )
        await wait_until(
            lambda: len(series(scrape(api), "tidegate_claim_wait_seconds_count")) == 2, 10
        )
        samples = scrape(api)
    counts = series(samples, "tidegate_claim_wait_seconds_count")
    assert counts == {(("lane", "default"),): 4, (("lane", "manual"),): 1}
    waits = series(samples, "tidegate_claim_wait_seconds_bucket")
    assert waits[(("lane", "default"), ("le", "0.1"))] == 0
    assert waits[(("lane", "default"), ("le", "+Inf"))] == 4
    assert series(samples, "tidegate_claim_wait_seconds_sum")[(("lane", "default"),)] >= 1.2
    # The rescued attempt had no handler time: it is no part of the durations.
    assert series(samples, "tidegate_run_duration_seconds_count") == {(("task", "noop"),): 5}


async def test_the_busiest_keys_show_their_runs_and_what_holds_them(
    app: Tidegate, sql: psycopg.Connection, start_api: Callable[..., ApiServer]
) -> None:
    api = start_api(metrics_max_keys=3)
    app.set_key_policy("default", "hot", max_running=2)
    for n in range(20):  # keys with a policy and nothing to do: not among the busiest
        app.set_key_policy("default", f"idle{n:02}", max_running=5)
    app.enqueue_many(
        [NewRun("async_sleep", {"seconds": 2}, key="hot") for _ in range(10)]
        + [NewRun("async_sleep", {"seconds": 2}, key="cold")]
    )

    def keys() -> dict[tuple[str, ...], float]:
        samples = scrape(api)
        return {
            (name.removeprefix("tidegate_key_"), *(value for _, value in labels)): count
            for name in (
                "tidegate_key_in_flight",
                "tidegate_key_waiting",
                "tidegate_key_max_running",
                "tidegate_key_held",
            )
            for labels, count in series(samples, name).items()
        }

    async with running_worker(app, "*:4"):
        figures: dict[tuple[str, ...], float] = {}

        def claimed() -> bool:
            figures.clear()
            figures.update(keys())
            return figures.get(("in_flight", "hot", "default")) == 2 and (
                figures.get(("in_flight", "cold", "default")) == 1
            )

        await wait_until(claimed, 10)
    assert figures == {
        ("in_flight", "hot", "default"): 2,
        ("in_flight", "cold", "default"): 1,
        ("waiting", "hot", "default"): 8,
        ("waiting", "cold", "default"): 0,
        ("max_running", "hot", "default"): 2,
        # The cap holds hot back; nothing holds cold, which has no policy of its own.
        ("held", "breaker", "hot", "default"): 0,
        ("held", "order", "hot", "default"): 0,
        ("held", "cap", "hot", "default"): 1,
        ("held", "rate", "hot", "default"): 0,
        ("held", "breaker", "cold", "default"): 0,
        ("held", "order", "cold", "default"): 0,
        ("held", "cap", "cold", "default"): 0,
        ("held", "rate", "cold", "default"): 0,
        # The third place: the first of the keys with a policy, by name.
        ("in_flight", "idle00", "default"): 0,
        ("waiting", "idle00", "default"): 0,
        ("max_running", "idle00", "default"): 5,
        ("held", "breaker", "idle00", "default"): 0,
        ("held", "order", "idle00", "default"): 0,
        ("held", "cap", "idle00", "default"): 0,
        ("held", "rate", "idle00", "default"): 0,
    }


def test_schedules_are_counted_by_state_and_an_overdue_one_shows_its_lag(
    app: Tidegate, api: ApiServer, sql: psycopg.Connection
) -> None:
    for name in ("due", "paused", "failing"):
        app.execute(create_schedule("default", name, "noop", interval_seconds=60))
    app.execute(update_schedule("default", "paused", paused=True))
    # No worker fires them: 'due' waits 30 s past its tick, 'failing' says why it failed.
    sql.execute("UPDATE schedules SET next_tick = now() - interval '30 s' WHERE name = 'due'")
    sql.execute("UPDATE schedules SET last_error = 'KeyError: x' WHERE name = 'failing'")

    samples = scrape(api)
    states = {
        dict(labels)["state"]: value
        for labels, value in series(samples, "tidegate_schedules").items()
    }
    assert states == {"active": 2, "paused": 1, "failing": 1}
    (lag,) = series(samples, "tidegate_schedule_lag_seconds").values()
    assert 30 <= lag < 60
