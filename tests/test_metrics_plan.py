"""A scrape's cost must not grow with the table: its statements never scan ``runs``.

auto_explain (as in test_claim_plan) shows the plan of each statement of a scrape and of
every statement the functions they call run (lane_figures' counts and probes).
"""

from __future__ import annotations

import json

import psycopg

from tests.test_claim_plan import explained, plan_nodes, rows_read
from tidegate import Tidegate
from tidegate.figures import (
    COUNT_BUDGET,
    COUNT_CAP,
    KEY_SCAN,
    WAITING_CAP,
    read_figures,
)
from tidegate.storage.sql import drive


def test_a_scrape_reads_indexes_and_a_bounded_number_of_runs(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, state, completed_at)"
        " SELECT 'p', 'default', 'k', 'noop', 'succeeded', now()"
        " FROM generate_series(1, 40000)"
    )
    # One lane past the count's cap, the others below it, every active state somewhere.
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p' || (i %% 30), l, 'k', 'noop', i"
        " FROM unnest(ARRAY['default', 'fast_lane', 'manual', 'bulk']) AS l,"
        " generate_series(1, CASE l WHEN 'default' THEN %s ELSE 300 END) AS i",
        [COUNT_CAP + 2000],
    )
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, state, vtime, scheduled_at)"
        " SELECT 'p', 'bulk', 'k', 'noop', s::run_state, i, now() + interval '1 hour'"
        " FROM unnest(ARRAY['scheduled', 'pending', 'running']) AS s,"
        " generate_series(1, 200) AS i"
    )
    sql.execute("INSERT INTO projects (id) SELECT 'p' || i FROM generate_series(0, 29) AS i")
    sql.execute(
        "INSERT INTO workers (id, host, pid, workloops) VALUES ('w', 'h', 1, %s)",
        [json.dumps([{"chain": ["fast_lane"], "slots": 2, "busy": 1}])],
    )
    sql.execute("ANALYZE runs")

    settings = app.settings
    steps = read_figures(settings)
    statement = next(steps)
    plans: list[dict] = []  # type: ignore[type-arg]
    try:
        while True:
            statement_plans, rows = explained(sql, statement.name, statement.params)
            # estimate_runs' EXPLAIN plans its statement and never runs it.
            plans += [p for p in statement_plans if not p["Query Text"].startswith("EXPLAIN")]
            statement = steps.send(rows)
    except StopIteration as done:
        figures = done.value

    scans = {
        (node["Node Type"], node.get("Index Name"))
        for p in plans
        for node in plan_nodes(p["Plan"])
        if node.get("Relation Name") == "runs"
    }
    assert scans and not any(kind == "Seq Scan" for kind, _ in scans), scans
    assert {
        "runs_claim_lane",
        "runs_due",
        "runs_pending",
        "runs_running",
        "runs_fast_lane_inflight",
    } <= {i for _, i in scans}
    # Counted: at most the cap per lane and state, the budget in all; the keys' scan and
    # their waiting runs; the probes besides.
    keys = KEY_SCAN + settings.metrics_max_keys * WAITING_CAP
    assert rows_read(plans) <= COUNT_BUDGET + keys + 1000, rows_read(plans)
    # The lane past the cap gets an estimate, at least the cap; the others exact figures.
    default = next(lane for lane in figures.lanes if lane.lane == "default")
    assert COUNT_CAP <= default.depth["available"] < 2 * (COUNT_CAP + 2000)
    bulk = next(lane for lane in figures.lanes if lane.lane == "bulk")
    assert bulk.depth == {"scheduled": 200, "available": 300, "pending": 200, "running": 200}
    again = drive(sql, read_figures(settings))  # the same outside auto_explain
    assert [lane.depth for lane in again.lanes] == [lane.depth for lane in figures.lanes]
