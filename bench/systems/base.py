"""What every system under comparison provides: the adapter the driver measures through.

An adapter runs inside its system's own virtual environment (``bench/envs.py``), in the
driver process (enqueue, verification) and in one worker process that the driver starts
(``python -m bench.driver worker SYSTEM``). It is written with the system's own public,
documented API and its fastest documented path: batch enqueue where the system has
one, its own worker with the concurrency asked for.

Every job carries a tenant and small JSON args. The worker calls ``on_start(args)`` as
the first thing a job's handler does, and then returns: the jobs are no-ops, so what is
measured is the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import psycopg


@dataclass(frozen=True)
class Job:
    """One job to enqueue: whose it is (the fairness key, where a system has one), its args."""

    tenant: str
    args: dict[str, Any]


OnStart = Callable[[dict[str, Any]], None]
"""Called by the handler with the job's args, first thing when a job starts."""


class Adapter:
    """One system: how to install it, enqueue to it, work its jobs and read them back."""

    name: ClassVar[str]
    tables: ClassVar[tuple[str, ...]] = ()
    """Tables (``schema.table`` where not public) to ``VACUUM ANALYZE`` after a backlog load."""
    fairness: ClassVar[str] = "none: one plain queue, first in first out"
    """How the starvation workload uses the system: its per-key fairness, or none."""
    uvloop: ClassVar[bool] = False
    """Whether the system's worker runs on uvloop (as its own worker command does)."""

    def __init__(self, url: str) -> None:
        self.url = url
        """A database of the measurement's own, empty before ``install``."""

    async def install(self) -> None:
        """Create the system's tables in the (empty) database."""
        raise NotImplementedError

    async def open(self) -> None:
        """Open what enqueueing needs (a pool, an app); connecting is not enqueueing."""

    async def close(self) -> None:
        """Close what ``open`` opened."""

    async def enqueue_many(self, jobs: list[Job]) -> None:
        """Enqueue ``jobs`` by the system's fastest documented batch path."""
        raise NotImplementedError

    async def enqueue_one(self, job: Job) -> None:
        """Enqueue one job in a transaction of its own (the webhook path)."""
        raise NotImplementedError

    async def work(self, concurrency: int, on_start: OnStart, stop: asyncio.Event) -> None:
        """Run the system's worker with ``concurrency`` until ``stop`` is set, then drain."""
        raise NotImplementedError

    def count_done(self, conn: psycopg.Connection) -> int:
        """Jobs that the database records as completed successfully."""
        raise NotImplementedError

    def count_queued(self, conn: psycopg.Connection) -> int:
        """Jobs that the database holds waiting to run."""
        raise NotImplementedError
