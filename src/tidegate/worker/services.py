"""The pieces every background loop is made of, in a worker and in an API process alike.

- ``Service``: a named task with ``start`` and ``stop``; ``Periodic``, one that calls
  its tick every ``interval`` seconds (at once again after a full batch); ``Listener``,
  one that LISTENs and calls back for each notification (a hint: polls cover a gap).
- ``fetch``: run a named statement on a pooled connection.
- ``LinkError``, ``LINK_ERRORS``, ``passing``, ``retry_delay``, ``describe``: how a
  service tells an outage from a refusal, how long it waits, and how it says what
  failed.

A worker's services are its workloops (worker/workloop.py), its completer
(worker/completer.py), its heartbeat (worker/runtime.py), its maintenance duties
(worker/maintenance.py) and its scheduler (worker/scheduler.py).

No error from the database or the data ends a service (docs/architecture.md, invariant 7): a
database error in one round is logged with its context and the round retried with a
growing delay. Any other error is a bug: it ends the service's task, the worker stops
cleanly, and its supervisor (``tidegate serve``) starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from tidegate.errors import TidegateError
from tidegate.storage.database import transient
from tidegate.storage.sql import query

log = logging.getLogger("tidegate.worker")

FIRST_RETRY_SECONDS = 0.05
MAX_RETRY_SECONDS = 30.0
STOP_AGAIN_SECONDS = 0.1
"""How long a stopping service has to end before it is cancelled again."""


class LinkError(TidegateError):
    """A call of a remote worker to the API failed (worker/link.py); ``transient`` when
    the API could not be reached or could not serve it now, so a retry may pass."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


LINK_ERRORS = (psycopg.Error, LinkError)
"""What a worker's calls to its runs (the database, or the API) may raise."""


def passing(error: Exception) -> bool:
    """Whether the failure may pass by itself: an outage, not a refusal."""
    if isinstance(error, LinkError):
        return error.transient
    return isinstance(error, psycopg.Error) and transient(error)


def retry_delay(failures: int, first: float = FIRST_RETRY_SECONDS) -> float:
    """Seconds to wait after ``failures`` failures in a row: a random share of a ceiling
    that doubles with each failure, up to ``MAX_RETRY_SECONDS`` ("full jitter").

    Every worker loses the database at the same moment of an outage; with the ceiling
    itself as the delay, they would all come back at the same moment too, and again at
    each doubling. Spread over the whole interval, their retries arrive as a trickle the
    server can take.
    """
    return random.uniform(0.0, min(first * 2.0 ** (failures - 1), MAX_RETRY_SECONDS))


def describe(error: Exception) -> str:
    """One line for a log: the SQLSTATE when there is one, then the message."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    sqlstate = getattr(error, "sqlstate", None)
    return f"[{sqlstate}] {text}" if sqlstate else text


class Service:
    """A named background task that can be started, watched and stopped."""

    name = "service"

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.run(), name=f"tidegate.{self.name}")
        return self.task

    async def stop(self) -> None:
        """Cancel the task and wait until it has ended.

        The cancellation is sent again while the task runs on: a library may swallow one
        (psycopg can, when it lands while a query or transaction is cleaned up, and the
        call then returns as if nothing happened), and the service must stop all the same.
        """
        while self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.wait([self.task], timeout=STOP_AGAIN_SECONDS)
        if self.task is not None:
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
        failures = 0
        while True:
            try:
                again = await self.tick()
            except LINK_ERRORS as error:
                failures += 1
                delay = retry_delay(failures, self.interval)
                log.log(
                    logging.WARNING if passing(error) else logging.ERROR,
                    "%s failed (%d in a row), retrying in %.1fs: %s",
                    self.name,
                    failures,
                    delay,
                    describe(error),
                )
                await asyncio.sleep(delay)
                continue
            failures = 0
            if not again:
                await asyncio.sleep(self.interval)


async def fetch(pool: AsyncConnectionPool, name: str, params: dict[str, Any]) -> list[Any]:
    """Run a named statement on a pooled connection and return its rows, if it has any."""
    async with pool.connection() as conn:
        cursor = await conn.execute(query(name), params)
        return await cursor.fetchall() if cursor.description else []


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
            except psycopg.Error as error:
                self.listening.clear()
                log.warning("listener: connection lost, reconnecting: %s", describe(error))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
