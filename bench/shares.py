"""Whether a workloop's lanes get the shares of its slots they are configured for.

::

    python -m bench.shares                # embedded PostgreSQL (or TIDEGATE_DATABASE_URL)
    python -m bench.shares --database-url postgresql://postgres@127.0.0.1:5432/test --write-docs

One ``tidegate worker`` process with one workloop, on a schema of its own, and a backlog
kept in every lane (topped up whenever a lane has fewer than ``LOW`` ready runs) of
``tidegate.sleep`` runs each sleeping 20-50 ms (uniform). After ``--warmup`` seconds,
for ``--seconds``: each lane's slot-seconds, from its runs' ``attempted_at`` to
``completed_at`` (cut at the window's edges; a run still running counts to the end),
against the split the workloop is configured for (``share_demands`` of its slots with
every lane busy); and, per lane, the longest time no run of it started while it had
ready runs (a lane starved would show the whole window). The same for a chain over the
same lanes, to compare. Medians of ``--repeat``.

Then the claim's cost for shares: ``CLAIM_CALLS`` claims of one run per lane of three,
as the one statement with per-lane demands, and as one statement per lane, each
committed (the claim commits through the flush), p50 ms.
"""

from __future__ import annotations

import argparse
import itertools
import random
import shlex
import statistics
import sys
import time
from datetime import datetime
from typing import Any

import psycopg

from bench.harness import (
    DOCS,
    RESULTS,
    WorkerProcess,
    child_env,
    close_record,
    fresh_schema,
    new_record,
    percentiles,
    python_module,
    redact,
    schema_conninfo,
    start_run,
    write_between,
    write_results,
)
from bench.webhooks.common import START_SECONDS, WORKER_READY
from bench.webhooks.processes import migrate
from tidegate import NewRun, Settings, Tidegate
from tidegate.builtin import app as builtin
from tidegate.lanes import parse_workloops, share_demands
from tidegate.storage.sql import query

DESCRIPTION = "Whether a workloop's lanes get their configured shares of its slots."
LANES = ("a", "b", "c")
WORKLOOPS = {"shares": "a=3,b=1,c=1/2:12", "chain": "a>b>c:12"}
LOW = 300
"""Ready runs a lane keeps at least: more than its slots can take between two top-ups."""
SLEEP_SECONDS = (0.02, 0.05)
CLAIM_CALLS = 300
SMOKE = {"seconds": 2.0, "warmup": 0.5, "repeat": 1}

SLOT_SECONDS = """
SELECT lane,
       sum(extract(epoch FROM least(coalesce(completed_at, %(until)s), %(until)s)
                               - greatest(attempted_at, %(since)s)))
FROM runs
WHERE attempted_at < %(until)s AND coalesce(completed_at, %(until)s) > %(since)s
GROUP BY lane
"""
STARTS = """
SELECT lane, attempted_at FROM runs
WHERE attempted_at >= %(since)s AND attempted_at < %(until)s
ORDER BY lane, attempted_at
"""
READY = "SELECT lane, count(*) FROM runs WHERE state = 'available' GROUP BY lane"
NOW = "SELECT clock_timestamp()"


def configured(spec: str) -> dict[str, float]:
    """Each lane's part of the slots with every lane busy: the shares' split; a chain's
    first lane all of them."""
    (loop,) = parse_workloops(spec)
    if not loop.shares:
        return {lane: float(lane == loop.chain[0]) for lane in LANES}
    split = share_demands(loop.shares, [0] * len(loop.shares), loop.slots, set())
    return {share.lane: given / loop.slots for share, given in zip(loop.shares, split, strict=True)}


def top_up(tidegate: Tidegate, conn: psycopg.Connection) -> None:
    """Give every lane with fewer than ``LOW`` ready runs ``LOW`` more."""
    ready = dict(conn.execute(READY).fetchall())
    runs = [
        NewRun("tidegate.sleep", {"body": {"seconds": random.uniform(*SLEEP_SECONDS)}}, lane=lane)
        for lane in LANES
        if ready.get(lane, 0) < LOW
        for _ in range(LOW)
    ]
    if runs:
        tidegate.enqueue_many(runs)


def measure(url: str, spec: str, seconds: float, warmup: float) -> dict[str, Any]:
    """One worker on ``spec`` over a kept backlog: each lane's share and longest gap."""
    with fresh_schema(url, "shares") as schema:
        migrate(url, schema)
        tidegate = Tidegate(settings=Settings(database_url=url, schema=schema))
        tidegate.tasks.update(builtin.tasks)
        with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
            env = child_env(TIDEGATE_DATABASE_URL=url, TIDEGATE_SCHEMA=schema)
            argv = python_module(
                "tidegate", "worker", "--app", "tidegate.builtin:app", "--workloops", spec
            )
            with WorkerProcess(argv, env, WORKER_READY) as worker:
                worker.wait_ready(START_SECONDS)
                top_up(tidegate, conn)  # a worker has the task: the runs are not told to wait
                marks: list[datetime] = []
                started = time.monotonic()
                while time.monotonic() - started < warmup + seconds:
                    if not marks and time.monotonic() - started >= warmup:
                        marks.append(conn.execute(NOW).fetchone()[0])  # type: ignore[index]
                    top_up(tidegate, conn)
                    worker.check_alive()
                    time.sleep(0.05)
                marks.append(conn.execute(NOW).fetchone()[0])  # type: ignore[index]
                window = {"since": marks[0], "until": marks[1]}
                used = {lane: float(s) for lane, s in conn.execute(SLOT_SECONDS, window)}
                starts: dict[str, list[datetime]] = {lane: [] for lane in LANES}
                for lane, at in conn.execute(STARTS, window):
                    starts[lane].append(at)
                worker.stop()
        tidegate.close()
    total = sum(used.values()) or 1.0
    span = (marks[1] - marks[0]).total_seconds()
    found: dict[str, Any] = {"window_seconds": round(span, 2)}
    for lane, share in configured(spec).items():
        edges = [marks[0], *starts[lane], marks[1]]
        gap = max((b - a).total_seconds() for a, b in itertools.pairwise(edges))
        measured = used.get(lane, 0.0) / total
        found[lane] = {
            "configured": round(share, 4),
            "measured": round(measured, 4),
            "points": round(100 * (measured - share), 2),
            "slot_seconds": round(used.get(lane, 0.0), 2),
            "runs_started": len(starts[lane]),
            "longest_gap_ms": round(1000 * gap, 1),
        }
    return found


def claim_cost(url: str) -> dict[str, float]:
    """p50 ms of a claim of one run in each of three lanes: one statement with per-lane
    demands, and one statement per lane (three commits)."""
    found = {}
    with fresh_schema(url, "shares") as schema:
        migrate(url, schema)
        with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
            conn.execute(
                "INSERT INTO runs (project, lane, key, task, vtime)"
                " SELECT 'p', l, 'k', 'tidegate.sleep', i"
                " FROM generate_series(1, %(n)s) AS i, unnest(%(lanes)s::text[]) AS l",
                {"n": 4 * CLAIM_CALLS, "lanes": list(LANES)},
            )
            conn.execute("ANALYZE runs")
            base = {
                "worker_id": "bench",
                "workloop": 0,
                "lease_seconds": 60.0,
                "scan_limit": 500,
                "head_scan": 64,
                "tasks": ["tidegate.sleep"],
                "live_seconds": 30.0,
                "wildcard": False,
            }
            one = {**base, "lanes": list(LANES), "demands": [1, 1, 1], "demand": 3}
            per_lane = [{**base, "lanes": [lane], "demands": [1], "demand": 1} for lane in LANES]
            for name, claims in (("one_statement", [one]), ("statement_per_lane", per_lane)):
                times = []
                for _ in range(CLAIM_CALLS):
                    began = time.perf_counter()
                    for params in claims:
                        rows = conn.execute(query("claim_runs"), {**params, "others_demand": 0})
                        assert len(rows.fetchall()) == params["demand"]
                    times.append(1000 * (time.perf_counter() - began))
                found[name] = round(percentiles(times)["p50"], 3)
    return found


def run_benchmark(
    url: str, seconds: float, warmup: float, repeat: int, progress: Any = print
) -> dict[str, Any]:
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in WORKLOOPS}
    for rep in range(repeat):
        for name, spec in WORKLOOPS.items():
            found = measure(url, spec, seconds, warmup)
            samples[name].append(found)
            progress(f"{rep + 1}/{repeat} {name} {spec}: {found}")
    return {"samples": samples, "claim_ms": claim_cost(url)}


def table(result: dict[str, Any]) -> str:
    server, machine = result["server"], result["machine"]
    lines = [
        f"PostgreSQL {server['version']} ({server['connection']}), {result['date']}, "
        f"tidegate commit {result['code'].get('commit', '?')}, {machine['cores']} cores "
        f"({machine['cpu_model']}), load average {machine['loadavg_at_start'][0]} at start; "
        f"{result['repeat']} repetitions of {result['window_seconds']:.0f} s, median; "
        f"`{result['command']}`",
        "",
        "| workloop | lane | configured | measured | difference (points) | runs started |"
        " longest gap between starts (ms) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, found in result["samples"].items():

        def median(lane: str, field: str, found: list[dict[str, Any]] = found) -> float:
            return statistics.median(sample[lane][field] for sample in found)

        for lane in LANES:
            lines.append(
                f"| `{WORKLOOPS[name]}` | {lane} | {100 * median(lane, 'configured'):.1f}%"
                f" | {100 * median(lane, 'measured'):.1f}% | {median(lane, 'points'):+.2f}"
                f" | {median(lane, 'runs_started'):,.0f} | {median(lane, 'longest_gap_ms'):,.0f} |"
            )
    claim = result["claim_ms"]
    lines.append("")
    lines.append(
        f"Claim of one run in each of three lanes, p50 of {CLAIM_CALLS}: one statement with"
        f" per-lane demands {claim['one_statement']:.2f} ms, one statement per lane"
        f" {claim['statement_per_lane']:.2f} ms."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.shares", description=DESCRIPTION)
    parser.add_argument("--database-url", help="PostgreSQL to measure on (default: embedded)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window (20)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before it (2)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (3)")
    parser.add_argument("--snapshot", action="store_true", help="measure a copy of the code")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/benchmarks.md")
    args = parser.parse_args(argv)
    url, embedded = start_run("bench.shares", sys.argv[1:], args.database_url, args.snapshot)
    started = time.monotonic()
    command = "python -m bench.shares " + shlex.join(sys.argv[1:])
    result = new_record(
        redact(url),
        command,
        embedded,
        workloops=WORKLOOPS,
        repeat=args.repeat,
        window_seconds=args.seconds,
    )
    result.update(run_benchmark(url, args.seconds, args.warmup, args.repeat))
    close_record(result, started, print)
    write_results(result, RESULTS / "shares.json")
    text = table(result)
    print(text)
    if args.write_docs:
        write_between(DOCS, "shares", text)


if __name__ == "__main__":
    main()
