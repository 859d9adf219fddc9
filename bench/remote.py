"""Remote workers beside local ones: the same drain, and what each asks of PostgreSQL.

::

    python -m bench.remote                 # embedded PostgreSQL (or TIDEGATE_DATABASE_URL)
    python -m bench.remote --database-url postgresql://postgres@127.0.0.1:5432/test --write-docs

Drain: ``--runs`` no-op runs over 100 keys, each scenario on a schema of its own, with 4
worker processes ``tidegate worker --app bench.scale:app --workloops manual>*:32``,
started first and idle; then all the runs are enqueued in one statement. The figure is
runs per second from the first claim to the last completion, by the database's clock,
as in ``bench.scale``:

  local           the 4 workers on PostgreSQL, as usual
  remote, N API   the same 4 workers with ``--server-url`` and ``--worker-token``
                  (docs/workers.md), through ``tidegate serve --role api`` with N
                  processes (1, 2): they hold no database connection; the API claims,
                  renews and completes for them

Beside each: the CPU per run of the workers, the API processes and PostgreSQL; runs per
second per API process; and the most PostgreSQL connections the setup held at once
(client backends of the database, sampled every 50 ms, less those open before it
started). Every drain is checked: every run succeeded, once.
"""

from __future__ import annotations

import shlex
import statistics
import sys
import threading
import time
from typing import Any

import httpx
import psycopg

from bench.harness import (
    child_env,
    close_record,
    drain_parser,
    fresh_schema,
    new_record,
    publish,
    redact,
    spread,
    start_run,
)
from bench.scale import SLOTS, drain_with
from bench.webhooks.common import ADMIN_TOKEN
from bench.webhooks.processes import ApiServer
from tidegate import Settings, Tidegate

DESCRIPTION = "Remote workers beside local ones: drain, CPU, connections."
WORKERS = 4
SCENARIOS = (("local", 0), ("remote, 1 API", 1), ("remote, 2 API", 2))
"""(scenario, API processes; 0: local workers)."""
SMOKE_RUNS = 2000
"""Enough runs that the CPU they cost spans several of /proc's 10 ms ticks (with 300,
a drain's could read 0)."""


class Connections:
    """The most client backends of the database seen at once, sampled in a thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.most = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._sample, name="bench-connections")

    def count(self, conn: psycopg.Connection) -> int:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND datname = current_database()"
            " AND pid <> pg_backend_pid()"
        ).fetchone()
        return int(row[0]) if row else 0

    def _sample(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stopping.wait(0.05):
                self.most = max(self.most, self.count(conn))

    def __enter__(self) -> Connections:
        with psycopg.connect(self.url, autocommit=True) as conn:
            self.before = self.count(conn)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()

    @property
    def held(self) -> int:
        return max(0, self.most - self.before)


def drain(url: str, api_processes: int, runs: int) -> dict[str, Any]:
    """Drain ``runs`` no-op runs with 4 workers, local or through ``api_processes``."""
    with fresh_schema(url, "remote") as schema:
        settings = Settings(database_url=url, schema=schema)
        with Tidegate(settings=settings) as tidegate, Connections(url) as connections:
            tidegate.migrate()
            if not api_processes:
                env = child_env(TIDEGATE_DATABASE_URL=url, TIDEGATE_SCHEMA=schema)
                found = drain_with(tidegate, env, WORKERS, runs, {"api": list})
            else:
                with ApiServer(url, schema, api_processes) as api:
                    token = _token(api.base)
                    env = child_env(TIDEGATE_SERVER_URL=api.base, TIDEGATE_WORKER_TOKEN=token)
                    found = drain_with(tidegate, env, WORKERS, runs, {"api": api.pids})
                    api.stop()
    # The setup's connections, less the one Tidegate() above keeps for the enqueue.
    return {**found, "connections": max(0, connections.held - 1)}


def _token(base: str) -> str:
    created = httpx.post(
        base + "/admin/worker-tokens",
        json={"name": "bench", "lanes": ["*"]},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10,
    )
    created.raise_for_status()
    token: str = created.json()["token"]
    return token


def run_benchmark(
    url: str, runs: int, repeat: int, progress: Any
) -> dict[str, list[dict[str, Any]]]:
    samples: dict[str, list[dict[str, Any]]] = {}
    for repetition in range(repeat):
        for scenario, api_processes in SCENARIOS:
            found = drain(url, api_processes, runs)
            samples.setdefault(scenario, []).append(found)
            progress(
                f"#{repetition + 1} {scenario}: {found['rate']:,.0f} runs/s, "
                f"{found['connections']} connections"
            )
    return samples


def summarize(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        scenario: {
            "rate": spread([f["rate"] for f in found]),
            "connections": max(f["connections"] for f in found),
            **{
                f"{side}_cpu_us": statistics.median(f["cpu_us_per_run"][side] for f in found)
                for side in ("workers", "api", "postgres")
            },
        }
        for scenario, found in samples.items()
    }


def render(result: dict[str, Any]) -> str:
    s = result["summary"]
    server, machine = result["server"], result["machine"]
    local = s["local"]["rate"]["median"]
    lines = [
        f"PostgreSQL {server['version']} ({server['connection']}), {result['date']}, "
        f"tidegate commit {result['code'].get('commit', '?')}, {machine['cores']} cores, "
        f"load average {machine['loadavg_at_start'][0]} at start; {result['repeat']} "
        f"repetitions, median (min - max); `{result['command']}`",
        "",
        f"| drain, {result['runs']:,} no-op runs, {WORKERS} workers `manual>*:{SLOTS}` "
        "| runs/s | / local | runs/s per API process | PostgreSQL connections "
        "| CPU per run, µs: workers / API / PostgreSQL |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for scenario, api_processes in SCENARIOS:
        d = s[scenario]
        rate = d["rate"]
        per_api = f"{rate['median'] / api_processes:,.0f}" if api_processes else "-"
        lines.append(
            f"| {scenario} | {rate['median']:,.0f} ({rate['min']:,.0f} - {rate['max']:,.0f}) "
            f"| {rate['median'] / local:.2f} | {per_api} | {d['connections']} "
            f"| {d['workers_cpu_us']:.0f} / {d['api_cpu_us']:.0f} / {d['postgres_cpu_us']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = drain_parser("python -m bench.remote", DESCRIPTION, "a few runs: checks only")
    args = parser.parse_args(argv)
    runs, repeat = (SMOKE_RUNS, 1) if args.smoke else (args.runs, args.repeat)
    url, embedded = start_run("bench.remote", argv, args.database_url, args.snapshot)
    command = shlex.join(["python", "-m", "bench.remote", *(redact(a) for a in argv)])
    started = time.monotonic()
    result = new_record(url, command, embedded, repeat=repeat, runs=runs)
    samples = run_benchmark(url, runs, repeat, lambda line: print(line, file=sys.stderr))
    result["samples"] = samples
    result["summary"] = summarize(samples)
    result["verified"] = all(f["verified"] for found in samples.values() for f in found)
    close_record(result, started, lambda line: print(line, file=sys.stderr))
    label = f"remote-postgres{result['server']['major']}{'-embedded' if embedded else ''}"
    publish(result, render(result), label, smoke=args.smoke, write_docs=args.write_docs)
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
