"""The worker: one process's workloops, its connections, and the services that keep them
honest, started together and stopped together.

A ``Worker`` holds:

- its workloops (worker/workloop.py), which claim runs and execute them;
- its completer (worker/completer.py), which writes their outcomes;
- its heartbeat (``beat``, here), which writes the worker's row (workloops, slots, busy),
  renews the leases of the runs it holds, and adds the attempts finished since the last
  beat to its counters (worker/counters.py);
- on PostgreSQL, a listener that wakes the workloops a NOTIFY's lane concerns
  (``wake``), the maintenance duties (worker/maintenance.py: stager, parker, rescuer,
  pruner, folder) and the scheduler (worker/scheduler.py);
- its link (worker/link.py): the database, or the API for a remote worker.

When it starts, a worker declares its tasks' settings (lane, priority, max_attempts,
timeout) in the ``tasks`` table (tidegate.tasks), so that a run enqueued by task name by
a process without the task's code gets them too. A worker claims only runs of the tasks
it has (its app's tasks when it starts, also advertised in its row): a claim passes
over a run of another task, leaving it for a worker that has it. When no live worker
has it, the parker (every ``stage_seconds``, after a claim that came up short) sets it
``pending`` until one starts, out of the claims' way. No attempt is spent for want of a task.

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
import json
import logging
import os
import secrets
import signal
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from tidegate.app import Tidegate
from tidegate.forward import FORWARD_TASK, handler
from tidegate.lanes import BUILTIN_LANES
from tidegate.settings import Settings
from tidegate.storage.sql import adrive
from tidegate.tasks import declare_tasks
from tidegate.worker.completer import Completer
from tidegate.worker.counters import Counters, as_json
from tidegate.worker.link import DatabaseLink, RemoteLink
from tidegate.worker.maintenance import Folder, Parker, Pruner, Rescuer, Stager
from tidegate.worker.scheduler import Scheduler, declare_steps
from tidegate.worker.services import LINK_ERRORS, Listener, Periodic, Service, describe
from tidegate.worker.workloop import Workloop

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


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """Return uvloop's loop factory where uvloop is installed, else None (asyncio's)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


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
        self.counters = Counters()
        """The attempts finished since the last heartbeat, which writes them."""
        self.claim_params: dict[str, Any] = {
            "worker_id": self.id,
            "lease_seconds": self.settings.lease_seconds,
            "scan_limit": CLAIM_SCAN_LIMIT,
            "head_scan": CLAIM_HEAD_SCAN,
            "tasks": list(self.tasks),
            "live_seconds": self.live_seconds,
        }
        """What every claim of its workloops passes (``claim_runs``); each adds its lanes."""
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
        self.heartbeat = Periodic("heartbeat", self.settings.heartbeat_seconds, self.beat)
        self.started = asyncio.Event()
        """Set once its workloops claim."""
        self.services: list[Service] = [self.completer, self.heartbeat]
        self.parker: Parker | None = None
        self.scheduler: Scheduler | None = None
        self.folder: Folder | None = None
        if isinstance(self.link, DatabaseLink):
            self.pool = self.link.pool
            self.services += self._maintenance()

    def _maintenance(self) -> list[Service]:
        """What a worker on PostgreSQL does beside its workloops (worker/maintenance.py,
        worker/scheduler.py); for a remote worker, the API stages and rescues at its
        heartbeats (worker/link.py)."""
        app, settings = self.app, self.settings
        # Which runs are this worker's to stage and to park: of the tasks it has, in the
        # lanes its workloops take.
        routes = {
            "tasks": list(self.tasks),
            "lanes": sorted({lane for w in self.workloops for lane in w.spec.named_lanes}),
            "wildcard": any(w.spec.wildcard for w in self.workloops),
        }
        self.parker = Parker(
            self.pool,
            settings.stage_seconds,
            {**routes, "scan_limit": CLAIM_SCAN_LIMIT, "live_seconds": self.live_seconds},
            self.look_again,
        )
        self.scheduler = Scheduler(app, self.pool, settings.schedule_seconds, list(self.tasks))
        self.folder = Folder(self.pool, settings.rescue_seconds, self.live_seconds)
        prune = {
            "lease_seconds": settings.lease_seconds,
            "retention_seconds": settings.retention_seconds,
            "batch": settings.prune_batch,
        }
        return [
            Listener(app.database.aconnect, [app.available_channel], self.wake),
            Stager(self.pool, settings.stage_seconds, {"channel": app.available_channel, **routes}),
            self.parker,
            Rescuer(
                self.pool, settings.rescue_seconds, app.available_channel, app.completed_channel
            ),
            Pruner(self.pool, settings.prune_seconds, prune),
            self.scheduler,
            self.folder,
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
                    declared = [task.settings for task in self.tasks.values()]
                    await adrive(conn, declare_tasks(declared, self.id))
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
        if self.folder is not None:
            await self.folder.fold()

    # -- what the workloops and the services tell it ----------------------------------

    def wake(self, channel: str, lane: str) -> None:
        """``lane`` has new runs: wake the workloops that name it, or, where none of them
        has a free slot, those that take it through ``*``. Every woken loop claims, and
        one run needs one claim (a sync webhook's, most often). A loop left asleep looks
        when its next slot frees, or when a woken one comes back with all it asked for
        (``spill``)."""
        loops = [loop for loop in self.workloops if loop.admits(lane)]
        for loop in loops:
            loop.backlog = True
            loop.stocked(lane)
        named = [loop for loop in loops if lane in loop.places and loop.free > 0]
        for loop in named or [loop for loop in loops if loop.free > 0]:
            loop.wake.set()

    def came_up_short(self) -> None:
        """A claim came up short: strays of a task no live worker has may be what it passed
        over, and the parker (a local worker's) looks at its next round."""
        if self.parker is not None:
            self.parker.came_up_short = True

    def look_again(self) -> None:
        """Runs were set pending at the head of a lane: every workloop looks again."""
        for loop in self.workloops:
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
