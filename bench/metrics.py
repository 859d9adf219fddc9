"""What a ``GET /metrics`` scrape costs the database, at 1,000,000 runs.

::

    python bench/metrics.py                   # embedded PostgreSQL (or TIDEGATE_DATABASE_URL)
    python bench/metrics.py --database-url postgresql://postgres@127.0.0.1:5432/test
    python bench/metrics.py --runs 200000     # a smaller table

Fills a schema of its own (``bench_metrics_<hex>``, dropped after) with ``--runs`` runs:
88% succeeded, 10% available over four lanes (a hot ``default`` and three smaller ones),
1.5% scheduled, 0.5% pending, a few running; 1,000 projects with fast-lane runs in
flight; 20 live workers, each with counters of finished attempts in 320 series (20
tasks, 2 lanes, 8 outcomes), and as many retired; webhook answers of the 1,000 projects
in 6 series each. Then it times the scrape's statements
(``read_figures``, as the API runs them, on one connection, prepared after the first
few) twice: right after the fill and an ANALYZE, when the visibility map is still empty
and an index-only count reads the heap, and after a VACUUM. Each figure is the median
and the slowest of ``--repeat`` scrapes, in milliseconds of wall time seen by the client
on the same machine: the database's time plus a local round trip per statement. Beside
them, for comparison: counting every available run, which a scrape never does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

if __package__ in (None, ""):  # run as ``python bench/metrics.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql

from tidegate import Settings, Tidegate
from tidegate.figures import read_figures
from tidegate.storage.sql import drive, query

LANES = {"default": 0.6, "manual": 0.2, "bulk": 0.15, "fast_lane": 0.05}
"""How the available runs spread over the lanes."""


def fill(conn: psycopg.Connection, runs: int) -> None:
    """Insert ``runs`` runs (see the module doc) and the workers and projects."""
    finished = int(runs * 0.88)
    available = int(runs * 0.10)
    scheduled = int(runs * 0.015)
    running = 100
    pending = runs - finished - available - scheduled - running
    insert = (
        "INSERT INTO runs (project, lane, key, task, state, vtime, scheduled_at, completed_at)"
        " SELECT 'p' || (i %% 1000), %(lane)s, 'k' || (i %% 500), 'bench.noop',"
        " %(state)s::run_state, i, now() - make_interval(secs => i / 100.0),"
        " CASE WHEN %(state)s IN ('succeeded') THEN now() END"
        " FROM generate_series(1, %(count)s::integer) AS i"
    )
    conn.execute(insert, {"lane": "default", "state": "succeeded", "count": finished})
    for lane, share in LANES.items():
        conn.execute(insert, {"lane": lane, "state": "available", "count": int(available * share)})
    conn.execute(insert, {"lane": "default", "state": "scheduled", "count": scheduled})
    conn.execute(insert, {"lane": "bulk", "state": "pending", "count": pending})
    conn.execute(insert, {"lane": "manual", "state": "running", "count": running})
    conn.execute(
        "INSERT INTO projects (id, fast_lane_cap)"
        " SELECT 'p' || i, 1 + i % 20 FROM generate_series(0, 999) AS i"
    )
    loops = json.dumps(
        [
            {"chain": ["fast_lane"], "slots": 2, "busy": 1},
            {"chain": ["manual", "*"], "slots": 8, "busy": 5},
        ]
    )
    conn.execute(
        "INSERT INTO workers (id, host, pid, workloops)"
        " SELECT 'w' || i, 'bench', i, %s::jsonb FROM generate_series(1, 20) AS i",
        [loops],
    )
    conn.execute(
        "INSERT INTO worker_counters"
        " SELECT w, 'bench.task' || t, l, o, 100, 12.5, array_fill(10::bigint, ARRAY[14])"
        " FROM (SELECT 'retired' UNION ALL SELECT 'w' || i FROM generate_series(1, 20) AS i)"
        " AS w(w), generate_series(1, 20) AS t, unnest(ARRAY['default', 'manual']) AS l,"
        " unnest(ARRAY['succeeded', 'failed', 'retry_requested', 'discarded', 'cancelled',"
        " 'late', 'rescued', 'claimed']) AS o"
    )
    conn.execute(
        "INSERT INTO ingress_counters"
        " SELECT p, m, o, s, 1000, 2.5, array_fill(50::bigint, ARRAY[15])"
        " FROM (SELECT 'p' || i FROM generate_series(0, 999) AS i) AS p(p),"
        " (VALUES ('async', 'admitted', 202), ('async', 'rate_limited', 429),"
        " ('async', 'replayed', 202), ('sync', 'admitted', 200), ('sync', 'over_cap', 429),"
        " ('sync', 'no_capacity', 503)) AS a(m, o, s)"
    )


@contextmanager
def filled_schema(
    database_url: str | None, prefix: str, runs: int
) -> Iterator[tuple[Settings, psycopg.Connection]]:
    """A schema of its own (``<prefix>_<hex>``) filled with ``runs`` runs (``fill``), and
    an autocommit connection to it; the schema is dropped after."""
    settings = Settings(database_url=database_url, schema=f"{prefix}_{uuid.uuid4().hex[:8]}")
    app = Tidegate(settings=settings)
    app.migrate()
    try:
        with app.database.connect() as conn:
            conn.autocommit = True
            print(f"{settings.schema}: filling {runs:,} runs ...", flush=True)
            fill(conn, runs)
            yield settings, conn
    finally:
        with app.database.connect() as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(settings.schema)))
        app.close()


def timed_scrape(conn: psycopg.Connection, settings: Settings) -> dict[str, float]:
    """Run one scrape's statements as the API does; return each one's time in ms."""
    steps = read_figures(settings)
    times: dict[str, float] = {}
    try:
        statement = next(steps)
        while True:
            start = time.perf_counter()
            cursor = conn.cursor(row_factory=statement.rows)
            rows = cursor.execute(query(statement.name), statement.params).fetchall()
            times[statement.name] = (time.perf_counter() - start) * 1000
            statement = steps.send(rows)
    except StopIteration:
        pass
    return {"scrape": sum(times.values()), **times}


def scrape_times(
    conn: psycopg.Connection, settings: Settings, repeat: int
) -> dict[str, list[float]]:
    """Time ``repeat`` scrapes after five that prepare the statements."""
    for _ in range(5):
        timed_scrape(conn, settings)
    runs = [timed_scrape(conn, settings) for _ in range(repeat)]
    return {name: [run[name] for run in runs] for name in runs[0]}


def full_count_times(conn: psycopg.Connection, repeat: int) -> list[float]:
    """Time counting every available run, what the scrape's caps avoid, in ms."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        conn.execute("SELECT count(*) FROM runs WHERE state = 'available'").fetchone()
        times.append((time.perf_counter() - start) * 1000)
    return times


def report(title: str, times: dict[str, list[float]]) -> None:
    print(title)
    for name, values in times.items():
        print(
            f"  {name:<26} median {statistics.median(values):7.2f} ms   max {max(values):7.2f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("TIDEGATE_DATABASE_URL"))
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=50)
    options = parser.parse_args()
    with filled_schema(options.database_url, "bench_metrics", options.runs) as (settings, conn):
        conn.execute("ANALYZE runs")
        start = time.perf_counter()
        figures = drive(conn, read_figures(settings))
        first = (time.perf_counter() - start) * 1000
        print(f"first scrape (plans made, hint bits set): {first:.2f} ms")
        for lane in figures.lanes:
            print(f"  {lane.lane:<10} {lane.depth}  lag {lane.lag_seconds:.0f} s")
        exact = dict(
            conn.execute(
                "SELECT lane || '/' || state, count(*) FROM runs"
                " WHERE state NOT IN ('succeeded') GROUP BY 1"
            ).fetchall()
        )
        print(f"  exact: {exact}")
        for title in ("after ANALYZE (visibility map empty)", "after VACUUM"):
            if title == "after VACUUM":
                conn.execute("VACUUM ANALYZE runs")
            times = scrape_times(conn, settings, options.repeat)
            times["count every available run"] = full_count_times(conn, 10)
            report(f"{title}:", times)


if __name__ == "__main__":
    main()
