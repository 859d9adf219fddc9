"""A workloop: one group of a worker's slots, claiming along its lane chain and running
what it claims.

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

A workloop with shares (``"a=3,b=1/2,*:12"``, tidegate/lanes.py) splits each claim's
demand among its lanes from its own runs per lane (``share_demands``), and asks for each
lane's part in one statement. A lane whose part came up short is *dry*: its share is lent
to the others until a NOTIFY says it has runs again (or the safety-net poll), and the
claim goes on at once for the slots it left. Lent slots come back as the borrowers' runs
finish: a run is never stopped to make room.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidegate.lanes import WILDCARD, WorkloopSpec, chain_admits, share_demands
from tidegate.runs import Run, RunState, _progress
from tidegate.tracing import span
from tidegate.worker.counters import outcome_label
from tidegate.worker.execute import ExcInfo, Outcome, execute
from tidegate.worker.link import DatabaseLink, RemoteLink
from tidegate.worker.maintenance import log_parked
from tidegate.worker.services import LINK_ERRORS, Service, describe, passing, retry_delay

if TYPE_CHECKING:
    from tidegate.worker.runtime import Worker

log = logging.getLogger("tidegate.worker")

HOLD_SECONDS = 0.01
"""How long a run claimed ahead may wait in the worker for a slot before it is handed
back: runs are claimed ahead only for handlers that return within a claim's round trip
(about a millisecond), so one that has waited this long waits behind a slow handler."""


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
        self.carried: list[Outcome] = []
        """Outcomes the next claim carries, where the link's claims do (a remote
        worker's): written in the claim's call, their slots claimed in it at once."""
        self.claiming = False
        """Whether a claim is in flight."""
        self.carried_last = False
        """Whether the last claim carried outcomes."""
        self.backlog = True
        """Whether the last claim was full, so runs may be waiting for a free slot."""
        self.last_claim_seconds = 0.0
        """How long the last claim took (a remote one's long poll included)."""
        self.wake = asyncio.Event()
        self.wake.set()
        self.claim_params: dict[str, Any] = {
            **worker.claim_params,
            "lanes": list(spec.named_lanes),
            "wildcard": spec.wildcard,
            "workloop": index,
            "demands": None,
            "others_demand": None,
        }
        self.share_of = {share.lane: i for i, share in enumerate(spec.shares)}
        """With shares: each shared lane's share, by lane name (``*``'s too)."""
        self.dry: set[int] = set()
        """The shares whose lanes came up short since they were last told of runs: they
        ask for nothing, and their slots are lent to the others. All ask again every
        ``poll_seconds`` (the safety net, for a NOTIFY that never came)."""
        self.wetted = time.monotonic()
        """When ``dry`` was last emptied by the safety net."""
        self.told: set[int] = set()
        """The shares told of runs while the current claim was in flight: a claim that
        came up short may have read their lanes before the runs were committed."""

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
        held until its outcome is in (docs/workers.md). An outcome the next claim
        carries frees its slot for that claim: the API writes it before it counts."""
        slots = self.spec.slots
        if self.worker.link.remote:
            return slots - (self.unwritten - len(self.carried)) - len(self.running)
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

    def share_index(self, lane: str) -> int:
        """The share a run of ``lane`` counts in: its own, or ``*``'s."""
        return self.share_of.get(lane, self.share_of.get(WILDCARD, -1))

    def stocked(self, lane: str) -> None:
        """``lane`` has new runs: its share asks for its part again."""
        self.dry.discard(self.share_index(lane))
        self.told.add(self.share_index(lane))

    def demands(self, free: int) -> list[int] | None:
        """With shares, how many runs each share asks for, ``free`` in all at most, from
        the runs each holds now (handlers executing, and runs claimed ahead); None for a
        chain."""
        shares = self.spec.shares
        if not shares:
            return None
        held = [0] * len(shares)
        for run in (*self.runs.values(), *self.waiting.values()):
            held[self.share_index(run.lane)] += 1
        return share_demands(shares, held, free, self.dry)

    def note_dry(self, demands: list[int], claimed: list[Run]) -> None:
        """Mark dry the shares that got fewer runs than they asked for, but those told of
        new runs meanwhile."""
        got = [0] * len(demands)
        for run in claimed:
            got[self.share_index(run.lane)] += 1
        self.dry.update(
            i
            for i, (asked, had) in enumerate(zip(demands, got, strict=True))
            if had < asked and i not in self.told
        )

    def claim_order(self, run: Run) -> tuple[int, float, int]:
        """Where ``run`` stands in a claim: its lane's place in the chain, then its rank."""
        return self.places.get(run.lane, len(self.places)), run.rank, run.id

    async def run(self) -> None:
        try:
            await self.claim_and_launch()
        finally:
            if self.carried:  # the claim they waited for will not come
                self.worker.completer.give(self.carried)
                self.carried = []

    async def claim_and_launch(self) -> None:
        worker = self.worker
        failures = 0
        long_polled = False
        while not worker.stopping.is_set():
            if not long_polled:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), worker.settings.poll_seconds)
            self.wake.clear()
            if time.monotonic() - self.wetted >= worker.settings.poll_seconds:
                self.dry.clear()  # the safety net, for a NOTIFY that never came
                self.wetted = time.monotonic()
            long_polled = False
            # One turn of the loop lets the other handlers finishing now free their
            # slots too, so the claim asks for them all in one statement.
            await asyncio.sleep(0)
            while self.free > 0 and not worker.stopping.is_set():
                demand = self.free
                demands = self.demands(demand)
                if demands is not None:
                    demand = sum(demands)
                    if not demand:  # every shared lane is dry
                        self.backlog = False
                        break
                try:
                    runs = await self.claim(demand, demands)
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
                # full) waits as a local loop does, whose worker's LISTEN wakes it,
                # unless it carried outcomes (the API answers such a claim at once).
                long_polled = worker.link.remote and (
                    bool(runs)
                    or self.carried_last
                    or self.last_claim_seconds >= 0.9 * worker.settings.poll_seconds
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
                    log_parked(parked)
                # A full claim may have left runs behind: a freed slot should look again.
                # A short one found the lanes empty: new runs will say so (NOTIFY). Runs
                # set pending made room at the head of a lane: look again at once.
                self.backlog = len(claimed) == demand
                if self.backlog:
                    worker.spill(self)
                else:
                    worker.came_up_short()
                # With shares, a dry lane's part goes to the lanes still with runs: at
                # once, in the next claim (its passed-over strays aside, set pending).
                lend = False
                if demands is not None and not parked and not self.backlog:
                    self.note_dry(demands, claimed)
                    lend = len(self.dry) < len(demands)
                if not (self.backlog or parked or lend):
                    break

    async def claim(self, demand: int, demands: list[int] | None = None) -> list[Run]:
        """Claim up to ``demand`` runs; with shares, ``demands`` says how many of each
        share's lanes (in ``spec.shares``' order)."""
        started = time.monotonic()
        self.told.clear()
        params = {**self.claim_params, "demand": demand}
        if demands is not None:
            shares = self.spec.shares
            params["demands"] = [
                d for d, s in zip(demands, shares, strict=True) if s.lane != WILDCARD
            ]
            params["others_demand"] = sum(
                d for d, s in zip(demands, shares, strict=True) if s.lane == WILDCARD
            )
        link = self.worker.link
        with span("claim", chain=">".join(self.spec.chain), demand=demand) as claiming:
            if not isinstance(link, RemoteLink) or not link.carries_outcomes:
                claimed = await link.claim(params)
            else:
                carried, self.carried = self.carried, []
                self.carried_last = bool(carried)
                self.claiming = True
                try:
                    rows = [outcome.as_row() for outcome in carried]
                    claimed, written = await link.claim_carrying(params, rows)
                except BaseException:
                    self.worker.completer.give(carried)  # the completer writes them
                    raise
                finally:
                    self.claiming = False
                if carried:
                    await self.worker.completer.settle(carried, written)
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
        attributes: dict[str, Any] = run.fields  # none of them named as span's options
        with span("execute", kind="consumer", link=run.trace_context, **attributes) as executing:
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
        if outcome.raised is not None:
            # What is written needs none of the handler's frames, nor the locals they
            # hold, which would otherwise stay alive while the outcome waits in a batch.
            outcome = dataclasses.replace(outcome, raised=None)
        self.unwritten += 1
        counted = functools.partial(self.written, run, outcome, seconds)
        if run.lane == "fast_lane":
            # A caller waits for the result, and admission counts fast-lane slots from
            # the database: the slot frees once the outcome is written.
            stored: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            worker.completer.add(outcome, lambda recorded: _resolve(stored, recorded))
            counted(await stored)
        else:
            self.complete(outcome, counted)
        self.free_slot(run)

    def complete(self, outcome: Outcome, written: Callable[[bool], None]) -> None:
        """Have ``outcome`` written, then ``written(recorded)`` called: by the next claim,
        where claims carry outcomes and none is in flight (the claim goes at once), else
        by the completer: an outcome that would wait for a long poll's answer, one at
        shutdown, or one whose run's progress events wait (they are written first)."""
        worker = self.worker
        completer = worker.completer
        if (
            worker.link.carries_outcomes
            and not self.claiming
            and not worker.stopping.is_set()
            and outcome.run_id not in completer.events
        ):
            completer.hold(outcome, written)
            self.carried.append(outcome)
            self.wake.set()
        else:
            completer.add(outcome, written)

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
    JSON line carries the run's fields and the outcome, named as in the metrics.

    A handler that raised has its traceback under the line, from the handler's own
    frame on, as its stored error has it (``handler_traceback``); with ``-v``
    (tidegate's loggers at DEBUG), the whole of it, the frames that called the handler
    included.
    """
    state = outcome.state
    if state is RunState.SUCCEEDED or (state is RunState.SCHEDULED and outcome.message is None):
        return  # succeeded, or a retry its handler asked for: nothing to tell
    where = (
        f"run {run.id} (task {run.task}, key {run.key}) attempt {run.attempt}/{run.max_attempts}"
    )
    extra = {**run.fields, "outcome": label}
    exc_info: ExcInfo | BaseException | None = outcome.raised
    if outcome.raised is not None and log.isEnabledFor(logging.DEBUG):
        exc_info = outcome.raised[1]  # its own traceback: the whole of it
    if state is RunState.DISCARDED:
        log.error(
            "%s failed, discarded: %s", where, outcome.message, extra=extra, exc_info=exc_info
        )
    elif state is RunState.SCHEDULED:
        log.warning(
            "%s failed, retrying in %.1fs: %s",
            where,
            outcome.delay_seconds,
            outcome.message,
            extra=extra,
            exc_info=exc_info,
        )
    elif state is RunState.CANCELLED:
        log.info("%s cancelled by its handler: %s", where, outcome.message, extra=extra)
