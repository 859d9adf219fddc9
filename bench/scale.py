"""How tidegate scales with processes on one machine, and what key policies cost the claim.

::

    python -m bench.scale                   # embedded PostgreSQL (or TIDEGATE_DATABASE_URL)
    python -m bench.scale --database-url postgresql://postgres@127.0.0.1:5432/test --write-docs

Drain: ``--runs`` no-op runs over 100 keys, each scenario on a schema of its own. The
worker processes (``tidegate worker --app bench.scale:app --workloops manual>*:32``, as a
user runs them) start first and wait, idle; then all the runs are enqueued in one
statement, so every process sees them at once. The figure is runs per second from the
first claim to the last completion, by the database's clock (``attempted_at``,
``completed_at``), with 1, 2 and 4 worker processes, and the CPU the worker processes
and PostgreSQL spent per run. Twice with one process more:

  keyed     the lane's default key policy is set (``max_running`` 1,000: never reached),
            so every claim takes the path that enforces key policies
            (``claim_runs_keyed``) instead of the set-based one: the cost of that path
            alone, as a ratio to the plain claim
  capped    ``max_running`` 2 per key (100 keys: 200 in flight at most, above the 32
            slots): the same path, with its per-key counts doing work

Ingest: the async ingest of ``python -m bench.webhooks`` (5,000 webhooks from 16
clients, httpx and a minimal HTTP/1.1 client) with 1, 2 and 4 API processes, beside the
raw-SQL floor (the same rows inserted from 16 connections), measured once per
repetition.

Every scenario is repeated ``--repeat`` times, the scenarios in turn; figures are
medians, with min and max. Each drain is checked: every run succeeded, once.
"""

from __future__ import annotations

import dataclasses
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

from bench.harness import (
    BenchError,
    WorkerProcess,
    child_env,
    close_record,
    drain_parser,
    fresh_schema,
    new_record,
    progress,
    publish,
    python_module,
    redact,
    schema_conninfo,
    spread,
    start_run,
)
from bench.webhooks.common import WORKER_READY, Options
from bench.webhooks.ingest import measure_ingest
from bench.webhooks.processes import CpuMeter, server_pids
from tidegate import NewRun, Settings, Tidegate
from tidegate.policies import set_key_policy

DESCRIPTION = "How tidegate scales with processes, and what key policies cost the claim."
app = Tidegate()


@app.task(name="noop")
async def noop(**args: Any) -> None:
    """The drain's handler: nothing, so what is measured is the queue."""


PROCESSES = (1, 2, 4)
KEYS = 100
SLOTS = 32
DRAIN_SECONDS = 300.0
DRAINS = (
    *((f"{n} worker{'s' if n > 1 else ''}", n, None) for n in PROCESSES),
    ("1 worker, keyed", 1, 1000),
    ("1 worker, capped", 1, 2),
)
"""(scenario, worker processes, the lane's default max_running or None)."""
SMOKE_RUNS = 2000
"""Enough runs that the CPU they cost spans several of /proc's 10 ms ticks (with 300,
a drain's could read 0)."""
SMOKE_INGEST = Options(ingest_requests=100, ingest_clients=4)


def drain(url: str, processes: int, max_running: int | None, runs: int) -> dict[str, Any]:
    """Drain ``runs`` no-op runs with ``processes`` worker processes; return the figures."""
    with fresh_schema(url, "scale") as schema:
        settings = Settings(database_url=url, schema=schema)
        with Tidegate(settings=settings) as tidegate:
            tidegate.migrate()
            if max_running is not None:
                tidegate.execute(set_key_policy("default", "*", max_running=max_running))
            env = child_env(TIDEGATE_DATABASE_URL=url, TIDEGATE_SCHEMA=schema)
            return drain_with(tidegate, env, processes, runs, {})


def drain_with(
    tidegate: Tidegate,
    env: dict[str, str],
    processes: int,
    runs: int,
    groups: dict[str, Callable[[], Iterable[int]]],
) -> dict[str, Any]:
    """Start ``processes`` idle workers (``manual>*:32``, environment ``env``), enqueue
    ``runs`` no-op runs at once, wait until they are done; return runs per second (first
    claim to last completion, by the database's clock), CPU per run of the workers,
    PostgreSQL and ``groups``, and whether every run succeeded, once."""
    url, schema = tidegate.settings.database_url or "", tidegate.settings.schema
    argv = python_module(
        "tidegate", "worker", "--app", "bench.scale:app", "--workloops", f"manual>*:{SLOTS}"
    )
    workers = [WorkerProcess(argv, env, WORKER_READY) for _ in range(processes)]
    try:
        for worker in workers:
            worker.wait_ready()
        pids = [worker.process.pid for worker in workers]
        meter = CpuMeter({"workers": lambda: pids, "postgres": server_pids(url), **groups})
        meter.start()
        tidegate.enqueue_many(
            [NewRun("noop", {"i": i}, key=f"k{i % KEYS:03d}") for i in range(runs)]
        )
        _wait_drained(schema_conninfo(url, schema), runs, workers)
        cpu = meter.stop()["cpu_seconds"]
        for worker in workers:
            worker.stop()
    finally:
        for worker in workers:
            worker.kill()
    with psycopg.connect(schema_conninfo(url, schema)) as conn:
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE attempt = 1),"
            " extract(epoch FROM max(completed_at) - min(attempted_at))"
            " FROM runs WHERE state = 'succeeded'"
        ).fetchone()
    assert row is not None
    done, once, seconds = int(row[0]), int(row[1]), float(row[2])
    return {
        "runs": runs,
        "rate": runs / seconds,
        "verified": done == once == runs,
        "cpu_us_per_run": {side: 1e6 * used / runs for side, used in cpu.items()},
    }


def _wait_drained(conninfo: str, runs: int, workers: list[WorkerProcess]) -> None:
    deadline = time.monotonic() + DRAIN_SECONDS
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM runs WHERE state = 'succeeded'").fetchone()
            if row is not None and row[0] >= runs:
                return
            for worker in workers:
                worker.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"{row[0] if row else 0} of {runs} runs done in {DRAIN_SECONDS}s")
            time.sleep(0.05)


def run_benchmark(
    url: str, runs: int, repeat: int, ingest: Options, progress: Any
) -> dict[str, list[dict[str, Any]]]:
    samples: dict[str, list[dict[str, Any]]] = {}
    for repetition in range(repeat):
        for scenario, processes, max_running in DRAINS:
            found = drain(url, processes, max_running, runs)
            samples.setdefault(f"drain: {scenario}", []).append(found)
            progress(f"#{repetition + 1} drain, {scenario}: {found['rate']:,.0f} runs/s")
        for processes in PROCESSES:
            options = dataclasses.replace(ingest, ingest_api_processes=processes)
            found = measure_ingest(url, options, raw_first=repetition % 2 == 1)
            samples.setdefault(f"ingest: {processes} API", []).append(found)
            progress(
                f"#{repetition + 1} ingest, {processes} API process(es): "
                f"{found['tidegate']['rate']:,.0f}/s (raw {found['raw']['rate']:,.0f}/s)"
            )
    return samples


def summarize(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name, found in samples.items():
        if name.startswith("drain"):
            summary[name] = {
                "rate": spread([f["rate"] for f in found]),
                "workers_cpu_us": statistics.median(f["cpu_us_per_run"]["workers"] for f in found),
                "postgres_cpu_us": statistics.median(
                    f["cpu_us_per_run"]["postgres"] for f in found
                ),
            }
        else:
            summary[name] = {
                "rate": spread([f["tidegate"]["rate"] for f in found]),
                "plain_rate": spread([f["tidegate"]["plain_client"]["rate"] for f in found]),
                "raw_rate": spread([f["raw"]["rate"] for f in found]),
            }
    return summary


def _cell(figure: dict[str, Any]) -> str:
    return f"{figure['median']:,.0f} ({figure['min']:,.0f} - {figure['max']:,.0f})"


def render(result: dict[str, Any]) -> str:
    s = result["summary"]
    server, machine = result["server"], result["machine"]
    single = s["drain: 1 worker"]["rate"]["median"]
    lines = [
        f"PostgreSQL {server['version']} ({server['connection']}), {result['date']}, "
        f"tidegate commit {result['code'].get('commit', '?')}, {machine['cores']} cores, "
        f"load average {machine['loadavg_at_start'][0]} at start; {result['repeat']} "
        f"repetitions, median (min - max); `{result['command']}`",
        "",
        f"| drain, {result['runs']:,} no-op runs | runs/s | / 1 worker | worker CPU per run, µs"
        " | PostgreSQL CPU per run, µs |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for scenario, *_ in DRAINS:
        d = s[f"drain: {scenario}"]
        lines.append(
            f"| {scenario} | {_cell(d['rate'])} | {d['rate']['median'] / single:.2f} "
            f"| {d['workers_cpu_us']:.0f} | {d['postgres_cpu_us']:.0f} |"
        )
    lines += [
        "",
        f"| async ingest, {result['ingest']['requests']:,} webhooks, "
        f"{result['ingest']['clients']} clients | accepted/s, httpx | accepted/s, minimal"
        " client | raw-SQL floor/s | minimal client / floor |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for processes in PROCESSES:
        i = s[f"ingest: {processes} API"]
        lines.append(
            f"| {processes} API process{'es' if processes > 1 else ''} | {_cell(i['rate'])} "
            f"| {_cell(i['plain_rate'])} | {_cell(i['raw_rate'])} "
            f"| {i['plain_rate']['median'] / i['raw_rate']['median']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = drain_parser("python -m bench.scale", DESCRIPTION, "a few runs and webhooks: checks")
    args = parser.parse_args(argv)
    runs, repeat, ingest = args.runs, args.repeat, Options()
    if args.smoke:
        runs, repeat, ingest = SMOKE_RUNS, 1, SMOKE_INGEST
    url, embedded = start_run("bench.scale", argv, args.database_url, args.snapshot)
    command = shlex.join(["python", "-m", "bench.scale", *(redact(a) for a in argv)])
    started = time.monotonic()
    result = new_record(
        url,
        command,
        embedded,
        repeat=repeat,
        runs=runs,
        ingest={"requests": ingest.ingest_requests, "clients": ingest.ingest_clients},
    )
    samples = run_benchmark(url, runs, repeat, ingest, progress)
    result["samples"] = samples
    result["summary"] = summarize(samples)
    result["verified"] = all(f["verified"] for found in samples.values() for f in found)
    close_record(result, started, progress)
    label = f"scale-postgres{result['server']['major']}{'-embedded' if embedded else ''}"
    publish(result, render(result), label, smoke=args.smoke, write_docs=args.write_docs)
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
