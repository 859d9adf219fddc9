"""procrastinate 3.x: its own App, task, batch defer and worker, over psycopg 3.

The path measured, all of it procrastinate's public, documented API:

- schema: ``app.schema_manager.apply_schema_async()`` on an open app (what ``procrastinate
  schema --apply`` does), in the empty database;
- connector: ``PsycopgConnector`` (psycopg 3 and its ``AsyncConnectionPool``), the async
  connector its docs recommend ("howto/basics/connector");
- enqueue: one task, ``noop``, its kwargs the job's args; a batch is
  ``task.batch_defer_async(*kwargs)`` ("howto/basics/batch_defer": one call, one
  ``procrastinate_defer_jobs_v1`` statement for the whole batch), one job is
  ``task.defer_async(**kwargs)`` in its own transaction;
- work: ``app.run_worker_async(...)`` run as an asyncio task in the worker process, and
  stopped the way "howto/advanced/shutdown" and "howto/basics/worker" document for a
  worker inside a bigger application: ``install_signal_handlers=False`` (the driver owns
  SIGTERM) and ``task.cancel()``, after which the worker stops fetching, waits for its
  running jobs (no ``shutdown_graceful_timeout``: however long they take), records their
  outcome, unregisters and returns.

Worker settings, from the docs, for short jobs at ``concurrency=32``:

- ``concurrency=32``: async sub-workers; the task is an ``async def``, as the docs ask
  for concurrency ("howto/concurrency");
- ``listen_notify=True`` (the default): a dedicated connection LISTENs, and every
  inserted job wakes the worker;
- ``fetch_job_polling_interval=5.0`` (the default): with LISTEN/NOTIFY on, polling is
  only the fallback and "can reasonably be set to a higher value" (``run_worker_async``
  docstring), so it is not lowered;
- pool ``min_size = max_size = concurrency + 1``: "The shorter your average job execution
  time, the more your pool will need to contain as many connections as your concurrency
  (plus one)" (discussions, "Mind the size of your PostgreSQL pool"); the LISTEN
  connection is outside the pool. The enqueueing side keeps psycopg's default pool.
- everything else at its default: jobs kept after completion (``delete_jobs="never"``, so
  ``count_done`` can read them), abort polling and heartbeat at 5 s and 10 s.

Fairness: none. procrastinate has ``lock`` (jobs sharing a lock run one at a time, in
order), ``queueing_lock`` (at most one waiting job per key), priorities and queues, but
no documented per-key fairness or per-key concurrency limit that would keep one hot
tenant from starving cold ones. The starvation workload therefore runs on one plain
queue, fetched in ``priority DESC, id ASC`` order, i.e. first in first out, and
``Job.tenant`` is not used.

procrastinate logs every job start and end at INFO; its loggers are held at WARNING.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import procrastinate
import psycopg

from bench.systems.base import Adapter, Job, OnStart

TASK = "noop"
logging.getLogger("procrastinate").setLevel(logging.WARNING)


class ProcrastinateAdapter(Adapter):
    name = "procrastinate"
    # Deferring a job inserts a row in each (the job, its "deferred" event).
    tables = ("procrastinate_jobs", "procrastinate_events")

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.on_start: OnStart | None = None
        self.app = self.make_app()

    def make_app(self, **pool: Any) -> procrastinate.App:
        """An app on ``self.url`` with the ``noop`` task; ``pool``: AsyncConnectionPool args."""
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=self.url, **pool))

        async def noop(**args: Any) -> None:
            assert self.on_start is not None, "a job ran outside of work()"
            self.on_start(args)

        self.task = app.task(name=TASK)(noop)
        return app

    async def install(self) -> None:
        async with self.app.open_async():
            await self.app.schema_manager.apply_schema_async()

    async def open(self) -> None:
        await self.app.open_async()

    async def close(self) -> None:
        await self.app.close_async()

    async def enqueue_many(self, jobs: list[Job]) -> None:
        await self.task.batch_defer_async(*(job.args for job in jobs))

    async def enqueue_one(self, job: Job) -> None:
        await self.task.defer_async(**job.args)

    async def work(self, concurrency: int, on_start: OnStart, stop: asyncio.Event) -> None:
        self.on_start = on_start
        app = self.make_app(min_size=concurrency + 1, max_size=concurrency + 1)
        async with app.open_async():
            worker = asyncio.create_task(
                app.run_worker_async(
                    concurrency=concurrency,
                    listen_notify=True,
                    fetch_job_polling_interval=5.0,
                    install_signal_handlers=False,
                ),
                name="procrastinate.worker",
            )
            stopping = asyncio.create_task(stop.wait(), name="procrastinate.stop")
            await asyncio.wait({worker, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not worker.done():
                # The documented graceful stop: cancel the run_worker_async task once; it
                # stops fetching, waits for its running jobs and records their outcome.
                worker.cancel()
                await asyncio.wait({worker})
            if not worker.cancelled() and (error := worker.exception()) is not None:
                raise error
            if not stop.is_set():
                raise RuntimeError("procrastinate's worker stopped before it was asked to")

    def count_done(self, conn: psycopg.Connection) -> int:
        return self._count(conn, "succeeded")

    def count_queued(self, conn: psycopg.Connection) -> int:
        return self._count(conn, "todo")

    @staticmethod
    def _count(conn: psycopg.Connection, status: str) -> int:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = %s::procrastinate_job_status",
            (status,),
        ).fetchone()
        return int(row[0]) if row else 0


ADAPTER = ProcrastinateAdapter
