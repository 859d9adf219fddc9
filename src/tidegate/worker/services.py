"""The worker's background duties, each a small service with ``start``/``stop``.

- ``Heartbeat``: writes the worker row (workloops, slots, busy) and renews its leases.
- ``Stager``: makes scheduled runs that came due available.
- ``Rescuer``: returns the runs of workers whose leases ran out.
- ``Pruner``: deletes finished runs past retention, one process at a time.
- ``Completer``: writes outcomes in batches; fast-lane outcomes at once.
- ``Listener``: LISTENs for ready lanes and wakes the workloops that can take them.

A database error in one round is logged and the round retried later; any other error
ends the service's task, which the worker notices and stops on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from tidegate.storage.sql import query
from tidegate.worker.execute import Outcome

log = logging.getLogger("tidegate.worker")

BATCH_LIMIT = 5000
"""Rows the stager and the rescuer move per statement."""


class Service:
    """A named background task that can be started, watched and stopped."""

    name = "service"

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.run(), name=f"tidegate.{self.name}")
        return self.task

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def run(self) -> None:
        raise NotImplementedError


class Periodic(Service):
    """Call ``tick`` every ``interval`` seconds; a tick that did a full batch goes again."""

    def __init__(self, name: str, interval: float, tick: Callable[[], Awaitable[bool]]) -> None:
        super().__init__()
        self.name = name
        self.interval = interval
        self.tick = tick

    async def run(self) -> None:
        while True:
            try:
                again = await self.tick()
            except psycopg.OperationalError as error:
                log.warning("%s: database unavailable, retrying: %s", self.name, error)
                again = False
            if not again:
                await asyncio.sleep(self.interval)


async def fetch(pool: AsyncConnectionPool, name: str, params: dict[str, Any]) -> list[Any]:
    """Run a named statement on a pooled connection and return its rows, if it has any."""
    async with pool.connection() as conn:
        cursor = await conn.execute(query(name), params)
        return await cursor.fetchall() if cursor.description else []


class Completer(Service):
    """Write outcomes in batches: whatever arrived while the last write ran goes next.

    There is no timer: an idle worker writes each outcome at once, a busy one writes
    larger batches. Fast-lane outcomes skip the queue (a caller is waiting). A write that
    fails on a database error is retried; the outcomes stay in ``pending`` (and their
    leases renewed) until they are written. ``add`` returns a future that resolves once
    the outcome is written: a slot stays taken until then, so the database never shows
    a workloop running more runs than it has slots, and a slow database slows claiming.
    """

    name = "completer"

    def __init__(self, pool: AsyncConnectionPool, params: dict[str, Any]) -> None:
        super().__init__()
        self.pool = pool
        self.params = params
        self.queue: list[Outcome] = []
        self.pending: dict[int, asyncio.Future[None]] = {}
        """Outcomes not written yet, by run id: each future resolves once it is."""
        self.ready = asyncio.Event()
        self.urgent: set[asyncio.Task[None]] = set()

    def add(self, outcome: Outcome) -> asyncio.Future[None]:
        written = self.pending[outcome.run_id] = asyncio.get_running_loop().create_future()
        if outcome.lane == "fast_lane":
            task = asyncio.create_task(self.write([outcome]), name="tidegate.complete-fast")
            self.urgent.add(task)
            task.add_done_callback(self.urgent.discard)
        else:
            self.queue.append(outcome)
            self.ready.set()
        return written

    async def run(self) -> None:
        while True:
            await self.ready.wait()
            self.ready.clear()
            while self.queue:
                batch, self.queue = self.queue, []
                await self.write(batch)

    async def write(self, batch: Sequence[Outcome]) -> None:
        params = {**self.params, "outcomes": json.dumps([o.as_row() for o in batch])}
        delay = 0.05
        while True:
            try:
                await fetch(self.pool, "complete_runs", params)
                break
            except psycopg.OperationalError as error:
                log.warning("completer: database unavailable, retrying: %s", error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        for outcome in batch:
            written = self.pending.pop(outcome.run_id, None)
            if written is not None and not written.done():
                written.set_result(None)

    async def drain(self) -> None:
        """Write everything queued, then stop."""
        if self.urgent:
            await asyncio.gather(*self.urgent)
        await self.stop()
        while self.queue:
            batch, self.queue = self.queue, []
            await self.write(batch)


class Listener(Service):
    """LISTEN on the ready-lane channel and call ``wake(lane)`` for each notification.

    Only a hint: if the connection drops, the workloops' polls cover the gap while the
    listener reconnects.
    """

    name = "listener"

    def __init__(
        self,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection]],
        channels: Iterable[str],
        wake: Callable[[str, str], None],
        on_listen: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self.connect = connect
        self.channels = list(channels)
        self.wake = wake
        self.on_listen = on_listen
        """Called each time LISTEN (re)starts: notifications in a gap are lost."""
        self.listening = asyncio.Event()

    async def run(self) -> None:
        delay = 0.1
        while True:
            try:
                async with await self.connect() as conn:
                    for channel in self.channels:
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self.listening.set()
                    if self.on_listen is not None:
                        self.on_listen()
                    delay = 0.1
                    async for notify in conn.notifies():
                        self.wake(notify.channel, notify.payload)
            except psycopg.OperationalError as error:
                self.listening.clear()
                log.warning("listener: connection lost, reconnecting: %s", error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
