"""Remote workers' long-polling claims: how many may wait, and which a NOTIFY wakes.

A claim (``POST /workers/{id}/claim``) that finds no run waits for one, up to its
``wait_seconds``, holding no connection. What it costs is bounded (docs/architecture.md, invariant
13), per API process:

- one claim at a time per workloop of a worker: a workloop claims for its free slots,
  then again once it has its runs, so a worker that plays by the protocol never needs
  two; a second is answered 429, ``Retry-After`` when the first ends at the latest;
- ``max_claims_per_token`` claims of one worker token's workers, and claims of at most
  ``MAX_KINDS_PER_TOKEN`` kinds (below): 429, ``Retry-After`` when the token's soonest
  claim ends at the latest.

A wake costs the database a look per new run, not per waiting claim. Claims that can
take the same runs (the same chain and the same tasks: one *kind*) wait in one queue,
first come first served. Lanes with new runs NOTIFY the available channel (a LISTEN
connection per process, opened by the first claim that waits). A NOTIFY of a lane wakes
the first claim of each kind whose chain takes the lane, and no other: its worker's
runs would be the same as the next one's. A woken claim that takes all it asked for
wakes the next of its kind (more runs may be waiting); one that comes back short does
not (its kind's runs are taken), and goes back to the end of the queue. No wake is lost:

- a claim woken that leaves before it has looked (its deadline came, its client went,
  an error) wakes the next of its kind in its place;
- a NOTIFY that finds no claim of a kind asleep (they are all looking, their reads
  perhaps older than the new runs) marks the kind; a claim that comes back empty looks
  again, instead of sleeping, when the mark came since its look began;
- when the listener connects again, notifications may have been lost meanwhile: the
  first claim of every kind is woken.

The long poll's deadline, and the workers' next claims, are a safety net only.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg

from tidegate.lanes import chain_admits
from tidegate.worker.services import Listener

LISTEN_WAIT_SECONDS = 5.0
"""How long the first claim waits for the listener to LISTEN before it looks anyway."""
MAX_KINDS_PER_TOKEN = 16
"""The most kinds of claims (chain and tasks) one worker token's workers may have waiting
on an API process: every kind costs a look at each NOTIFY of a lane it takes. A fleet
running one app has one kind per workloop chain."""

Kind = tuple[tuple[str, ...], tuple[str, ...]]
"""(chain, tasks)"""


class Busy(Exception):
    """A claim over its bounds: 429, to retry after ``retry_after`` seconds."""

    def __init__(self, title: str, retry_after: float) -> None:
        super().__init__(title)
        self.title = title
        self.retry_after = max(1, min(60, math.ceil(retry_after)))


class Queue:
    """The waiting claims of one kind: those asleep, in order, and whether a wake came
    while none was."""

    def __init__(self, chain: tuple[str, ...]) -> None:
        self.chain = chain
        self.asleep: dict[Turn, None] = {}
        """Claims asleep, first come first (a dict keeps its order, and drops one in O(1))."""
        self.missed = False
        """A wake came while no claim of this kind was asleep."""
        self.claims = 0

    def wake(self) -> None:
        """Wake the first claim asleep, or mark the kind for those looking."""
        if not self.asleep:
            self.missed = True
            return
        turn = next(iter(self.asleep))
        del self.asleep[turn]
        turn.owed = True
        turn.woken.set()


class Turn:
    """One claim's place among the waiting: look, then sleep until woken."""

    def __init__(self, queue: Queue, token: str, deadline: float) -> None:
        self.queue = queue
        self.token = token
        self.deadline = deadline
        self.woken = asyncio.Event()
        self.owed = False
        """Woken by a NOTIFY (or passed a wake) and not yet looked: a look it owes."""

    def look(self) -> None:
        """Say a look begins: it reads every run whose NOTIFY came before now."""
        self.queue.missed = False

    def looked(self, *, asked: int, got: int) -> None:
        """Say the look is done: it asked for ``asked`` runs (none: its workloop was full)
        and got ``got``. One that got all it asked for wakes the next of its kind (runs may
        be left); so does one woken that could ask for none (the wake was not used)."""
        if (asked > 0 and got == asked) or (asked <= 0 and self.owed):
            self.queue.wake()
        self.owed = False

    async def sleep(self, timeout: float, gone: asyncio.Future[None]) -> None:
        """Wait until woken, ``gone`` is done (the client left) or ``timeout`` passes;
        return at once if a wake came while this claim looked."""
        if self.queue.missed:
            return
        self.woken.clear()
        self.queue.asleep[self] = None
        woken = asyncio.ensure_future(self.woken.wait())
        either: list[asyncio.Future[Any]] = [woken, gone]
        try:
            await asyncio.wait(
                either, timeout=max(timeout, 0.0), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            woken.cancel()
            self.queue.asleep.pop(self, None)


class Claims:
    """The waiting claims of one API process, their bounds, and the listener that wakes
    them."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection]],
        available_channel: str,
        max_per_token: int,
    ) -> None:
        self.max_per_token = max_per_token
        self.queues: dict[Kind, Queue] = {}
        self.workloops: dict[tuple[str, int], Turn] = {}
        """The claim of each (worker, workloop) that has one."""
        self.tokens: dict[str, dict[Turn, Kind]] = {}
        """Each worker token's claims, with their kinds."""
        self.listener = Listener(connect, [available_channel], self._ready, self._wake_all)
        """Started by the first claim: a process no remote worker calls does not hear of
        every enqueue."""

    async def stop(self) -> None:
        await self.listener.stop()

    @contextlib.asynccontextmanager
    async def claiming(
        self,
        token: str,
        worker: tuple[str, int],
        kind: Kind,
        deadline: float,
    ) -> AsyncIterator[Turn]:
        """A turn among the waiting claims, for the block; ``Busy`` past the bounds."""
        now = asyncio.get_running_loop().time()
        held = self.workloops.get(worker)
        if held is not None:
            raise Busy(
                f"workloop {worker[1]} of this worker has a claim waiting", held.deadline - now
            )
        mine = self.tokens.get(token, {})
        if len(mine) >= self.max_per_token or (
            kind not in mine.values() and len(set(mine.values())) >= MAX_KINDS_PER_TOKEN
        ):
            title = (
                f"this worker token's workers have {len(mine)} claims waiting (at most "
                f"{self.max_per_token}, of {MAX_KINDS_PER_TOKEN} kinds of workloop chain and "
                "tasks)"
            )
            raise Busy(title, min(turn.deadline for turn in mine) - now)
        queue = self.queues.get(kind)
        if queue is None:
            queue = self.queues[kind] = Queue(kind[0])
        turn = Turn(queue, token, deadline)
        queue.claims += 1
        self.workloops[worker] = turn
        self.tokens.setdefault(token, {})[turn] = kind
        try:
            if self.listener.task is None:
                self.listener.start()
            with contextlib.suppress(TimeoutError):  # until it listens, a claim waits longer
                await asyncio.wait_for(self.listener.listening.wait(), LISTEN_WAIT_SECONDS)
            yield turn
        finally:
            if turn.owed:  # woken, and gone without looking: the next looks instead
                queue.wake()
            queue.claims -= 1
            if not queue.claims:
                del self.queues[kind]
            del self.workloops[worker]
            del self.tokens[token][turn]
            if not self.tokens[token]:
                del self.tokens[token]

    def _ready(self, channel: str, lane: str) -> None:
        for queue in self.queues.values():
            if chain_admits(queue.chain, lane):
                queue.wake()

    def _wake_all(self) -> None:
        for queue in self.queues.values():
            queue.wake()
