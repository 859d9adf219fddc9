"""The raw-SQL queue: what a job queue on PostgreSQL costs at the least.

One table, one partial index for the claim, three statements, one asyncio worker
process. It does what tidegate's hot path does, and nothing else: batched insert with
``unnest`` and a NOTIFY, a ``SKIP LOCKED`` claim of exactly as many jobs as there are
free slots, a no-op coroutine per job, completions written in batches with ``unnest``,
LISTEN/NOTIFY wake-ups with a poll as the safety net. Its worker commits claims and
completions the way tidegate's worker does (``--synchronous-commit``, which the harness
reads from tidegate), so both sides pay for the same durability. No leases, heartbeats, retries,
lanes, idempotency keys, rescuer or stager: it is the practical limit, the line tidegate
is measured against, not a queue anyone should run.

The harness calls ``measure_enqueue``, ``measure_drain`` and ``measure_wakeup``; the
worker is this module run as a program::

    python -m bench.raw --database-url URL --schema SCHEMA --slots 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.harness import (
    BenchError,
    WorkerProcess,
    child_env,
    fresh_schema,
    paced,
    python_module,
    schema_conninfo,
    settle,
    wait_for,
    wakeup_figures,
)

READY = "raw worker ready"
LOAD_BATCH = 5000
"""Rows per insert when filling the queue before a drain (not measured)."""

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
    completed_at timestamptz,
    result       jsonb
);
-- The claim's only index: available jobs in claim order.
CREATE INDEX jobs_claim ON jobs (priority, scheduled_at, id) WHERE state = 'available'
"""

# One round trip per batch; the NOTIFY rides in the same statement (one per statement,
# whatever the batch size), as tidegate's insert does.
INSERT_JOBS = """
WITH inserted AS (
    INSERT INTO jobs (queue, kind, args)
    SELECT %(queue)s, j.kind, j.args::jsonb
    FROM unnest(%(kind)s::text[], %(args)s::text[]) AS j(kind, args)
    RETURNING id
),
notified AS (SELECT pg_notify(%(channel)s, %(queue)s))
SELECT inserted.id FROM inserted, notified
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
RETURNING jobs.id, jobs.kind, jobs.args
"""

# A batch of outcomes in one statement; the state guard makes a repeat a no-op.
COMPLETE_JOBS = """
UPDATE jobs
SET state = 'completed', completed_at = now(), result = o.result::jsonb
FROM unnest(%(id)s::bigint[], %(result)s::text[]) AS o(id, result)
WHERE jobs.id = o.id AND jobs.state = 'running'
"""

# Everything the harness needs to believe a figure: every job there, finished once.
CHECK_JOBS = """
SELECT count(*),
       count(*) FILTER (WHERE state = 'completed'),
       coalesce(max(attempt), 0),
       min(attempted_at),
       max(completed_at)
FROM jobs
"""

COUNT_COMPLETED = "SELECT count(*) FROM jobs WHERE state = 'completed'"

# Per wake-up run: the client's send time (in its args), the insert's and the claim's
# transaction start, the handler's start (its result); all Unix seconds.
WAKEUP_SAMPLES = """
SELECT (args->>'enqueued_at')::float8,
       extract(epoch FROM inserted_at)::float8,
       extract(epoch FROM attempted_at)::float8,
       (result->>'started_at')::float8
FROM jobs
WHERE args ? 'enqueued_at'
"""


def channel_name(schema: str) -> str:
    return f"{schema}.jobs"


def create(url: str, schema: str) -> None:
    with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
        conn.execute(CREATE_JOBS)


def insert(conn: psycopg.Connection, schema: str, kind: str, args: list[str]) -> list[int]:
    """Insert jobs of one kind (``args`` as JSON text); return their ids."""
    cursor = conn.execute(
        INSERT_JOBS,
        {
            "queue": "default",
            "kind": [kind] * len(args),
            "args": args,
            "channel": channel_name(schema),
        },
    )
    return [row[0] for row in cursor.fetchall()]


def completed(conn: psycopg.Connection) -> int:
    row = conn.execute(COUNT_COMPLETED).fetchone()
    return int(row[0]) if row else 0


def check(conn: psycopg.Connection, runs: int) -> dict[str, Any]:
    """Read back what the worker did; raise unless every job completed exactly once."""
    row = conn.execute(CHECK_JOBS).fetchone()
    assert row is not None
    total, finished, max_attempt, first_attempted, last_completed = row
    found = {"total": total, "finished": finished, "max_attempt": max_attempt}
    if not (total == finished == runs and max_attempt == 1):
        raise BenchError(f"raw: expected {runs} jobs completed once each, found {found}")
    return {**found, "first_attempted": first_attempted, "last_completed": last_completed}


def worker_argv(url: str, schema: str, slots: int, synchronous_commit: str) -> list[str]:
    return python_module(
        "bench.raw",
        "--database-url",
        url,
        "--schema",
        schema,
        "--slots",
        str(slots),
        "--synchronous-commit",
        synchronous_commit,
    )


# -- the three workloads ---------------------------------------------------------------


def measure_enqueue(url: str, runs: int, batch: int) -> dict[str, Any]:
    """Insert ``runs`` jobs in batches on one connection; return runs/s."""
    with fresh_schema(url, "raw") as schema:
        create(url, schema)
        with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
            started = time.perf_counter()
            for first in range(0, runs, batch):
                args = [json.dumps({"i": i}) for i in range(first, min(first + batch, runs))]
                insert(conn, schema, "noop", args)
            seconds = time.perf_counter() - started
            row = conn.execute(
                "SELECT count(*), count(DISTINCT args->>'i') FROM jobs WHERE state = 'available'"
            ).fetchone()
        if row != (runs, runs):
            raise BenchError(f"raw enqueue: expected {runs} distinct jobs, found {row}")
        return {"runs": runs, "seconds": seconds, "rate": runs / seconds, "verified": True}


def measure_drain(
    url: str, runs: int, slots: int, synchronous_commit: str = "on"
) -> dict[str, Any]:
    """Fill the queue, start one worker, time first claim to last completion."""
    with fresh_schema(url, "raw") as schema:
        create(url, schema)
        with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
            for first in range(0, runs, LOAD_BATCH):
                size = min(LOAD_BATCH, runs - first)
                args = [json.dumps({"i": i}) for i in range(first, first + size)]
                insert(conn, schema, "noop", args)
            settle(url, schema, "jobs")
            argv = worker_argv(url, schema, slots, synchronous_commit)
            with WorkerProcess(argv, child_env(), READY) as worker:
                done = wait_for(
                    lambda: completed(conn) >= runs,
                    timeout=max(60.0, runs / 100),
                    what="raw drain",
                    worker=worker,
                    interval=0.25,
                )
                worker.stop()
            found = check(conn, runs)
        seconds = (found.pop("last_completed") - found.pop("first_attempted")).total_seconds()
        return {
            "runs": runs,
            "seconds": seconds,
            "rate": runs / seconds,
            "wall_seconds": done - worker.started_at,
            "verified": True,
            **found,
        }


def measure_wakeup(
    url: str, runs: int, interval: float, warmup: int, slots: int, synchronous_commit: str = "on"
) -> dict[str, Any]:
    """Enqueue one job every ``interval`` seconds to an idle worker; time each wake-up."""
    with fresh_schema(url, "raw") as schema:
        create(url, schema)
        with (
            psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn,
            WorkerProcess(
                worker_argv(url, schema, slots, synchronous_commit), child_env(), READY
            ) as worker,
        ):
            worker.wait_ready()
            for _ in paced(warmup, interval):
                insert(conn, schema, "wakeup", [json.dumps({"warmup": True})])
            wait_for(lambda: completed(conn) >= warmup, timeout=30, what="raw warm-up")
            for k in paced(runs, interval):
                insert(conn, schema, "wakeup", [json.dumps({"k": k, "enqueued_at": time.time()})])
            wait_for(
                lambda: completed(conn) >= warmup + runs,
                timeout=30,
                what="raw wake-up",
                worker=worker,
            )
            worker.stop()
            check(conn, warmup + runs)
            rows = conn.execute(WAKEUP_SAMPLES).fetchall()
        return {**wakeup_figures(rows), "runs": runs, "verified": len(rows) == runs}


# -- the worker ------------------------------------------------------------------------


async def noop(args: dict[str, Any]) -> None:
    return None


async def wakeup(args: dict[str, Any]) -> dict[str, float]:
    return {"started_at": time.time()}


HANDLERS: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]] = {
    "noop": noop,
    "wakeup": wakeup,
}


class RawWorker:
    """One process, ``slots`` coroutines at most, three connections (claim, complete,
    listen).

    The claim loop wakes on a NOTIFY, on a slot freeing, or every ``poll_seconds``, and
    claims exactly the free slots. Finished jobs queue up for the completer, which
    writes whatever arrived while its last write ran: one job when idle, large batches
    when busy. The same shape as tidegate's workloop and completer, without the rest.
    """

    def __init__(
        self,
        url: str,
        schema: str,
        slots: int,
        poll_seconds: float = 1.0,
        synchronous_commit: str = "on",
    ) -> None:
        self.conninfo = make_conninfo(
            schema_conninfo(url, schema),
            options=f"-c search_path={schema} -c synchronous_commit={synchronous_commit}",
        )
        self.channel = channel_name(schema)
        self.slots = slots
        self.poll_seconds = poll_seconds
        self.running: set[asyncio.Task[None]] = set()
        self.finished: list[tuple[int, str | None]] = []
        self.wake = asyncio.Event()
        self.flush = asyncio.Event()
        self.stopping = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stop)
        connect = psycopg.AsyncConnection.connect
        async with (
            await connect(self.conninfo, autocommit=True) as claimer,
            await connect(self.conninfo, autocommit=True) as completer,
            await connect(self.conninfo, autocommit=True) as listener,
        ):
            await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
            listening = asyncio.create_task(self.listen(listener), name="raw.listen")
            completing = asyncio.create_task(self.complete(completer), name="raw.complete")
            print(READY, file=sys.stderr, flush=True)
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
                listening.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listening
                await completing

    def stop(self) -> None:
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
                for job_id, kind, args in jobs:
                    task = asyncio.create_task(self.execute(job_id, kind, args))
                    self.running.add(task)
                if len(jobs) < free:
                    break

    async def execute(self, job_id: int, kind: str, args: dict[str, Any]) -> None:
        result = await HANDLERS[kind](args)
        self.finished.append((job_id, None if result is None else json.dumps(result)))
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
            await self.write(conn)
            if self.stopping and not self.running and not self.finished:
                return

    async def write(self, conn: psycopg.AsyncConnection) -> None:
        while self.finished:
            batch, self.finished = self.finished, []
            await conn.execute(
                COMPLETE_JOBS,
                {"id": [job_id for job_id, _ in batch], "result": [r for _, r in batch]},
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.raw", description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--poll-seconds", type=float, default=1.0)
    parser.add_argument(
        "--synchronous-commit",
        choices=("on", "off"),
        default="on",
        help="how claims and completions commit (the harness passes tidegate's worker's)",
    )
    options = parser.parse_args(argv)
    worker = RawWorker(
        options.database_url,
        options.schema,
        options.slots,
        options.poll_seconds,
        options.synchronous_commit,
    )
    asyncio.run(worker.run())


if __name__ == "__main__":
    main()
