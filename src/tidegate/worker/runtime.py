"""The worker: workloops that claim and run, and the services that keep them honest.

A worker process runs one or more workloops (``"fast_lane:1 manual>*:4"``). Each
workloop claims as many runs as it has free slots, in one statement, and never lends
slots to another, so a fast-lane slot is free when a fast-lane run arrives, however long
the backlog elsewhere. Where its handlers finish faster than a claim's round trip, a
workloop also claims runs ahead (``Pace``), one for each slot whose handler is about to
return: they wait for a slot in the worker, no more than ``slots`` handlers execute at
once, and a run that has not started within ``HOLD_SECONDS`` is handed back to
``available`` (its attempt not counted), so ``running`` means a handler executes the run
or will within milliseconds, and no run waits behind a slow handler while another
worker has a free slot (docs/guarantees.md). A workloop wakes on a NOTIFY for a lane its
chain admits, on a slot freeing, or, as a safety net, every ``poll_seconds``.

A worker claims only runs of the tasks it has (its app's tasks when it starts, also
advertised in its row): a claim passes over a run of another task, leaving it for a
worker that has it. When no live worker has it, the parker (every ``stage_seconds``,
after a claim that came up short) sets it ``pending`` until one starts, out of the
claims' way. No attempt is spent for want of a task.

Shutdown (SIGTERM/SIGINT): stop claiming, start no run that waits for a slot, let
in-flight runs finish for up to ``shutdown_grace_seconds``, then cancel async handlers
and hand their runs back to ``available`` (attempt not counted) once they have stopped,
with the runs that never started. Sync handlers cannot be stopped: their runs stay
leased until their threads return, and their outcomes are written. A second signal
exits at once; runs still leased are then rescued when their leases lapse. No run is
handed back while its handler may still be executing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import secrets
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from tidegate.app import Tidegate
from tidegate.forward import FORWARD_TASK, handler
from tidegate.lanes import BUILTIN_LANES, WorkloopSpec, chain_admits
from tidegate.runs import Run, RunState, _progress, run_row
from tidegate.settings import Settings
from tidegate.storage.sql import adrive, query
from tidegate.tracing import span
from tidegate.worker.completer import Completer
from tidegate.worker.counters import Counters, as_json, outcome_label
from tidegate.worker.execute import Outcome, execute
from tidegate.worker.link import DatabaseLink, RemoteLink
from tidegate.worker.scheduler import FIRE_LIMIT, declare_steps, fire_steps
from tidegate.worker.services import (
    BATCH_LIMIT,
    LINK_ERRORS,
    Listener,
    Periodic,
    Service,
    describe,
    fetch,
    passing,
    rescue,
    retry_delay,
)

log = logging.getLogger("tidegate.worker")

CLAIM_SCAN_LIMIT = 500
"""Candidates a claim looks at, at most, past runs of keys at their limits."""
CLAIM_HEAD_SCAN = 64
"""Candidates a claim looks at at the head of a lane before it jumps to the frontier."""
WRITE_RESERVE_SECONDS = 3.0
"""Of the shutdown's grace, what is kept for the last writes (outcomes, hand-backs, the
worker's row): at most a fifth of it."""
LAST_WORDS_SECONDS = 1.0
"""How long the last writes may take at least, when sync handlers outlasted the grace."""
HOLD_SECONDS = 0.01
"""How long a run claimed ahead may wait in the worker for a slot before it is handed
back: runs are claimed ahead only for handlers that return within a claim's round trip
(about a millisecond), so one that has waited this long waits behind a slow handler."""


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """Return uvloop's loop factory where uvloop is installed, else None (asyncio's)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


class Workloop(Service):
    """One group of slots claiming along its lane chain."""

    def __init__(self, worker: Worker, spec: WorkloopSpec, index: int) -> None:
        super().__init__()
        self.name = f"workloop-{index}:{spec}"
        self.worker = worker
        self.spec = spec
        self.running: dict[int, asyncio.Task[None]] = {}
        """The runs that take a slot, by id: those whose handlers execute, and fast-lane
        runs until their outcome is written."""
        self.runs: dict[int, Run] = {}
        """The runs of ``running``, by id."""
        self.handling: dict[int, tuple[asyncio.Task[None], Run, float]] = {}
        """The runs whose handlers execute now, by id: the task, the run it was given,
        and when it started (``time.monotonic()``)."""
        self.waiting: dict[int, Run] = {}
        """Runs claimed ahead (``Pace``) that wait for a slot, in claim order; each is
        handed back if no slot takes it within ``HOLD_SECONDS``."""
        self.releasing: set[int] = set()
        """Runs claimed ahead that waited too long, being handed back (their leases are
        renewed until they are)."""
        self.releases: set[asyncio.Task[None]] = set()
        self.pace = Pace(spec.slots)
        self.places = {lane: place for place, lane in enumerate(spec.named_lanes)}
        """The lanes the chain names, by their place in it."""
        self.lost: set[asyncio.Task[None]] = set()
        """Executions whose runs left this worker while their handlers executed
        (cancelled, or rescued after their leases lapsed): being stopped."""
        self.unwritten = 0
        """Outcomes of this workloop's runs that wait to be written (their leases are
        renewed meanwhile)."""
        self.backlog = True
        """Whether the last claim was full, so runs may be waiting for a free slot."""
        self.last_claim_seconds = 0.0
        """How long the last claim took (a remote one's long poll included)."""
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
            "tasks": list(worker.tasks),
            "live_seconds": worker.live_seconds,
        }

    @property
    def free(self) -> int:
        """How many runs to claim: the free slots, plus one for each slot whose handler is
        about to return while handlers return faster than a claim's round trip
        (``Pace``), less the runs already waiting for a slot. A slot frees
        when its handler returns, except a fast-lane run's, which frees once its outcome
        is written (a sync caller waits for it, and the admission counts fast-lane
        slots from the database). So that a slow database slows claiming, at most
        ``slots`` outcomes wait to be written.

        A remote worker's slot frees once its outcome is written, and it claims no run
        ahead: the API gives a workloop no more runs than its slots, counting each run
        held until its outcome is in (docs/workers.md)."""
        slots = self.spec.slots
        if self.worker.link.remote:
            return slots - self.unwritten - len(self.running)
        room = slots + self.pace.ahead(self.overdue())
        held = len(self.running) + len(self.waiting)
        return min(room, room + slots - self.unwritten) - held

    def overdue(self) -> int:
        """How many handlers have executed longer than a run claimed ahead may wait: their
        slots are not about to free."""
        since = time.monotonic() - HOLD_SECONDS
        return sum(1 for _, _, started in self.handling.values() if started < since)

    def admits(self, lane: str) -> bool:
        return chain_admits(self.spec.chain, lane)

    def claim_order(self, run: Run) -> tuple[int, float, int]:
        """Where ``run`` stands in a claim: its lane's place in the chain, then its rank."""
        return self.places.get(run.lane, len(self.places)), run.rank, run.id

    async def run(self) -> None:
        worker = self.worker
        failures = 0
        long_polled = False
        while not worker.stopping.is_set():
            if not long_polled:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), worker.settings.poll_seconds)
            self.wake.clear()
            long_polled = False
            # One turn of the loop lets the other handlers finishing now free their
            # slots too, so the claim asks for them all in one statement.
            await asyncio.sleep(0)
            while self.free > 0 and not worker.stopping.is_set():
                demand = self.free
                try:
                    runs = await self.claim(demand)
                except LINK_ERRORS as error:
                    failures += 1
                    delay = retry_delay(failures)
                    log.log(
                        logging.WARNING if passing(error) else logging.ERROR,
                        "%s: claim failed (%d in a row), retrying in %.1fs: %s",
                        self.name,
                        failures,
                        delay,
                        describe(error),
                    )
                    with contextlib.suppress(TimeoutError):  # a shutdown cuts the wait short
                        await asyncio.wait_for(worker.stopping.wait(), delay)
                    self.wake.set()
                    break
                failures = 0
                # A remote worker hears of new runs only through a claim waiting at the
                # API (a long poll): after one that took runs, or waited its whole poll,
                # the next goes at once, so that while a slot is free a claim always
                # waits there. One answered empty at once (the API counts the workloop
                # full) waits as a local loop does, whose worker's LISTEN wakes it.
                long_polled = worker.link.remote and (
                    bool(runs) or self.last_claim_seconds >= 0.9 * worker.settings.poll_seconds
                )
                # Launched in the claim's order (a run claimed ahead waits for a slot in
                # it): the chain's named lanes first, each by rank, then the rest by rank.
                # The claim's rows come back in id order.
                claimed = sorted(
                    (run for run in runs if run.state is RunState.RUNNING), key=self.claim_order
                )
                for run in claimed:
                    self.launch(run)
                ahead = {run.id for run in claimed} & self.waiting.keys()
                if ahead:
                    asyncio.get_running_loop().call_later(HOLD_SECONDS, self.give_back, ahead)
                parked = [run for run in runs if run.state is RunState.PENDING]
                if parked:
                    _log_parked(parked)
                # A full claim may have left runs behind: a freed slot should look again.
                # A short one found the lanes empty: new runs will say so (NOTIFY). Runs
                # set pending made room at the head of a lane: look again at once.
                self.backlog = len(claimed) == demand
                if self.backlog:
                    worker.spill(self)
                else:
                    worker.came_up_short = True
                if not (self.backlog or parked):
                    break

    async def claim(self, demand: int) -> list[Run]:
        started = time.monotonic()
        with span("claim", chain=">".join(self.spec.chain), demand=demand) as claiming:
            claimed = await self.worker.link.claim({**self.claim_params, "demand": demand})
            claiming.note(runs=len(claimed))
        self.last_claim_seconds = time.monotonic() - started
        self.pace.claimed(self.last_claim_seconds)
        self.worker.counters.claimed(claimed)
        return claimed

    def launch(self, run: Run) -> None:
        """Start ``run``'s handler in a free slot, or keep it waiting for one."""
        # A run can come back to a worker whose handler of it still executes (it left,
        # was rescued, and this worker claimed it again): that execution is stale.
        self.stop_lost(run.id)
        self.waiting.pop(run.id, None)
        if len(self.running) >= self.spec.slots:
            self.waiting[run.id] = run
            return
        self.running[run.id] = asyncio.create_task(self.execute(run), name=f"tidegate.run-{run.id}")
        self.runs[run.id] = run

    def give_back(self, run_ids: set[int]) -> None:
        """Hand back those of ``run_ids`` still waiting for a slot: no handler of this
        workloop returned in time, so another worker's free slot should take them. At
        shutdown, the worker hands them back with the rest."""
        late = [run_id for run_id in run_ids if run_id in self.waiting]
        if not late or self.worker.stopping.is_set():
            return
        for run_id in late:
            del self.waiting[run_id]
        self.releasing.update(late)
        task = asyncio.create_task(self.release(late), name="tidegate.give-back")
        self.releases.add(task)
        task.add_done_callback(self.releases.discard)

    async def release(self, run_ids: list[int]) -> None:
        """Make ``run_ids`` available again, their attempts not counted, retrying while
        the database is unavailable (their leases are renewed meanwhile)."""
        worker = self.worker
        # Only a local worker claims ahead: the API gives a remote workloop no more runs
        # than its free slots.
        assert isinstance(worker.link, DatabaseLink)
        failures = 0
        while True:
            try:
                await worker.link.release(worker.id, run_ids, worker.app.available_channel)
                break
            except LINK_ERRORS as error:
                failures += 1
                log.warning(
                    "%s: could not hand back %d run(s) claimed ahead, retrying: %s",
                    self.name,
                    len(run_ids),
                    describe(error),
                )
                await asyncio.sleep(retry_delay(failures))
        self.releasing.difference_update(run_ids)

    async def execute(self, run: Run) -> None:
        worker = self.worker
        started = time.monotonic()
        _progress.set(worker.completer)  # in this run's task's own context
        me = asyncio.current_task()
        assert me is not None
        with span("execute", **run.fields) as executing:
            self.handling[run.id] = (me, run, started)
            try:
                outcome = await execute(
                    run, worker.tasks[run.task], worker.executor, worker.settings
                )
            except asyncio.CancelledError:
                if me not in self.lost:
                    raise  # the shutdown's: the run is handed back
                executing.note(outcome="late")
                worker.counters.stopped(run, time.monotonic() - started)
                self.free_slot(run)
                return
            finally:
                self.lost.discard(me)  # a thread told to stop ends here too
                if self.handling.get(run.id, (None,))[0] is me:
                    del self.handling[run.id]
            label = outcome_label(outcome, recorded=True)
            executing.note(outcome=label)
            if outcome.message is not None:
                executing.failed(outcome.message)
        seconds = time.monotonic() - started
        self.pace.ran(seconds)
        _log_outcome(run, outcome, label)
        self.unwritten += 1
        counted = functools.partial(self.written, run, outcome, seconds)
        if run.lane == "fast_lane":
            # A caller waits for the result, and admission counts fast-lane slots from
            # the database: the slot frees once the outcome is written.
            stored: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            worker.completer.add(outcome, lambda recorded: _resolve(stored, recorded))
            counted(await stored)
        else:
            worker.completer.add(outcome, counted)
        self.free_slot(run)

    def free_slot(self, run: Run) -> None:
        if self.running.get(run.id) is asyncio.current_task():  # not a later claim's
            del self.running[run.id], self.runs[run.id]
        if self.waiting and not self.worker.stopping.is_set():
            run_id = next(iter(self.waiting))
            self.launch(self.waiting.pop(run_id))
        if self.backlog:
            self.wake.set()

    def forget_waiting(self, run_ids: set[int]) -> None:
        """Drop the waiting runs among ``run_ids``: they left this worker (cancelled, or
        rescued) before a slot took them."""
        for run_id in run_ids & self.waiting.keys():
            run = self.waiting.pop(run_id)
            log.warning(
                "run %d (task %s) attempt %d left this worker before it started "
                "(cancelled, or its lease lapsed and it was rescued): not run",
                run.id,
                run.task,
                run.attempt,
                extra=run.fields,
            )

    def stop_lost(self, run_id: int, execution: asyncio.Task[None] | None = None) -> None:
        """Stop the handler of a run that is no longer this worker's (only if it is still
        ``execution``, when given): an async one is cancelled (no outcome is written: the
        run has one already, or another attempt will give it one); a thread cannot be
        stopped, its outcome comes late."""
        found = self.handling.get(run_id)
        if found is None or found[0] in self.lost or execution not in (None, found[0]):
            return
        task, run, _ = found
        self.lost.add(task)
        is_async = self.worker.tasks[run.task].is_async
        log.warning(
            "run %d (task %s) attempt %d is no longer this worker's (cancelled, or its "
            "lease lapsed and it was rescued): %s",
            run.id,
            run.task,
            run.attempt,
            "its handler is cancelled"
            if is_async
            else "its sync handler cannot be stopped, and its outcome will not be recorded",
            extra=run.fields,
        )
        if is_async:
            task.cancel()

    def written(self, run: Run, outcome: Outcome, seconds: float, recorded: bool) -> None:
        """Count an attempt once its outcome is written (or given up)."""
        self.unwritten -= 1
        self.worker.counters.count(run, outcome, recorded, seconds)
        if self.backlog:
            self.wake.set()


class Pace:
    """Whether a workloop claims runs ahead of its free slots: while its handlers return
    faster than a claim's round trip, one for each slot whose handler is not overdue;
    else none.

    Where handlers return within a claim's round trip (a drain of short runs), every
    slot would stand empty while each claim travels; the runs claimed ahead fill them at
    once instead. A run claimed ahead waits for one handler to return, shorter than a
    claim's round trip, so a key that turns up meanwhile is held back no longer than a
    claim would have taken anyway. Where handlers take longer, nothing is claimed ahead,
    and a slot whose handler has run past ``HOLD_SECONDS`` (a slow run among fast ones)
    is not counted on. Both durations are smoothed over recent ones (exponentially,
    ``WEIGHT`` to the newest)."""

    WEIGHT = 0.2

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.run_seconds = math.inf
        """How long a handler takes."""
        self.claim_seconds = 0.0
        """How long a claim takes, from asking to the runs in hand."""

    def ahead(self, overdue: int) -> int:
        """Runs to claim beyond the free slots, ``overdue`` of the slots' handlers having
        run past ``HOLD_SECONDS``."""
        return self.slots - overdue if self.run_seconds < self.claim_seconds else 0

    def ran(self, seconds: float) -> None:
        if math.isinf(self.run_seconds):
            self.run_seconds = seconds
        self.run_seconds += self.WEIGHT * (seconds - self.run_seconds)

    def claimed(self, seconds: float) -> None:
        self.claim_seconds += self.WEIGHT * (seconds - self.claim_seconds)


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():  # not cancelled by a shutdown meanwhile
        future.set_result(value)


def _log_outcome(run: Run, outcome: Outcome, label: str) -> None:
    """Log every attempt that did not succeed: failures, retries to come, discards. A
    JSON line carries the run's fields and the outcome, named as in the metrics."""
    state = outcome.state
    if state is RunState.SUCCEEDED or (state is RunState.SCHEDULED and outcome.message is None):
        return  # succeeded, or a retry its handler asked for: nothing to tell
    where = (
        f"run {run.id} (task {run.task}, key {run.key}) attempt {run.attempt}/{run.max_attempts}"
    )
    extra = {**run.fields, "outcome": label}
    if state is RunState.DISCARDED:
        log.error("%s failed, discarded: %s", where, outcome.message, extra=extra)
    elif state is RunState.SCHEDULED:
        log.warning(
            "%s failed, retrying in %.1fs: %s",
            where,
            outcome.delay_seconds,
            outcome.message,
            extra=extra,
        )
    elif state is RunState.CANCELLED:
        log.info("%s cancelled by its handler: %s", where, outcome.message, extra=extra)


def _log_parked(parked: list[Run]) -> None:
    """Say loudly which runs wait for a worker that has their task."""
    by_task: dict[tuple[str, str], list[int]] = {}
    for run in parked:
        by_task.setdefault((run.task, run.lane), []).append(run.id)
    for (task, lane), ids in by_task.items():
        shown = ", ".join(map(str, ids[:5])) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        log.warning(
            "no live worker has task %r for lane %r: run(s) %s wait as pending until one "
            "starts (is the task registered under this name in the worker's app?)",
            task,
            lane,
            shown,
        )


class Worker:
    """One worker process: its workloops, its connections, its services."""

    def __init__(
        self,
        app: Tidegate,
        settings: Settings | None = None,
        link: DatabaseLink | RemoteLink | None = None,
    ) -> None:
        self.app = app
        self.settings = settings or app.settings
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.stopping = asyncio.Event()
        """Set at shutdown: workloops stop claiming."""
        self.tasks = dict(app.tasks)
        """The tasks this worker runs: its app's, as they were when it was made (a remote
        worker's built-in forwarding gets its requests from the API)."""
        if isinstance(link, RemoteLink):
            self.tasks[FORWARD_TASK] = replace(self.tasks[FORWARD_TASK], fn=handler(link.delivery))
        self.live_seconds = 3 * self.settings.heartbeat_seconds
        """How recently a worker must have beaten to count as alive."""
        self.came_up_short = False
        """Whether a claim came up short since the parker last looked: strays may be
        what it passed over. While every claim is full, none is in the way."""
        self.counters = Counters()
        """The attempts finished since the last heartbeat, which writes them."""
        self.workloops = [
            Workloop(self, spec, i) for i, spec in enumerate(self.settings.parsed_workloops)
        ]
        slots = sum(spec.slots for spec in self.settings.parsed_workloops)
        self.executor = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="tidegate-run")
        self.link = link or DatabaseLink(app, size=len(self.workloops) + 5)
        """How it reaches its runs: PostgreSQL, or the API (remote mode)."""
        self.completer = Completer(
            self.link,
            {
                "worker_id": self.id,
                "completed_channel": app.completed_channel,
                "channel": app.available_channel,
            },
        )
        channel = {"channel": app.available_channel}
        lease = {"lease_seconds": self.settings.lease_seconds}
        routes = {
            "tasks": list(self.tasks),
            "lanes": sorted({lane for w in self.workloops for lane in w.spec.named_lanes}),
            "wildcard": any(w.spec.wildcard for w in self.workloops),
        }
        self.heartbeat = Periodic("heartbeat", self.settings.heartbeat_seconds, self.beat)
        self.started = asyncio.Event()
        """Set once its workloops claim."""
        self.services: list[Service] = [self.completer, self.heartbeat]
        if isinstance(self.link, DatabaseLink):
            self.pool = self.link.pool
            self.services += self._database_services(channel, lease, routes)

    def _database_services(
        self, channel: dict[str, Any], lease: dict[str, Any], routes: dict[str, Any]
    ) -> list[Service]:
        """What a worker on PostgreSQL does beside its workloops; for a remote worker, the
        API stages and rescues at its heartbeats (worker/link.py)."""
        app = self.app
        return [
            Listener(app.database.aconnect, [app.available_channel], self.wake),
            Periodic(
                "stager",
                self.settings.stage_seconds,
                self._batch("stage_runs", {**channel, **routes, "limit": BATCH_LIMIT}),
            ),
            Periodic(
                "parker",
                self.settings.stage_seconds,
                functools.partial(
                    self.park,
                    {
                        **routes,
                        "scan_limit": CLAIM_SCAN_LIMIT,
                        "live_seconds": self.live_seconds,
                    },
                ),
            ),
            Periodic(
                "rescuer",
                self.settings.rescue_seconds,
                functools.partial(rescue, self.pool, app.available_channel, app.completed_channel),
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
            Periodic("scheduler", self.settings.schedule_seconds, self.fire_schedules),
            Periodic(
                "folder",
                self.settings.rescue_seconds,
                self._fold,
            ),
        ]

    # -- the life of a worker ------------------------------------------------------

    async def run_until_signalled(self) -> None:
        """Run until SIGTERM or SIGINT, then shut down gracefully; a second one exits now."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def signalled() -> None:
            if not stop.is_set():
                stop.set()
                return
            held = sum(len(w.running) + len(w.waiting) for w in self.workloops)
            log.warning(
                "worker %s: stopping now, at a second signal; %d run(s) it holds are "
                "rescued when their leases lapse",
                self.id,
                held,
            )
            os._exit(1)

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, signalled)
        await self.run(stop)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set or a service fails; always shut down cleanly."""
        await self.link.open(self)
        tasks: list[asyncio.Task[None]] = []
        try:
            await self.beat()
            if isinstance(self.link, DatabaseLink):
                async with self.pool.connection() as conn:
                    await adrive(conn, declare_steps(self.app, list(self.tasks)))
            tasks = [service.start() for service in self.services]
            for service in self.services:
                if isinstance(service, Listener):
                    await asyncio.wait_for(service.listening.wait(), 10)
            tasks += [loop.start() for loop in self.workloops]
            self.started.set()
            log.info(
                "worker %s started: workloops %s; tasks %s",
                self.id,
                " ".join(str(loop.spec) for loop in self.workloops),
                ", ".join(sorted(self.tasks)) or "(none)",
            )
            self.warn_of_unused_lanes()
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

    def warn_of_unused_lanes(self) -> None:
        """Warn of a workloop lane that nothing puts runs in: most likely a typo."""
        named = {lane for loop in self.workloops for lane in loop.spec.named_lanes}
        used = BUILTIN_LANES | {task.lane for task in self.tasks.values()}
        for lane in sorted(named - used):
            log.warning(
                "workloop lane %r: no task of this app has it and tidegate puts nothing in "
                "it; only runs enqueued with lane=%r reach it (a typo?)",
                lane,
                lane,
            )

    async def shutdown(self) -> None:
        """Stop within ``shutdown_grace_seconds``, whatever the database (or the API)
        does: handlers get the grace less ``WRITE_RESERVE_SECONDS``, the last writes
        (outcomes, hand-backs, the worker's row) what is left. Only a sync handler that
        outlasts the grace keeps the worker (its thread cannot be stopped)."""
        clock = asyncio.get_running_loop().time
        grace = self.settings.shutdown_grace_seconds
        deadline = clock() + grace
        handlers_until = deadline - min(WRITE_RESERVE_SECONDS, grace / 5)
        self.stopping.set()
        held = sum(len(loop.running) + len(loop.waiting) for loop in self.workloops)
        log.info(
            "worker %s: stopping: no more claims; %d run(s) in hand get up to %gs",
            self.id,
            held,
            grace,
        )
        for loop in self.workloops:
            loop.wake.set()
        # A claim in flight ends the loop's turn; one the database does not answer is
        # given up (what it may have claimed lapses and is rescued).
        claiming = [loop.task for loop in self.workloops if loop.task and not loop.task.done()]
        if claiming:
            _, stuck = await asyncio.wait(claiming, timeout=max(0.0, handlers_until - clock()))
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)
        in_flight = {
            run_id: task for loop in self.workloops for run_id, task in loop.running.items()
        }
        if in_flight:
            log.info("worker %s: waiting for %d runs", self.id, len(in_flight))
            await asyncio.wait(in_flight.values(), timeout=max(0.0, handlers_until - clock()))
        unfinished = [task for task in in_flight.values() if not task.done()]
        if unfinished:
            threads = sum(
                1
                for loop in self.workloops
                for run_id, task in loop.running.items()
                if not task.done() and not self.tasks[loop.runs[run_id].task].is_async
            )
            log.warning(
                "worker %s: grace period over: cancelling %d async handler(s), their runs go "
                "back to available once stopped; waiting for %d sync handler(s), which "
                "cannot be interrupted (their runs stay leased; a second signal exits now)",
                self.id,
                len(unfinished) - threads,
                threads,
            )
            for task in unfinished:
                task.cancel()
        # The heartbeat goes on meanwhile: runs whose handlers still execute keep their
        # leases until the handlers have returned or stopped.
        await asyncio.gather(*in_flight.values(), return_exceptions=True)
        # Runs that waited for a slot never started (none takes one once stopping):
        # handed back with the interrupted ones, their leases renewed until then, as are
        # those claimed ahead that were being handed back.
        for loop in self.workloops:
            for release in list(loop.releases):
                release.cancel()
        handed_back = [
            run_id for loop in self.workloops for run_id in (*loop.waiting, *loop.releasing)
        ]
        handed_back += [run_id for run_id, task in in_flight.items() if task.cancelled()]
        # Bounded: a database (or API) that stays down must not keep the worker alive.
        # Sync handlers that outlasted the grace still get their outcomes a moment.
        writes_until = max(deadline, clock() + LAST_WORDS_SECONDS)
        await self.completer.drain(writes_until - clock())
        for service in self.services:
            await service.stop()
        try:
            if handed_back:
                log.info("worker %s: handing back %d runs", self.id, len(handed_back))
            await asyncio.wait_for(
                self.leave(handed_back), max(LAST_WORDS_SECONDS / 2, writes_until - clock())
            )
        except (TimeoutError, *LINK_ERRORS) as error:
            log.warning(
                "worker %s: %s gone at shutdown, leases will expire, the attempts "
                "finished since the last heartbeat go uncounted: %s",
                self.id,
                "the API" if self.link.remote else "database",
                describe(error),
            )
        finally:
            await self.link.close()
            await self.app.aclose_pool()
            self.executor.shutdown(wait=False, cancel_futures=True)
        log.info("worker %s stopped", self.id)

    async def leave(self, handed_back: list[int]) -> None:
        """The last words: a beat writes what was counted since the previous one, the
        runs not finished go back, the worker's row goes; once it is gone, the fold moves
        its counters into those of 'retired'."""
        await self.beat()
        await self.link.leave(self.id, handed_back, self.app.available_channel)
        if isinstance(self.link, DatabaseLink):
            await self._fold()

    # -- what the services do ------------------------------------------------------

    def wake(self, channel: str, lane: str) -> None:
        """``lane`` has new runs: wake the workloops that name it, or, where none of them
        has a free slot, those that take it through ``*``. Every woken loop claims, and
        one run needs one claim (a sync webhook's, most often). A loop left asleep looks
        when its next slot frees, or when a woken one comes back with all it asked for
        (``spill``)."""
        loops = [loop for loop in self.workloops if loop.admits(lane)]
        for loop in loops:
            loop.backlog = True
        named = [loop for loop in loops if lane in loop.places and loop.free > 0]
        for loop in named or [loop for loop in loops if loop.free > 0]:
            loop.wake.set()

    def spill(self, full: Workloop) -> None:
        """``full`` claimed all it asked for: more runs may wait. Wake the other loops
        told of runs (``backlog``) that have free slots."""
        for loop in self.workloops:
            if loop is not full and loop.backlog and loop.free > 0:
                loop.wake.set()

    async def beat(self) -> bool:
        workloops = [
            {"chain": list(loop.spec.chain), "slots": loop.spec.slots, "busy": len(loop.running)}
            for loop in self.workloops
        ]
        held = [
            run_id
            for loop in self.workloops
            for run_id in (*loop.running, *loop.waiting, *loop.releasing)
        ]
        held += list(self.completer.pending)
        waiting = {run_id for loop in self.workloops for run_id in loop.waiting}
        handling = {
            run_id: (loop, task)
            for loop in self.workloops
            for run_id, (task, _, _) in loop.handling.items()
        }
        counted = self.counters.take()
        try:
            renewed = await self.link.beat(
                {
                    "worker_id": self.id,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "workloops": json.dumps(workloops),
                    "tasks": list(self.tasks),
                    "run_ids": held,
                    "lease_seconds": self.settings.lease_seconds,
                    "counters": as_json(counted),
                    "token": None,
                },
            )
        except BaseException:  # not written: the next beat (or the stop) writes them
            self.counters.restore(counted)
            raise
        # A run whose handler executed before the beat and whose lease was not renewed
        # has left this worker (its outcome, written meanwhile, would have taken it out
        # of ``handling``).
        for run_id in handling.keys() - set(renewed):
            loop, execution = handling[run_id]
            loop.stop_lost(run_id, execution)
        for loop in self.workloops:
            loop.forget_waiting(waiting - set(renewed))
        return False

    async def fire_schedules(self) -> bool:
        """Fire the due schedules of this worker's tasks (worker/scheduler.py)."""
        async with self.pool.connection() as conn, conn.transaction():
            locked = await adrive(conn, fire_steps(self.app, list(self.tasks)))
        return locked >= FIRE_LIMIT

    async def _fold(self) -> bool:
        """Fold the counters of workers no longer live into those of 'retired'."""
        params = {"live_seconds": self.live_seconds, "limit": BATCH_LIMIT}
        rows = await fetch(self.pool, "fold_counters", params)
        return bool(rows[0][0] >= BATCH_LIMIT)

    async def park(self, params: dict[str, Any]) -> bool:
        """Set pending the runs at the head of this worker's lanes that no live worker
        can run, and say so; a claim only passes over them."""
        if not self.came_up_short:
            return False
        self.came_up_short = False
        async with self.pool.connection() as conn:
            cursor = conn.cursor(row_factory=run_row)
            await cursor.execute(query("park_strays"), params)
            parked = await cursor.fetchall()
        if parked:
            _log_parked(parked)
            for loop in self.workloops:  # room at the head of a lane: look again
                loop.wake.set()
        return False

    def _batch(
        self, name: str, params: dict[str, Any], full: int = BATCH_LIMIT
    ) -> Callable[[], Awaitable[bool]]:
        """Return a tick that runs a batch statement; a full batch asks to go again."""

        async def tick() -> bool:
            rows = await fetch(self.pool, name, params)
            return bool(rows[0][0] >= full)

        return tick
