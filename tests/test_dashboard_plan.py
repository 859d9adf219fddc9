"""The dashboard's reads stay on their indexes, so a page's cost does not follow the table.

Each statement is EXPLAINed (with its parameters, as the API runs it) on a table where
a sequential scan would read 40,000 runs to find a handful.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.test_claim_plan import plan_nodes
from tidegate import Tidegate
from tidegate.storage.sql import query

NO_FILTER = dict.fromkeys(("project", "lane", "state", "task", "key", "args", "before"))


def plan(sql: psycopg.Connection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    row = sql.execute("EXPLAIN (FORMAT JSON) " + query(name), params).fetchone()
    assert row is not None
    document = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return plan_nodes(document[0]["Plan"])


def scans(nodes: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The scans of the plan: (node type, index name) of every table or index read."""
    return {
        (node["Node Type"], node.get("Index Name", ""))
        for node in nodes
        if "Relation Name" in node or "Index Name" in node
    }


@pytest.fixture
def filled(app: Tidegate, sql: psycopg.Connection) -> psycopg.Connection:
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, state, completed_at)"
        " SELECT 'p' || (i % 10), 'default', 'k' || (i % 50), 'noop', 'succeeded', now()"
        " FROM generate_series(1, 40000) AS i"
    )
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, state, completed_at)"
        " SELECT 'small', 'default', 'k', 'noop', s::run_state, now()"
        " FROM unnest(ARRAY['succeeded', 'discarded', 'cancelled']) AS s,"
        " generate_series(1, 5)"
    )
    # Runs in flight, interleaved with runs of every other state in id order.
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, state, worker_id)"
        " SELECT CASE WHEN i % 4 = 0 THEN 'small' ELSE 'p' || (i % 10) END, 'default',"
        " 'k' || (i % 50), 'noop', s::run_state,"
        " CASE WHEN s = 'running' THEN 'w' END"
        " FROM generate_series(1, 40) AS i,"
        " unnest(ARRAY['running', 'available', 'scheduled', 'succeeded']) AS s"
    )
    sql.execute("ANALYZE runs")
    return sql


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({}, "runs_pkey"),
        ({"project": "small"}, "runs_project"),
        ({"state": "discarded"}, "runs_failed"),
        ({"state": "cancelled"}, "runs_failed"),
        # Two indexes hold the runs in flight, and no other run: either will do.
        ({"state": "running"}, "runs_running|runs_held"),
        ({"project": "small", "state": "running"}, "runs_running|runs_held"),
        ({"state": "pending"}, "runs_pending"),
    ],
)
def test_a_page_of_the_run_list_reads_the_index_its_filter_needs(
    filled: psycopg.Connection, filters: dict[str, str], index: str
) -> None:
    nodes = plan(filled, "list_runs_page", {**NO_FILTER, **filters, "limit": 50})
    found = scans(nodes)
    assert all(kind != "Seq Scan" for kind, _ in found), found
    assert set(index.split("|")) & {name for _, name in found}, found


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"project": "small"},
        {"project": "small", "state": "running"},
        {"project": "small", "state": "available"},
        {"state": "running"},
        {"state": "succeeded", "lane": "default"},
        {"project": "p3", "key": "k13"},
    ],
)
@pytest.mark.parametrize("limit", [5, 50])
def test_the_run_lists_hold_what_their_filters_match_runs_in_flight_included(
    filled: psycopg.Connection, filters: dict[str, str], limit: int
) -> None:
    """The newest runs matching the filters, whatever their state: runs in flight are
    read apart from the others (runs_project holds none), and the two parts meet in id
    order, a page after another."""
    where = " AND ".join(f"{column} = %({column})s" for column in filters) or "true"
    expected = [
        row[0]
        for row in filled.execute(
            f"SELECT id FROM runs WHERE {where} ORDER BY id DESC", filters
        ).fetchall()
    ]
    assert len(expected) > 0
    params = {**NO_FILTER, **filters, "limit": limit}
    pages: list[int] = []
    while True:
        page = filled.execute(query("list_runs_page"), {**params, "before": (pages or [None])[-1]})
        ids = [row[0] for row in page.fetchall()]
        pages += ids
        if len(ids) < limit:
            break
    assert pages == expected
    if "key" not in filters:
        listed = filled.execute(query("list_runs"), {**params, "before": None}).fetchall()
        assert [row[0] for row in listed] == expected[:limit]


def test_a_page_of_the_webhook_log_reads_both_logs_by_trigger_index(
    filled: psycopg.Connection,
) -> None:
    filled.execute("INSERT INTO projects (id) VALUES ('p1')")
    filled.execute(
        "INSERT INTO triggers (project, name, token, mode, task)"
        " SELECT 'p1', 't' || i, 'tok' || i, 'async', 'noop' FROM generate_series(1, 20) AS i"
    )
    # A hot trigger and a quiet one, their requests interleaved in time: the quiet one's
    # log must not be found by reading the hot one's.
    filled.execute(
        "INSERT INTO requests (project, trigger_id, run_id, headers, body, received_at)"
        " SELECT 'p1', CASE WHEN i % 200 = 0 THEN 3 ELSE 1 END, i, '{}', '',"
        " now() - make_interval(secs => i) FROM generate_series(1, 40000) AS i"
    )
    filled.execute("ANALYZE requests")
    params = {"trigger_id": 3, "project": None, "limit": 50}
    first = {"before_at": None, "before_kind": None, "before_id": None}
    middle = filled.execute(
        "SELECT received_at, id FROM requests WHERE trigger_id = 3 ORDER BY id LIMIT 1 OFFSET 100"
    ).fetchone()
    assert middle is not None
    later = {"before_at": middle[0], "before_kind": "admitted", "before_id": middle[1]}
    for keyset in (first, later):
        found = scans(plan(filled, "read_trigger_log", {**params, **keyset}))
        assert {name for _, name in found} >= {"requests_trigger", "request_log_trigger"}, found
        assert all(kind != "Seq Scan" for kind, _ in found), found
