"""oban (oban-py 0.7.0, the Python port of Oban) through its own public API.

- ``install``: ``oban.schema.install(pool)``, the function behind ``oban install`` (which
  runs it on a one-connection pool, as here).
- ``enqueue_many``: ``Oban.enqueue_many(jobs)`` on a client-mode instance (``Oban(pool=...)``
  without queues), its documented batch path: one pooled connection, one transaction. The
  open-source build sends one ``INSERT ... RETURNING`` (plus its ``pg_notify``) per job in
  that transaction; bulk inserts are an Oban Pro feature. ``enqueue_one``: ``Oban.enqueue``,
  which commits its own transaction.
- ``work``: an embedded ``Oban(pool=pool, queues={"default": concurrency})`` (the documented
  embedded form of ``oban start --queues default:32``), run with ``async with`` until
  ``stop`` is set; leaving the block is Oban's graceful stop: the producer stops fetching,
  waits for running jobs (``shutdown_grace_period``, 15 s by default) and writes their acks
  before it returns. The worker is one ``@worker`` class whose ``process`` calls
  ``on_start(job.args)`` and returns ``None`` (recorded ``completed``).

Settings, all oban's defaults, which are already the low-latency ones: the PostgreSQL
notifier (LISTEN/NOTIFY; every insert notifies, and the notification makes the queue's
producer fetch at once), the stager's 1 s interval as the poll that catches anything a
notification missed, the producer's 5 ms debounce that batches acks and fetches under
load, leadership on (lifeline, pruner and refresher run as in production; the pruner only
deletes jobs older than a day), and ``Oban.create_pool``'s pool of at most 10 connections
(the production guide: workers borrow connections only to fetch and ack). As ``oban
start`` does, the worker process decodes and encodes JSON with orjson; what ``oban start``
also does and this cannot is run on uvloop, since the driver owns the event loop. No
telemetry logger is attached (``oban start`` attaches one; it logs every job).

Fairness: none. Partitioned queues and global limits by key ("Smart Concurrency") are
Oban Pro features in the Python port too (the package README lists them under Oban Pro);
open-source oban-py has plain per-queue limits and priorities only, so the starvation
workload runs on the one plain ``default`` queue and ``Job.tenant`` is not used.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import orjson
import psycopg
from oban import Job as ObanJob
from oban import Oban, worker
from oban.schema import install as install_schema
from psycopg.types.json import set_json_dumps, set_json_loads
from psycopg_pool import AsyncConnectionPool

from bench.systems.base import Adapter, Job, OnStart

QUEUE = "default"


@worker(queue=QUEUE)
class Noop:
    """The benchmark's job: report its start, then return (completed)."""

    on_start: ClassVar[OnStart | None] = None
    """Set by ``ObanAdapter.work`` in the worker process."""

    async def process(self, job: ObanJob) -> None:
        if Noop.on_start is not None:
            Noop.on_start(job.args)


def new_job(job: Job) -> ObanJob:
    made: ObanJob = Noop.new(job.args)  # type: ignore[attr-defined]
    return made


class ObanAdapter(Adapter):
    name = "oban"
    tables = ("oban_jobs",)

    async def install(self) -> None:
        pool = await Oban.create_pool(self.url, min_size=1, max_size=1)
        try:
            await install_schema(pool)
        finally:
            await pool.close()

    async def open(self) -> None:
        self.pool: AsyncConnectionPool = await Oban.create_pool(self.url)
        self.oban = Oban(pool=self.pool)  # client mode: enqueue only, nothing to start

    async def close(self) -> None:
        await self.pool.close()

    async def enqueue_many(self, jobs: list[Job]) -> None:
        await self.oban.enqueue_many([new_job(job) for job in jobs])

    async def enqueue_one(self, job: Job) -> None:
        await self.oban.enqueue(new_job(job))

    async def work(self, concurrency: int, on_start: OnStart, stop: asyncio.Event) -> None:
        set_json_dumps(orjson.dumps)
        set_json_loads(orjson.loads)
        Noop.on_start = on_start
        pool = await Oban.create_pool(self.url)
        try:
            async with Oban(pool=pool, queues={QUEUE: concurrency}):
                await stop.wait()
        finally:
            await pool.close()

    def count_done(self, conn: psycopg.Connection[Any]) -> int:
        return self._count(conn, "completed")

    def count_queued(self, conn: psycopg.Connection[Any]) -> int:
        return self._count(conn, "available")

    @staticmethod
    def _count(conn: psycopg.Connection[Any], state: str) -> int:
        row = conn.execute(
            "SELECT count(*) FROM oban_jobs WHERE state = %s::oban_job_state", (state,)
        ).fetchone()
        return int(row[0]) if row else 0


ADAPTER = ObanAdapter
