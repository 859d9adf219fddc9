"""tidegate through its public API, as a user would run it.

Batch enqueue is ``aenqueue_many`` (one statement per batch), single enqueue is
``aenqueue`` (one run, one transaction), and the worker is tidegate's ``Worker`` with
its default settings and the workloop ``manual>*:32``: the ``default`` lane, every run's
key its tenant. The starvation workload uses tidegate's fairness as it comes, with no
policy set: runs are taken round-robin across keys.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from bench.systems.base import Adapter, Job, OnStart
from tidegate import NewRun, Settings, Tidegate
from tidegate.worker.runtime import Worker


class TidegateAdapter(Adapter):
    name = "tidegate"
    tables = ("tidegate.runs",)
    fairness = "per-key round-robin (the default; the tenant is the run's key)"
    uvloop = True  # as `tidegate worker` runs

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.app = Tidegate(settings=Settings(database_url=url))

    async def install(self) -> None:
        await asyncio.to_thread(self.app.migrate)

    async def open(self) -> None:
        await self.app.aget_run(0)  # opens the pool: connecting is not enqueueing

    async def close(self) -> None:
        await self.app.aclose()

    async def enqueue_many(self, jobs: list[Job]) -> None:
        await self.app.aenqueue_many([NewRun("noop", j.args, key=j.tenant) for j in jobs])

    async def enqueue_one(self, job: Job) -> None:
        await self.app.aenqueue("noop", job.args, key=job.tenant)

    async def work(self, concurrency: int, on_start: OnStart, stop: asyncio.Event) -> None:
        @self.app.task(name="noop")
        async def noop(**args: Any) -> None:
            on_start(args)

        settings = self.app.settings.replace(workloops=f"manual>*:{concurrency}")
        await Worker(self.app, settings).run(stop)

    def count_done(self, conn: psycopg.Connection) -> int:
        row = conn.execute("SELECT count(*) FROM tidegate.runs WHERE state = 'succeeded'")
        return int(row.fetchone()[0])  # type: ignore[index]

    def count_queued(self, conn: psycopg.Connection) -> int:
        row = conn.execute("SELECT count(*) FROM tidegate.runs WHERE state = 'available'")
        return int(row.fetchone()[0])  # type: ignore[index]


ADAPTER = TidegateAdapter
