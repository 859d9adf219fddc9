"""A million rows: enqueue, claim and admission as the runs table grows.

::

    python -m bench.rows --database-url postgresql://postgres@127.0.0.1:5432/test --write-docs
    python -m bench.rows                  # embedded PostgreSQL 18 (or TIDEGATE_DATABASE_URL)
    python -m bench.rows --rows 300000    # a shorter curve
    python -m bench.rows --smoke          # a few thousand rows, once: checks, not figures

The same measurements on the runs table in seven states, each on a fresh schema of its
own (``bench_rows_<hex>``, dropped after):

  empty        nothing but what the measurements themselves make;
  finished N   N finished runs: 95% succeeded, 5% discarded after 20 attempts; over
               1,000 projects and 10,000 keys, 70% in ``default``, 10% in ``fast_lane``,
               the rest in two other lanes; completed_at spread evenly over the last
               6.9 days (inside the default 7-day retention, so the pruner finds none);
               every other one with its webhook request kept (``requests``);
  ready N      N available runs over 1,000 projects and 10,000 keys in ten lanes
               (``lane_0`` .. ``lane_9``) that no running worker serves, each key's runs
               stamped on its lane's fair clock as enqueue stamps them (consecutive
               steps of 1 from 0), enqueued over the last N ms.

N is a tenth, three tenths and all of ``--rows`` (1,000,000). Each state is filled with
``INSERT ... SELECT`` over ``generate_series``, then ``VACUUM ANALYZE``d, as autovacuum
would in time.

Why the ready backlog sits in lanes the measuring worker does not serve: a worker takes
what its lanes hold, so a backlog it could reach would be drained by the measurement
itself, and one in its own lane of a task it lacks would be set pending by its parker. A
backlog that stays ready is one no running worker serves (a lane whose workers are
down, or busy elsewhere), and it is the hard case for the indexes: every index of ready
runs (``runs_claim_lane``, ``runs_key_ready``) holds the N runs beside the few the
measurement makes, every enqueue and claim writes into those trees, and the planner's
statistics say that most of the table is ready, almost none of it in the lanes measured.
So the worker's workloops are ``fast_lane:16`` and ``manual>default:32``, without ``*``:
a wildcard would take the backlog. No backlog is put in ``fast_lane``: the admission
counts that lane's ready runs as taken slots.

In each state, ``--repeat`` times (3), in this order:

1. **Admission**: a worker process started (``tidegate worker --app bench.scale:app
   --workloops "fast_lane:16 manual>default:32"``, as ``bench.scale`` starts it), then
   the ``admit_webhook`` statement the API runs, with the parameters the API passes
   (``bench.webhooks``'s), called 1,000 times back to back on one connection, each a
   transaction of its own, commit included: to a sync trigger (the fast lane: its cap,
   capacity and breaker checks; project cap 100, 16 fast-lane slots, so that calls back
   to back are nearly all admitted) and to an async one (``default``). The worker
   executes the admitted runs meanwhile. Calls per second, and p50/p99 of a call; the
   decisions are kept.
2. **Batch enqueue**: the worker stopped, 20,000 no-op runs over 100 keys of project
   ``bench`` in lane ``default`` with ``Tidegate.enqueue_many``, batches of 1,000, one
   connection (opened before the clock starts): runs per second.
3. **Single enqueue**: 2,000 more with ``Tidegate.enqueue``, one run per transaction:
   runs per second, and p99 of a call.
4. **Drain**: a worker process started as in 1 takes the 22,000 runs; runs per second
   from the first claim to the last completion, by the database's clock (``attempted_at``,
   ``completed_at``), as ``bench.scale`` measures it.

Then the repetition's runs and requests (project ``bench``) are deleted and the tables
``VACUUM ANALYZE``d, so that each repetition finds the state as it was filled. Every
figure is the median of the repetitions, with min and max, and a ratio to the empty
table's; the aim, reported and not yet met, is every figure within 10% of the empty
table's. Also reported for each state: the sizes of ``runs`` (heap and indexes) and of
``requests``, and, from the first repetition, the index entries each measured part read
per run or call (``pg_stat_user_indexes.idx_tup_read``, and the sequential scans of
``runs``): a plan that changes with the table's size shows there first.

Nothing counts unless the database agrees: every admitted webhook left its run and one
request, every run of the repetition succeeded at its first attempt, and the state's own
runs are untouched at the end (the same counts by state, no backlog run attempted).
Results go to ``bench/results/rows-postgres<major>[-embedded].json``; ``--write-docs``
renders them into docs/benchmarks.md between its ``bench:rows`` markers.
"""

from __future__ import annotations

import argparse
import collections
import logging
import shlex
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg import sql

from bench.harness import (
    BenchError,
    WorkerProcess,
    child_env,
    close_record,
    new_record,
    percentiles,
    progress,
    publish,
    python_module,
    redact,
    schema_conninfo,
    spread,
    start_run,
)
from bench.webhooks.common import WORKER_READY
from bench.webhooks.sync import _admit_params, request_headers
from tidegate import NewRun, Settings, Tidegate
from tidegate.projects import create_project, create_trigger
from tidegate.storage.sql import query

DESCRIPTION = "Enqueue, claim and admission rates as the runs table grows."
WORKLOOPS = "fast_lane:16 manual>default:32"
PROJECT = "bench"
KEYS = 100
FAST_LANE_CAP = 100
WARMUP_CALLS = 20
DRAIN_SECONDS = 300.0
STATS_FLUSH_SECONDS = 0.5
"""How long to let the backends of a measured part report their table statistics: each
part's connections are closed when it ends, and an exiting backend reports at once."""
RETENTION_WINDOW_SECONDS = 6.9 * 24 * 3600


@dataclass(frozen=True)
class Sizes:
    """How much each part measures in one repetition."""

    batch_runs: int = 20_000
    batch_size: int = 1_000
    single_runs: int = 2_000
    admission_calls: int = 1_000


FULL = Sizes()
SMOKE = Sizes(batch_runs=2_000, single_runs=100, admission_calls=50)
SMOKE_ROWS = 3_000


def curve(rows: int, smoke: bool) -> list[tuple[str, str, int]]:
    """The table states measured: (label, kind, rows), the empty table first."""
    counts = [rows] if smoke else [rows // 10, rows * 3 // 10, rows]
    return [
        ("empty", "empty", 0),
        *((f"finished {n:,}", "finished", n) for n in counts),
        *((f"ready {n:,}", "ready", n) for n in counts),
    ]


# -- filling -------------------------------------------------------------------------------

FINISHED = """
INSERT INTO runs (project, lane, key, task, args, state, attempt, max_attempts,
                  scheduled_at, inserted_at, attempted_at, completed_at, worker_id,
                  workloop, result, errors, vtime)
SELECT 'p' || (i %% 1000),
       CASE WHEN i %% 10 < 7 THEN 'default' WHEN i %% 10 = 7 THEN 'fast_lane'
            ELSE 'lane_' || (i %% 10) END,
       'k' || (i %% 10000), 'noop', jsonb_build_object('i', i),
       CASE WHEN i %% 20 = 0 THEN 'discarded' ELSE 'succeeded' END::run_state,
       CASE WHEN i %% 20 = 0 THEN 20 ELSE 1 END, 20,
       done - interval '40 ms', done - interval '40 ms', done - interval '10 ms', done,
       'retired-worker', 1,
       CASE WHEN i %% 20 = 0 THEN NULL ELSE '{"ok": true}'::jsonb END,
       CASE WHEN i %% 20 = 0 THEN '[{"attempt": 20, "error": "TimeoutError"}]'::jsonb
            ELSE '[]'::jsonb END,
       1 + i / 10000
FROM generate_series(1, %(rows)s::integer) AS i,
     LATERAL (SELECT now() - make_interval(
         secs => %(window)s::float8 * (%(rows)s::integer - i) / %(rows)s::integer)) AS t(done)
"""

FINISHED_REQUESTS = """
INSERT INTO requests (project, trigger_id, run_id, content_type, headers, body, received_at)
SELECT project, 1 + id % 100, id, 'application/json',
       '{"content-type": "application/json", "user-agent": "sender/1.0"}'::jsonb,
       convert_to('{"event": "order.paid", "id": ' || id || '}', 'UTF8'), inserted_at
FROM runs WHERE id % 2 = 0
"""

READY = """
INSERT INTO runs (project, lane, key, task, args, state, scheduled_at, inserted_at, vtime)
SELECT 'p' || (i %% 1000), 'lane_' || (i %% 10), 'k' || (i %% 10000), 'noop',
       jsonb_build_object('i', i), 'available',
       queued, queued, 1 + i / 10000
FROM generate_series(0, %(rows)s::integer - 1) AS i,
     LATERAL (SELECT now() - make_interval(
         secs => (%(rows)s::integer - i) / 1000.0)) AS t(queued)
"""
# The lane is i % 10 and the key i % 10000, so each key is in one lane; its j-th run
# (j = i / 10000) is one step after its (j-1)-th on the lane's clock, as insert_runs.sql
# stamps a key's runs (key_clock + n / weight, weight 1, from a clock at 0).


def fill(conn: psycopg.Connection, kind: str, rows: int) -> None:
    """Put the state's runs in the (empty, migrated) schema and VACUUM ANALYZE it."""
    if kind == "finished":
        conn.execute(FINISHED, {"rows": rows, "window": RETENTION_WINDOW_SECONDS})
        conn.execute(FINISHED_REQUESTS)
    elif kind == "ready":
        conn.execute(READY, {"rows": rows})
    conn.execute("VACUUM ANALYZE runs")
    conn.execute("VACUUM ANALYZE requests")


def states_of(conn: psycopg.Connection) -> dict[str, int]:
    """The runs not the measurements', by state (those the measurements never touch)."""
    return {
        state: count
        for state, count in conn.execute(
            "SELECT state::text, count(*) FROM runs WHERE project <> %s GROUP BY 1", [PROJECT]
        )
    }


def sizes_of(conn: psycopg.Connection) -> dict[str, Any]:
    """Bytes of the runs heap, its indexes (each, and in all), and of requests."""
    row = conn.execute(
        "SELECT pg_relation_size('runs'), pg_indexes_size('runs'),"
        " pg_total_relation_size('requests')"
    ).fetchone()
    assert row is not None
    indexes = dict(
        conn.execute(
            "SELECT indexrelname::text, pg_relation_size(indexrelid) FROM pg_stat_user_indexes"
            " WHERE schemaname = current_schema() AND relname = 'runs' ORDER BY 1"
        ).fetchall()
    )
    return {"runs_heap": row[0], "runs_indexes": row[1], "requests": row[2], "index": indexes}


class IndexReads:
    """Index entries read (``idx_tup_read``) per index of runs and requests between two
    moments, and the rows the sequential scans of ``runs`` read."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.before = self._read()

    def _read(self) -> dict[str, int]:
        time.sleep(STATS_FLUSH_SECONDS)
        # This connection's own reads (the fill, the checks) are reported as it goes idle
        # after this statement, not a second later: they count before, not in a part.
        self.conn.execute("SELECT pg_stat_force_next_flush()")
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        found = dict(
            self.conn.execute(
                "SELECT indexrelname::text, idx_tup_read FROM pg_stat_user_indexes"
                " WHERE schemaname = current_schema()"
            ).fetchall()
        )
        row = self.conn.execute(
            "SELECT seq_tup_read FROM pg_stat_user_tables"
            " WHERE schemaname = current_schema() AND relname = 'runs'"
        ).fetchone()
        found["seq scans of runs"] = row[0] if row else 0
        return found

    def take(self) -> dict[str, int]:
        """What was read since the last take (or creation), by index, where any was."""
        after = self._read()
        read = {name: after[name] - self.before.get(name, 0) for name in after}
        self.before = after
        return {name: count for name, count in sorted(read.items()) if count}


# -- one repetition ------------------------------------------------------------------------


def start_worker(url: str, schema: str) -> WorkerProcess:
    env = child_env(TIDEGATE_DATABASE_URL=url, TIDEGATE_SCHEMA=schema)
    argv = python_module("tidegate", "worker", "--app", "bench.scale:app", "--workloops", WORKLOOPS)
    worker = WorkerProcess(argv, env, WORKER_READY)
    try:
        worker.wait_ready()
    except BaseException:
        worker.kill()
        raise
    return worker


def admission(
    url: str, schema: str, triggers: dict[str, dict[str, Any]], calls: int
) -> dict[str, Any]:
    """Call ``admit_webhook`` ``calls`` times per lane, back to back; return the figures."""
    admit = query("admit_webhook")
    headers = request_headers("127.0.0.1:8000")
    found: dict[str, Any] = {}
    with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
        for lane, trigger in triggers.items():
            warmup = collections.Counter[str]()
            for k in range(WARMUP_CALLS):  # prepared statements, caches
                row = conn.execute(admit, _admit_params(schema, trigger, lane, -1 - k, headers))
                warmup[row.fetchone()[0]] += 1  # type: ignore[index]
            times, decisions = [], collections.Counter[str]()
            started = time.perf_counter()
            for k in range(calls):
                params = _admit_params(schema, trigger, lane, k, headers)
                before = time.perf_counter()
                decision = conn.execute(admit, params).fetchone()
                times.append((time.perf_counter() - before) * 1000)
                decisions[decision[0] if decision else "none"] += 1
            seconds = time.perf_counter() - started
            found[lane] = {
                "calls": calls,
                "rate": calls / seconds,
                "ms": percentiles(times),
                "decisions": dict(decisions),
                "warmup_decisions": dict(warmup),
            }
    return found


def batch_enqueue(settings: Settings, sizes: Sizes) -> tuple[dict[str, Any], list[int]]:
    with Tidegate(settings=settings) as app:
        app.database.pool().wait()
        batches = [
            [
                NewRun("noop", {"i": i}, project=PROJECT, key=f"k{i % KEYS:03d}")
                for i in range(start, start + sizes.batch_size)
            ]
            for start in range(0, sizes.batch_runs, sizes.batch_size)
        ]
        ids: list[int] = []
        started = time.perf_counter()
        for batch in batches:
            ids += [run.id for run in app.enqueue_many(batch)]
        seconds = time.perf_counter() - started
    return {"runs": sizes.batch_runs, "rate": sizes.batch_runs / seconds}, ids


def single_enqueue(settings: Settings, sizes: Sizes) -> tuple[dict[str, Any], list[int]]:
    with Tidegate(settings=settings) as app:
        app.database.pool().wait()
        ids, times = [], []
        started = time.perf_counter()
        for i in range(sizes.single_runs):
            before = time.perf_counter()
            ids.append(app.enqueue("noop", {"i": i}, project=PROJECT, key=f"k{i % KEYS:03d}").id)
            times.append((time.perf_counter() - before) * 1000)
        seconds = time.perf_counter() - started
    figures = {"runs": sizes.single_runs, "rate": sizes.single_runs / seconds}
    return {**figures, "ms": percentiles(times)}, ids


UNFINISHED = """
SELECT EXISTS (SELECT 1 FROM runs WHERE lane = 'default' AND state = 'available')
    OR EXISTS (SELECT 1 FROM runs WHERE lane = 'fast_lane' AND state = 'available')
    OR EXISTS (SELECT 1 FROM runs WHERE state = 'running')
"""
"""Whether the worker has anything left to do: one index entry read per probe, so that
waiting reads next to nothing beside what is measured (the states' ready runs are in
other lanes; ``check`` then makes sure every run succeeded)."""


def drain(conn: psycopg.Connection, url: str, schema: str, ids: list[int]) -> dict[str, Any]:
    """Start a worker; wait until it has nothing left to do; return the drain rate of
    ``ids`` (first claim to last completion, by the database's clock)."""
    worker = start_worker(url, schema)
    try:
        deadline = time.monotonic() + DRAIN_SECONDS
        while conn.execute(UNFINISHED).fetchone() != (False,):
            worker.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"runs not done in {DRAIN_SECONDS}s")
            time.sleep(0.05)
        worker.stop()
    finally:
        worker.kill()
    row = conn.execute(
        "SELECT count(*), extract(epoch FROM max(completed_at) - min(attempted_at))"
        " FROM runs WHERE id = ANY(%s)",
        [ids],
    ).fetchone()
    assert row is not None
    return {"runs": int(row[0]), "rate": int(row[0]) / float(row[1])}


def repetition(
    conn: psycopg.Connection,
    url: str,
    schema: str,
    triggers: dict[str, dict[str, Any]],
    sizes: Sizes,
    watch: bool,
) -> dict[str, Any]:
    """Measure admission, batch and single enqueue and the drain once; check them; put
    the table back as it was filled. With ``watch``, count each part's index reads."""
    settings = Settings(database_url=url, schema=schema)
    reads = IndexReads(conn) if watch else None
    found: dict[str, Any] = {}
    worker = start_worker(url, schema)
    try:
        found["admission"] = admission(url, schema, triggers, sizes.admission_calls)
        worker.check_alive()
        worker.stop()
    finally:
        worker.kill()
    parts: list[tuple[str, Callable[[], tuple[dict[str, Any], list[int]]]]] = [
        ("batch", lambda: batch_enqueue(settings, sizes)),
        ("single", lambda: single_enqueue(settings, sizes)),
    ]
    if reads is not None:
        found["index_reads"] = {"admission": reads.take()}
    ids: list[int] = []
    for name, measure in parts:
        found[name], made = measure()
        ids += made
        if reads is not None:
            found["index_reads"][name] = reads.take()
    found["drain"] = drain(conn, url, schema, ids)
    if reads is not None:
        found["index_reads"]["drain"] = reads.take()
    found["verified"] = check(conn, found, len(ids))
    conn.execute("DELETE FROM runs WHERE project = %s", [PROJECT])
    conn.execute("DELETE FROM requests WHERE project = %s", [PROJECT])
    conn.execute("VACUUM ANALYZE runs")
    conn.execute("VACUUM ANALYZE requests")
    return found


def check(conn: psycopg.Connection, found: dict[str, Any], enqueued: int) -> bool:
    """Every admitted webhook left its run and one request, and every run of the
    project (admitted and enqueued) succeeded at its first attempt."""
    admitted = sum(
        lane[calls].get("admitted", 0)
        for lane in found["admission"].values()
        for calls in ("decisions", "warmup_decisions")
    )
    row = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE state = 'succeeded' AND attempt = 1),"
        " (SELECT count(*) FROM requests WHERE project = %(p)s),"
        " (SELECT count(DISTINCT run_id) FROM requests WHERE project = %(p)s)"
        " FROM runs WHERE project = %(p)s",
        {"p": PROJECT},
    ).fetchone()
    assert row is not None
    runs, once, requests, requested = row
    return (
        runs == once == admitted + enqueued
        and requests == requested == admitted
        and found["drain"]["runs"] == enqueued
    )


@contextmanager
def state_schema(url: str, kind: str, rows: int) -> Iterator[tuple[str, psycopg.Connection]]:
    """A fresh schema filled to the state, with the project and its two triggers."""
    schema = f"bench_rows_{uuid.uuid4().hex[:10]}"
    try:
        with Tidegate(settings=Settings(database_url=url, schema=schema)) as app:
            app.migrate()
        with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
            fill(conn, kind, rows)
            yield schema, conn
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def measure_state(
    url: str, label: str, kind: str, rows: int, repeat: int, sizes: Sizes, progress: Any
) -> dict[str, Any]:
    """Fill one state and measure it ``repeat`` times."""
    started = time.monotonic()
    with state_schema(url, kind, rows) as (schema, conn):
        filled = time.monotonic() - started
        before, size = states_of(conn), sizes_of(conn)
        with Tidegate(settings=Settings(database_url=url, schema=schema)) as app:
            app.execute(create_project(PROJECT, fast_lane_cap=FAST_LANE_CAP))
            triggers = {
                "fast_lane": app.execute(create_trigger(PROJECT, "sync", mode="sync", task="noop")),
                "default": app.execute(create_trigger(PROJECT, "async", mode="async", task="noop")),
            }
        progress(f"{label}: filled in {filled:.0f} s, {size['runs_heap'] / 2**20:,.1f} MB heap")
        samples = []
        for k in range(repeat):
            found = repetition(conn, url, schema, triggers, sizes, watch=k == 0)
            samples.append(found)
            a = found["admission"]
            progress(
                f"{label} #{k + 1}: batch {found['batch']['rate']:,.0f}/s, single "
                f"{found['single']['rate']:,.0f}/s, drain {found['drain']['rate']:,.0f}/s, "
                f"admission {a['fast_lane']['rate']:,.0f} / {a['default']['rate']:,.0f} calls/s"
            )
        untouched = states_of(conn) == before and (
            kind != "ready"
            or conn.execute(
                "SELECT count(*) FROM runs WHERE attempt > 0 AND project <> %s", [PROJECT]
            ).fetchone()
            == (0,)
        )
    return {
        "label": label,
        "kind": kind,
        "rows": rows,
        "fill_seconds": round(filled, 1),
        "states": before,
        "sizes": size,
        "samples": samples,
        "untouched": untouched,
        "verified": untouched and all(s["verified"] for s in samples),
    }


def run_benchmark(
    url: str, rows: int, repeat: int, sizes: Sizes, smoke: bool, progress: Any
) -> list[dict[str, Any]]:
    return [
        measure_state(url, label, kind, n, repeat, sizes, progress)
        for label, kind, n in curve(rows, smoke)
    ]


# -- the report ----------------------------------------------------------------------------

FIGURES = {
    "batch": ("batch", "rate"),
    "single": ("single", "rate"),
    "single_p99": ("single", "ms", "p99"),
    "drain": ("drain", "rate"),
    "admit_fast": ("admission", "fast_lane", "rate"),
    "admit_fast_p99": ("admission", "fast_lane", "ms", "p99"),
    "admit_default": ("admission", "default", "rate"),
    "admit_default_p99": ("admission", "default", "ms", "p99"),
}
"""Each figure reported, and where it is in a repetition's results."""


def _get(found: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = found
    for part in path:
        value = value[part]
    return float(value)


def summarize(states: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for state in states:
        figures = {
            name: spread([_get(s, path) for s in state["samples"]])
            for name, path in FIGURES.items()
        }
        reads: dict[str, dict[str, float]] = {}
        first = state["samples"][0]
        per = {
            "admission": 2 * (first["admission"]["default"]["calls"] + WARMUP_CALLS),
            "batch": first["batch"]["runs"],
            "single": first["single"]["runs"],
            "drain": first["drain"]["runs"],
        }
        for part, counts in first.get("index_reads", {}).items():
            reads[part] = {name: round(n / per[part], 2) for name, n in counts.items()}
        summary[state["label"]] = {"figures": figures, "index_reads_per_unit": reads}
    empty = summary["empty"]["figures"]
    for entry in summary.values():
        entry["ratios"] = {
            name: entry["figures"][name]["median"] / empty[name]["median"] for name in FIGURES
        }
    return summary


def _misses(summary: dict[str, Any]) -> list[str]:
    """The figures not within 10% of the empty table's (rates below 0.9, p99s above 1.1)."""
    missed = []
    for label, entry in summary.items():
        for name, ratio in entry["ratios"].items():
            if (name.endswith("_p99") and ratio > 1.1) or (
                not name.endswith("_p99") and ratio < 0.9
            ):
                missed.append(f"{label}: {name.replace('_', ' ')} {ratio:.2f}")
    return missed


def _cell(figure: dict[str, Any], digits: int = 0) -> str:
    median, low, high = (f"{figure[k]:,.{digits}f}" for k in ("median", "min", "max"))
    return f"{median} ({low} - {high})"


PARTS = ("admission", "batch", "single", "drain")


def _reads(reads: dict[str, float]) -> str:
    """Index entries read in all, and the indexes that read most of them."""
    indexes = {name: n for name, n in reads.items() if name != "seq scans of runs"}
    shown = ", ".join(
        f"{name} {n:,.1f}" for name, n in sorted(indexes.items(), key=lambda kv: -kv[1])[:2]
    )
    seq = reads.get("seq scans of runs", 0)
    return f"{sum(indexes.values()):,.1f} ({shown})" + (
        f"; rows read by sequential scans {seq:,.1f}" if seq >= 1 else ""
    )


def render(result: dict[str, Any]) -> str:
    s = result["summary"]
    server, machine = result["server"], result["machine"]
    sizes = result["sizes"]
    lines = [
        f"PostgreSQL {server['version']} ({server['connection']}), {result['date']}, "
        f"tidegate commit {result['code'].get('commit', '?')}, {machine['cores']} cores, "
        f"load average {machine['loadavg_at_start'][0]} at start, "
        f"{machine['loadavg_at_end'][0]} at end; {result['repeat']} repetitions, median "
        f"(min - max); the run took {result['seconds'] / 60:.0f} min; "
        f"`{result['command']}`",
        "",
        "| table state | batch enqueue, runs/s | / empty | single enqueue, runs/s | / empty "
        "| drain, runs/s | / empty | admission, fast lane, calls/s | / empty "
        "| admission, default lane, calls/s | / empty |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, entry in s.items():
        f, r = entry["figures"], entry["ratios"]
        cells = [
            f"{_cell(f[name])} | {r[name]:.2f}"
            for name in ("batch", "single", "drain", "admit_fast", "admit_default")
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| table state | single enqueue p99, ms | admission p99, fast lane, ms "
        "| admission p99, default lane, ms | runs heap, MB | runs indexes, MB | requests, MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for state in result["states"]:
        f, r = s[state["label"]]["figures"], s[state["label"]]["ratios"]
        size = state["sizes"]
        cells = [
            f"{_cell(f[name], 2)} ({r[name]:.2f})"
            for name in ("single_p99", "admit_fast_p99", "admit_default_p99")
        ]
        lines.append(
            f"| {state['label']} | "
            + " | ".join(cells)
            + f" | {size['runs_heap'] / 2**20:,.1f} | {size['runs_indexes'] / 2**20:,.1f}"
            f" | {size['requests'] / 2**20:,.1f} |"
        )
    lines += [
        "",
        "| table state | index entries read: admission, per call | batch enqueue, per run "
        "| single enqueue, per run | drain, per run |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, entry in s.items():
        reads = entry["index_reads_per_unit"]
        lines.append(f"| {label} | " + " | ".join(_reads(reads[part]) for part in PARTS) + " |")
    missed = _misses(s)
    lines += [
        "",
        f"Per repetition: admission {sizes['admission_calls']:,} calls per lane, batch "
        f"enqueue {sizes['batch_runs']:,} runs in batches of {sizes['batch_size']:,}, single "
        f"enqueue {sizes['single_runs']:,} runs, drain of the "
        f"{sizes['batch_runs'] + sizes['single_runs']:,} runs enqueued. p99 columns: the "
        "ratio to the empty table in brackets. Index entries read: in the first repetition, "
        "over every index of the schema, by the part's own statements and the worker's "
        "(pg_stat_user_indexes), with the two indexes that read most. Every run and webhook "
        "verified: "
        f"{'yes' if result['verified'] else '**no**'}. Aim, every figure within 10% of the "
        "empty table's: " + ("met." if not missed else "not met by " + "; ".join(missed) + "."),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.rows", description=DESCRIPTION)
    parser.add_argument("--database-url", help="PostgreSQL to measure on (default: embedded)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="the largest state (1,000,000)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per state (3)")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/benchmarks.md")
    parser.add_argument("--snapshot", action="store_true", help="measure a copy of the code")
    parser.add_argument("--smoke", action="store_true", help="a few thousand rows, once: checks")
    args = parser.parse_args(argv)
    rows, repeat, sizes = args.rows, args.repeat, FULL
    if args.smoke:
        rows, repeat, sizes = SMOKE_ROWS, 1, SMOKE
    url, embedded = start_run("bench.rows", argv, args.database_url, args.snapshot)
    command = shlex.join(["python", "-m", "bench.rows", *(redact(a) for a in argv)])
    started = time.monotonic()
    result = new_record(url, command, embedded, repeat=repeat, rows=rows, sizes=asdict(sizes))
    # The enqueues are measured while no worker runs, on purpose: the library's warning
    # that no live worker has their task would be printed at each.
    logging.getLogger("tidegate").setLevel(logging.ERROR)
    result["states"] = run_benchmark(url, rows, repeat, sizes, args.smoke, progress)
    result["summary"] = summarize(result["states"])
    result["verified"] = all(state["verified"] for state in result["states"])
    close_record(result, started, progress)
    label = f"rows-postgres{result['server']['major']}{'-embedded' if embedded else ''}"
    publish(result, render(result), label, smoke=args.smoke, write_docs=args.write_docs)
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
