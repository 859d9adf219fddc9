"""How many event streams an API process serves, in all and by caller.

An event stream (api/events.py: ``GET /runs/{id}/events``, or a sync webhook whose
caller asks for server-sent events) holds a page of events and a socket while it lasts.
``Streams`` bounds them (docs/architecture.md, invariant 13): at most ``max_streams``
per API process (503 past it) and ``max_streams_per_caller`` per caller (429), both with
``Retry-After``; a caller is a token (the super admin's, a project's), or for sync
webhooks the trigger's project. The process's state holds one ``Streams``
(api/kernel.py); a route takes a place before it answers with a stream, and the stream
gives it back when it ends.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable

STREAMS_RETRY_SECONDS = 5
"""Retry-After for a stream over its bounds: a stream ends with its run (a sync webhook's
at its trigger's timeout), so a place frees within seconds on a busy process."""
TRIM_SECONDS = 2.0
MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)
"""glibc's (the process's own symbols hold it); None where the C library has none."""


class Full(Exception):
    """No place for another stream: ``status`` 429 (the caller's) or 503 (the process's)."""

    def __init__(self, status: int, title: str) -> None:
        super().__init__(title)
        self.status = status
        self.title = title
        self.headers = {"Retry-After": str(STREAMS_RETRY_SECONDS)}


class Streams:
    """The event streams an API process serves, in all and by caller.

    What a stream held is freed when it ends, but glibc keeps freed memory for the
    process, to reuse: 500 slow readers of 60 KiB events left the API 75 MB larger once
    they had all gone. ``malloc_trim`` gives it back to the system, once streams have
    ended and at most every ``TRIM_SECONDS`` (it took 16 ms for 140 MB)."""

    def __init__(self, most: int, per_caller: int) -> None:
        self.most = most
        self.per_caller = per_caller
        self.callers: dict[str, int] = {}
        self.open = 0
        self.trim: asyncio.TimerHandle | None = None

    def take(self, caller: str) -> Callable[[], None]:
        """Take a place for a stream of ``caller``; return what gives it back (once,
        however often it is called). ``Full`` when there is none."""
        if self.callers.get(caller, 0) >= self.per_caller:
            raise Full(429, f"this caller has {self.per_caller} event streams open, its most")
        if self.open >= self.most:
            raise Full(503, f"this server has {self.most} event streams open, its most")
        self.callers[caller] = self.callers.get(caller, 0) + 1
        self.open += 1
        given: list[bool] = []

        def give_back() -> None:
            if given:
                return
            given.append(True)
            self.open -= 1
            self.callers[caller] -= 1
            if not self.callers[caller]:
                del self.callers[caller]
            if self.trim is None and MALLOC_TRIM is not None:
                self.trim = asyncio.get_running_loop().call_later(TRIM_SECONDS, self._trim)

        return give_back

    def _trim(self) -> None:
        self.trim = None
        if MALLOC_TRIM is not None:
            MALLOC_TRIM(0)
