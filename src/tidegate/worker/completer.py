"""Write the outcomes of a worker's runs, and their progress events, in batches.

Whatever arrived while the last write ran goes in the next one: an idle worker writes
each outcome at once, a busy one larger batches. A fast-lane outcome skips the queue (a
caller is waiting). A write that fails on an outage is retried until it passes; one the
database (or the API) refuses is written one outcome at a time, so one bad outcome
cannot hold back the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tidegate.runs import Run
from tidegate.worker.execute import Outcome
from tidegate.worker.services import LINK_ERRORS, Service, describe, passing, retry_delay

if TYPE_CHECKING:
    from tidegate.worker.link import Rows

log = logging.getLogger("tidegate.worker")

MAX_UNWRITTEN_EVENTS = 100
"""Progress events of one run that may wait to be written; past that the oldest go."""


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
        self.hold(outcome, written)
        if outcome.lane == "fast_lane":
            events = self.events.pop(outcome.run_id, [])
            write = self.write([outcome], events)
            task = asyncio.create_task(write, name="tidegate.complete-fast")
            self.urgent.add(task)
            task.add_done_callback(self.urgent.discard)
        else:
            self.give([outcome])

    def hold(self, outcome: Outcome, written: Callable[[bool], None]) -> None:
        """Count ``outcome`` as not written yet, and call ``written(recorded)`` once it
        is: ``add``'s first half, for an outcome a workloop's claim carries (the
        shutdown waits for it as for any other), which ``settle`` ends, or ``give``
        hands to this completer should the claim fail."""
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

    def give(self, batch: Sequence[Outcome]) -> None:
        """Write outcomes held (``hold``) in the next batch."""
        self.queue.extend(batch)
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
        try:
            rows = await self._write(batch, events)
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
            self._done(batch, set())
            return
        await self.settle(batch, rows)

    async def settle(self, batch: Sequence[Outcome], rows: Rows) -> None:
        """End a batch written (``complete_runs`` returned ``rows``: the ids recorded, then
        breaker changes): log the breakers that changed and the outcomes that came too
        late (noted in their runs), and call their callbacks."""
        for _, lane, key, change in rows:
            if change is not None:
                _log_breaker(lane, key, change)
        recorded = {row[0] for row in rows if row[0] is not None}
        late = [outcome for outcome in batch if outcome.run_id not in recorded]
        if late:
            await self._note_late(late)
        self._done(batch, recorded)

    def _done(self, batch: Sequence[Outcome], recorded: set[int]) -> None:
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

    async def _write(self, batch: Sequence[Outcome], events: Sequence[dict[str, Any]]) -> Rows:
        """Write a batch; return what ``complete_runs`` returned."""
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
            return rows

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
