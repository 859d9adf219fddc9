"""A run's progress as server-sent events: ``GET /runs/{id}/events`` and sync webhooks.

A stream sends the run's progress events (``run.progress``) in order, each as
``event: progress`` with its id, then one last event when the run finishes, and ends.
A client that lost the stream comes back with ``Last-Event-ID`` and gets what followed,
from any API process: the events are rows of ``run_events``, not memory of the process
that sent them.

Nothing polls: the stream sleeps until the completion listener says the run has news
(new events, its end), or sends a keep-alive comment every ``KEEP_ALIVE_SECONDS``.

What a stream costs is bounded (docs/architecture.md, invariant 13). It reads a page of at most
``PAGE`` events and ``PAGE_BYTES`` bytes (the last event may pass it), and the next page
only once the client has taken the last one (the server waits for the socket to drain):
a slow client holds back its own stream, and holds at most a page, an event being sent
and the socket's send buffer of the server's memory. ``Streams`` (api/streams.py) bounds
how many streams an API process serves and how many one caller holds.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

import psycopg
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tidegate.errors import InputError
from tidegate.lanes import FAST_LANE
from tidegate.limits import whole_number
from tidegate.runs import Run, get_run
from tidegate.storage.sql import Statement, Steps

if TYPE_CHECKING:
    from tidegate.api.kernel import Api

log = logging.getLogger("tidegate.ingress")

PAGE = 100
PAGE_BYTES = 64 * 1024
"""The most bytes of events a page holds, but for its last event (up to 64 KiB of JSON,
``MAX_PROGRESS_BYTES``): 100 events of 60 KiB were 6 MB held per slow reader."""
KEEP_ALIVE_SECONDS = 15.0
EVENT_STREAM = "text/event-stream"
END_ID = "end"
"""The id of a stream's last event: a client that comes back with it has seen the end."""
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
"""No cache may keep the stream, and no proxy buffer it (nginx reads the second)."""


def wants_events(accept: str | None) -> bool:
    """Whether the client asks for server-sent events (``Accept: text/event-stream``)."""
    return accept is not None and EVENT_STREAM in accept.lower()


def last_event_id(value: str | None) -> int | None:
    """The event a returning client has seen: ``0`` for none, ``None`` for the end.

    Raises ``InputError`` for anything else: it came from the client.
    """
    if value is None or not value.strip():
        return 0
    value = value.strip()
    if value == END_ID:
        return None
    event_id = whole_number(value)
    if event_id is None:
        raise InputError(f"Last-Event-ID {value[:40]!r} is not an id this server sent")
    return event_id


def sse(event: str, data: str, event_id: str | None = None) -> bytes:
    """One server-sent event; ``data`` is one line (JSON text)."""
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return f"{head}data: {data}\n\n".encode()


class EventStream(Response):
    """A stream of server-sent events that ends itself when its client goes, and gives
    its place back (``give_back``) however it ends.

    Not a ``StreamingResponse``: when the client goes, that cancels the stream wherever it
    waits (a query, a free connection), and the cancellation's traceback keeps its frames
    (the page and the event being sent among them) in reference cycles that only a full
    garbage collection frees: 500 readers that went kept 60 MB. Here the client going sets
    the event the body was made with (``events(gone)``); the body returns at its next step.
    """

    media_type = EVENT_STREAM

    def __init__(
        self,
        events: Callable[[asyncio.Event], AsyncGenerator[bytes]],
        headers: dict[str, str],
        give_back: Callable[[], None],
    ) -> None:
        self.events = events
        self.give_back = give_back
        self.status_code = 200
        self.background = None
        self.init_headers({**STREAM_HEADERS, **headers})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()
        listening = asyncio.create_task(disconnected(receive))
        listening.add_done_callback(lambda _: gone.set())
        body = self.events(gone)
        try:
            start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
            await send(start)
            async for chunk in body:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                del chunk  # not kept while the next is read
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            listening.cancel()
            await body.aclose()
            self.give_back()


async def disconnected(receive: Receive) -> None:
    """Return once the client has gone. For an answer that lasts (a stream, a long poll)
    once its request has been read: nothing else comes in but the disconnect."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def run_events(
    api: Api,
    run_id: int,
    lane: str,
    after: int,
    end: Callable[[Run], bytes],
    gone: asyncio.Event,
    timeout: float | None = None,
    on_timeout: Callable[[Run], bytes] | None = None,
) -> AsyncGenerator[bytes]:
    """The events of run ``run_id`` after id ``after``, then ``end(run)`` once it has
    finished; or, ``timeout`` seconds on, ``on_timeout(run)``; or nothing more once
    ``gone`` is set (the client went).

    Each round reads the run's state first and its events second, page after page: the
    events written with (or before) a final state are then all read before the end is
    sent. A run that is not in the fast lane is marked watched first, so that its end
    NOTIFYs.
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    watched = lane == FAST_LANE  # its end NOTIFYs anyway
    try:
        with api.completions.watch(run_id) as news:
            while not gone.is_set():
                news.clear()
                run = await api.run(get_run(run_id))
                full = True
                while full and not gone.is_set():
                    events = await api.run(_read_events(run_id, after))
                    full = len(events) == PAGE or bool(events and events[-1][4] >= PAGE_BYTES)
                    while events:  # each event let go once sent
                        event_id, attempt, at, data, _ = events.pop(0)
                        yield sse(
                            "progress",
                            f'{{"attempt": {attempt}, "at": {json.dumps(at.isoformat())}, '
                            f'"data": {data}}}',
                            str(event_id),
                        )
                        after = event_id
                        del data
                if gone.is_set():
                    return
                if run is None:  # pruned meanwhile: nothing more will come
                    return
                if run.state.finished:
                    yield end(run)
                    return
                if not watched:
                    await api.run(_watch(run_id))
                    watched = True
                    continue  # look again: it may have finished before it was watched
                wait = KEEP_ALIVE_SECONDS
                if deadline is not None:
                    wait = min(wait, deadline - loop.time())
                    if wait <= 0 and on_timeout is not None:
                        yield on_timeout(run)
                        return
                if not await _either(news, gone, max(wait, 0.0)):
                    yield b": keep-alive\n\n"
    except psycopg.Error as error:
        # The answer has begun: it cannot become a 503. The stream ends; the client comes
        # back with its Last-Event-ID.
        log.warning("events of run %d: stream ended on a database error: %s", run_id, error)


async def _either(news: asyncio.Event, gone: asyncio.Event, timeout: float) -> bool:
    """Wait until ``news`` or ``gone`` is set; ``False`` after ``timeout`` seconds."""
    waits = [asyncio.ensure_future(news.wait()), asyncio.ensure_future(gone.wait())]
    done, pending = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    for wait in pending:
        wait.cancel()
    return bool(done)


def _read_events(run_id: int, after: int) -> Steps[list[Any]]:
    params = {"run_id": run_id, "after": after, "limit": PAGE, "max_bytes": PAGE_BYTES}
    return (yield Statement("read_run_events", params))


def _watch(run_id: int) -> Steps[None]:
    yield Statement("watch_run", {"id": run_id})
