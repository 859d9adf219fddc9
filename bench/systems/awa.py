"""awa (PyPI ``awa-pg``): a PostgreSQL job queue with a Rust core, driven from Python.

Everything goes through awa's public Python API (``awa.AsyncClient``), as its README
and ``docs/`` describe it for awa 0.6:

- ``install``: ``awa.migrate(url)`` (docs/migrations.md, "Fresh Install"), then
  ``AsyncClient.install_queue_storage()``, which activates the queue-storage engine
  (ADR-019/023: append-only ready entries, rotating lease/claim/receipt rings), the
  engine awa 0.6 runs. On a fresh database awa would otherwise activate it only when a
  worker first starts (``storage_auto_finalize_if_fresh``), and the workloads enqueue
  before any worker starts, which would pin the database to the legacy "canonical"
  engine; awa's own Python benchmark adapter (``benchmarks/portable/awa-python-bench``
  in its repository) installs the same way.
- ``enqueue_many``: ``AsyncClient.enqueue_many_copy`` -- the README's "COPY ingestion"
  path that "streams directly into queue storage for high-volume Python producers".
- ``enqueue_one``: ``AsyncClient.insert``, one job in its own transaction.
- ``work``: awa's own worker runtime in-process: ``@client.task(dict, kind="noop")``,
  ``client.start([(QUEUE, concurrency)], poll_interval_ms=50)`` (hard-reserved mode,
  ``max_workers`` = 32 for the queue), and on stop ``client.shutdown()``, its graceful
  shutdown that stops claiming and drains in-flight jobs and their completions.

Settings: LISTEN/NOTIFY is always on in awa (every enqueue issues
``pg_notify('awa:<queue>')`` and the dispatcher listens); there is no switch. The poll
interval is the safety net under it: 50 ms instead of the 200 ms default, the value
awa's own benchmark adapter uses (docs/configuration.md: "Tune if NOTIFY latency
matters"). Everything else is awa's default: queue-storage ring sizes and rotation
intervals, a 10-connection pool, one claimer per queue, no striping.

Counting: completed jobs are not rows of one table. A completion is recorded as an item
of a compact receipt batch (``receipt_completion_batches``) or as a ``done_entries`` row,
which awa's ``awa.terminal_jobs`` view reads back; once a ready-ring segment is pruned
its completed jobs survive only as per-lane counters (``queue_terminal_rollups``, with
the legacy ``queue_lanes.pruned_completed_count``); with the default 16 slots rotated
every second that happens within about 20 s, well inside a full-size run.
``count_done`` adds all three; ``count_queued`` counts what the ``awa.jobs`` view calls
``available``. Both follow the definitions of awa's views but read the tables
directly, since the views plan badly on fresh partitions (see the queries below).

Fairness: none. awa 0.6 controls execution per queue (hard-reserved or weighted
per-queue concurrency, rate limits, priority aging); ``ordering_key`` and
``PartitionedQueue`` route keys to shards or physical queues for ordering and
throughput, and its docs say ``ordering_key`` gives no per-key concurrency guarantee.
Per-key execution control (``concurrency_key``, ADR-033) is accepted for 0.7 but not
shipped in 0.6.9. So the starvation workload runs on one plain FIFO queue.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import awa
import psycopg

from bench.systems.base import Adapter, Job, OnStart

QUEUE = "bench"
KIND = "noop"
POLL_INTERVAL_MS = 50
"""The poll under LISTEN/NOTIFY, as awa's own benchmark adapter sets it (default 200)."""
SHUTDOWN_TIMEOUT_MS = 30_000
"""How long ``shutdown`` may drain in-flight jobs (no-ops: far more than needed)."""

# Completed jobs, as awa's ``awa.terminal_jobs`` view defines them, plus the pruned ones:
# ``done_entries`` rows in state completed; the items of the compact receipt completion
# batches that no ``receipt_completion_tombstones`` row withdraws (the view joins each
# item to its ready row only to fill in columns, and the planner turns that join
# quadratic on fresh, unanalysed partitions: over a second at 1,000 jobs); and the jobs
# whose ready-ring segment was pruned, kept as per-lane counters. The last term is the
# sum awa's own queue-storage tests read: the legacy lane counter and the rollup may
# both hold a lane's pruned count during upgrades, hence GREATEST rather than a sum.
COUNT_DONE = """
SELECT
    (SELECT count(*) FROM awa.done_entries WHERE state = 'completed')
    + (SELECT count(*)
       FROM awa.receipt_completion_batches AS batch
       CROSS JOIN LATERAL unnest(batch.job_ids, batch.run_leases) AS item (job_id, run_lease)
       WHERE NOT EXISTS (
           SELECT 1 FROM awa.receipt_completion_tombstones AS tomb
           WHERE tomb.ready_slot = batch.ready_slot
             AND tomb.ready_generation = batch.ready_generation
             AND tomb.job_id = item.job_id
             AND tomb.run_lease = item.run_lease))
    + (SELECT COALESCE(sum(GREATEST(
                COALESCE(lanes.pruned_completed_count, 0),
                COALESCE(rollups.pruned_completed_count, 0))), 0)
       FROM awa.queue_lanes AS lanes
       FULL OUTER JOIN awa.queue_terminal_rollups AS rollups USING (queue, priority))
"""

# Available jobs, as the ``awa.jobs`` view defines them under queue storage: ready rows at
# or past their lane's claim cursor that no ready tombstone withdraws. The cursor is a
# sequence read once per lane here (the view reads it once per row: 1.5 s at 20,000).
COUNT_QUEUED = """
WITH heads AS MATERIALIZED (
    SELECT queue, priority, enqueue_shard, awa.sequence_next_value(seq_name) AS next_seq
    FROM awa.queue_claim_heads
)
SELECT count(*)
FROM awa.ready_entries AS ready
JOIN heads USING (queue, priority, enqueue_shard)
WHERE ready.lane_seq >= heads.next_seq
  AND NOT EXISTS (
      SELECT 1 FROM awa.ready_tombstones AS tomb
      WHERE tomb.ready_slot = ready.ready_slot
        AND tomb.ready_generation = ready.ready_generation
        AND tomb.queue = ready.queue
        AND tomb.priority = ready.priority
        AND tomb.enqueue_shard = ready.enqueue_shard
        AND tomb.lane_seq = ready.lane_seq)
"""


def socket_url(url: str) -> str:
    """Give a URL with no host (a Unix socket named by ``?host=``) a placeholder host.

    awa's driver refuses ``postgresql://user@/db?host=/dir`` ("empty host") but takes
    the socket from ``?host=`` when the authority names any host.
    """
    parts = urlsplit(url)
    if parts.hostname or "host=" not in parts.query:
        return url
    return urlunsplit(parts._replace(netloc=f"{parts.netloc}localhost"))


class AwaAdapter(Adapter):
    name = "awa"
    # The backlog (ready entries, a partitioned table: VACUUM covers its partitions) and
    # the per-lane counter rows that every enqueue batch updates.
    tables = ("awa.ready_entries", "awa.queue_lanes", "awa.queue_enqueue_heads")

    def __init__(self, url: str) -> None:
        super().__init__(socket_url(url))

    async def install(self) -> None:
        await awa.migrate(self.url)
        client = awa.AsyncClient(self.url)
        try:
            await client.install_queue_storage()
        finally:
            await client.close()

    async def open(self) -> None:
        self.client = awa.AsyncClient(self.url)

    async def close(self) -> None:
        await self.client.close()

    async def enqueue_many(self, jobs: list[Job]) -> None:
        await self.client.enqueue_many_copy([j.args for j in jobs], kind=KIND, queue=QUEUE)

    async def enqueue_one(self, job: Job) -> None:
        await self.client.insert(job.args, kind=KIND, queue=QUEUE)

    async def work(self, concurrency: int, on_start: OnStart, stop: asyncio.Event) -> None:
        client = awa.AsyncClient(self.url)

        @client.task(dict, kind=KIND, queue=QUEUE)
        async def noop(job: awa.Job[dict[str, Any]]) -> None:
            on_start(job.args)

        try:
            await client.start([(QUEUE, concurrency)], poll_interval_ms=POLL_INTERVAL_MS)
            await stop.wait()
            await client.shutdown(timeout_ms=SHUTDOWN_TIMEOUT_MS)
        finally:
            await client.close()

    def count_done(self, conn: psycopg.Connection) -> int:
        row = conn.execute(COUNT_DONE).fetchone()
        return int(row[0]) if row else 0

    def count_queued(self, conn: psycopg.Connection) -> int:
        row = conn.execute(COUNT_QUEUED).fetchone()
        return int(row[0]) if row else 0


ADAPTER = AwaAdapter
