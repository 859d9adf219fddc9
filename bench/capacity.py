"""What a run costs PostgreSQL, phase by phase: the figures docs/deployment.md's capacity
of one primary rests on.

::

    python -m bench.capacity                  # a private embedded PostgreSQL (quiet: all ours)
    python -m bench.capacity --database-url postgresql://postgres@127.0.0.1:5432/test

Each phase runs on a schema of its own, after a ``CHECKPOINT`` (so the WAL counted holds
the full-page images a page's first change after a checkpoint writes: the dearer end of
a busy server's steady state). For each: the WAL inserted (``pg_current_wal_insert_lsn``
before and after), the CPU of every PostgreSQL process (``/proc/<pid>/stat``, the
postmaster's children), both per run, and the most client connections the database had.

  enqueue      ``--runs`` runs by ``enqueue_many``, 1,000 a statement
  single       ``--runs`` / 10 runs by ``enqueue``, one transaction each
  claim        500 runs, enqueued into a paused lane, claimed by one worker
               (``manual>*:500``) once the lane resumes: the claims alone (the handler
               holds each run until a time well after they are all running; no heartbeat
               falls inside the window)
  complete     the same 500 runs ending together: their completions
  drain        ``--runs`` no-op runs, claimed and completed by one worker
               (``manual>*:32``)
  admission    ``--runs`` / 10 async webhooks from 16 clients to one API process: the
               admission and the insert of request and run, no worker running

Every PostgreSQL process counts, and all of the server's WAL, other users' too on a shared
server: run it on a quiet one, or on the private embedded server (no ``--database-url``).
A phase too short for /proc's 10 ms ticks reads 0 CPU: keep ``--runs`` >= 10,000.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psycopg

from bench.harness import (
    EMBEDDED_DATA_DIR,
    WorkerProcess,
    child_env,
    fresh_schema,
    python_module,
    schema_conninfo,
)
from bench.webhooks.client import create_trigger
from bench.webhooks.common import WORKER_READY
from bench.webhooks.processes import ApiServer, CpuMeter, server_pids
from tidegate import NewRun, Settings, Tidegate

app = Tidegate()
HOLD_LANE = "held"
HOLD_RUNS = 500
HOLD_SECONDS = 12.0
"""From the enqueue of the held runs to their end: the worker's start and every claim
fit well inside it."""


@app.task(name="noop")
async def noop(**_: Any) -> None:
    """Nothing: what is measured is the queue."""


@app.task(name="hold")
async def hold(until: float, **_: Any) -> None:
    """Hold the run until ``until`` (epoch seconds): every claim is done before any
    completion."""
    await asyncio.sleep(max(0.0, until - time.time()))


class Phase:
    """WAL, PostgreSQL's CPU and the most connections, from ``start`` to ``stop``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = psycopg.connect(url, autocommit=True)
        self.meter = CpuMeter({"postgres": server_pids(url)})
        self.connections = 0

    def checkpoint(self) -> None:
        self.conn.execute("CHECKPOINT")

    def start(self) -> None:
        self.lsn = self.conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        self.connections = 0
        self.meter.start()

    def sample(self) -> None:
        row = self.conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND backend_type = 'client backend'"
        ).fetchone()
        self.connections = max(self.connections, int(row[0]) if row else 0)

    def stop(self, runs: int) -> dict[str, Any]:
        spent = self.meter.stop()
        wal = self.conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", self.lsn
        ).fetchone()
        assert wal is not None
        return {
            "runs": runs,
            "seconds": spent["wall_seconds"],
            "wal_bytes_per_run": round(float(wal[0]) / runs),
            "postgres_cpu_us_per_run": round(spent["cpu_seconds"]["postgres"] * 1e6 / runs, 1),
            "connections": self.connections,
        }


@contextmanager
def schema_app(url: str) -> Iterator[Tidegate]:
    with (
        fresh_schema(url, "capacity") as schema,
        Tidegate(settings=Settings(database_url=url, schema=schema)) as tidegate,
    ):
        tidegate.migrate()
        yield tidegate


def wait_for(check: Callable[[], bool], phase: Phase, worker: WorkerProcess | None) -> None:
    deadline = time.monotonic() + 600
    while not check():
        phase.sample()
        if worker is not None:
            worker.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError("a phase did not end within 600 s")
        time.sleep(0.02)


def count(conn: psycopg.Connection, state: str) -> int:
    row = conn.execute("SELECT count(*) FROM runs WHERE state = %s", [state]).fetchone()
    return int(row[0]) if row else 0


def worker(url: str, schema: str, workloops: str, **env: str) -> WorkerProcess:
    argv = python_module(
        "tidegate", "worker", "--app", "bench.capacity:app", "--workloops", workloops
    )
    process = WorkerProcess(
        argv, child_env(TIDEGATE_DATABASE_URL=url, TIDEGATE_SCHEMA=schema, **env), WORKER_READY
    )
    process.wait_ready(60)
    return process


def enqueue(url: str, runs: int, phase: Phase) -> dict[str, Any]:
    with schema_app(url) as tidegate:
        phase.checkpoint()
        phase.start()
        for first in range(0, runs, 1000):
            tidegate.enqueue_many(
                [NewRun("noop", {"i": i}, key=f"k{i % 100}") for i in range(first, first + 1000)]
            )
        phase.sample()
        return phase.stop(runs)


def single(url: str, runs: int, phase: Phase) -> dict[str, Any]:
    with schema_app(url) as tidegate:
        phase.checkpoint()
        phase.start()
        for i in range(runs):
            tidegate.enqueue("noop", {"i": i}, key=f"k{i % 100}")
        phase.sample()
        return phase.stop(runs)


def claim_and_complete(url: str, phase: Phase) -> dict[str, Any]:
    with schema_app(url) as tidegate:
        schema = tidegate.settings.schema
        tidegate.pause_lane(HOLD_LANE)
        until = time.time() + HOLD_SECONDS
        tidegate.enqueue_many(
            [NewRun("hold", {"until": until}, lane=HOLD_LANE) for _ in range(HOLD_RUNS)]
        )
        held = worker(
            url,
            schema,
            f"manual>*:{HOLD_RUNS}",
            TIDEGATE_HEARTBEAT_SECONDS="60",
            TIDEGATE_LEASE_SECONDS="180",
        )
        try:
            with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
                phase.checkpoint()
                phase.start()
                tidegate.resume_lane(HOLD_LANE)
                wait_for(lambda: count(conn, "running") == HOLD_RUNS, phase, held)
                claimed = phase.stop(HOLD_RUNS)
                if time.time() > until:
                    raise RuntimeError("the runs ended before every claim was done")
                phase.checkpoint()
                phase.start()
                wait_for(lambda: count(conn, "succeeded") == HOLD_RUNS, phase, held)
                completed = phase.stop(HOLD_RUNS)
            held.stop()
        finally:
            held.kill()
        return {"claim": claimed, "complete": completed}


def drain(url: str, runs: int, phase: Phase) -> dict[str, Any]:
    with schema_app(url) as tidegate:
        schema = tidegate.settings.schema
        process = worker(url, schema, "manual>*:32")
        try:
            tidegate.enqueue_many(
                [NewRun("noop", {"i": i}, key=f"k{i % 100}") for i in range(runs)]
            )
            with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
                phase.checkpoint()
                phase.start()
                wait_for(lambda: count(conn, "succeeded") == runs, phase, process)
                figures = phase.stop(runs)
            process.stop()
        finally:
            process.kill()
        return figures


def admission(url: str, webhooks: int, phase: Phase) -> dict[str, Any]:
    with schema_app(url) as tidegate, ApiServer(url, tidegate.settings.schema, 1) as api:
        return asyncio.run(_admit(api.base, webhooks, phase))


async def _admit(base: str, webhooks: int, phase: Phase) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base, timeout=60) as admin:
        trigger = await create_trigger(admin, "capacity", "hook", "async", "noop")
    numbers = iter(range(webhooks))
    statuses: dict[int, int] = {}

    async def send(client: httpx.AsyncClient) -> None:
        for n in numbers:
            reply = await client.post(trigger["url"], json={"n": n})
            statuses[reply.status_code] = statuses.get(reply.status_code, 0) + 1

    clients = [httpx.AsyncClient(base_url=base, timeout=60) for _ in range(16)]
    try:
        phase.checkpoint()
        phase.start()
        await asyncio.gather(*(send(client) for client in clients))
        phase.sample()
        figures = phase.stop(webhooks)
    finally:
        for client in clients:
            await client.aclose()
    if statuses != {202: webhooks}:
        raise RuntimeError(f"webhooks not all accepted: {statuses}")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="What a run costs PostgreSQL, by phase.")
    parser.add_argument("--database-url", help="default: the embedded server of bench/")
    parser.add_argument("--runs", type=int, default=20_000)
    options = parser.parse_args(argv)
    url, runs = options.database_url, options.runs
    if url is None:
        from tidegate.storage.embedded import start_embedded

        url = start_embedded(EMBEDDED_DATA_DIR)
    phase = Phase(url)
    found: dict[str, Any] = {
        "server": phase.conn.info.server_version,
        "enqueue": enqueue(url, runs, phase),
        "single": single(url, runs // 10, phase),
        **claim_and_complete(url, phase),
        "drain": drain(url, runs, phase),
        "admission": admission(url, runs // 10, phase),
    }
    json.dump(found, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
