"""Fairness benchmark: a cold key behind a hot key's backlog, and the cost of fair claims.

::

    python -m bench.fairness                  # embedded PostgreSQL 18 (or TIDEGATE_DATABASE_URL)
    python -m bench.fairness --database-url postgresql://postgres@127.0.0.1:5432/test
    python -m bench.fairness --smoke          # small sizes, once: does it all work?
    python -m bench.fairness --write-docs     # also rewrite the figures in docs/benchmarks.md

Two parts, in one run on one database, every measurement on a fresh schema (or a fresh
backlog), repeated ``--repeat`` times (default 3) in alternating order; every figure is
the median with min and max:

1. **Starvation.** A hot key with ``hot_runs`` ready runs (100,000), then ``cold_runs``
   (1,000) cold runs arriving one every ``cold_interval_ms`` (10 ms) from this process,
   cycling over ``cold_keys`` (100) keys, while one worker process drains
   (``python -m tidegate worker --app bench.apps:app --workloops "manual>*:32"``). A cold
   run's wait is ``attempted_at - inserted_at`` from the table (and, beside it, handler
   start minus the client's time before the insert). Measured (a) tidegate with the hot
   backlog, (b) tidegate with the same cold arrivals and no hot key, (c) the raw-SQL
   FIFO queue of ``bench/raw.py`` (its table, its worker) with the hot backlog. Aim:
   (a)'s p99 <= 2 x (b)'s.
2. **Claim throughput.** One connection calls tidegate's claim statement
   (``queries/claim_runs.sql``, demand 32, chain ``manual>*``) and then completes the
   claimed runs in one batch (``queries/complete_runs.sql``), ``claims`` times; the same
   for the raw queue's claim and completion. The claimed runs are replaced after each
   cycle by as many new ones of the same keys (outside the clock), so the backlog stays
   at its size: 1,000 / 100,000 / 1,000,000 ready runs over 10 / 10,000 / 100,000 keys.
   tidegate is measured twice on the same backlog: with a lane default policy
   (``max_running`` far above what one connection can hold in flight) and per-key
   weights, so ``claim_runs`` takes its per-candidate path; and with no policy at all,
   its set-based fast path. Aim: tidegate with policies >= 0.7 of the raw queue's runs/s.

Every figure is checked against the table before it counts: every run finished exactly
once, every claim took exactly what it asked for, no run is left in flight.
"""

from __future__ import annotations

import argparse
import atexit
import bisect
import contextlib
import dataclasses
import itertools
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from bench import raw, tidegate_side
from bench.harness import (
    ROOT,
    BenchError,
    WorkerProcess,
    child_env,
    code_info,
    fresh_schema,
    machine_info,
    paced,
    percentiles,
    schema_conninfo,
    server_info,
    settle,
    source_digest,
    spread,
    tidegate_dir,
    wait_for,
)
from bench.run import DOCS, EMBEDDED_DATA_DIR, RESULTS, redact, server_label, write_results
from tidegate import NewRun
from tidegate.storage.sql import query

SNAPSHOT_ENV = "BENCH_FAIRNESS_SNAPSHOT"
CODE_ENV = "BENCH_FAIRNESS_CODE"
BEGIN, END = "<!-- bench:fairness:begin -->", "<!-- bench:fairness:end -->"
LOAD_BATCH = 5_000
HOT_TASK, COLD_TASK = "noop", "wakeup"
"""Hot runs do nothing; cold runs return the time their handler started (bench/apps.py)."""
HOT_KEY = "hot"
LANE = "default"
WORKLOOPS = "manual>*:32"
"""The claim loop claims as this workloop would (the worker's default chain)."""
WORKER_ID = "bench-fairness"
WARMUP_CLAIMS = 5
"""Cycles before the clock starts in each claim measurement (plans, caches)."""
SLOW_MS = 100.0
"""A cold run waiting longer than this counts as held up (reported as a share)."""

AIM_STARVATION = 2.0
"""tidegate's cold p99 with the hot backlog, at most this times its p99 without it."""
AIM_CLAIMS = 0.7
"""tidegate's claim-and-complete runs/s with policies on, as a share of the raw queue's."""

SCENARIOS = ("tidegate_hot", "tidegate_cold_only", "raw_hot")
MODES = ("policies", "fast", "raw")
PARTS = ("starvation", "claims")


@dataclass(frozen=True)
class Options:
    """What to measure; the defaults are the published benchmark."""

    hot_runs: int = 100_000
    cold_runs: int = 1_000
    cold_keys: int = 100
    cold_interval_ms: float = 10.0
    slots: int = 32
    repeat: int = 3
    backlogs: tuple[int, ...] = (1_000, 100_000, 1_000_000)
    keys: tuple[int, ...] = (10, 10_000, 100_000)
    claims: int = 300
    demand: int = 32
    max_running: int = 1_000
    heavy_every: int = 10
    """Every ``heavy_every``-th key of the claim part has weight 2 (the others 1)."""
    parts: tuple[str, ...] = PARTS
    smoke: bool = False


SMOKE = Options(
    hot_runs=2_000,
    cold_runs=60,
    cold_keys=10,
    repeat=1,
    backlogs=(1_000,),
    keys=(10,),
    claims=20,
    smoke=True,
)


# -- part 1: starvation ----------------------------------------------------------------

# Per cold run: insert and claim transaction start, the client's time before the insert,
# the handler's start; all Unix seconds. The same for both queues.
TIDEGATE_COLD = """
SELECT extract(epoch FROM inserted_at)::float8, extract(epoch FROM attempted_at)::float8,
       (args->>'enqueued_at')::float8, (result->>'started_at')::float8
FROM runs WHERE task = 'wakeup' ORDER BY id
"""
RAW_COLD = """
SELECT extract(epoch FROM inserted_at)::float8, extract(epoch FROM attempted_at)::float8,
       (args->>'enqueued_at')::float8, (result->>'started_at')::float8
FROM jobs WHERE kind = 'wakeup' ORDER BY id
"""

# What the harness needs to believe a starvation sample: every run there and finished
# once, the cold runs distinct, and how much hot backlog was still waiting when the
# last cold run was claimed (claimed strictly later).
TIDEGATE_FACTS = """
SELECT count(*) FILTER (WHERE task = 'noop'),
       count(*) FILTER (WHERE task = 'wakeup'),
       count(DISTINCT args->>'k') FILTER (WHERE task = 'wakeup'),
       count(DISTINCT key) FILTER (WHERE task = 'wakeup'),
       count(*) FILTER (WHERE state = 'succeeded' AND attempt = 1),
       count(*) FILTER (WHERE task = 'noop' AND attempted_at >
                        (SELECT max(attempted_at) FROM runs WHERE task = 'wakeup')),
       extract(epoch FROM min(attempted_at) FILTER (WHERE task = 'noop'))::float8,
       extract(epoch FROM max(completed_at) FILTER (WHERE task = 'noop'))::float8
FROM runs
"""
RAW_FACTS = """
SELECT count(*) FILTER (WHERE kind = 'noop'),
       count(*) FILTER (WHERE kind = 'wakeup'),
       count(DISTINCT args->>'k') FILTER (WHERE kind = 'wakeup'),
       count(DISTINCT args->>'key') FILTER (WHERE kind = 'wakeup'),
       count(*) FILTER (WHERE state = 'completed' AND attempt = 1),
       count(*) FILTER (WHERE kind = 'noop' AND attempted_at >
                        (SELECT max(attempted_at) FROM jobs WHERE kind = 'wakeup')),
       extract(epoch FROM min(attempted_at) FILTER (WHERE kind = 'noop'))::float8,
       extract(epoch FROM max(completed_at) FILTER (WHERE kind = 'noop'))::float8
FROM jobs
"""


# Every claim of the measurement: its transaction start (shared by the runs it took), how
# many runs it took, how many of them cold.
TIDEGATE_CLAIMS = """
SELECT extract(epoch FROM attempted_at)::float8, count(*), count(*) FILTER (WHERE task = 'wakeup')
FROM runs GROUP BY attempted_at ORDER BY 1
"""
RAW_CLAIMS = """
SELECT extract(epoch FROM attempted_at)::float8, count(*), count(*) FILTER (WHERE kind = 'wakeup')
FROM jobs GROUP BY attempted_at ORDER BY 1
"""


def claim_cadence(
    rows: list[tuple[float, float, float, float]], claims: list[tuple[float, int, int]]
) -> dict[str, Any]:
    """Relate each cold run's wait to the claims the worker made meanwhile.

    ``passed_over``: claims that started after the cold run's insert began and before
    the claim that took it (a claim that started before the insert committed cannot see
    it, so 1 is as good as 0). ``gap_ms``: time between consecutive claim starts while
    cold runs arrived; in a worker whose slots are all busy, a cold run's wait is the
    time to the next claim, so about half a gap on average and a whole one at worst.
    """
    starts = [c[0] for c in claims]
    lo = min(r[0] for r in rows)
    hi = max(r[1] for r in rows)
    window = [c for c in claims if lo <= c[0] <= hi]
    gaps = [(b[0] - a[0]) * 1000 for a, b in itertools.pairwise(window)]
    passed = [
        bisect.bisect_left(starts, attempted) - bisect.bisect_right(starts, inserted)
        for inserted, attempted, _, _ in rows
    ]
    return {
        "claims": len(claims),
        "claims_in_window": len(window),
        "runs_per_claim_in_window": sum(c[1] for c in window) / max(1, len(window)),
        "gap_ms": percentiles(gaps) if gaps else None,
        "passed_over": percentiles(passed),
        "share_first_claim": sum(p <= 1 for p in passed) / len(passed),
    }


def cold_key(k: int, options: Options) -> str:
    return f"cold-{k % options.cold_keys}"


def drain_timeout(runs: int) -> float:
    return max(60.0, runs / 100)


def starvation_tidegate(url: str, options: Options, hot: bool) -> dict[str, Any]:
    """Hot backlog (or none), one worker, cold runs paced in; read every wait back."""
    hot_runs = options.hot_runs if hot else 0
    total = hot_runs + options.cold_runs
    with fresh_schema(url, "fair") as schema:
        app = tidegate_side.open_app(url, schema)
        try:
            for first in range(0, hot_runs, LOAD_BATCH):
                last = min(first + LOAD_BATCH, hot_runs)
                app.enqueue_many(
                    [NewRun(HOT_TASK, {"i": i}, key=HOT_KEY) for i in range(first, last)]
                )
            app.list_runs(limit=1)  # opens the pool: connecting is not enqueueing
            settle(url, schema, "runs")
            with (
                psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn,
                tidegate_side.start_worker(url, schema, options.slots) as worker,
            ):
                worker.wait_ready()
                started = time.time()
                for k in paced(options.cold_runs, options.cold_interval_ms / 1000):
                    app.enqueue(
                        COLD_TASK,
                        {"k": k, "enqueued_at": time.time()},
                        key=cold_key(k, options),
                    )
                arrived = time.time()
                wait_for(
                    lambda: tidegate_side.succeeded(conn) >= total,
                    timeout=drain_timeout(total),
                    what="tidegate starvation",
                    worker=worker,
                    interval=0.25,
                )
                worker.stop()
                facts = conn.execute(TIDEGATE_FACTS).fetchone()
                rows = conn.execute(TIDEGATE_COLD).fetchall()
                claims = conn.execute(TIDEGATE_CLAIMS).fetchall()
        finally:
            app.close()
    return starvation_sample("tidegate", options, hot_runs, facts, rows, claims, arrived - started)


def starvation_raw(url: str, options: Options, worker_commit: str) -> dict[str, Any]:
    """The same workload on the raw FIFO queue, with the hot backlog."""
    hot_runs = options.hot_runs
    total = hot_runs + options.cold_runs
    with fresh_schema(url, "fairraw") as schema:
        raw.create(url, schema)
        with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
            for first in range(0, hot_runs, LOAD_BATCH):
                last = min(first + LOAD_BATCH, hot_runs)
                args = [json.dumps({"i": i, "key": HOT_KEY}) for i in range(first, last)]
                raw.insert(conn, schema, HOT_TASK, args)
            settle(url, schema, "jobs")
            argv = raw.worker_argv(url, schema, options.slots, worker_commit)
            with WorkerProcess(argv, child_env(), raw.READY) as worker:
                worker.wait_ready()
                started = time.time()
                for k in paced(options.cold_runs, options.cold_interval_ms / 1000):
                    payload = {"k": k, "key": cold_key(k, options), "enqueued_at": time.time()}
                    raw.insert(conn, schema, COLD_TASK, [json.dumps(payload)])
                arrived = time.time()
                wait_for(
                    lambda: raw.completed(conn) >= total,
                    timeout=drain_timeout(total),
                    what="raw starvation",
                    worker=worker,
                    interval=0.25,
                )
                worker.stop()
            facts = conn.execute(RAW_FACTS).fetchone()
            rows = conn.execute(RAW_COLD).fetchall()
            claims = conn.execute(RAW_CLAIMS).fetchall()
    return starvation_sample("raw", options, hot_runs, facts, rows, claims, arrived - started)


def starvation_sample(
    side: str,
    options: Options,
    hot_runs: int,
    facts: Any,
    rows: list[tuple[float, float, float, float]],
    claims: list[tuple[float, int, int]],
    arrival_seconds: float,
) -> dict[str, Any]:
    """Check a starvation measurement against the table; return its figures."""
    assert facts is not None
    hot, cold, cold_distinct, cold_keys, once, hot_after, hot_first, hot_last = facts
    found = {
        "hot_runs": hot,
        "cold_runs": cold,
        "cold_distinct": cold_distinct,
        "cold_keys": cold_keys,
        "finished_once": once,
    }
    expected = {
        "hot_runs": hot_runs,
        "cold_runs": options.cold_runs,
        "cold_distinct": options.cold_runs,
        "cold_keys": min(options.cold_keys, options.cold_runs),
        "finished_once": hot_runs + options.cold_runs,
    }
    if found != expected:
        raise BenchError(f"{side} starvation: expected {expected}, found {found}")
    waits = [(attempted - inserted) * 1000 for inserted, attempted, _, _ in rows]
    handler = [(started - enqueued) * 1000 for _, _, enqueued, started in rows]
    sample: dict[str, Any] = {
        **found,
        "arrival_seconds": arrival_seconds,
        "db_ms": percentiles(waits),
        "handler_ms": percentiles(handler),
        "share_over_100ms": sum(w > SLOW_MS for w in waits) / len(waits),
        "cadence": claim_cadence(rows, claims),
        "loadavg": round(os.getloadavg()[0], 2),
        "verified": True,
    }
    if hot_runs:
        sample["hot_left_at_last_cold_claim"] = hot_after
        sample["hot_drain_seconds"] = hot_last - hot_first
        sample["hot_drain_rate"] = hot_runs / (hot_last - hot_first)
    return sample


def run_starvation(
    url: str, options: Options, worker_commit: str, progress: Callable[[str], None]
) -> dict[str, Any]:
    samples: dict[str, list[dict[str, Any]]] = {s: [] for s in SCENARIOS}
    for repetition in range(options.repeat):
        order = list(SCENARIOS) if repetition % 2 == 0 else list(reversed(SCENARIOS))
        for scenario in order:
            if scenario == "raw_hot":
                sample = starvation_raw(url, options, worker_commit)
            else:
                sample = starvation_tidegate(url, options, hot=scenario == "tidegate_hot")
            samples[scenario].append(sample)
            db, handler = sample["db_ms"], sample["handler_ms"]
            held = (
                f", hot left at last cold claim {sample['hot_left_at_last_cold_claim']:,}"
                if "hot_left_at_last_cold_claim" in sample
                else ""
            )
            progress(
                f"starvation {scenario:18} #{repetition + 1}  cold wait p50 {db['p50']:.2f} ms,"
                f" p99 {db['p99']:.2f} ms (handler p99 {handler['p99']:.2f} ms){held}"
                f" ({sample['cold_runs']} cold verified)"
            )
    figures: dict[str, Any] = {}
    for scenario, found in samples.items():
        entry: dict[str, Any] = {"samples": found}
        for p in ("p50", "p95", "p99", "max"):
            entry[f"db_{p}"] = spread([s["db_ms"][p] for s in found])
            entry[f"handler_{p}"] = spread([s["handler_ms"][p] for s in found])
        entry["share_over_100ms"] = spread([s["share_over_100ms"] for s in found])
        cadence = [s["cadence"] for s in found]
        if all(c["gap_ms"] for c in cadence):
            entry["claim_gap_p50"] = spread([c["gap_ms"]["p50"] for c in cadence])
            entry["claim_gap_p99"] = spread([c["gap_ms"]["p99"] for c in cadence])
        entry["runs_per_claim"] = spread([c["runs_per_claim_in_window"] for c in cadence])
        entry["share_first_claim"] = spread([c["share_first_claim"] for c in cadence])
        entry["passed_over_p99"] = spread([c["passed_over"]["p99"] for c in cadence])
        entry["passed_over_max"] = spread([c["passed_over"]["max"] for c in cadence])
        if "hot_drain_rate" in found[0]:
            entry["hot_drain_rate"] = spread([s["hot_drain_rate"] for s in found])
            entry["hot_drain_seconds"] = spread([s["hot_drain_seconds"] for s in found])
            entry["hot_left_at_last_cold_claim"] = spread(
                [s["hot_left_at_last_cold_claim"] for s in found]
            )
        figures[scenario] = entry
    ratio = (
        figures["tidegate_hot"]["db_p99"]["median"]
        / figures["tidegate_cold_only"]["db_p99"]["median"]
    )
    return {
        "verified": all(s["verified"] for found in samples.values() for s in found),
        **figures,
        "ratio_p99": ratio,
        "aim": f"tidegate cold p99 with the hot backlog <= {AIM_STARVATION:g}x without it",
        "met": ratio <= AIM_STARVATION,
    }


# -- part 2: claim throughput ----------------------------------------------------------

# The backlog, as enqueue_many would stamp it on an empty table: key g % keys, the n-th
# run of a key at virtual time n / weight (key_clock starts at 0, then steps of 1/weight).
FILL_RUNS = """
WITH weights AS MATERIALIZED (
    SELECT k, key_weight('default', 'k' || k) AS weight
    FROM generate_series(0, %(keys)s - 1) AS k
)
INSERT INTO runs (project, lane, key, task, args, state, vtime)
SELECT 'default', 'default', 'k' || (g %% %(keys)s), 'noop', jsonb_build_object('i', g),
       'available', (g / %(keys)s + 1) / w.weight
FROM generate_series(0, %(runs)s - 1) AS g
JOIN weights AS w ON w.k = g %% %(keys)s
ORDER BY g
"""
HEAVY_KEYS = """
INSERT INTO key_policies (lane, key, weight)
SELECT 'default', 'k' || k, 2.0 FROM generate_series(0, %(keys)s - 1, %(every)s) AS k
"""
SAVE_POLICIES = "CREATE TABLE bench_policies AS SELECT * FROM key_policies"
POLICIES_ON = (
    "TRUNCATE key_policies",
    "INSERT INTO key_policies SELECT * FROM bench_policies",
    "ANALYZE key_policies",
)
POLICIES_OFF = ("TRUNCATE key_policies",)
FILL_JOBS = """
INSERT INTO jobs (kind, args)
SELECT 'noop', jsonb_build_object('i', g) FROM generate_series(0, %(runs)s - 1) AS g
"""
TIDEGATE_STATES = """
SELECT count(*) FILTER (WHERE state = 'succeeded'), count(*) FILTER (WHERE state = 'running'),
       count(*) FILTER (WHERE state = 'available'), coalesce(max(attempt), 0),
       (SELECT count(*) FROM key_policies),
       (SELECT count(*) FROM projects WHERE concurrency IS NOT NULL)
FROM runs
"""
TIDEGATE_ONCE = """
SELECT count(*) FROM runs WHERE id = ANY(%(ids)s) AND state = 'succeeded' AND attempt = 1
"""
RAW_STATES = """
SELECT count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state = 'running'),
       count(*) FILTER (WHERE state = 'available'), coalesce(max(attempt), 0), 0, 0
FROM jobs
"""
RAW_ONCE = """
SELECT count(*) FROM jobs WHERE id = ANY(%(ids)s) AND state = 'completed' AND attempt = 1
"""


def claim_cells(options: Options) -> list[tuple[int, int]]:
    """(ready runs, keys) to measure; never more keys than runs."""
    cells: list[tuple[int, int]] = []
    for runs in options.backlogs:
        for keys in options.keys:
            cell = (runs, min(keys, runs))
            if cell not in cells:
                cells.append(cell)
    return cells


def loop_conninfo(url: str, schema: str) -> str:
    """One connection, committing as tidegate's worker (and the raw worker) does."""
    return make_conninfo(
        schema_conninfo(url, schema),
        options=f"-c search_path={schema} -c synchronous_commit=off",
    )


class Backlog:
    """One side's backlog of ready runs for a cell, and what its loops have finished."""

    def __init__(self, side: str, url: str, schema: str, runs: int, keys: int) -> None:
        self.side = side
        self.url = url
        self.schema = schema
        self.runs = runs
        self.keys = keys
        self.finished = 0
        """Runs completed by every loop so far on this backlog."""


def fill_tidegate(url: str, schema: str, options: Options, runs: int, keys: int) -> Backlog:
    """Migrate, set the policies (kept aside), and insert the backlog; vacuumed."""
    app = tidegate_side.open_app(url, schema)
    try:
        app.set_key_policy(LANE, "*", max_running=options.max_running, weight=1.0)
    finally:
        app.close()
    with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
        conn.execute(HEAVY_KEYS, {"keys": keys, "every": options.heavy_every})
        conn.execute(SAVE_POLICIES)
        conn.execute(FILL_RUNS, {"runs": runs, "keys": keys})
    settle(url, schema, "runs")
    return Backlog("tidegate", url, schema, runs, keys)


def fill_raw(url: str, schema: str, runs: int) -> Backlog:
    raw.create(url, schema)
    with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
        conn.execute(FILL_JOBS, {"runs": runs})
    settle(url, schema, "jobs")
    return Backlog("raw", url, schema, runs, 0)


def claim_loop(backlog: Backlog, mode: str, options: Options) -> dict[str, Any]:
    """Claim ``demand``, complete the batch, replace it; ``claims`` times. Then verify."""
    if mode != "raw":
        with psycopg.connect(schema_conninfo(backlog.url, backlog.schema), autocommit=True) as c:
            for statement in POLICIES_ON if mode == "policies" else POLICIES_OFF:
                c.execute(statement)
    settle(backlog.url, backlog.schema, "jobs" if mode == "raw" else "runs")
    cycle = TidegateCycle(backlog, options) if mode != "raw" else RawCycle(backlog, options)
    claim_seconds = complete_seconds = 0.0
    claimed: list[int] = []
    keys: Counter[str] = Counter()
    short = 0
    with psycopg.connect(loop_conninfo(backlog.url, backlog.schema), autocommit=True) as conn:
        for n in range(WARMUP_CLAIMS + options.claims):
            t0 = time.perf_counter()
            rows = cycle.claim(conn)
            t1 = time.perf_counter()
            cycle.complete(conn, rows)
            t2 = time.perf_counter()
            short += len(rows) != options.demand
            claimed.extend(cycle.ids(rows))
            batch_keys = cycle.keys(rows)
            cycle.replenish(conn, batch_keys)  # not timed
            if n >= WARMUP_CLAIMS:
                claim_seconds += t1 - t0
                complete_seconds += t2 - t1
                keys.update(batch_keys)
        backlog.finished += len(claimed)
        found = verify_loop(conn, backlog, mode, claimed, short, options)
    timed_runs = options.claims * options.demand
    seconds = claim_seconds + complete_seconds
    sample: dict[str, Any] = {
        "claims": options.claims,
        "runs": timed_runs,
        "claim_seconds": claim_seconds,
        "complete_seconds": complete_seconds,
        "claims_per_second": options.claims / seconds,
        "runs_per_second": timed_runs / seconds,
        "claim_ms": claim_seconds / options.claims * 1000,
        "complete_ms": complete_seconds / options.claims * 1000,
        "claim_only_runs_per_second": timed_runs / claim_seconds,
        "distinct_keys_per_claim": len(keys) / options.claims if mode != "raw" else None,
        "loadavg": round(os.getloadavg()[0], 2),
        "verified": True,
        **found,
    }
    if mode == "policies" and backlog.keys * 20 <= timed_runs:
        # Weight 2 keys should get twice the claims of weight 1 keys (enough claims).
        heavy = [n for k, n in keys.items() if int(k[1:]) % options.heavy_every == 0]
        light = [n for k, n in keys.items() if int(k[1:]) % options.heavy_every != 0]
        if heavy and light:
            sample["heavy_to_light_share"] = (sum(heavy) / len(heavy)) / (sum(light) / len(light))
    return sample


def verify_loop(
    conn: psycopg.Connection,
    backlog: Backlog,
    mode: str,
    claimed: list[int],
    short: int,
    options: Options,
) -> dict[str, Any]:
    """Every claim full, every run claimed once and finished once, nothing in flight."""
    states, once_sql = (RAW_STATES, RAW_ONCE) if mode == "raw" else (TIDEGATE_STATES, TIDEGATE_ONCE)
    row = conn.execute(states).fetchone()
    assert row is not None
    finished, running, available, max_attempt, policies, capped = row
    once = conn.execute(once_sql, {"ids": claimed}).fetchone()
    expected_claimed = (WARMUP_CLAIMS + options.claims) * options.demand
    found = {
        "short_claims": short,
        "claimed": len(claimed),
        "claimed_distinct": len(set(claimed)),
        "claimed_finished_once": once[0] if once else None,
        "finished_total": finished,
        "running": running,
        "available": available,
        "max_attempt": max_attempt,
    }
    expected = {
        "short_claims": 0,
        "claimed": expected_claimed,
        "claimed_distinct": expected_claimed,
        "claimed_finished_once": expected_claimed,
        "finished_total": backlog.finished,
        "running": 0,
        "available": backlog.runs,
        "max_attempt": 1,
    }
    if found != expected:
        raise BenchError(f"{mode} claims: expected {expected}, found {found}")
    path = {"policies": policies > 0, "fast": policies == 0 and capped == 0, "raw": True}
    if not path[mode]:
        raise BenchError(f"{mode} claims ran with {policies} key policies, {capped} caps")
    return {"key_policies": policies, **found}


def worker_claim_params(url: str, schema: str) -> dict[str, Any]:
    """Return the parameters a ``manual>*`` workloop of tidegate's worker claims with.

    Taken from a ``Worker`` built (nothing connects) the way ``tidegate worker`` builds
    it, so the loop sends exactly what the worker sends: the chain, the scan limits, the
    lease.
    """
    from tidegate import Settings, Tidegate
    from tidegate.worker.runtime import Worker

    app = Tidegate(settings=Settings(database_url=url, schema=schema))
    worker = Worker(app, app.settings.replace(workloops=WORKLOOPS))
    try:
        return dict(worker.workloops[0].claim_params)
    finally:
        worker.executor.shutdown(wait=False)
        app.close()


class TidegateCycle:
    """tidegate's claim and completion statements, as its worker sends them."""

    def __init__(self, backlog: Backlog, options: Options) -> None:
        self.options = options
        self.claim_sql = query("claim_runs")
        self.complete_sql = query("complete_runs")
        self.insert_sql = query("insert_runs")
        self.params = {
            **worker_claim_params(backlog.url, backlog.schema),
            "demand": options.demand,
            "worker_id": WORKER_ID,
        }
        self.channels = {
            "worker_id": WORKER_ID,
            "completed_channel": f"{backlog.schema}.completed",
            "channel": f"{backlog.schema}.available",
        }
        self.columns: dict[str, int] = {}

    def claim(self, conn: psycopg.Connection) -> list[tuple[Any, ...]]:
        cursor = conn.execute(self.claim_sql, self.params)
        if not self.columns:
            assert cursor.description is not None
            self.columns = {c.name: i for i, c in enumerate(cursor.description)}
        return cursor.fetchall()

    def complete(self, conn: psycopg.Connection, rows: list[tuple[Any, ...]]) -> None:
        c = self.columns
        outcomes = [
            {
                "id": r[c["id"]],
                "attempt": r[c["attempt"]],
                "state": "succeeded",
                "result": None,
                "error": None,
                "delay_seconds": None,
                "max_attempts": r[c["max_attempts"]],
            }
            for r in rows
        ]
        conn.execute(self.complete_sql, {"outcomes": json.dumps(outcomes), **self.channels})

    def ids(self, rows: list[tuple[Any, ...]]) -> list[int]:
        return [r[self.columns["id"]] for r in rows]

    def keys(self, rows: list[tuple[Any, ...]]) -> list[str]:
        return [r[self.columns["key"]] for r in rows]

    def replenish(self, conn: psycopg.Connection, keys: list[str]) -> None:
        """As many new runs as were claimed, same keys, through tidegate's insert."""
        new = [
            {
                "project": "default",
                "lane": LANE,
                "key": key,
                "task": HOT_TASK,
                "args": {},
                "priority": 0,
                "max_attempts": 20,
                "scheduled_at": None,
                "idempotency_key": None,
            }
            for key in keys
        ]
        conn.execute(
            self.insert_sql, {"runs": json.dumps(new), "channel": self.channels["channel"]}
        )


class RawCycle:
    """The raw queue's claim and completion statements (bench/raw.py), as its worker's."""

    def __init__(self, backlog: Backlog, options: Options) -> None:
        self.schema = backlog.schema
        self.demand = options.demand

    def claim(self, conn: psycopg.Connection) -> list[tuple[Any, ...]]:
        return conn.execute(raw.CLAIM_JOBS, {"limit": self.demand}).fetchall()

    def complete(self, conn: psycopg.Connection, rows: list[tuple[Any, ...]]) -> None:
        conn.execute(raw.COMPLETE_JOBS, {"id": [r[0] for r in rows], "result": [None] * len(rows)})

    def ids(self, rows: list[tuple[Any, ...]]) -> list[int]:
        return [r[0] for r in rows]

    def keys(self, rows: list[tuple[Any, ...]]) -> list[str]:
        return ["" for _ in rows]

    def replenish(self, conn: psycopg.Connection, keys: list[str]) -> None:
        raw.insert(conn, self.schema, HOT_TASK, ["{}"] * len(keys))


def run_claims(url: str, options: Options, progress: Callable[[str], None]) -> dict[str, Any]:
    cells = []
    raw_backlogs: dict[int, Backlog] = {}
    raw_fill: dict[int, float] = {}
    with contextlib.ExitStack() as raw_schemas:
        for runs, keys in claim_cells(options):
            if runs not in raw_backlogs:  # the raw queue has no keys: one backlog per size
                for old in raw_backlogs.values():
                    drop_schema(old)
                raw_backlogs = {}
                started = time.monotonic()
                schema = raw_schemas.enter_context(fresh_schema(url, "fairraw"))
                raw_backlogs[runs] = fill_raw(url, schema, runs)
                raw_fill[runs] = time.monotonic() - started
                progress(f"claims {runs:>9,} ready: raw backlog in {raw_fill[runs]:.0f} s")
            with fresh_schema(url, "fair") as schema:
                started = time.monotonic()
                backlog = fill_tidegate(url, schema, options, runs, keys)
                tidegate_fill = time.monotonic() - started
                progress(
                    f"claims {runs:>9,} ready, {keys:>7,} keys: tidegate backlog in "
                    f"{tidegate_fill:.0f} s"
                )
                backlogs = {"policies": backlog, "fast": backlog, "raw": raw_backlogs[runs]}
                samples: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
                for repetition in range(options.repeat):
                    # Rotate who goes first, so a drift in the machine hits every mode.
                    order = MODES[repetition % 3 :] + MODES[: repetition % 3]
                    for mode in order:
                        sample = claim_loop(backlogs[mode], mode, options)
                        samples[mode].append(sample)
                        progress(
                            f"claims {runs:>9,} ready, {keys:>7,} keys, {mode:8} "
                            f"#{repetition + 1}  {sample['claims_per_second']:,.0f} claims/s, "
                            f"{sample['runs_per_second']:,.0f} runs/s (claim "
                            f"{sample['claim_ms']:.2f} ms, complete {sample['complete_ms']:.2f}"
                            f" ms; {sample['claimed']:,} claimed once, verified)"
                        )
            cells.append(
                {
                    **summarize_cell(runs, keys, samples),
                    "fill_seconds": {"tidegate": tidegate_fill, "raw": raw_fill[runs]},
                }
            )
    return {
        "verified": all(c["verified"] for c in cells),
        "cells": cells,
        "aim": f"tidegate with policies >= {AIM_CLAIMS:.0%} of the raw queue's runs/s",
        "met": all(c["met"] for c in cells),
    }


def drop_schema(backlog: Backlog) -> None:
    """Drop a raw backlog's schema early (fresh_schema drops it again, harmlessly)."""
    with psycopg.connect(backlog.url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{backlog.schema}" CASCADE')


def summarize_cell(
    runs: int, keys: int, samples: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for mode, found in samples.items():
        figures[mode] = {
            name: spread([s[name] for s in found])
            for name in (
                "claims_per_second",
                "runs_per_second",
                "claim_ms",
                "complete_ms",
                "claim_only_runs_per_second",
            )
        }
        figures[mode]["samples"] = found
    raw_rate = figures["raw"]["runs_per_second"]["median"]
    raw_claim = figures["raw"]["claim_only_runs_per_second"]["median"]
    ratio = {m: figures[m]["runs_per_second"]["median"] / raw_rate for m in ("policies", "fast")}
    claim_ratio = {
        m: figures[m]["claim_only_runs_per_second"]["median"] / raw_claim
        for m in ("policies", "fast")
    }
    shares = [s["heavy_to_light_share"] for s in samples["policies"] if "heavy_to_light_share" in s]
    return {
        "ready_runs": runs,
        "keys": keys,
        "verified": all(s["verified"] for found in samples.values() for s in found),
        **figures,
        "ratio": ratio,
        "claim_only_ratio": claim_ratio,
        "heavy_to_light_share": spread(shares) if shares else None,
        "met": ratio["policies"] >= AIM_CLAIMS,
    }


# -- the run ---------------------------------------------------------------------------


def run_fairness(
    url: str,
    options: Options,
    *,
    embedded: bool = False,
    command: str = "",
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Measure both parts against ``url``; return the results."""
    worker_commit = tidegate_side.worker_synchronous_commit(url)
    result: dict[str, Any] = {
        "benchmark": "fairness",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "options": dataclasses.asdict(options),
        "embedded": embedded,
        "machine": machine_info(),
        "server": server_info(url),
        "code": json.loads(os.environ[CODE_ENV]) if CODE_ENV in os.environ else code_info(),
        "durability": {
            "enqueue_synchronous_commit": "server setting",
            "worker_synchronous_commit": worker_commit,
            "claim_loop_synchronous_commit": "off",
        },
    }
    started = time.monotonic()
    progress(f"load average at start: {result['machine']['loadavg_at_start']}")
    if "starvation" in options.parts:
        result["starvation"] = run_starvation(url, options, worker_commit, progress)
        result["machine"]["loadavg_after_starvation"] = [round(x, 2) for x in os.getloadavg()]
    if "claims" in options.parts:
        result["claims"] = run_claims(url, options, progress)
    result["seconds"] = round(time.monotonic() - started, 1)
    result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    progress(f"load average at end: {result['machine']['loadavg_at_end']}")
    if source_digest(tidegate_dir()) != result["code"].get("src_sha256"):
        result["code"]["changed_during_run"] = True
        progress("warning: src/tidegate changed while the benchmark ran")
    result["verified"] = all(result[p]["verified"] for p in options.parts)
    return result


# -- reporting -------------------------------------------------------------------------


def _f(s: dict[str, Any], digits: int = 0) -> str:
    return f"{s['median']:,.{digits}f} ({s['min']:,.{digits}f} - {s['max']:,.{digits}f})"


def render(result: dict[str, Any]) -> str:
    """Return one run's results as Markdown: where, how, and the tables."""
    server, machine, options = result["server"], result["machine"], result["options"]
    code = result.get("code", {})
    where = "embedded, " if result.get("embedded") else ""
    settings = ", ".join(f"{k}={v}" for k, v in server["settings"].items())
    load = machine["loadavg_at_start"]
    lines = [
        f"### PostgreSQL {server['version']} ({where}{server['connection']}), {result['date']}",
        "",
        f"- command: `{result['command']}`",
        f"- machine: {machine['cores']} cores, {machine['cpu_model']}, "
        f"{machine['memory_gib']} GiB memory, Linux {machine['kernel']}; load average "
        f"(1/5/15 min) {' / '.join(str(x) for x in load)} at start, "
        + (
            f"{machine['loadavg_after_starvation'][0]} (1 min) after part 1, "
            if "loadavg_after_starvation" in machine
            else ""
        )
        + f"{' / '.join(str(x) for x in machine.get('loadavg_at_end', ['?']))} at end",
        f"- software: Python {machine['python']}, psycopg {machine['psycopg']}, "
        f"tidegate commit {code.get('commit', '?')}"
        + (
            f" plus uncommitted changes in src/tidegate (sha256 {code.get('src_sha256')})"
            if code.get("src_modified")
            else ""
        )
        + (", measured on a copy taken at start (--snapshot)" if code.get("snapshot") else "")
        + (" (**changed during the run**)" if code.get("changed_during_run") else ""),
        f"- server settings: {settings}",
        f"- {options['repeat']} repetitions; median (min - max); the whole run took "
        f"{result.get('seconds', 0):.0f} s",
        "",
    ]
    if "starvation" in result:
        lines += render_starvation(result["starvation"], options)
    if "claims" in result:
        lines += render_claims(result["claims"], options)
    return "\n".join(lines)


def render_starvation(s: dict[str, Any], o: dict[str, Any]) -> list[str]:
    names = {
        "tidegate_hot": f"tidegate, hot backlog of {o['hot_runs']:,}",
        "tidegate_cold_only": "tidegate, no hot key",
        "raw_hot": f"raw FIFO, hot backlog of {o['hot_runs']:,}",
    }
    lines = [
        f"**Starvation**: {o['cold_runs']:,} cold runs, one every {o['cold_interval_ms']:g} ms "
        f"over {o['cold_keys']} keys, one worker with {o['slots']} slots. Cold wait in ms "
        "(`attempted_at - inserted_at`; handler: handler start - client's time before the "
        "insert).",
        "",
        "| scenario | wait p50 | wait p95 | wait p99 | wait max | handler p50 | handler p99 "
        f"| waited > {SLOW_MS:g} ms | hot left at last cold claim | hot drain, runs/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for scenario in SCENARIOS:
        f = s[scenario]
        hot = (
            f"{_f(f['hot_left_at_last_cold_claim'])} | {_f(f['hot_drain_rate'])}"
            if "hot_drain_rate" in f
            else " | "
        )
        share = f["share_over_100ms"]
        lines.append(
            f"| {names[scenario]} | {_f(f['db_p50'], 2)} | {_f(f['db_p95'], 2)} "
            f"| {_f(f['db_p99'], 2)} | {_f(f['db_max'], 1)} | {_f(f['handler_p50'], 2)} "
            f"| {_f(f['handler_p99'], 2)} | {share['median']:.1%} | {hot} |"
        )
    lines += [
        "",
        "Claims while the cold runs arrived (from `attempted_at`, which a claim's runs "
        "share): gap between claim starts, runs per claim, and how many claims passed a "
        "cold run over (started after its insert began, before the claim that took it; 1 "
        "is as good as 0, a claim that started before the insert committed cannot see it).",
        "",
        "| scenario | claim gap p50, ms | claim gap p99, ms | runs per claim "
        "| taken by the 1st or 2nd claim | claims passed over, p99 | max |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for scenario in SCENARIOS:
        f = s[scenario]
        gaps = (
            f"{_f(f['claim_gap_p50'], 1)} | {_f(f['claim_gap_p99'], 1)}"
            if "claim_gap_p50" in f
            else " | "
        )
        lines.append(
            f"| {names[scenario]} | {gaps} | {_f(f['runs_per_claim'], 1)} "
            f"| {f['share_first_claim']['median']:.1%} | {_f(f['passed_over_p99'])} "
            f"| {_f(f['passed_over_max'])} |"
        )
    lines += [
        "",
        f"Aim: {s['aim']}: {s['ratio_p99']:.2f}x, " + ("**met**." if s["met"] else "**not met**."),
        "",
    ]
    return lines


def render_claims(c: dict[str, Any], o: dict[str, Any]) -> list[str]:
    lines = [
        f"**Claim throughput**: one connection, claim {o['demand']} then complete them in one "
        f"batch, {o['claims']} cycles per sample, backlog kept at its size. Cycles/s and "
        "runs/s of claim + completion time; the ratio is to the raw FIFO queue's runs/s "
        f"(aim with policies >= {AIM_CLAIMS:g}); ms per claim statement and per completion.",
        "",
        "| ready runs | keys | policies: claims/s | runs/s | fast path: claims/s | runs/s "
        "| raw FIFO: claims/s | runs/s | policies / raw | fast / raw | met "
        "| claim ms (policies / fast / raw) | complete ms (tidegate / raw) |",
        "|" + " ---: |" * 10 + " --- | ---: | ---: |",
    ]
    for cell in c["cells"]:
        p, f, r = cell["policies"], cell["fast"], cell["raw"]
        claim_ms = " / ".join(f"{m['claim_ms']['median']:.2f}" for m in (p, f, r))
        complete_ms = (
            f"{statistics.median([p['complete_ms']['median'], f['complete_ms']['median']]):.2f}"
            f" / {r['complete_ms']['median']:.2f}"
        )
        lines.append(
            f"| {cell['ready_runs']:,} | {cell['keys']:,} "
            f"| {_f(p['claims_per_second'])} | {_f(p['runs_per_second'])} "
            f"| {_f(f['claims_per_second'])} | {_f(f['runs_per_second'])} "
            f"| {_f(r['claims_per_second'])} | {_f(r['runs_per_second'])} "
            f"| {cell['ratio']['policies']:.2f} | {cell['ratio']['fast']:.2f} "
            f"| {'yes' if cell['met'] else '**no**'} | {claim_ms} | {complete_ms} |"
        )
    shares = [
        f"{cell['ready_runs']:,} runs / {cell['keys']:,} keys: "
        f"{cell['heavy_to_light_share']['median']:.2f}"
        for cell in c["cells"]
        if cell.get("heavy_to_light_share")
    ]
    if shares:
        lines += [
            "",
            "Weights at work (policies): claims per weight-2 key / per weight-1 key, "
            "where every key was claimed often enough to tell: " + "; ".join(shares) + ".",
        ]
    lines.append("")
    return lines


def write_docs(results_dir: Path = RESULTS, docs: Path = DOCS) -> None:
    """Render every ``fairness-postgres*.json`` between the fairness markers of ``docs``.

    Only the text between the markers changes; without them, a "Fairness" section with
    the markers is appended at the end. The file is read right before it is written.
    """
    found = [json.loads(p.read_text()) for p in sorted(results_dir.glob("fairness-postgres*.json"))]
    found.sort(key=lambda r: (-r["server"]["major"], not r.get("embedded")))
    body = "\n".join(render(r) for r in found)
    text = docs.read_text()
    if BEGIN not in text or END not in text:
        text = text.rstrip("\n") + f"\n\n## Fairness\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    docs.write_text(f"{head}{BEGIN}\n\n{body}\n{END}{tail}")


# -- the command -----------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fairness",
        description="Cold keys behind a hot backlog, and fair claims against a FIFO claim.",
    )
    parser.add_argument(
        "--database-url",
        help="PostgreSQL to measure on (default: TIDEGATE_DATABASE_URL, else an embedded "
        f"PostgreSQL 18 under {EMBEDDED_DATA_DIR.relative_to(ROOT)})",
    )
    parser.add_argument("--repeat", type=int, default=Options.repeat, help="repetitions")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE.hot_runs:,} hot runs, {SMOKE.cold_runs} cold, one small claim cell, "
        "once: checks, not figures",
    )
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help="which parts, comma-separated (default: all; for investigation, not published)",
    )
    parser.add_argument(
        "--backlogs",
        help="ready runs of the claim part, comma-separated (investigation, not published)",
    )
    parser.add_argument(
        "--keys", help="keys of the claim part, comma-separated (investigation, not published)"
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="where to write the JSON (default: bench/results/fairness-latest.json and "
        "bench/results/fairness-postgres<major>[-embedded].json for a full run; "
        "nothing for --smoke)",
    )
    parser.add_argument(
        "--write-docs", action="store_true", help="rewrite the figures in docs/benchmarks.md"
    )
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="measure a copy of src/tidegate taken at start (edits made while the benchmark "
        "runs cannot mix two versions of the code in one run)",
    )
    options = parser.parse_args(argv)
    options.parts = tuple(p.strip() for p in options.parts.split(",") if p.strip())
    if set(options.parts) - set(PARTS) or not options.parts:
        parser.error(f"--parts takes some of {', '.join(PARTS)}")
    options.full = options.parts == PARTS and not options.backlogs and not options.keys
    for name in ("backlogs", "keys"):
        value = getattr(options, name)
        if value:
            try:
                setattr(options, name, tuple(int(v.replace("_", "")) for v in value.split(",")))
            except ValueError:
                parser.error(f"--{name} takes whole numbers, comma-separated")
    if options.smoke and options.write_docs:
        parser.error("--smoke measures too little to publish; drop --write-docs")
    if options.write_docs and not options.full:
        parser.error("--write-docs publishes full runs only; drop --parts/--backlogs/--keys")
    if options.repeat < 1:
        parser.error("--repeat must be >= 1")
    return options


def reexec_on_snapshot(argv: list[str]) -> None:
    """Copy ``src/tidegate`` aside and run this command again on the copy (never returns)."""
    code = code_info()
    snapshot = Path(tempfile.mkdtemp(prefix="tidegate-fairness-src-"))
    shutil.copytree(
        ROOT / "src" / "tidegate",
        snapshot / "tidegate",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    code["src_sha256"] = source_digest(snapshot / "tidegate")
    code["snapshot"] = True
    path = [str(snapshot), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, path)),
        SNAPSHOT_ENV: str(snapshot),
        CODE_ENV: json.dumps(code),
    }
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "bench.fairness", *argv], env)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.snapshot and SNAPSHOT_ENV not in os.environ:
        reexec_on_snapshot(argv)
    if SNAPSHOT_ENV in os.environ:
        atexit.register(shutil.rmtree, os.environ[SNAPSHOT_ENV], ignore_errors=True)
    url = args.database_url or os.environ.get("TIDEGATE_DATABASE_URL")
    embedded = not url
    if not url:
        from tidegate.storage.embedded import start_embedded

        url = start_embedded(EMBEDDED_DATA_DIR)
    base = SMOKE if args.smoke else Options(repeat=args.repeat)
    changes: dict[str, Any] = {"parts": args.parts}
    if args.backlogs:
        changes["backlogs"] = args.backlogs
    if args.keys:
        changes["keys"] = args.keys
    if args.smoke and args.repeat != Options.repeat:
        changes["repeat"] = args.repeat
    options = dataclasses.replace(base, **changes)
    command = shlex.join(["python", "-m", "bench.fairness", *(redact(a) for a in argv)])
    print(f"tidegate fairness benchmark: {command}", file=sys.stderr)
    result = run_fairness(
        url,
        options,
        embedded=embedded,
        command=command,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(render(result))
    if args.output:
        write_results(result, args.output)
    elif not args.smoke:
        write_results(result, RESULTS / "fairness-latest.json")
        if args.full:
            write_results(result, RESULTS / f"fairness-{server_label(result)}.json")
    if args.write_docs:
        write_docs()
        print(f"wrote {DOCS.relative_to(ROOT)}", file=sys.stderr)
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
