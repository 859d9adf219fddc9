"""The claim's cost must not grow with the backlog: its scans are ordered index probes.

``claim_runs`` is a PL/pgSQL function; auto_explain (loaded for this session, plans
sent to the client as notices) shows the plan of every statement it runs.
"""

from __future__ import annotations

import json

import psycopg
import pytest

from tidegate import Tidegate
from tidegate.storage.sql import query


def plan_nodes(plan: dict) -> list[dict]:  # type: ignore[type-arg]
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes


def claim_plans(sql: psycopg.Connection, lanes: list[str], wildcard: bool) -> list[dict]:  # type: ignore[type-arg]
    notices: list[str] = []
    sql.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    sql.execute("LOAD 'auto_explain'")
    for setting, value in [
        ("auto_explain.log_min_duration", "0"),
        ("auto_explain.log_nested_statements", "on"),
        ("auto_explain.log_format", "json"),
        ("auto_explain.log_analyze", "on"),
        ("auto_explain.log_level", "notice"),
    ]:
        sql.execute("SELECT set_config(%s, %s, false)", [setting, value])
    params = {
        "lanes": lanes,
        "wildcard": wildcard,
        "demand": 8,
        "worker_id": "w",
        "workloop": 0,
        "lease_seconds": 30.0,
        "scan_limit": 500,
        "head_scan": 64,
    }
    with sql.transaction(force_rollback=True):
        claimed = sql.execute(query("claim_runs"), params).fetchall()
    sql.execute("SELECT set_config('auto_explain.log_min_duration', '-1', false)")
    assert len(claimed) == 8
    plans = []
    for notice in notices:
        start = notice.find("{")
        if start >= 0:
            plans.append(json.loads(notice[start:]))
    return plans


@pytest.mark.parametrize(("lanes", "wildcard"), [(["fast_lane"], False), (["manual"], True)])
def test_claim_scans_its_indexes_and_never_the_backlog(
    app: Tidegate, sql: psycopg.Connection, lanes: list[str], wildcard: bool
) -> None:
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, state, completed_at)"
        " SELECT 'p', 'default', 'k', 'noop', 'succeeded', now() FROM generate_series(1, 20000)"
    )
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p', l, 'k' || (i % 50), 'noop', i FROM generate_series(1, 20000) AS i,"
        " unnest(ARRAY['default', 'fast_lane']) AS l"
    )
    # Fewer manual runs than the demand: `manual>*` goes on to its `*` scan.
    sql.execute("INSERT INTO runs (project, lane, key, task) VALUES ('p', 'manual', 'k', 'noop')")
    sql.execute("ANALYZE runs")
    plans = claim_plans(sql, lanes, wildcard)
    texts = [p["Query Text"] for p in plans]
    scans = {
        (node["Node Type"], node.get("Index Name"), node.get("Relation Name"))
        for p in plans
        for node in plan_nodes(p["Plan"])
        if "Scan" in node["Node Type"]
    }
    assert not any(kind == "Seq Scan" and rel == "runs" for kind, _, rel in scans), scans
    assert any(index == "runs_claim_lane" for _, index, _ in scans), scans
    assert any(index == "runs_pkey" for _, index, _ in scans), scans
    if wildcard:
        assert any(index == "runs_claim_any" for _, index, _ in scans), scans
    assert not any(kind == "Sort" for p in plans for kind in [p["Plan"]["Node Type"]]), texts


def test_probe_of_an_empty_lane_stays_on_its_index_when_one_lane_holds_everything(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p', 'default', 'k', 'noop', i FROM generate_series(1, 30000) AS i"
    )
    sql.execute("ANALYZE runs")  # one distinct lane: the planner's trap
    plans = claim_plans(sql, ["manual"], True)
    probes = [
        node
        for p in plans
        for node in plan_nodes(p["Plan"])
        if "Scan" in node["Node Type"] and node.get("Rows Removed by Filter", 0) > 1000
    ]
    assert not probes, probes  # no index scan that reads the backlog to find nothing
