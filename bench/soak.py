"""The soak: a worker and a steady enqueuer for a long while, retention pruning on.

::

    python -m bench.soak --database-url postgresql://postgres@127.0.0.1:5432/test --write-docs
    python -m bench.soak --minutes 30     # embedded PostgreSQL 18 (or TIDEGATE_DATABASE_URL)
    python -m bench.soak --rate 5000      # enqueue at this rate, without measuring the drain
    python -m bench.soak --smoke          # a few seconds, a few hundred runs: checks

First the drain rate, in the same run: ``bench.scale``'s drain of 20,000 no-op runs by
one worker process, on a schema of its own (``--rate`` gives the enqueue rate instead).
Then, on a fresh schema, for ``--minutes`` (30):

- one worker process, ``tidegate worker --app bench.scale:app --workloops manual>*:32``
  as ``bench.scale`` starts it, with the retention short: ``retention_seconds`` =
  ``--retention`` (300) and ``prune_seconds`` = the default 60, or a fifth of the
  retention when that is shorter (``TIDEGATE_RETENTION_SECONDS``,
  ``TIDEGATE_PRUNE_SECONDS``), everything else as shipped;
- an enqueuer in this process at 60% of the drain rate: every 50 ms one
  ``Tidegate.enqueue_many`` of the runs due, over 100 keys, paced on a fixed schedule (a
  late batch does not shift the ones after it).

Every ``--sample-seconds`` (30) a sample, from a connection of its own: the heap and
index sizes of every table of the schema (``runs`` is the one that grows), the live and
dead rows of ``runs`` and its vacuums and analyzes (``pg_stat_user_tables``: n_dead_tup,
last_autovacuum, autovacuum_count), the runs by state, and the wake-up latency of the
runs that finished since the previous sample: ``attempted_at - scheduled_at`` (both
stamped by the database: a run's enqueue transaction and its claim), p50 and p99. A
run waits behind the others of its batch as well, so this is a queue's latency, not a
single run's wake-up. Also the slowest enqueue_many calls of the window (p99).

At the end the enqueuer stops, the worker works off what is left and stops (SIGTERM),
and the run is checked: the worker's counters of finished attempts (``worker_counters``,
what ``/metrics`` reports) hold every enqueued run as succeeded and no failed, retried,
discarded or late attempt, and every run still in the table succeeded at its first attempt.

Verdicts, each reported with its figure whether or not it holds:

- **sizes flat**: the largest size of ``runs`` (heap and indexes) in the last half of the
  run is within 20% of its size at the end of the first retention period (the first
  sample at or after ``--retention``);
- **p99 not creeping**: after warm-up (the first retention period, while the table
  grows), the median p99 wake-up of the samples of the last third is within 25% of the
  first third's;
- **autovacuum keeping up**: in the last half, autovacuum ran on ``runs``, and its dead
  rows stayed under twice autovacuum's own trigger (50 + 0.2 x live rows).

The server's vacuum settings (``autovacuum``, its naptime, scale factor, cost limit and
delay, workers) are kept with the results: the last verdict means nothing on a server
whose autovacuum is off. Results go to
``bench/results/soak-postgres<major>[-embedded].json``; ``--write-docs`` renders them
into docs/benchmarks.md between its ``bench:soak`` markers.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from bench.harness import (
    BenchError,
    WorkerProcess,
    child_env,
    close_record,
    new_record,
    paced,
    percentiles,
    progress,
    publish,
    python_module,
    redact,
    schema_conninfo,
    start_run,
)
from bench.scale import drain
from bench.webhooks.common import WORKER_READY
from tidegate import NewRun, Settings, Tidegate
from tidegate.settings import DEFAULT_PRUNE_SECONDS

DESCRIPTION = "A worker and a steady enqueuer for a long while, with retention pruning on."
WORKLOOPS = "manual>*:32"
KEYS = 100
SHARE = 0.6
"""The enqueue rate, as a share of the drain rate."""
BATCH_SECONDS = 0.05
DRAIN_RUNS = 20_000
FINISH_SECONDS = 300.0
SIZE_SLACK = 1.20
P99_SLACK = 1.25
DEAD_SLACK = 2.0
SMOKE = {"minutes": 0.2, "retention": 4.0, "sample_seconds": 2.0, "rate": 300.0}

AUTOVACUUM = (
    "autovacuum",
    "autovacuum_naptime",
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_cost_limit",
    "autovacuum_vacuum_cost_delay",
    "autovacuum_max_workers",
)
"""The server's settings that decide whether and how fast dead rows are vacuumed."""

SAMPLE = """
SELECT relname::text, pg_relation_size(relid), pg_indexes_size(relid), n_live_tup,
       n_dead_tup, last_autovacuum, autovacuum_count, autoanalyze_count
FROM pg_stat_user_tables WHERE schemaname = current_schema()
"""

WAKE_UPS = """
SELECT count(*), percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY ms)
FROM (
    SELECT extract(epoch FROM attempted_at - scheduled_at) * 1000 AS ms FROM runs
    WHERE state IN ('succeeded', 'discarded', 'cancelled')
      AND completed_at > %(since)s AND completed_at <= %(until)s
) AS finished
"""
"""The runs that finished in a window (through runs_finished), and their wake-ups."""


class Enqueuer(threading.Thread):
    """Enqueue ``rate`` no-op runs a second in batches every ``BATCH_SECONDS`` until
    stopped; keep the count and each call's time."""

    def __init__(self, settings: Settings, rate: float) -> None:
        super().__init__(name="bench-enqueuer", daemon=True)
        self.settings = settings
        self.rate = rate
        self.stopping = threading.Event()
        self.enqueued = 0
        self.calls: list[tuple[float, float]] = []
        """(when it ended, in monotonic time; how long it took, in ms)."""
        self.error: BaseException | None = None

    def run(self) -> None:
        per_batch = self.rate * BATCH_SECONDS
        try:
            with Tidegate(settings=self.settings) as app:
                for k in paced(sys.maxsize, BATCH_SECONDS):
                    if self.stopping.is_set():
                        return
                    count = int(per_batch * (k + 1)) - int(per_batch * k)
                    runs = [
                        NewRun("noop", {"i": self.enqueued + i}, key=f"k{i % KEYS:03d}")
                        for i in range(count)
                    ]
                    started = time.perf_counter()
                    app.enqueue_many(runs)
                    ended = time.perf_counter()
                    self.enqueued += count
                    self.calls.append((time.monotonic(), (ended - started) * 1000))
        except BaseException as error:  # reported by the main thread
            self.error = error

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)

    def check(self) -> None:
        if self.error is not None:
            raise BenchError(f"the enqueuer failed: {self.error!r}")


def take_sample(
    conn: psycopg.Connection, t: float, since: Any, enqueuer: Enqueuer, last: float
) -> tuple[dict[str, Any], Any]:
    """One sample at ``t`` seconds; the wake-ups of runs finished after ``since``."""
    until = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
    tables = {}
    for name, heap, indexes, live, dead, autovacuumed, vacuums, analyzes in conn.execute(SAMPLE):
        tables[name] = {
            "heap": heap,
            "indexes": indexes,
            "live": live,
            "dead": dead,
            "last_autovacuum": autovacuumed,
            "autovacuums": vacuums,
            "autoanalyzes": analyzes,
        }
    states = dict(conn.execute("SELECT state::text, count(*) FROM runs GROUP BY 1").fetchall())
    row = conn.execute(WAKE_UPS, {"since": since, "until": until}).fetchone()
    assert row is not None
    finished, (p50, p99) = row[0], row[1] or (None, None)
    calls = [ms for ended, ms in list(enqueuer.calls) if ended > last]
    runs = tables["runs"]
    return {
        "t": round(t, 1),
        "enqueued": enqueuer.enqueued,
        "runs_heap": runs["heap"],
        "runs_indexes": runs["indexes"],
        "others": sum(v["heap"] + v["indexes"] for k, v in tables.items() if k != "runs"),
        "tables": tables,
        "states": states,
        "finished": finished,
        "wake_up_ms": {"p50": p50, "p99": p99},
        "enqueue_ms": percentiles(calls) if calls else None,
    }, until


def soak(
    url: str, minutes: float, retention: float, sample_seconds: float, rate: float, progress: Any
) -> dict[str, Any]:
    """Run the soak on a fresh schema; return its samples and checks."""
    schema = f"bench_soak_{uuid.uuid4().hex[:10]}"
    settings = Settings(database_url=url, schema=schema)
    prune_seconds = min(DEFAULT_PRUNE_SECONDS, retention / 5)
    try:
        with Tidegate(settings=settings) as app:
            app.migrate()
        env = child_env(
            TIDEGATE_DATABASE_URL=url,
            TIDEGATE_SCHEMA=schema,
            TIDEGATE_RETENTION_SECONDS=str(retention),
            TIDEGATE_PRUNE_SECONDS=str(prune_seconds),
        )
        argv = python_module(
            "tidegate", "worker", "--app", "bench.scale:app", "--workloops", WORKLOOPS
        )
        with (
            WorkerProcess(argv, env, WORKER_READY) as worker,
            psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn,
        ):
            worker.wait_ready()
            samples, enqueued = run_soak(
                conn, worker, settings, minutes, sample_seconds, rate, progress
            )
            _wait_finished(conn, worker)
            worker.stop()
            checked = check(conn, enqueued)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    return {
        "minutes": minutes,
        "retention_seconds": retention,
        "prune_seconds": prune_seconds,
        "sample_seconds": sample_seconds,
        "rate": rate,
        "enqueued": enqueued,
        "samples": samples,
        "checked": checked,
        "verified": checked["verified"],
    }


def run_soak(
    conn: psycopg.Connection,
    worker: WorkerProcess,
    settings: Settings,
    minutes: float,
    sample_seconds: float,
    rate: float,
    progress: Callable[[str], None],
) -> tuple[list[dict[str, Any]], int]:
    """Enqueue at ``rate`` for ``minutes``, sampling (the last sample at the end); return
    the samples and the runs enqueued."""
    enqueuer = Enqueuer(settings, rate)
    since = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
    start = last = time.monotonic()
    end = start + minutes * 60
    samples: list[dict[str, Any]] = []
    enqueuer.start()
    try:
        due = start
        while due < end:
            due = min(due + sample_seconds, end)
            while (left := due - time.monotonic()) > 0:
                worker.check_alive()
                enqueuer.check()
                time.sleep(min(0.5, left))
            taken = time.monotonic()
            sample, since = take_sample(conn, taken - start, since, enqueuer, last)
            last = taken
            samples.append(sample)
            progress(
                f"{sample['t'] / 60:5.1f} min: runs {sample['runs_heap'] / 2**20:,.0f} MB heap + "
                f"{sample['runs_indexes'] / 2**20:,.0f} MB indexes, dead "
                f"{sample['tables']['runs']['dead']:,}, states {sample['states']}, wake-up p99 "
                f"{sample['wake_up_ms']['p99'] or 0:,.1f} ms"
            )
    finally:
        enqueuer.stop()
    enqueuer.check()
    return samples, enqueuer.enqueued


def _wait_finished(conn: psycopg.Connection, worker: WorkerProcess) -> None:
    deadline = time.monotonic() + FINISH_SECONDS
    while conn.execute(
        "SELECT EXISTS (SELECT 1 FROM runs WHERE state IN ('available', 'running', 'scheduled'))"
    ).fetchone() != (False,):
        worker.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"runs still not finished {FINISH_SECONDS:.0f}s after the soak")
        time.sleep(0.2)


def check(conn: psycopg.Connection, enqueued: int) -> dict[str, Any]:
    """The worker's counters hold every enqueued run as succeeded, and no other outcome
    (beside ``claimed``, the claims' own series); every run left in the table (the rest
    were pruned) succeeded at its first attempt."""
    counted = dict(
        conn.execute(
            "SELECT outcome, sum(attempts)::bigint FROM worker_counters GROUP BY 1"
        ).fetchall()
    )
    row = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE state = 'succeeded' AND attempt = 1) FROM runs"
    ).fetchone()
    assert row is not None
    left, once = row
    return {
        "counted": counted,
        "left": left,
        "left_succeeded_once": once,
        "verified": counted.get("succeeded") == enqueued
        and set(counted) <= {"succeeded", "claimed"}
        and left == once <= enqueued,
    }


# -- verdicts and the report -----------------------------------------------------------------


def size_of(sample: dict[str, Any]) -> int:
    return int(sample["runs_heap"] + sample["runs_indexes"])


def verdicts(result: dict[str, Any]) -> dict[str, Any]:
    s = result["soak"]
    samples, retention = s["samples"], s["retention_seconds"]
    half = s["minutes"] * 60 / 2
    found: dict[str, Any] = {}
    at_retention = next((x for x in samples if x["t"] >= retention), None)
    last_half = [x for x in samples if x["t"] >= half]
    if at_retention is not None and last_half:
        ratio = max(size_of(x) for x in last_half) / size_of(at_retention)
        found["sizes_flat"] = {
            "figure": ratio,
            "size_at_retention": size_of(at_retention),
            "t_at_retention": at_retention["t"],
            "max_in_last_half": max(size_of(x) for x in last_half),
            "holds": ratio <= SIZE_SLACK,
        }
    settled = [x["wake_up_ms"]["p99"] for x in samples if x["t"] > retention]
    settled = [p99 for p99 in settled if p99 is not None]
    if len(settled) >= 3:
        third = len(settled) // 3
        first, last = statistics.median(settled[:third]), statistics.median(settled[-third:])
        found["p99_not_creeping"] = {
            "figure": last / first,
            "first_third_ms": first,
            "last_third_ms": last,
            "holds": last / first <= P99_SLACK,
        }
    if last_half:
        ratios = [
            x["tables"]["runs"]["dead"] / (50 + 0.2 * x["tables"]["runs"]["live"])
            for x in last_half
        ]
        before = [x for x in samples if x["t"] < half]
        vacuums = last_half[-1]["tables"]["runs"]["autovacuums"] - (
            before[-1]["tables"]["runs"]["autovacuums"] if before else 0
        )
        found["autovacuum_keeping_up"] = {
            "figure": max(ratios),
            "max_dead": max(x["tables"]["runs"]["dead"] for x in last_half),
            "autovacuums_in_last_half": vacuums,
            "holds": max(ratios) <= DEAD_SLACK and vacuums >= 1,
        }
    return found


def _mb(value: float) -> str:
    return f"{value / 2**20:,.1f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def render(result: dict[str, Any]) -> str:
    s, v = result["soak"], result["verdicts"]
    server, machine = result["server"], result["machine"]
    measured = (
        f"{result['drain_rate']:,.0f} runs/s measured at the start"
        if result.get("drain_rate")
        else "not measured (`--rate`)"
    )
    lines = [
        f"PostgreSQL {server['version']} ({server['connection']}), {result['date']}, "
        f"tidegate commit {result['code'].get('commit', '?')}, {machine['cores']} cores, "
        f"load average {machine['loadavg_at_start'][0]} at start, "
        f"{machine['loadavg_at_end'][0]} at end; `{result['command']}`",
        "",
        "Server's vacuum settings: "
        + ", ".join(f"{name}={value}" for name, value in result["autovacuum"].items())
        + ".",
        "",
        f"A {s['minutes']:g}-minute run: drain rate {measured}; enqueued "
        f"{s['rate']:,.0f} runs/s asked, {s['enqueued'] / (s['minutes'] * 60):,.0f} done "
        f"({s['enqueued']:,} runs); retention {s['retention_seconds']:g} s, pruned every "
        f"{s['prune_seconds']:g} s; a sample every {s['sample_seconds']:g} s. Every run "
        f"verified: {'yes' if s['verified'] else '**no**'}.",
        "",
        "| t, min | runs heap, MB | runs indexes, MB | other tables, MB | runs live / dead rows "
        "| autovacuums of runs | ready / running | enqueued, runs/s | finished in the window "
        "| wake-up p50 / p99, ms | enqueue_many p99, ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    before = {"t": 0.0, "enqueued": 0}
    for x in s["samples"]:
        runs, states = x["tables"]["runs"], x["states"]
        enqueue = x["enqueue_ms"]["p99"] if x["enqueue_ms"] else None
        rate = (x["enqueued"] - before["enqueued"]) / max(x["t"] - before["t"], 1e-9)
        before = x
        lines.append(
            f"| {x['t'] / 60:.1f} | {_mb(x['runs_heap'])} | {_mb(x['runs_indexes'])} "
            f"| {_mb(x['others'])} | {runs['live']:,} / {runs['dead']:,} | {runs['autovacuums']} "
            f"| {states.get('available', 0):,} / {states.get('running', 0):,} | {rate:,.0f} "
            f"| {x['finished']:,} | {_ms(x['wake_up_ms']['p50'])} / {_ms(x['wake_up_ms']['p99'])} "
            f"| {_ms(enqueue)} |"
        )
    lines += ["", "| verdict | figure | holds |", "| --- | --- | --- |"]
    if "sizes_flat" in v:
        f = v["sizes_flat"]
        lines.append(
            f"| sizes flat after the first retention period | largest size of runs in the last "
            f"half {_mb(f['max_in_last_half'])} MB / at {f['t_at_retention'] / 60:.1f} min "
            f"{_mb(f['size_at_retention'])} MB = {f['figure']:.2f} (<= {SIZE_SLACK:.2f}) "
            f"| {'yes' if f['holds'] else '**no**'} |"
        )
    if "p99_not_creeping" in v:
        f = v["p99_not_creeping"]
        lines.append(
            f"| p99 not creeping | median p99 wake-up, last third {f['last_third_ms']:,.1f} ms / "
            f"first third {f['first_third_ms']:,.1f} ms (after the first retention period) = "
            f"{f['figure']:.2f} (<= {P99_SLACK:.2f}) | {'yes' if f['holds'] else '**no**'} |"
        )
    if "autovacuum_keeping_up" in v:
        f = v["autovacuum_keeping_up"]
        lines.append(
            f"| autovacuum keeping up | dead rows of runs in the last half at most "
            f"{f['figure']:.2f} x autovacuum's trigger (<= {DEAD_SLACK:.0f}; {f['max_dead']:,} "
            f"rows), {f['autovacuums_in_last_half']} autovacuums of runs in the last half "
            f"(>= 1) | {'yes' if f['holds'] else '**no**'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=DESCRIPTION)
    parser.add_argument("--database-url", help="PostgreSQL to measure on (default: embedded)")
    parser.add_argument("--minutes", type=float, default=30.0, help="how long (30)")
    parser.add_argument("--retention", type=float, default=300.0, help="seconds (300)")
    parser.add_argument("--sample-seconds", type=float, default=30.0, help="(30)")
    parser.add_argument("--rate", type=float, help="runs/s to enqueue (default: 60%% of drain)")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/benchmarks.md")
    parser.add_argument("--snapshot", action="store_true", help="measure a copy of the code")
    parser.add_argument("--smoke", action="store_true", help="a few seconds: checks")
    args = parser.parse_args(argv)
    options = {
        "minutes": args.minutes,
        "retention": args.retention,
        "sample_seconds": args.sample_seconds,
        "rate": args.rate,
    }
    if args.smoke:
        options = SMOKE
    url, embedded = start_run("bench.soak", argv, args.database_url, args.snapshot)
    command = shlex.join(["python", "-m", "bench.soak", *(redact(a) for a in argv)])
    started = time.monotonic()
    result = new_record(url, command, embedded)
    with psycopg.connect(url, autocommit=True) as conn:
        result["autovacuum"] = {
            name: conn.execute("SELECT current_setting(%s)", [name]).fetchone()[0]  # type: ignore[index]
            for name in AUTOVACUUM
        }
    rate = options["rate"]
    if rate is None:
        result["drain_rate"] = drain(url, 1, None, DRAIN_RUNS)["rate"]
        rate = SHARE * result["drain_rate"]
        progress(f"drain {result['drain_rate']:,.0f} runs/s: enqueueing {rate:,.0f} runs/s")
    result["soak"] = soak(
        url,
        options["minutes"],
        options["retention"],
        options["sample_seconds"],
        rate,
        progress,
    )
    result["verdicts"] = verdicts(result)
    result["verified"] = result["soak"]["verified"]
    close_record(result, started, progress)
    label = f"soak-postgres{result['server']['major']}{'-embedded' if embedded else ''}"
    publish(result, render(result), label, smoke=args.smoke, write_docs=args.write_docs)
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
