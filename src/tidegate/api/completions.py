"""Wait for runs to finish or report progress, on one LISTEN connection per API process.

Workers NOTIFY the id of every fast-lane run, and of every watched run, that reaches a
final state. The listener resolves the futures of the requests waiting for those ids,
and remembers the ids it saw in the last minute: a request that starts waiting just
after its run finished (the notification came between the commit and the wait) still
finds it. A run's new progress events NOTIFY ``e<id>``: they wake the streams that
``watch`` the run. No request polls. (Remote workers' claims wait in api/claims.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator

import psycopg

from tidegate.worker.services import Listener

REMEMBER_SECONDS = 60.0


class Completions:
    """Futures of waiting requests, keyed by run id, resolved by NOTIFY."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection]],
        channel: str,
    ) -> None:
        self.waiting: dict[int, list[asyncio.Future[None]]] = {}
        self.seen: set[int] = set()
        self.seen_order: deque[tuple[float, int]] = deque()
        self.watchers: dict[int, set[asyncio.Event]] = {}
        self.listener = Listener(connect, [channel], self._notified, self._wake_everyone)

    def start(self) -> asyncio.Task[None]:
        return self.listener.start()

    async def stop(self) -> None:
        await self.listener.stop()

    async def wait(self, run_id: int, timeout: float) -> bool:
        """Wait until the run may have finished; ``False`` after ``timeout`` seconds.

        ``True`` is a hint to look: after the listener reconnects, every waiter is woken,
        since a notification may have been lost in the gap.
        """
        if run_id in self.seen:
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(run_id, []).append(future)
        try:
            await asyncio.wait_for(future, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            futures = self.waiting.get(run_id, [])
            if future in futures:
                futures.remove(future)
            if not futures:
                self.waiting.pop(run_id, None)

    @contextlib.contextmanager
    def watch(self, run_id: int) -> Iterator[asyncio.Event]:
        """An event set, for the block, whenever the run may have news: new progress
        events, its end, or the listener's reconnection (a notification may be lost)."""
        news = asyncio.Event()
        self.watchers.setdefault(run_id, set()).add(news)
        try:
            yield news
        finally:
            watchers = self.watchers.get(run_id, set())
            watchers.discard(news)
            if not watchers:
                self.watchers.pop(run_id, None)

    def _notified(self, channel: str, payload: str) -> None:
        if payload.startswith("e"):
            for news in self.watchers.get(int(payload[1:]), ()):
                news.set()
            return
        run_id = int(payload)
        for news in self.watchers.get(run_id, ()):
            news.set()
        now = time.monotonic()
        self.seen.add(run_id)
        self.seen_order.append((now, run_id))
        while self.seen_order and self.seen_order[0][0] < now - REMEMBER_SECONDS:
            self.seen.discard(self.seen_order.popleft()[1])
        for future in self.waiting.get(run_id, []):
            if not future.done():
                future.set_result(None)

    def _wake_everyone(self) -> None:
        for watchers in self.watchers.values():
            for news in watchers:
                news.set()
        for futures in self.waiting.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)
