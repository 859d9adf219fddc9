"""What a page of the dashboard's run list costs, at 1,000,000 runs, for each filter alone.

::

    python bench/run_list.py --database-url postgresql://postgres@127.0.0.1:5432/test
    python bench/run_list.py --runs 200000

Fills a schema of its own (dropped after) as ``bench/metrics.py`` does (1,000 projects,
500 keys, one task, four lanes, 88% succeeded), plus 20 runs of a rare project, task,
key and lane, so that a filter matching almost nothing is measured too. Then, after a
VACUUM ANALYZE, runs ``list_runs_page.sql`` (one page of 50, newest first, as /ui/runs
does) on one connection, as the API's pool would: the median and slowest of
``--repeat`` runs after five that let psycopg prepare it, and the plan's top nodes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):  # run as ``python bench/run_list.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql

from bench.metrics import fill
from tidegate import Settings, Tidegate
from tidegate.storage.sql import query

FILTERS: list[dict[str, str]] = [
    {},
    {"state": "succeeded"},
    {"state": "available"},
    {"state": "scheduled"},
    {"state": "pending"},
    {"state": "running"},
    {"state": "discarded"},
    {"lane": "default"},
    {"lane": "rare_lane"},
    {"project": "p7"},
    {"project": "rare"},
    {"task": "bench.noop"},
    {"task": "bench.rare"},
    {"key": "k7"},
    {"key": "rare-key"},
]


def params(filters: dict[str, str]) -> dict[str, object]:
    empty = dict.fromkeys(("project", "lane", "state", "task", "key", "before"))
    return {**empty, **filters, "limit": 50}


def plan(conn: psycopg.Connection, filters: dict[str, str]) -> str:
    """The plan's nodes, outermost first (``Limit > Index Scan Backward using ...``)."""
    lines = [
        row[0]
        for row in conn.execute("EXPLAIN (COSTS OFF) " + query("list_runs_page"), params(filters))
    ]
    nodes = [lines[0]] + [line.split("->", 1)[1] for line in lines if "->" in line]
    return " > ".join(node.strip() for node in nodes)


def timed(conn: psycopg.Connection, filters: dict[str, str], repeat: int) -> list[float]:
    text = query("list_runs_page")
    for _ in range(5):
        conn.execute(text, params(filters)).fetchall()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        conn.execute(text, params(filters)).fetchall()
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("TIDEGATE_DATABASE_URL"))
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    options = parser.parse_args()
    schema = f"bench_run_list_{uuid.uuid4().hex[:8]}"
    app = Tidegate(settings=Settings(database_url=options.database_url, schema=schema))
    app.migrate()
    try:
        with app.database.connect() as conn:
            conn.autocommit = True
            print(f"{schema}: filling {options.runs:,} runs ...", flush=True)
            fill(conn, options.runs)
            conn.execute(
                "INSERT INTO runs (project, lane, key, task, state, completed_at)"
                " SELECT 'rare', 'rare_lane', 'rare-key', 'bench.rare', 'succeeded', now()"
                " FROM generate_series(1, 20)"
            )
            conn.execute("VACUUM ANALYZE runs")
            for filters in FILTERS:
                times = timed(conn, filters, options.repeat)
                shown = " ".join(f"{k}={v}" for k, v in filters.items()) or "(none)"
                print(
                    f"{shown:<20} median {statistics.median(times):8.2f} ms"
                    f"   max {max(times):8.2f} ms   {plan(conn, filters)}",
                    flush=True,
                )
    finally:
        with app.database.connect() as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        app.close()


if __name__ == "__main__":
    main()
