"""The claim's cost must not grow with the number of runs: it probes indexes only."""

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


@pytest.mark.parametrize(("lanes", "wildcard"), [(["fast_lane"], False), (["manual"], True)])
def test_claim_uses_its_indexes_and_never_scans_runs(
    app: Tidegate, sql: psycopg.Connection, lanes: list[str], wildcard: bool
) -> None:
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, state, completed_at)"
        " SELECT 'p', 'default', 'k', 'noop', 'succeeded', now() FROM generate_series(1, 20000)"
    )
    sql.execute(
        "INSERT INTO runs (project, lane, key, task)"
        " SELECT 'p', l, 'k', 'noop' FROM generate_series(1, 2000),"
        " unnest(ARRAY['default', 'manual', 'fast_lane']) AS l"
    )
    sql.execute("ANALYZE runs")
    params = {
        "lanes": lanes,
        "wildcard": wildcard,
        "worker_id": "w",
        "workloop": 0,
        "lease_seconds": 30.0,
        "demand": 8,
    }
    statement = psycopg.ClientCursor(sql).mogrify(query("claim_runs"), params)
    with sql.transaction(force_rollback=True):
        (raw,) = sql.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement).fetchone()  # type: ignore[misc]
    plan = (raw if isinstance(raw, list) else json.loads(raw))[0]["Plan"]
    nodes = plan_nodes(plan)
    scans = {(n["Node Type"], n.get("Index Name")) for n in nodes if "Scan" in n["Node Type"]}
    assert not any(kind == "Seq Scan" for kind, _ in scans), scans
    assert ("Index Scan", "runs_claim_lane") in scans
    assert ("Index Scan", "runs_pkey") in scans
    if wildcard:
        assert ("Index Scan", "runs_claim_any") in scans
    assert plan["Actual Rows"] == 8
