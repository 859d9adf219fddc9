"""A run's progress as server-sent events: ``GET /runs/{id}/events`` and sync webhooks.

A stream sends the run's progress events (``run.progress``) in order, each as
``event: progress`` with its id, then one last event when the run finishes, and ends.
A client that lost the stream comes back with ``Last-Event-ID`` and gets what followed,
from any API process: the events are rows of ``run_events``, not memory of the process
that sent them.

Nothing polls: the stream sleeps until the completion listener says the run has news
(new events, its end), or sends a keep-alive comment every ``KEEP_ALIVE_SECONDS``. It
reads at most ``PAGE`` events at a time, and the next page only once the client has
taken the last one (the server waits for the socket to drain), so a slow client holds
back its own stream, never the server's memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import psycopg
from starlette.responses import StreamingResponse

from tidegate.errors import InputError
from tidegate.lanes import FAST_LANE
from tidegate.limits import whole_number
from tidegate.runs import Run, run_row
from tidegate.storage.sql import Statement, Steps

if TYPE_CHECKING:
    from tidegate.ingress.server import Ingress

log = logging.getLogger("tidegate.ingress")

PAGE = 100
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


def stream_response(body: AsyncIterator[bytes], headers: dict[str, str]) -> StreamingResponse:
    return StreamingResponse(body, media_type=EVENT_STREAM, headers={**STREAM_HEADERS, **headers})


async def run_events(
    ingress: Ingress,
    run_id: int,
    lane: str,
    after: int,
    end: Callable[[Run], bytes],
    timeout: float | None = None,
    on_timeout: Callable[[Run], bytes] | None = None,
) -> AsyncIterator[bytes]:
    """The events of run ``run_id`` after id ``after``, then ``end(run)`` once it has
    finished; or, ``timeout`` seconds on, ``on_timeout(run)``.

    Each round reads the run's state first and its events second: the events written
    with (or before) a final state are then all read before the end is sent. A run that
    is not in the fast lane is marked watched first, so that its end NOTIFYs.
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    watched = lane == FAST_LANE  # its end NOTIFYs anyway
    try:
        with ingress.completions.watch(run_id) as news:
            while True:
                news.clear()
                run = await ingress.run(get_run(run_id))
                events = await ingress.run(_read_events(run_id, after))
                for event_id, attempt, at, data in events:
                    yield sse(
                        "progress",
                        f'{{"attempt": {attempt}, "at": {json.dumps(at.isoformat())}, '
                        f'"data": {data}}}',
                        str(event_id),
                    )
                    after = event_id
                if len(events) == PAGE:
                    continue
                if run is None:  # pruned meanwhile: nothing more will come
                    return
                if run.state.finished:
                    yield end(run)
                    return
                if not watched:
                    await ingress.run(_watch(run_id))
                    watched = True
                    continue  # look again: it may have finished before it was watched
                wait = KEEP_ALIVE_SECONDS
                if deadline is not None:
                    wait = min(wait, deadline - loop.time())
                    if wait <= 0 and on_timeout is not None:
                        yield on_timeout(run)
                        return
                try:
                    await asyncio.wait_for(news.wait(), max(wait, 0.0))
                except TimeoutError:
                    yield b": keep-alive\n\n"
    except psycopg.Error as error:
        # The answer has begun: it cannot become a 503. The stream ends; the client comes
        # back with its Last-Event-ID.
        log.warning("events of run %d: stream ended on a database error: %s", run_id, error)


def get_run(run_id: int) -> Steps[Run | None]:
    rows = yield Statement("get_run", {"id": run_id}, run_row)
    return rows[0] if rows else None


def _read_events(run_id: int, after: int) -> Steps[list[Any]]:
    return (yield Statement("read_run_events", {"run_id": run_id, "after": after, "limit": PAGE}))


def _watch(run_id: int) -> Steps[None]:
    yield Statement("watch_run", {"id": run_id})
