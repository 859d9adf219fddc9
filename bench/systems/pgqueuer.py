"""pgqueuer 1.6.0 on asyncpg: its installer, its batch enqueue, its own worker.

Driver: asyncpg. pgqueuer's docs present it as the main path and the fastest one: the
README quick start and every worker example use it, the core-concepts driver table
marks ``AsyncpgDriver`` (one connection) "Workers (recommended)", the performance
guide says to run the ``QueueManager`` on a direct asyncpg connection, and the
benchmark page measures asyncpg at about 1.7x psycopg. asyncpg comes with the
``pgqueuer[asyncpg]`` extra (``bench/systems/__init__.py``).

- ``install``: ``Queries.install()``, what ``pgq install`` runs (durability
  ``durable``, the default: every table logged, as the other systems' are), then
  ``Queries.optimize_autovacuum()``, what ``pgq autovac`` runs, which the
  performance-tuning guide's checklist says to run after installing (aggressive
  autovacuum and fillfactor 70 on the queue table, lazy autovacuum on the log).
- ``enqueue_many``: ``Queries.enqueue(entrypoints, payloads, priorities)`` with lists,
  its batch form: one ``unnest`` statement that inserts the jobs and their ``queued``
  log rows; the table's statement-level trigger sends the NOTIFY.
- ``enqueue_one``: ``Queries.enqueue(entrypoint, payload)``, one autocommit statement.
- ``work``: ``PgQueuer.from_asyncpg_connection(...)`` with one ``async`` entrypoint,
  ``PgQueuer.run(...)`` as ``pgq run`` runs it; the benchmark's ``stop`` sets
  ``PgQueuer.shutdown``, on which pgqueuer stops dequeueing, waits for its in-flight
  tasks and flushes their buffered completions before ``run`` returns (its graceful
  shutdown). Settings, from the performance-tuning guide:

  - ``max_concurrent_tasks=concurrency`` (32): its per-worker cap on picked jobs,
    enforced in the dequeue query. (The entrypoint's ``concurrency_limit`` is a
    fleet-wide cap counted in SQL on every dequeue; it is left unlimited.)
  - ``batch_size=concurrency // 2`` (16): the guide says to raise it from the default
    10 for short jobs, and pgqueuer requires ``max_concurrent_tasks >= 2 *
    batch_size``, so 16 is the largest it accepts at 32. Completions are written in
    batches of the same size (or every 0.1 s, its buffer's timer).
  - everything else at its default: ``dequeue_timeout`` 30 s (the poll fallback;
    wake-ups come from LISTEN/NOTIFY), ``heartbeat_timeout`` 30 s,
    ``log_aggregation_interval`` 30 s.

  The event loop is the driver's asyncio loop, not the uvloop that the ``pgq`` CLI
  would install.

- ``count_queued``: rows of ``pgqueuer`` with status ``queued``.
- ``count_done``: pgqueuer deletes a finished job from ``pgqueuer`` and writes a
  ``successful`` row to ``pgqueuer_log`` in the same statement (``Queries.log_jobs``);
  its periodic aggregation into ``pgqueuer_statistics`` only marks log rows
  ``aggregated`` and never deletes them, so the log's ``successful`` rows count every
  completed job exactly once.

Fairness: none. pgqueuer's documented controls are per-entrypoint concurrency limits,
priorities and deferral; it has no per-key (per-tenant) fair claiming, so every job
goes to the one ``noop`` entrypoint and the starvation workload runs FIFO (the
default ``fairness``). An entrypoint per tenant would be an invention, not a feature.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import asyncpg
import psycopg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job as PgqJob
from pgqueuer.queries import Queries

from bench.systems.base import Adapter, Job, OnStart

ENTRYPOINT = "noop"
QUEUE_TABLE = "pgqueuer"
LOG_TABLE = "pgqueuer_log"
"""pgqueuer's default object names (no ``PGQUEUER_PREFIX``)."""
DEQUEUE_TIMEOUT = timedelta(seconds=30)
HEARTBEAT_TIMEOUT = timedelta(seconds=30)
LOG_AGGREGATION_INTERVAL = timedelta(seconds=30)
"""pgqueuer's defaults, spelled out."""


def payload(job: Job) -> bytes:
    return json.dumps(job.args).encode()


class PgqueuerAdapter(Adapter):
    name = "pgqueuer"
    tables = (QUEUE_TABLE, LOG_TABLE)

    async def install(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            queries = Queries(AsyncpgDriver(conn))
            await queries.install()
            await queries.optimize_autovacuum()
        finally:
            await conn.close()

    async def open(self) -> None:
        self.conn = await asyncpg.connect(self.url)
        self.queries = Queries(AsyncpgDriver(self.conn))

    async def close(self) -> None:
        await self.conn.close()

    async def enqueue_many(self, jobs: list[Job]) -> None:
        await self.queries.enqueue(
            [ENTRYPOINT] * len(jobs), [payload(j) for j in jobs], [0] * len(jobs)
        )

    async def enqueue_one(self, job: Job) -> None:
        await self.queries.enqueue(ENTRYPOINT, payload(job))

    async def work(self, concurrency: int, on_start: OnStart, stop: asyncio.Event) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            pgq = PgQueuer.from_asyncpg_connection(conn)

            @pgq.entrypoint(ENTRYPOINT)
            async def noop(job: PgqJob) -> None:
                on_start(json.loads(job.payload or b"{}"))

            running = asyncio.create_task(
                pgq.run(
                    dequeue_timeout=DEQUEUE_TIMEOUT,
                    batch_size=max(1, concurrency // 2),
                    max_concurrent_tasks=concurrency,
                    heartbeat_timeout=HEARTBEAT_TIMEOUT,
                    log_aggregation_interval=LOG_AGGREGATION_INTERVAL,
                ),
                name="pgqueuer.run",
            )
            stopping = asyncio.create_task(stop.wait(), name="pgqueuer.stop")
            await asyncio.wait((running, stopping), return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            # Graceful: pgqueuer stops dequeueing, awaits its running jobs and flushes
            # their completions to the database before run() returns.
            pgq.shutdown.set()
            await running
        finally:
            await conn.close()

    def count_done(self, conn: psycopg.Connection) -> int:
        row = conn.execute(
            f"SELECT count(*) FROM {LOG_TABLE} WHERE status = 'successful'"
        ).fetchone()
        return int(row[0]) if row else 0

    def count_queued(self, conn: psycopg.Connection) -> int:
        row = conn.execute(f"SELECT count(*) FROM {QUEUE_TABLE} WHERE status = 'queued'").fetchone()
        return int(row[0]) if row else 0


ADAPTER = PgqueuerAdapter
