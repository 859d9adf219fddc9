"""The claim's cost must not grow with the backlog: its scans are ordered index probes.

auto_explain (loaded for this session, plans sent to the client as notices) shows the
plan of the claim statement and of every statement the PL/pgSQL functions it calls run
(the keyed claim, the parker).
"""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.conftest import admission
from tidegate import Tidegate
from tidegate.projects import create_project, create_trigger
from tidegate.storage.sql import query

CLAIM = {
    "demand": 8,
    "worker_id": "w",
    "workloop": 0,
    "lease_seconds": 30.0,
    "scan_limit": 500,
    "head_scan": 64,
    "tasks": ["noop"],
    "live_seconds": 30.0,
    "demands": None,
    "others_demand": None,
}
"""The parameters of a claim by worker ``w`` of 8 runs of the task ``noop``, along a
chain."""


def plan_nodes(plan: dict) -> list[dict]:  # type: ignore[type-arg]
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes


def scans_of(plans: list[dict]) -> set[tuple[str, str | None, str | None]]:  # type: ignore[type-arg]
    """Each scan in ``plans``: its node type, index and relation."""
    return {
        (node["Node Type"], node.get("Index Name"), node.get("Relation Name"))
        for p in plans
        for node in plan_nodes(p["Plan"])
        if "Scan" in node["Node Type"]
    }


def claim_plans(
    sql: psycopg.Connection, lanes: list[str], wildcard: bool, *, keep: bool = False
) -> tuple[list[dict], list[tuple]]:  # type: ignore[type-arg]
    """Run one claim of 8 runs of the task ``noop``; return its plans and its rows.

    The claim is rolled back unless ``keep``.
    """
    return explained(sql, "claim_runs", {**CLAIM, "lanes": lanes, "wildcard": wildcard}, keep)


def explained(
    sql: psycopg.Connection, name: str, params: dict, keep: bool = False
) -> tuple[list[dict], list[tuple]]:  # type: ignore[type-arg]
    """Run the query ``name``; return the plans of its statements and its rows."""
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
    with sql.transaction(force_rollback=not keep):
        rows = sql.execute(query(name), params).fetchall()
    sql.execute("SELECT set_config('auto_explain.log_min_duration', '-1', false)")
    plans = []
    for notice in notices:
        start = notice.find("{")
        if start >= 0:
            plans.append(json.loads(notice[start:]))
    return plans, rows


def rows_read(plans: list[dict]) -> int:  # type: ignore[type-arg]
    """Rows the claim's scans of ``runs`` returned, over every loop of every scan."""
    return sum(
        round(node["Actual Rows"] * node["Actual Loops"])
        for p in plans
        for node in plan_nodes(p["Plan"])
        if "Scan" in node["Node Type"] and node.get("Relation Name") == "runs"
    )


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
    plans, claimed = claim_plans(sql, lanes, wildcard)
    assert len(claimed) == 8
    texts = [p["Query Text"] for p in plans]
    scans = scans_of(plans)
    assert not any(kind == "Seq Scan" and rel == "runs" for kind, _, rel in scans), scans
    assert any(index == "runs_claim_lane" for _, index, _ in scans), scans
    assert any(index == "runs_pkey" for _, index, _ in scans), scans
    if wildcard:  # the lanes of `*`: a skip scan of the claim's index, no index across lanes
        assert ("Index Only Scan", "runs_claim_lane", "runs") in scans, scans
    # No statement of the claim is compiled: JIT costs more than the claim (tens of ms).
    assert not any("JIT" in p for p in plans), [p["Query Text"] for p in plans if "JIT" in p]
    # Nothing is sorted but the lanes of `*` (by their heads): never the runs.
    sorted_rows = [
        node["Actual Rows"]
        for p in plans
        for node in plan_nodes(p["Plan"])
        if node["Node Type"] in ("Sort", "Incremental Sort")
    ]
    assert all(rows <= 3 for rows in sorted_rows), texts


def test_probe_of_an_empty_lane_stays_on_its_index_when_one_lane_holds_everything(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p', 'default', 'k', 'noop', i FROM generate_series(1, 30000) AS i"
    )
    sql.execute("ANALYZE runs")  # one distinct lane: the planner's trap
    plans, claimed = claim_plans(sql, ["manual"], True)
    assert len(claimed) == 8
    probes = [
        node
        for p in plans
        for node in plan_nodes(p["Plan"])
        if "Scan" in node["Node Type"] and node.get("Rows Removed by Filter", 0) > 1000
    ]
    assert not probes, probes  # no index scan that reads the backlog to find nothing


@pytest.mark.parametrize("limits", [False, True], ids=["set-based", "with-key-limits"])
@pytest.mark.parametrize(("lanes", "wildcard"), [(["default"], False), (["manual"], True)])
def test_a_backlog_of_a_task_no_worker_has_costs_each_claim_a_bounded_scan(
    app: Tidegate, sql: psycopg.Connection, lanes: list[str], wildcard: bool, limits: bool
) -> None:
    """100,000 runs of a task nobody has, ahead of runnable ones in the same lane."""
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p', 'default', 'k' || (i % 50), 'nobody.has_it', i"
        " FROM generate_series(1, 100000) AS i"
    )
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p', 'default', 'k', 'noop', 100000 + i FROM generate_series(1, 20) AS i"
    )
    if limits:
        sql.execute("INSERT INTO key_policies (lane, key, max_running) VALUES ('default', '*', 99)")
    chain = [*lanes, "*"] if wildcard else lanes
    sql.execute(
        "INSERT INTO workers (id, host, pid, workloops, tasks) VALUES ('w', 'h', 1, %s, '{noop}')",
        [json.dumps([{"chain": chain, "slots": 8, "busy": 0}])],
    )
    sql.execute("ANALYZE runs")
    # A claim reads at most its scan limit (500) per probe and the rows it updates,
    # whatever the backlog behind them; the keyed claim then sets the strays it passed
    # pending itself, the set-based one leaves them to the parker.
    plans, rows = claim_plans(sql, lanes, wildcard, keep=True)
    assert rows_read(plans) <= 3 * 500 + 2 * 8, rows_read(plans)
    assert {row[6] for row in rows} == ({"pending"} if limits else set())
    claim = {**CLAIM, "lanes": lanes, "wildcard": wildcard}
    park = {key: claim[key] for key in ("lanes", "wildcard", "tasks", "scan_limit")}
    park["live_seconds"] = 30.0
    # The parker reads no more than a claim (and the skip scan of `*`, an entry per
    # lane), and each round clears a lane's head.
    plans, parked = explained(sql, "park_strays", park, keep=True)
    assert rows_read(plans) <= 3 * 500 + 3, rows_read(plans)
    assert parked and {row[6] for row in parked} == {"pending"}
    for _ in range(100_000 // 500):
        rows = sql.execute(query("claim_runs"), claim).fetchall()
        if any(row[6] == "running" for row in rows):
            break
        assert {row[6] for row in rows} <= {"pending"}
        sql.execute(query("park_strays"), park)
    else:
        raise AssertionError("the runnable runs were never claimed")
    claimed = sql.execute("SELECT task, count(*) FROM runs WHERE state = 'running' GROUP BY 1")
    assert claimed.fetchall() == [("noop", 8)]
    spent = sql.execute("SELECT count(*) FROM runs WHERE task = 'nobody.has_it' AND attempt > 0")
    assert spent.fetchone() == (0,)
    left = sql.execute("SELECT state, count(*) FROM runs WHERE task = 'nobody.has_it' GROUP BY 1")
    assert dict(left.fetchall()).get("available", 0) < 500


def rows_scanned(plans: list[dict]) -> int:  # type: ignore[type-arg]
    """Rows the scans of ``runs`` read: those they returned and those their filter
    dropped, over every loop of every scan."""
    return sum(
        round((node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"])
        for p in plans
        for node in plan_nodes(p["Plan"])
        if "Scan" in node["Node Type"] and node.get("Relation Name") == "runs"
    )


def stale_statistics_under_a_backlog(sql: psycopg.Connection) -> None:
    """Statistics taken while no run was ready (a quiet system's table), then a backlog
    of 50,000 ready runs over 20 keys that no ANALYZE has seen: the planner believes
    the lane holds no ready run, so every index on them looks about as cheap as another
    (which one wins moves with the indexes' sizes)."""
    sql.execute("ALTER TABLE runs SET (autovacuum_enabled = off)")
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, state, vtime, completed_at)"
        " SELECT 'p', 'default', 'k' || (i % 20), 'noop', 'succeeded', i, now()"
        " FROM generate_series(1, 5000) AS i"
    )
    sql.execute("ANALYZE runs")
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p', 'default', 'k' || (i % 20), 'noop', i FROM generate_series(1, 50000) AS i"
    )


def test_enqueueing_reads_no_backlog_when_the_statistics_predate_it(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """Each key's place on the clock is two index probes, not a read of the lane's
    backlog (which a generic plan of key_clock did: a sort of the lane's ready runs per
    key, per enqueue, growing with the backlog until the next ANALYZE)."""
    stale_statistics_under_a_backlog(sql)
    batch = [
        {
            "project": "p",
            "lane": "default",
            "key": f"k{i % 20}",
            "task": "noop",
            "args": {},
            "priority": 0,
            "max_attempts": 20,
            "scheduled_at": None,
            "idempotency_key": None,
            "unique_key": None,
            "unique_states": None,
            "trace_context": None,
        }
        for i in range(200)
    ]
    params = {"runs": json.dumps(batch), "channel": "c", "default_max_attempts": 20}
    for _ in range(7):  # past the five custom plans after which a generic one may stay
        plans, inserted = explained(sql, "insert_runs", params)
        assert len(inserted) == 200
        assert rows_scanned(plans) <= 20 * 10, rows_scanned(plans)
    one = {**batch[0], "args": "{}", "channel": "c", "default_max_attempts": 20}
    for _ in range(7):
        plans, inserted = explained(sql, "insert_run", one)
        assert len(inserted) == 1
        assert rows_scanned(plans) <= 10, rows_scanned(plans)


@pytest.mark.parametrize("limits", [False, True], ids=["set-based", "with-key-limits"])
@pytest.mark.parametrize(("lanes", "wildcard"), [(["default"], False), (["manual"], True)])
def test_a_claim_reads_no_backlog_when_the_statistics_predate_it(
    app: Tidegate, sql: psycopg.Connection, lanes: list[str], wildcard: bool, limits: bool
) -> None:
    stale_statistics_under_a_backlog(sql)
    if limits:
        sql.execute("INSERT INTO key_policies (lane, key, max_running) VALUES ('default', '*', 99)")
    for _ in range(7):
        plans, claimed = claim_plans(sql, lanes, wildcard)
        assert len(claimed) == 8
        assert rows_scanned(plans) <= 500 + 2 * 8, rows_scanned(plans)


def stale_statistics_of_finished_runs_in_many_lanes(sql: psycopg.Connection) -> None:
    """Statistics taken over 100,000 finished runs of five lanes, none ready, then a
    backlog of 50,000 ready runs in ``default`` that no ANALYZE has seen: every index of
    ready runs looks empty, and ``manual`` holds none. (Over one lane's finished runs the
    fixed n_distinct keeps the probes right; over several, a probe of ``manual`` took
    runs_claim_any, the smaller index, and filtered the whole backlog to find nothing.)"""
    sql.execute("ALTER TABLE runs SET (autovacuum_enabled = off)")
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, state, vtime, completed_at)"
        " SELECT 'p' || (i % 1000),"
        "  CASE WHEN i % 10 < 7 THEN 'default' WHEN i % 10 = 7 THEN 'fast_lane'"
        "   ELSE 'lane' || (i % 3) END,"
        "  'k' || (i % 10000), 'noop',"
        "  CASE WHEN i % 20 = 0 THEN 'discarded' ELSE 'succeeded' END::run_state, i, now()"
        " FROM generate_series(1, 100000) AS i"
    )
    sql.execute("ANALYZE runs")
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p', 'default', 'k' || (i % 20), 'noop', i FROM generate_series(1, 50000) AS i"
    )


@pytest.mark.parametrize("limits", [False, True], ids=["set-based", "with-key-limits"])
def test_a_probe_of_an_empty_lane_reads_no_backlog_of_another_when_the_statistics_predate_it(
    app: Tidegate, sql: psycopg.Connection, limits: bool
) -> None:
    """A `manual>default` workloop on a quiet system's statistics: its probe of the empty
    `manual` reads nothing, its probe of `default` the head; an enqueue to `manual`
    stamps its run from two probes."""
    stale_statistics_of_finished_runs_in_many_lanes(sql)
    if limits:
        sql.execute("INSERT INTO key_policies (lane, key, max_running) VALUES ('default', '*', 99)")
    for _ in range(7):  # past the five custom plans after which a generic one may stay
        plans, claimed = claim_plans(sql, ["manual"], False)
        assert claimed == []
        assert rows_scanned(plans) <= 10, rows_scanned(plans)
        plans, claimed = claim_plans(sql, ["manual", "default"], False)
        assert len(claimed) == 8
        assert rows_scanned(plans) <= 500 + 2 * 8, rows_scanned(plans)
    one = {
        "project": "p",
        "lane": "manual",
        "key": "k1",
        "task": "noop",
        "args": "{}",
        "priority": 0,
        "max_attempts": 20,
        "scheduled_at": None,
        "idempotency_key": None,
        "unique_key": None,
        "unique_states": None,
        "trace_context": None,
        "channel": "c",
        "default_max_attempts": 20,
    }
    for _ in range(7):
        plans, inserted = explained(sql, "insert_run", one)
        assert len(inserted) == 1
        assert rows_scanned(plans) <= 10, rows_scanned(plans)


def test_a_webhook_admission_reads_no_backlog_when_the_statistics_predate_it(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """A project with a backlog cap: each admission counts its key's ready runs, up to the
    cap, from runs_key_ready (it read the lane's whole backlog, as the key clock did)."""
    app.execute(create_project("q", backlog_cap=100_000))
    trigger = app.execute(create_trigger("q", "t", mode="async", task="noop"))
    stale_statistics_under_a_backlog(sql)  # project p's: 2,500 ready runs of key k3
    params = admission(trigger, "k3")
    for _ in range(7):
        plans, rows = explained(sql, "admit_webhook", params)
        assert rows[0][0] == "admitted"
        assert rows_scanned(plans) <= 2_500 + 20, rows_scanned(plans)


@pytest.mark.parametrize("limits", [False, True], ids=["set-based", "with-key-limits"])
def test_a_wildcard_takes_every_other_lane_in_turn_by_its_head(
    app: Tidegate, sql: psycopg.Connection, limits: bool
) -> None:
    """`*` with backlogs in three lanes whose ranks interleave: each claim takes the lane
    whose head is lowest, so the lanes share the claims and none waits behind another's
    backlog; the named lane of the chain still comes first."""
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p', l, 'k' || (i % 10), 'noop', i"
        " FROM unnest(ARRAY['a', 'b', 'c']) AS l, generate_series(1, 400) AS i"
    )
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p', 'first', 'k', 'noop', 1000 + i FROM generate_series(1, 4) AS i"
    )
    if limits:
        sql.execute("INSERT INTO key_policies (lane, key, max_running) VALUES ('a', '*', 999)")
    sql.execute("ANALYZE runs")
    claim = {**CLAIM, "lanes": ["first"], "wildcard": True}
    taken: list[list[str]] = []
    for _ in range(12):
        rows = sql.cursor(row_factory=dict_row).execute(query("claim_runs"), claim).fetchall()
        taken.append([row["lane"] for row in rows if row["state"] == "running"])
    assert taken[0].count("first") == 4  # the named lane before `*`'s
    every = [lane for claimed in taken for lane in claimed]
    assert len(every) == 12 * 8
    shares = {lane: every.count(lane) for lane in "abc"}
    # 92 runs of `*`: each lane within one claim of a third.
    assert all(abs(n - 92 / 3) <= 8 for n in shares.values()), (shares, taken)


@pytest.mark.parametrize("limits", [False, True], ids=["set-based", "with-key-limits"])
def test_a_share_claim_takes_each_lanes_demand_and_stars_lanes_together(
    app: Tidegate, sql: psycopg.Connection, limits: bool
) -> None:
    """A claim for shares asking 3 of ``a``, 2 of ``b`` and 4 of the other lanes (``*``)
    together takes exactly that, whatever more each lane holds; ``b`` has none, and its
    part is not given to the others in the same claim (the workloop lends it next)."""
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p', l, 'k' || (i % 5), 'noop', i FROM generate_series(1, 2000) AS i,"
        " unnest(ARRAY['a', 'c', 'd']) AS l"
    )
    if limits:
        sql.execute("INSERT INTO key_policies (lane, key, max_running) VALUES ('a', '*', 99)")
    sql.execute("ANALYZE runs")
    params = {
        **CLAIM,
        "lanes": ["a", "b"],
        "wildcard": True,
        "demands": [3, 2],
        "others_demand": 4,
        "demand": 9,
    }
    plans, rows = explained(sql, "claim_runs", params)
    lanes = [row[2] for row in rows]
    assert lanes.count("a") == 3, lanes
    assert lanes.count("c") + lanes.count("d") == 4, lanes
    assert len(lanes) == 7, lanes
    scans = scans_of(plans)
    assert not any(kind == "Seq Scan" and rel == "runs" for kind, _, rel in scans), scans
    assert any(index == "runs_claim_lane" for _, index, _ in scans), scans
    assert rows_read(plans) <= 100, rows_read(plans)  # never a lane's 2,000


def test_a_workers_runs_in_flight_are_read_from_its_own_entries(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """A remote claim counts the runs its workloop holds (held_runs), a batch of outcomes
    finds its worker's runs (complete_runs), and a sync admission counts each fast-lane
    workloop's free slots, from that worker's entries of runs_held: never every run in
    flight of the cluster (here 3,000 of another worker's, whose workloop takes no
    fast-lane run)."""
    sql.execute("INSERT INTO worker_tokens (name, token_hash, lanes) VALUES ('t', 'h', '{*}')")
    sql.execute(
        "INSERT INTO workers (id, host, pid, workloops, tasks, token) VALUES"
        " ('w', 'h', 1, '[{\"chain\": [\"fast_lane\", \"*\"], \"slots\": 8}]', '{noop}', 't'),"
        " ('other', 'h', 2, '[{\"chain\": [\"default\"], \"slots\": 10000}]', '{noop}', NULL)"
    )
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, state, worker_id, workloop, attempt)"
        " SELECT 'p', 'default', 'k' || (i % 50), 'noop', 'running',"
        " CASE WHEN i <= 5 THEN 'w' ELSE 'other' END, 0, 1"
        " FROM generate_series(1, 3005) AS i"
    )
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, state, completed_at, worker_id, workloop)"
        " SELECT 'p', 'default', 'k', 'noop', 'succeeded', now(), 'w', 0"
        " FROM generate_series(1, 20000)"
    )
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p', 'default', 'k' || i, 'noop', i FROM generate_series(1, 20) AS i"
    )
    sql.execute("ANALYZE runs")
    params = {
        **CLAIM,
        "token_hash": "h",
        "slots": 8,
        "outcomes": None,
        "completed_channel": "c",
        "channel": "c",
        "lanes": ["fast_lane"],
        "wildcard": True,
    }
    plans, rows = explained(sql, "claim_workloop", params)
    free, claimed = rows[0][:2]
    assert (free, claimed) == (3, 3), rows[0][:2]
    held = [p for p in plans if "count(*) FROM runs" in p["Query Text"]]
    assert {index for _, index, _ in scans_of(held) if index} == {"runs_held"}, scans_of(held)
    assert rows_scanned(held) <= 5, rows_scanned(held)

    # A batch of outcomes: w's 5 runs, found among its own runs in flight.
    outcomes = [
        {"id": run_id, "attempt": 1, "state": "succeeded", "result": "null", "max_attempts": 20}
        for (run_id,) in sql.execute(
            "SELECT id FROM runs WHERE worker_id = 'w' AND state = 'running'"
        )
    ]
    batch = {
        "worker_id": "w",
        "completed_channel": "c",
        "channel": "c",
        "outcomes": json.dumps(outcomes),
        "events": "[]",
    }
    plans, rows = explained(sql, "complete_runs", batch)
    assert len(rows) == 5, rows
    assert rows_scanned(plans) <= 5 + 3, rows_scanned(plans)

    app.execute(create_project("p"))
    trigger = app.execute(create_trigger("p", "s", mode="sync", task="noop"))
    plans, rows = explained(sql, "admit_webhook", {**admission(trigger, "k"), "lane": "fast_lane"})
    assert rows[0][0] == "admitted", rows[0]
    # Its scans of runs: the fast lane's own indexes (empty), and w's 5 runs in flight.
    assert rows_scanned(plans) <= 5, rows_scanned(plans)
