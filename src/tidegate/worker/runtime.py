"""The worker: workloops that claim and run, and the services that keep them honest.

A worker process runs one or more workloops (``"fast_lane:1 manual>*:4"``). Each
workloop claims only as many runs as it has free slots, in one statement, and never
lends slots to another, so a fast-lane slot is free when a fast-lane run arrives,
however long the backlog elsewhere. A workloop wakes on a NOTIFY for a lane its chain
admits, on a slot freeing, or, as a safety net, every ``poll_seconds``.

Shutdown (SIGTERM/SIGINT): stop claiming, let in-flight runs finish for up to
``shutdown_grace_seconds``, hand the rest back to ``available`` (attempt not counted),
write every outcome, remove the worker row. No run is left ``running``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from tidegate.app import Tidegate
from tidegate.lanes import WorkloopSpec, chain_admits
from tidegate.runs import Run, run_row
from tidegate.settings import Settings
from tidegate.storage.migrate import check_schema
from tidegate.storage.sql import query
from tidegate.worker.execute import execute
from tidegate.worker.services import (
    BATCH_LIMIT,
    Completer,
    Listener,
    Periodic,
    Service,
    fetch,
)

log = logging.getLogger("tidegate.worker")

CLAIM_SCAN_LIMIT = 500
"""Candidates a claim looks at, at most, past runs of keys at their limits."""
CLAIM_HEAD_SCAN = 64
"""Candidates a claim looks at at the head of a lane before it jumps to the frontier."""


class Workloop(Service):
    """One group of slots claiming along its lane chain."""

    def __init__(self, worker: Worker, spec: WorkloopSpec, index: int) -> None:
        super().__init__()
        self.name = f"workloop-{index}:{spec}"
        self.worker = worker
        self.spec = spec
        self.running: dict[int, asyncio.Task[None]] = {}
        self.backlog = True
        """Whether the last claim was full, so runs may be waiting for a free slot."""
        self.wake = asyncio.Event()
        self.wake.set()
        self.claim_params: dict[str, Any] = {
            "lanes": list(spec.named_lanes),
            "wildcard": spec.wildcard,
            "worker_id": worker.id,
            "workloop": index,
            "lease_seconds": worker.settings.lease_seconds,
            "scan_limit": CLAIM_SCAN_LIMIT,
            "head_scan": CLAIM_HEAD_SCAN,
        }

    @property
    def free(self) -> int:
        return self.spec.slots - len(self.running)

    def admits(self, lane: str) -> bool:
        return chain_admits(self.spec.chain, lane)

    async def run(self) -> None:
        worker = self.worker
        while not worker.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), worker.settings.poll_seconds)
            self.wake.clear()
            # One turn of the loop lets the other handlers finishing now free their
            # slots too, so the claim asks for them all in one statement.
            await asyncio.sleep(0)
            while self.free > 0 and not worker.stopping:
                demand = self.free
                try:
                    runs = await self.claim(demand)
                except psycopg.OperationalError as error:
                    log.warning("%s: claim failed, retrying: %s", self.name, error)
                    break
                for run in runs:
                    self.launch(run)
                # A full claim may have left runs behind: a freed slot should look again.
                # A short one found the lanes empty: new runs will say so (NOTIFY).
                self.backlog = len(runs) == demand
                if not self.backlog:
                    break

    async def claim(self, demand: int) -> list[Run]:
        async with self.worker.pool.connection() as conn:
            cursor = conn.cursor(row_factory=run_row)
            await cursor.execute(query("claim_runs"), {**self.claim_params, "demand": demand})
            return await cursor.fetchall()

    def launch(self, run: Run) -> None:
        task = asyncio.create_task(self.execute(run), name=f"tidegate.run-{run.id}")
        self.running[run.id] = task

    async def execute(self, run: Run) -> None:
        worker = self.worker
        outcome = await execute(
            run, worker.app.tasks.get(run.task), worker.executor, worker.settings
        )
        # The slot frees once the outcome is written, not before: a claim must not
        # take more runs than the workloop has slots while outcomes wait in a batch.
        await worker.completer.add(outcome)
        del self.running[run.id]
        if self.backlog:
            self.wake.set()


class Worker:
    """One worker process: its workloops, its connections, its services."""

    def __init__(self, app: Tidegate, settings: Settings | None = None) -> None:
        self.app = app
        self.settings = settings or app.settings
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.stopping = False
        self.workloops = [
            Workloop(self, spec, i) for i, spec in enumerate(self.settings.parsed_workloops)
        ]
        slots = sum(spec.slots for spec in self.settings.parsed_workloops)
        self.executor = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="tidegate-run")
        self.pool: AsyncConnectionPool = app.database.async_pool(
            size=len(self.workloops) + 5, synchronous_commit=False
        )
        self.completer = Completer(
            self.pool,
            {
                "worker_id": self.id,
                "completed_channel": app.completed_channel,
                "channel": app.available_channel,
            },
        )
        channel = {"channel": app.available_channel}
        lease = {"lease_seconds": self.settings.lease_seconds}
        self.listener = Listener(app.database.aconnect, [app.available_channel], self.wake)
        self.services: list[Service] = [
            self.completer,
            self.listener,
            Periodic("heartbeat", self.settings.heartbeat_seconds, self.beat),
            Periodic(
                "stager",
                self.settings.stage_seconds,
                self._batch("stage_runs", {**channel, "limit": BATCH_LIMIT}),
            ),
            Periodic(
                "rescuer",
                self.settings.rescue_seconds,
                self._batch(
                    "rescue_runs",
                    {**channel, "limit": BATCH_LIMIT, "completed_channel": app.completed_channel},
                ),
            ),
            Periodic(
                "pruner",
                self.settings.prune_seconds,
                self._batch(
                    "prune_runs",
                    {
                        **lease,
                        "retention_seconds": self.settings.retention_seconds,
                        "batch": self.settings.prune_batch,
                    },
                    full=self.settings.prune_batch,
                ),
            ),
        ]

    # -- the life of a worker ------------------------------------------------------

    async def run_until_signalled(self) -> None:
        """Run until SIGTERM or SIGINT, then shut down gracefully."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await self.run(stop)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set or a service fails; always shut down cleanly."""
        await self.prepare_schema()
        await self.pool.open(wait=True)
        tasks: list[asyncio.Task[None]] = []
        try:
            await self.beat()
            tasks = [service.start() for service in self.services]
            await asyncio.wait_for(self.listener.listening.wait(), 10)
            tasks += [loop.start() for loop in self.workloops]
            log.info(
                "worker %s started: %s",
                self.id,
                " ".join(str(loop.spec) for loop in self.workloops),
            )
            stopped = asyncio.create_task(stop.wait(), name="tidegate.stop")
            done, _ = await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            for task in done - {stopped}:
                if not task.cancelled() and task.exception() is not None:
                    log.error("%s failed, stopping", task.get_name(), exc_info=task.exception())
        finally:
            await self.shutdown()
        failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception()]
        if failed:
            raise RuntimeError(f"worker {self.id} stopped: {failed[0].get_name()} failed")

    async def prepare_schema(self) -> None:
        """Refuse to start on a schema older or newer than this code."""

        def prepare() -> None:
            with self.app.database.connect() as conn:
                check_schema(conn, self.settings.schema)

        await asyncio.to_thread(prepare)

    async def shutdown(self) -> None:
        self.stopping = True
        for loop in self.workloops:
            loop.wake.set()
        await asyncio.gather(*(loop.task for loop in self.workloops if loop.task))
        in_flight = {
            run_id: task for loop in self.workloops for run_id, task in loop.running.items()
        }
        if in_flight:
            log.info("worker %s: waiting for %d runs", self.id, len(in_flight))
            await asyncio.wait(in_flight.values(), timeout=self.settings.shutdown_grace_seconds)
        unfinished = [run_id for run_id, task in in_flight.items() if not task.done()]
        for run_id in unfinished:
            in_flight[run_id].cancel()
        await asyncio.gather(*in_flight.values(), return_exceptions=True)
        await self.completer.drain()
        for service in self.services:
            await service.stop()
        try:
            if unfinished:
                log.info("worker %s: handing back %d runs", self.id, len(unfinished))
                await fetch(
                    self.pool,
                    "release_runs",
                    {
                        "ids": unfinished,
                        "worker_id": self.id,
                        "channel": self.app.available_channel,
                    },
                )
            await fetch(self.pool, "delete_worker", {"worker_id": self.id})
        except psycopg.OperationalError as error:
            log.warning(
                "worker %s: database gone at shutdown, leases will expire: %s", self.id, error
            )
        finally:
            await self.pool.close()
            self.executor.shutdown(wait=False, cancel_futures=True)

    # -- what the services do ------------------------------------------------------

    def wake(self, channel: str, lane: str) -> None:
        for loop in self.workloops:
            if loop.admits(lane):
                loop.backlog = True  # a full workloop looks when its next slot frees
                if loop.free > 0:
                    loop.wake.set()

    async def beat(self) -> bool:
        workloops = [
            {"chain": list(loop.spec.chain), "slots": loop.spec.slots, "busy": len(loop.running)}
            for loop in self.workloops
        ]
        held = [run_id for loop in self.workloops for run_id in loop.running]
        held += list(self.completer.pending)
        await fetch(
            self.pool,
            "beat_worker",
            {
                "worker_id": self.id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "workloops": json.dumps(workloops),
                "run_ids": held,
                "lease_seconds": self.settings.lease_seconds,
            },
        )
        return False

    def _batch(
        self, name: str, params: dict[str, Any], full: int = BATCH_LIMIT
    ) -> Callable[[], Awaitable[bool]]:
        """Return a tick that runs a batch statement; a full batch asks to go again."""

        async def tick() -> bool:
            rows = await fetch(self.pool, name, params)
            return bool(rows[0][0] >= full)

        return tick
