"""The raw-SQL queue: what a job queue on PostgreSQL costs at the least.

One table, one partial index for the claim, three statements, one asyncio worker. It
does what tidegate's hot path does, and nothing else: batched insert with ``unnest``
and a NOTIFY, a ``SKIP LOCKED`` claim of exactly as many jobs as there are free slots,
a no-op coroutine per job, completions written in batches with ``unnest``,
LISTEN/NOTIFY wake-ups with a poll as the safety net. Its worker commits claims
through the WAL flush and completions with ``synchronous_commit=off``, as tidegate's
worker does, so both pay for the same durability. No leases, heartbeats, retries,
lanes, idempotency keys, rescuer, stager or fairness: it is the practical limit, the
line every system is measured against, not a queue anyone should run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from bench.systems.base import Adapter, Job, OnStart

CHANNEL = "jobs"
COMPLETER_SYNCHRONOUS_COMMIT = "off"
"""As tidegate's worker commits its completions (its claims wait for the flush)."""

CREATE_JOBS = """
CREATE TABLE jobs (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text        NOT NULL DEFAULT 'default',
    kind         text        NOT NULL,
    args         jsonb       NOT NULL DEFAULT '{}',
    state        text        NOT NULL DEFAULT 'available',
    priority     smallint    NOT NULL DEFAULT 0,
    attempt      smallint    NOT NULL DEFAULT 0,
    scheduled_at timestamptz NOT NULL DEFAULT now(),
    inserted_at  timestamptz NOT NULL DEFAULT now(),
    attempted_at timestamptz,
    completed_at timestamptz
);
-- The claim's only index: available jobs in claim order.
CREATE INDEX jobs_claim ON jobs (priority, scheduled_at, id) WHERE state = 'available'
"""

# One round trip per batch; the NOTIFY rides in the same statement (one per statement,
# whatever the batch size), as tidegate's insert does.
INSERT_JOBS = """
WITH inserted AS (
    INSERT INTO jobs (kind, args)
    SELECT 'noop', a::jsonb FROM unnest(%(args)s::text[]) AS a
    RETURNING id
),
notified AS (SELECT pg_notify('jobs', 'default'))
SELECT count(*) FROM inserted, notified
"""

# The CTE picks (and locks) at most %(limit)s rows through jobs_claim; the UPDATE then
# touches exactly those.
CLAIM_JOBS = """
WITH picked AS (
    SELECT id FROM jobs
    WHERE state = 'available'
    ORDER BY priority, scheduled_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs
SET state = 'running', attempt = jobs.attempt + 1, attempted_at = now()
FROM picked
WHERE jobs.id = picked.id
RETURNING jobs.id, jobs.args
"""

# A batch of outcomes in one statement; the state guard makes a repeat a no-op.
COMPLETE_JOBS = """
UPDATE jobs SET state = 'completed', completed_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND state = 'running'
"""


class RawAdapter(Adapter):
    name = "raw"
    tables = ("jobs",)
    uvloop = True  # the limit: on the faster loop, as tidegate's worker

    async def install(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute(CREATE_JOBS)

    async def open(self) -> None:
        self.conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)

    async def close(self) -> None:
        await self.conn.close()

    async def enqueue_many(self, jobs: list[Job]) -> None:
        await self.conn.execute(INSERT_JOBS, {"args": [json.dumps(j.args) for j in jobs]})

    async def enqueue_one(self, job: Job) -> None:
        await self.enqueue_many([job])

    async def work(self, concurrency: int, on_start: OnStart, stop: asyncio.Event) -> None:
        await RawWorker(self.url, concurrency, on_start).run(stop)

    def count_done(self, conn: psycopg.Connection) -> int:
        row = conn.execute("SELECT count(*) FROM jobs WHERE state = 'completed'").fetchone()
        return int(row[0]) if row else 0

    def count_queued(self, conn: psycopg.Connection) -> int:
        row = conn.execute("SELECT count(*) FROM jobs WHERE state = 'available'").fetchone()
        return int(row[0]) if row else 0


class RawWorker:
    """``slots`` coroutines at most, three connections (claim, complete, listen).

    The claim loop wakes on a NOTIFY, on a slot freeing, or every ``poll_seconds``, and
    claims exactly the free slots. Finished jobs queue up for the completer, which
    writes whatever arrived while its last write ran: one job when idle, large batches
    when busy. The same shape as tidegate's workloop and completer, without the rest.
    """

    def __init__(self, url: str, slots: int, on_start: OnStart, poll_seconds: float = 1.0) -> None:
        self.conninfo = url
        self.completer_conninfo = make_conninfo(
            url, options=f"-c synchronous_commit={COMPLETER_SYNCHRONOUS_COMMIT}"
        )
        self.slots = slots
        self.on_start = on_start
        self.poll_seconds = poll_seconds
        self.running: set[asyncio.Task[None]] = set()
        self.finished: list[int] = []
        self.wake = asyncio.Event()
        self.flush = asyncio.Event()
        self.stopping = False

    async def run(self, stop: asyncio.Event) -> None:
        connect = psycopg.AsyncConnection.connect
        async with (
            await connect(self.conninfo, autocommit=True) as claimer,
            await connect(self.completer_conninfo, autocommit=True) as completer,
            await connect(self.conninfo, autocommit=True) as listener,
        ):
            await listener.execute(f"LISTEN {CHANNEL}")
            listening = asyncio.create_task(self.listen(listener), name="raw.listen")
            completing = asyncio.create_task(self.complete(completer), name="raw.complete")
            stopping = asyncio.create_task(self.stop_on(stop), name="raw.stop")
            self.wake.set()
            try:
                await self.claim_loop(claimer, completing)
            finally:
                # Stop claiming, let every job finish, and have the completer write them
                # all before it returns (cancelling it could cut a write in half).
                self.stopping = True
                if self.running:
                    await asyncio.gather(*self.running)
                self.flush.set()
                for task in (listening, stopping):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await completing

    async def stop_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stopping = True
        self.wake.set()

    async def claim_loop(
        self, conn: psycopg.AsyncConnection, completing: asyncio.Task[None]
    ) -> None:
        while not self.stopping and not completing.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.poll_seconds)
            self.wake.clear()
            while (free := self.slots - len(self.running)) > 0 and not self.stopping:
                cursor = await conn.execute(CLAIM_JOBS, {"limit": free})
                jobs = await cursor.fetchall()
                for job_id, args in jobs:
                    task = asyncio.create_task(self.execute(job_id, args))
                    self.running.add(task)
                if len(jobs) < free:
                    break

    async def execute(self, job_id: int, args: dict[str, Any]) -> None:
        self.on_start(args)
        await asyncio.sleep(0)  # a no-op coroutine: it yields once, as a handler would
        self.finished.append(job_id)
        self.flush.set()
        task = asyncio.current_task()
        if task is not None:
            self.running.discard(task)
        self.wake.set()

    async def listen(self, conn: psycopg.AsyncConnection) -> None:
        async for _ in conn.notifies():
            self.wake.set()

    async def complete(self, conn: psycopg.AsyncConnection) -> None:
        while True:
            await self.flush.wait()
            self.flush.clear()
            while self.finished:
                batch, self.finished = self.finished, []
                await conn.execute(COMPLETE_JOBS, {"ids": batch})
            if self.stopping and not self.running and not self.finished:
                return


ADAPTER = RawAdapter
