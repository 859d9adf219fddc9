"""What schedules cost the database: 10,000 of them, idle, steady and all due at once.

::

    python -m bench.schedules               # embedded PostgreSQL (or TIDEGATE_DATABASE_URL)
    python -m bench.schedules --database-url postgresql://postgres@127.0.0.1:5432/test --write-docs

Each scenario runs a worker's scheduler the way a worker does (``Scheduler.fire``: one
transaction that locks the due schedules, inserts their runs and moves them on, again
while a batch is full) once a second, for ``--seconds``, on a schema of its own:

  idle    ``--schedules`` schedules, none due: the price of looking each second
  steady  the same schedules every 10 s, their ticks spread evenly: schedules/10 runs a
          second
  burst   the same schedules on ``* * * * *``, every one due at once (a minute's
          boundary): how long until every one has its run

The figure is PostgreSQL's CPU time per second (all its processes, from /proc), beside
two floors measured in the same run on the same schema: the same number of runs a
second enqueued with one ``enqueue_many`` (what the runs cost without schedules), and
the same number of rows inserted into a plain table by one ``INSERT ... SELECT`` (raw
SQL). Medians of ``--repeat``.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time
from typing import Any

import psycopg

from bench.harness import (
    DOCS,
    RESULTS,
    close_record,
    fresh_schema,
    new_record,
    redact,
    schema_conninfo,
    start_run,
    write_between,
    write_results,
)
from bench.webhooks.processes import CpuMeter, server_pids
from tidegate import NewRun, Settings, Tidegate
from tidegate.worker.runtime import Worker

DESCRIPTION = "What schedules cost the database: idle, steady and all due at once."
app = Tidegate()


@app.task(name="noop")
async def noop(**args: Any) -> None:
    """The scheduled task; nothing runs it here, only its runs are made."""


INTERVAL_SECONDS = 10
SETUP = {
    "idle": "INSERT INTO schedules (project, name, task, interval_seconds, next_tick)"
    " SELECT 'default', 's' || i, 'noop', %(interval)s, now() + interval '1 day'"
    " FROM generate_series(1, %(count)s) i",
    "steady": "INSERT INTO schedules (project, name, task, interval_seconds, next_tick)"
    " SELECT 'default', 's' || i, 'noop', %(interval)s,"
    " now() + make_interval(secs => %(interval)s * i::float8 / %(count)s)"
    " FROM generate_series(1, %(count)s) i",
    "burst": "INSERT INTO schedules (project, name, task, cron, next_tick)"
    " SELECT 'default', 's' || i, 'noop', '* * * * *', date_trunc('minute', now())"
    " FROM generate_series(1, %(count)s) i",
}
RAW_TABLE = (
    "CREATE TABLE raw_runs (id bigserial PRIMARY KEY, task text, args jsonb, run_at timestamptz)"
)
RAW_INSERT = (
    "INSERT INTO raw_runs (task, args, run_at) SELECT 'noop', '{}', now()"
    " FROM generate_series(1, %(count)s)"
)


async def scheduler_seconds(
    url: str, schema: str, scenario: str, count: int, seconds: float
) -> dict[str, Any]:
    """Set up ``scenario`` and fire once a second for ``seconds``; what it cost."""
    tidegate = Tidegate(settings=Settings(database_url=url, schema=schema))
    tidegate.tasks.update(app.tasks)
    tidegate.migrate()
    with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
        conn.execute(SETUP[scenario], {"count": count, "interval": INTERVAL_SECONDS})
    worker = Worker(tidegate, tidegate.settings)
    scheduler = worker.scheduler
    assert scheduler is not None  # a worker on PostgreSQL fires schedules
    meter = CpuMeter({"postgres": server_pids(url)})
    await worker.pool.open(wait=True)
    try:
        meter.start()
        started = time.monotonic()
        firing = 0.0
        while time.monotonic() - started < seconds:
            second = time.monotonic()
            while await scheduler.fire():
                pass
            firing = max(firing, time.monotonic() - second)
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - second)))
        spent = meter.stop()
    finally:
        await worker.pool.close()
        tidegate.close()
    with psycopg.connect(schema_conninfo(url, schema)) as conn:
        row = conn.execute("SELECT count(*) FROM runs").fetchone()
    runs = int(row[0]) if row else 0
    return {
        "runs": runs,
        "runs_per_second": round(runs / spent["wall_seconds"], 1),
        "db_cpu_per_second": round(spent["cpu_seconds"]["postgres"] / spent["wall_seconds"], 4),
        "longest_firing_seconds": round(firing, 3),
    }


def floors(url: str, schema: str, per_second: float, seconds: float) -> dict[str, float]:
    """PostgreSQL's CPU per second to insert ``per_second`` rows a second: into a plain
    table (raw SQL), and as runs with one ``enqueue_many`` (tidegate without schedules)."""
    found = {}
    tidegate = Tidegate(settings=Settings(database_url=url, schema=schema))
    with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
        conn.execute(RAW_TABLE)
        for floor in ("raw", "enqueue"):
            meter = CpuMeter({"postgres": server_pids(url)})
            meter.start()
            started = time.monotonic()
            while time.monotonic() - started < seconds:
                second = time.monotonic()
                if per_second >= 1 and floor == "raw":
                    conn.execute(RAW_INSERT, {"count": round(per_second)})
                elif per_second >= 1:
                    tidegate.enqueue_many([NewRun("noop") for _ in range(round(per_second))])
                time.sleep(max(0.0, 1.0 - (time.monotonic() - second)))
            spent = meter.stop()
            found[floor] = round(spent["cpu_seconds"]["postgres"] / spent["wall_seconds"], 4)
    tidegate.close()
    return found


def run_benchmark(
    url: str, count: int, seconds: float, repeat: int, progress: Any = print
) -> dict[str, list[dict[str, Any]]]:
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in SETUP}
    for rep in range(repeat):
        for scenario in SETUP:
            with fresh_schema(url, "schedules") as schema:
                # A burst is fired once: one second's firing holds it whole.
                span = 1.0 if scenario == "burst" else seconds
                found = asyncio.run(scheduler_seconds(url, schema, scenario, count, span))
                per_second = found["runs"] / span if scenario != "burst" else found["runs"]
                floor = floors(url, schema, per_second, span)
                found["raw_db_cpu_per_second"] = floor["raw"]
                found["enqueue_db_cpu_per_second"] = floor["enqueue"]
            samples[scenario].append(found)
            progress(f"{rep + 1}/{repeat} {scenario}: {found}")
    return samples


def table(samples: dict[str, list[dict[str, Any]]], count: int) -> str:
    lines = [
        f"| {count:,} schedules | runs/s | PostgreSQL CPU s/s | the same runs by enqueue_many |"
        " raw-SQL floor | longest firing (s) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for scenario, found in samples.items():

        def median(name: str, found: list[dict[str, Any]] = found) -> float:
            return statistics.median(sample[name] for sample in found)

        lines.append(
            f"| {scenario} | {median('runs_per_second'):,.0f} | {median('db_cpu_per_second'):.3f}"
            f" | {median('enqueue_db_cpu_per_second'):.3f} | {median('raw_db_cpu_per_second'):.3f}"
            f" | {median('longest_firing_seconds'):.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--database-url")
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--snapshot", action="store_true")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    url, embedded = start_run("bench.schedules", sys.argv[1:], args.database_url, args.snapshot)
    started = time.monotonic()
    command = "python -m bench.schedules " + shlex.join(sys.argv[1:])
    result = new_record(redact(url), command, embedded, schedules=args.schedules)
    result["samples"] = run_benchmark(url, args.schedules, args.seconds, args.repeat)
    close_record(result, started, print)
    write_results(result, RESULTS / "schedules.json")
    text = table(result["samples"], args.schedules)
    print(text)
    if args.write_docs:
        write_between(DOCS, "schedules", text)


if __name__ == "__main__":
    main()
