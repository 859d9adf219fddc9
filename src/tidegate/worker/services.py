"""The worker's background duties, each a small service with ``start``/``stop``.

- ``Heartbeat``: writes the worker row (workloops, slots, busy), renews its leases, and
  adds the attempts it finished since the last beat to its counters (worker/counters.py).
- ``Stager``: makes scheduled runs that came due available, and pending runs of this
  worker's tasks.
- ``Parker``: sets pending the runs at the head of this worker's lanes whose task no
  live worker has.
- ``Rescuer``: returns the runs of workers whose leases ran out (``rescue``; every API
  process runs one too).
- ``Pruner``: deletes finished runs past retention, one process at a time.
- ``Folder``: folds the counters of workers that are no longer live into ``retired``.
- ``Scheduler``: fires the due schedules of this worker's tasks (worker/scheduler.py).
- ``Completer``: writes outcomes in batches; fast-lane outcomes at once.
- ``Listener``: LISTENs for ready lanes and wakes the workloops that can take them.

No error from the database or the data ends a service (docs/architecture.md, invariant 7): a
database error in one round is logged with its context and the round retried with a
growing delay. Any other error is a bug: it ends the service's task, the worker stops
cleanly, and its supervisor (``tidegate serve``) starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from tidegate.errors import TidegateError
from tidegate.runs import Run
from tidegate.storage.database import transient
from tidegate.storage.sql import query
from tidegate.worker.counters import DURATION_BUCKETS
from tidegate.worker.execute import Outcome

if TYPE_CHECKING:
    from tidegate.worker.link import Rows

log = logging.getLogger("tidegate.worker")

BATCH_LIMIT = 5000
"""Rows the stager and the rescuer move per statement."""
FIRST_RETRY_SECONDS = 0.05
MAX_RETRY_SECONDS = 30.0
MAX_UNWRITTEN_EVENTS = 100
"""Progress events of one run that may wait to be written; past that the oldest go."""
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
    """Seconds to wait after ``failures`` failures in a row: doubling, capped."""
    return float(min(first * 2.0 ** (failures - 1), MAX_RETRY_SECONDS))


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


async def rescue(pool: AsyncConnectionPool, channel: str, completed_channel: str) -> bool:
    """Take back the runs whose leases lapsed (``rescue_runs``), say so, and tell
    whether a full batch asks to go again. Every worker does, and every API process: a
    run stops counting toward its caps only once rescued, and with no worker alive the
    API is the one left to do it."""
    params = {
        "channel": channel,
        "completed_channel": completed_channel,
        "limit": BATCH_LIMIT,
        "buckets": len(DURATION_BUCKETS) + 1,
    }
    rows = await fetch(pool, "rescue_runs", params)
    for task, lane, count in rows:
        log.warning(
            "rescued %d run(s) of task %r in lane %r: their leases lapsed (the worker "
            "holding them stopped renewing them); available again, or discarded after "
            "their last attempt",
            count,
            task,
            lane,
            extra={"task": task, "lane": lane},
        )
    return sum(int(count) for *_, count in rows) >= BATCH_LIMIT


class Link(Protocol):
    """What the completer needs of the worker's link (worker/link.py)."""

    async def complete(self, params: dict[str, Any]) -> Rows: ...

    async def note_late(self, params: dict[str, Any]) -> None: ...


class Completer(Service):
    """Write outcomes in batches: whatever arrived while the last write ran goes next.

    There is no timer: an idle worker writes each outcome at once, a busy one writes
    larger batches. Fast-lane outcomes skip the queue (a caller is waiting). A write that
    fails on a database error is retried; the outcomes stay in ``pending`` (and their
    leases renewed) until they are written. Once an outcome is written or given up,
    ``add``'s callback is called with whether it was recorded (not when it came late, or
    was refused).
    """

    name = "completer"

    def __init__(self, link: Link, params: dict[str, Any]) -> None:
        super().__init__()
        self.link = link
        self.params = params
        self.queue: list[Outcome] = []
        self.pending: dict[int, Callable[[bool], None]] = {}
        """Outcomes not written yet, by run id, each with its callback."""
        self.ready = asyncio.Event()
        self.settled = asyncio.Event()
        """Set while ``pending`` is empty: every outcome added has been written."""
        self.settled.set()
        self.urgent: set[asyncio.Task[None]] = set()
        self.events: dict[int, list[dict[str, Any]]] = {}
        """Progress events not written yet, by run id, in the order reported."""
        self.dropped: dict[int, int] = {}
        """How many events were dropped unwritten, by run id, until its outcome."""
        self.taken = asyncio.Event()
        """Set when waiting events are taken for a write: there is room for more."""
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> asyncio.Task[None]:
        self.loop = asyncio.get_running_loop()
        return super().start()

    def add(self, outcome: Outcome, written: Callable[[bool], None]) -> None:
        """Write ``outcome`` soon, then call ``written(recorded)``.

        The run's progress events reported before go first, in the same statement.
        """
        self.pending[outcome.run_id] = written
        self.settled.clear()
        dropped = self.dropped.pop(outcome.run_id, 0)
        if dropped:
            log.warning(
                "run %d attempt %d reported progress faster than it could be written: "
                "%d event(s) dropped unwritten, the oldest first",
                outcome.run_id,
                outcome.attempt,
                dropped,
            )
        if outcome.lane == "fast_lane":
            events = self.events.pop(outcome.run_id, [])
            write = self.write([outcome], events)
            task = asyncio.create_task(write, name="tidegate.complete-fast")
            self.urgent.add(task)
            task.add_done_callback(self.urgent.discard)
        else:
            self.queue.append(outcome)
            self.ready.set()

    def report(self, run: Run, data: str) -> None:
        """Write a progress event of ``run`` soon (``Run.progress``; any thread).

        Of a run's events waiting to be written, at most ``MAX_UNWRITTEN_EVENTS`` are
        kept, so a handler reporting faster than the database writes cannot fill the
        worker's memory: a thread waits for room, the event loop cannot, and drops the
        oldest.
        """
        if self.loop is None:
            raise RuntimeError("the worker is not running")
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._report(run, data)
        else:
            asyncio.run_coroutine_threadsafe(self.areport(run, data), self.loop).result()

    async def areport(self, run: Run, data: str) -> None:
        """``report``, waiting for room rather than dropping (``Run.aprogress``)."""
        while len(self.events.get(run.id, ())) >= MAX_UNWRITTEN_EVENTS and self.writing:
            self.taken.clear()
            await self.taken.wait()
        self._report(run, data)

    @property
    def writing(self) -> bool:
        """Whether the completer runs: once it has stopped, nothing would make room."""
        return self.task is not None and not self.task.done()

    async def stop(self) -> None:
        await super().stop()
        self.taken.set()  # a handler waiting for room waits no more

    def _report(self, run: Run, data: str) -> None:
        events = self.events.setdefault(run.id, [])
        if len(events) >= MAX_UNWRITTEN_EVENTS:
            del events[0]
            self.dropped[run.id] = self.dropped.get(run.id, 0) + 1
        events.append({"run_id": run.id, "attempt": run.attempt, "data": data})
        self.ready.set()

    async def run(self) -> None:
        while True:
            await self.ready.wait()
            self.ready.clear()
            while self.queue or self.events:
                await self.write(*self._take())

    def _take(self) -> tuple[list[Outcome], list[dict[str, Any]]]:
        """The outcomes and events waiting, taken for one write."""
        batch, self.queue = self.queue, []
        events = [event for run_events in self.events.values() for event in run_events]
        self.events.clear()
        self.taken.set()
        return batch, events

    async def write(self, batch: Sequence[Outcome], events: Sequence[dict[str, Any]] = ()) -> None:
        """Write a batch and the progress events before it; call each outcome's callback
        once it is written or given up, with whether it was recorded.

        A transient error (an outage) is retried until it passes. A batch the database
        refuses is written one outcome at a time, so one bad outcome cannot hold back the
        others; an outcome refused on its own is given up, logged at ERROR: its run stays
        leased until its lease lapses, and the rescuer runs it again. Events refused are
        dropped, logged at ERROR.
        """
        recorded: set[int] = set()
        try:
            recorded = await self._write(batch, events)
        except LINK_ERRORS as error:
            if len(batch) > 1 or (batch and events):
                if events:
                    await self.write([], events)
                for outcome in batch:
                    await self.write([outcome])
                return
            if not batch:
                log.error(
                    "%d progress event(s) of run(s) %s could not be written, dropped: %s",
                    len(events),
                    ", ".join(sorted({str(event["run_id"]) for event in events})),
                    describe(error),
                )
                return
            log.error(
                "run %d: its outcome (%s) could not be written, the run is rescued when its "
                "lease lapses: %s",
                batch[0].run_id,
                batch[0].state,
                describe(error),
            )
        else:
            late = [outcome for outcome in batch if outcome.run_id not in recorded]
            if late:
                await self._note_late(late)
        for outcome in batch:
            written = self.pending.pop(outcome.run_id, None)
            if written is not None:
                written(outcome.run_id in recorded)
        if not self.pending:
            self.settled.set()

    async def _note_late(self, late: Sequence[Outcome]) -> None:
        """Say, in the log and in the runs' errors, which outcomes came too late."""
        for outcome in late:
            log.warning(
                "run %d: the outcome of attempt %d (%s) came after the run had left this "
                "worker (lease lapsed, cancelled, or its claim lost in a database crash): "
                "not recorded, noted in its errors",
                outcome.run_id,
                outcome.attempt,
                outcome.state.value,
            )
        rows = [{"id": o.run_id, "attempt": o.attempt, "state": o.state.value} for o in late]
        params = {"worker_id": self.params["worker_id"], "outcomes": json.dumps(rows)}
        try:
            await self.link.note_late(params)
        except LINK_ERRORS as error:  # only a note: the log line above stands
            log.warning("could not note late outcomes in their runs: %s", describe(error))

    async def _write(self, batch: Sequence[Outcome], events: Sequence[dict[str, Any]]) -> set[int]:
        """Write a batch; return the ids of the runs whose outcomes were recorded."""
        params = {
            **self.params,
            "outcomes": json.dumps([o.as_row() for o in batch]),
            "events": json.dumps(events),
        }
        failures = 0
        while True:
            try:
                rows = await self.link.complete(params)
            except LINK_ERRORS as error:
                if not passing(error):
                    raise
                failures += 1
                delay = retry_delay(failures)
                log.warning(
                    "completer: database unavailable, retrying in %.1fs: %s", delay, describe(error)
                )
                await asyncio.sleep(delay)
                continue
            for _, lane, key, change in rows:
                if change is not None:
                    _log_breaker(lane, key, change)
            return {row[0] for row in rows if row[0] is not None}

    async def drain(self, timeout: float) -> None:
        """Wait until every outcome added has been written, at most ``timeout`` seconds
        (an outage is retried meanwhile), then stop. What is left unwritten is logged:
        those runs run again once their leases lapse."""

        async def settle() -> None:
            if self.task is None or self.task.done():  # not started, or ended by a bug
                while self.queue or self.events:
                    await self.write(*self._take())
            await self.settled.wait()

        try:
            await asyncio.wait_for(settle(), timeout)
        except TimeoutError:
            log.error(
                "%d outcome(s) could not be written within the shutdown's grace, given "
                "up: run(s) %s run again once their leases lapse",
                len(self.pending),
                ", ".join(map(str, sorted(self.pending))),
            )
        await self.stop()


def _log_breaker(lane: str, key: str, change: str) -> None:
    """Say that a key's circuit breaker opened or closed (count_breaker_outcomes)."""
    extra = {"lane": lane, "key": key, "breaker": change}
    if change == "closed":
        log.info(
            "circuit breaker of key %r in lane %r closed: its probe succeeded",
            key,
            lane,
            extra=extra,
        )
        return
    log.warning(
        "circuit breaker of key %r in lane %r %s: its runs wait unclaimed until the "
        "cooldown ends (tidegate keys breakers)",
        key,
        lane,
        "opened on its failures" if change == "opened" else "reopened: its probe failed",
        extra=extra,
    )


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
