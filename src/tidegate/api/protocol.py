"""Limits on the request head, which uvicorn's httptools parser does not have.

``GuardedHttpToolsProtocol`` is uvicorn's own httptools protocol with two bounds, each
answered before the request reaches the application:

- the request line and headers together within ``max_head_bytes`` (431): without it, a
  client can send megabytes of one header, all kept in memory;
- the head complete within ``read_timeout_seconds`` of its first byte, or of the
  connection (408 and close): without it, a client sending one byte a minute holds a
  connection for ever.

An answer sent before the request's body is all in ends the connection (uvicorn would
keep it and drop the rest of the body as it trickles in, without any time limit). A
connection closed while the client is still sending (such an answer, a 413 or 401
before the body was read, a refused head) is closed gently: the answer goes out, the server's side
is shut for writing, and what the client still sends is read and dropped until it stops
or ``LINGER_SECONDS`` pass. Closed at once, the unread bytes make the kernel reset the
connection, and the client may lose the answer it was about to read.

The number of header fields (431), the body's limits and its timeouts are the ``Guard``
middleware's. ``tidegate serve``
passes this class to uvicorn (``http=``); behind a reverse proxy, keep the proxy's own
limits too (docs/security.md).

uvicorn has no setting for either bound (``h11_max_incomplete_event_size`` is h11's
only, and nothing times a head), and ``HttpToolsProtocol`` and the parser callbacks
overridden here are not uvicorn's public API: pyproject.toml holds uvicorn below its
next minor release, and ``tests/test_packaging.py`` checks that every method overridden
here is still one of uvicorn's.
"""

from __future__ import annotations

import asyncio
import functools
import http
from collections.abc import Iterable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tidegate.settings import Settings

LINGER_SECONDS = 2.0
"""How long a connection closed mid-request keeps reading (and dropping) what comes in."""


class LingeringTransport:
    """The connection's transport, whose ``close`` lingers while the request is unread.

    uvicorn closes the transport itself when a response says ``Connection: close``;
    handing it this wrapper is how the protocol gets to close gently instead.
    """

    def __init__(self, transport: asyncio.Transport, protocol: GuardedHttpToolsProtocol) -> None:
        self.transport = transport
        self.protocol = protocol
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self.transport.is_closing()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        # Dropped once lingering, as a closed transport drops it: an earlier request's
        # answer may still be under way when a parser error closes the connection.
        if not self.lingering:
            self.transport.write(data)

    def writelines(self, data: Iterable[bytes | bytearray | memoryview]) -> None:
        if not self.lingering:
            self.transport.writelines(data)

    def close(self) -> None:
        transport = self.transport
        if self.lingering or transport.is_closing():
            return
        if not (self.protocol.unread() and transport.can_write_eof()):
            transport.close()
            return
        self.lingering = True
        transport.write_eof()  # after the answer still buffered
        transport.resume_reading()
        self.protocol.loop.call_later(LINGER_SECONDS, transport.close)


@functools.cache
def _settings() -> Settings:
    """The server's settings (``TIDEGATE_*``), read once per process, not per connection."""
    return Settings.from_env()


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a bounded, timed request head."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = _settings()
        self.max_head_bytes = settings.max_head_bytes
        self.head_timeout = settings.read_timeout_seconds
        self.head_bytes = 0
        """Bytes received since the head began: what httptools holds until it ends."""
        self.head_size = 0
        """The size of the head parsed so far: its URL and header fields."""
        self.in_head = True
        self.refused = False
        self.head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(LingeringTransport(transport, self))  # type: ignore[arg-type]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def unread(self) -> bool:
        """Tell whether the client may still be sending: a head or a body not all read."""
        return self.in_head or self.refused or (self.cycle is not None and self.cycle.more_body)

    def data_received(self, data: bytes) -> None:
        if self.refused or self.transport.is_closing():
            return
        if self.in_head:
            self.head_bytes += len(data)
        super().data_received(data)
        # A head still incomplete after this read: httptools holds all of it so far.
        if self.in_head and self.head_bytes > self.max_head_bytes:
            self._refuse(431, f"request line and headers over {self.max_head_bytes} bytes")

    # Once refused, the rest of what the client sent in the same read (a request behind
    # the refused one, say) is parsed but goes nowhere: the connection is closing.

    def on_message_begin(self) -> None:
        if self.refused:
            return
        super().on_message_begin()
        self.in_head = True
        self.head_size = 0
        self._arm()

    def on_url(self, url: bytes) -> None:
        if self.refused:
            return
        self.head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.refused:
            return
        self.head_size += len(name) + len(value) + 4  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.refused:
            return
        self.in_head = False
        self.head_bytes = 0
        self._disarm()
        if self.head_size > self.max_head_bytes:  # a whole head, but too large
            self._refuse(431, f"request line and headers over {self.max_head_bytes} bytes")
            return
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        # Answered before its body was all in (an unknown trigger, a route that reads no
        # body): uvicorn would keep the connection and drop the rest of the body as it
        # comes, with no timer, since each byte cancels its keep-alive timeout: a client
        # trickling the rest held the connection for ever. Close it (gently) instead.
        if self.cycle is not None and self.cycle.more_body and not self.transport.is_closing():
            self.transport.close()
        super().on_response_complete()

    def _unsupported_upgrade_warning(self) -> None:
        """uvicorn's warning for an Upgrade request (``ws="none"``) names a missing
        library; none is missing, the request is served as plain HTTP."""
        self.logger.debug("an Upgrade request, served as plain HTTP")

    def on_body(self, body: bytes) -> None:
        if not self.refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self.refused:
            super().on_message_complete()

    def _arm(self) -> None:
        self._disarm()
        self.head_timer = self.loop.call_later(self.head_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _too_slow(self) -> None:
        self.head_timer = None
        if self.in_head and not self.transport.is_closing():
            self._refuse(408, f"the request head did not arrive within {self.head_timeout:g}s")

    def _refuse(self, status: int, title: str) -> None:
        """Answer with a problem and close, without running the application."""
        self.refused = True
        if self.transport.is_closing():
            return
        body = f'{{"title": "{title}", "status": {status}}}'.encode()
        reason = http.HTTPStatus(status).phrase
        self.transport.write(
            f"HTTP/1.1 {status} {reason}\r\n".encode()
            + b"content-type: application/problem+json\r\n"
            + f"content-length: {len(body)}\r\n".encode()
            + b"connection: close\r\n\r\n"
            + body
        )
        self.transport.close()
