"""``tidegate.forward``: the built-in task that delivers a webhook to an HTTP endpoint.

A trigger with a ``forward_url`` admits its webhooks as runs of this task. Each
attempt reads the request as it was received (``requests``: the raw body, its content
type, the headers kept) and the trigger's forward settings as they are now, and sends
the body unchanged. What the endpoint answers decides the run:

======================  ===============================================================
answer                  the run
======================  ===============================================================
2xx                     succeeded; the result is the response (``kept_response``)
429, 503 + Retry-After  retried after that delay without spending an attempt
                        (``DownstreamFailing``: a failure for the circuit breaker)
other 5xx, 429, no      failed: retried with backoff, discarded after ``max_attempts``
answer (connection,
timeout)
other 3xx and 4xx       discarded at once (``Discard``), the response in its errors;
                        the breaker does not count it (the request is refused, the
                        endpoint is up)
======================  ===============================================================

Every failure above counts for the circuit breaker of the run's key, which is the
trigger's breaker key (the destination unless the trigger names another). An attempt
that cannot read its request (the database, or a remote worker's API, out of reach) is
not the endpoint's failure: it is given back and tried again ``FIND_RETRY_SECONDS``
later, no attempt spent, nothing counted.

A sync trigger's caller is waiting: every answer the endpoint gives becomes the
caller's (``$reply``), as a proxy would pass it on; a 5xx or 429 also ends the run
``discarded`` and counts as a failure (``DownstreamFailing`` with the reply), and no
answer at all gives the caller 504 (timeout) or 502, as a gateway would.

Every tidegate app registers the task (``Tidegate.__init__``), so any worker can take
forwarding runs; a remote worker gets each attempt's request from the API, signed there
(the trigger's secret never leaves it).
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import logging
import re
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import psycopg
from psycopg.rows import dict_row

from tidegate.errors import InputError, TidegateError
from tidegate.lanes import FAST_LANE
from tidegate.limits import DIGITS, check_text
from tidegate.runs import REPLY_KEY, Discard, DownstreamFailing, Retry, Run, current_run
from tidegate.signatures import sign
from tidegate.storage.sql import Statement, Steps

log = logging.getLogger("tidegate.forward")

FORWARD_TASK = "tidegate.forward"
METHODS = ("POST", "PUT", "PATCH")
MAX_URL_CHARS = 2048
MAX_FORWARD_HEADERS = 32
DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_KEPT_BODY_BYTES = 64 * 1024
"""The most of a response body a run's result keeps (and a sync caller gets), decoded."""
CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""The content codings an attempt asks for and decodes itself, within the bound above
(zlib's ``wbits`` for each)."""
MAX_RETRY_AFTER_SECONDS = 3600.0
"""A longer Retry-After is cut to this: a downstream cannot park a run for days."""
_DAY = "(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_MONTH = "(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_TIME = "[0-9]{2}:[0-9]{2}:[0-9]{2}"
HTTP_DATE = re.compile(
    f"{_DAY}, [0-9]{{2}} {_MONTH} [0-9]{{4}} {_TIME} GMT"
    f"|(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day, [0-9]{{2}}-{_MONTH}-[0-9]{{2}} {_TIME} GMT"
    f"|{_DAY} {_MONTH} [0-9 ][0-9] {_TIME} [0-9]{{4}}"
)
"""An HTTP date (RFC 9110, 5.6.7): the IMF-fixdate, or the obsolete RFC 850 and asctime
forms a recipient must still read."""
DEFAULT_PORTS = {"http": 80, "https": 443}
FIND_RETRY_SECONDS = 5.0
"""When an attempt cannot read its request (the database or the API is unreachable)."""

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
NOT_PASSED_ON = HOP_BY_HOP | {"host", "content-length", "content-type", "content-encoding"}
"""Received headers a trigger may not list in ``forward_headers``: the hop-by-hop ones
belong to the connection they came on, and the others are set from the request sent."""
NOT_KEPT = HOP_BY_HOP | {"content-length", "content-encoding", "date", "server"}
"""Response headers not kept: the body is kept decoded, its length is set anew, and the
ingress that replies to a sync caller sends its own ``date`` and ``server``."""


class ForwardError(Exception):
    """The endpoint gave no answer, or one that a retry may mend (5xx).

    ``status``: what a gateway answers its caller for it (502, or 504 for a timeout).
    """

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


def check_url(url: Any) -> str:
    """Return ``url`` if the task can send to it, else raise ``InputError`` saying why.

    ``http`` or ``https``, a host, a valid port, at most ``MAX_URL_CHARS`` visible ASCII
    characters, and no user or password: the URL is shown by the admin API, so
    credentials go in a passed-on header or the signing secret instead.
    """
    text = check_text(url, "forward_url", MAX_URL_CHARS)
    if not text.isascii() or not text.isprintable() or " " in text:
        raise InputError("forward_url must be visible ASCII (percent-encode anything else)")
    try:
        parts = urlsplit(text)
        httpx.URL(text)
    except (ValueError, httpx.InvalidURL) as error:
        raise InputError(f"forward_url is not a valid URL: {error}") from None
    if parts.scheme not in DEFAULT_PORTS:
        raise InputError(f"forward_url must be http:// or https://, got {parts.scheme!r}")
    try:
        parts.port  # noqa: B018 (raises on a port out of range or not a number)
    except ValueError:
        raise InputError("forward_url has an invalid port") from None
    if not parts.hostname:
        raise InputError("forward_url has no host")
    if parts.username is not None or parts.password is not None:
        raise InputError("forward_url must not hold a user or password")
    return text


def hook_token(url: str) -> str | None:
    """Return the trigger token of ``url`` if its path is a tidegate hook's
    (``.../hooks/{token}``), else ``None``."""
    segments = unquote(urlsplit(url).path).rstrip("/").split("/")
    return segments[-1] if len(segments) >= 2 and segments[-2] == "hooks" else None


def address_of(url: str) -> tuple[str, int]:
    """Return the host and port ``url`` goes to, the default port filled in."""
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or DEFAULT_PORTS.get(parts.scheme, 0)


LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"})
"""Names of this machine for a server that listens on loopback or on every address."""


def own_addresses(host: str, port: int) -> set[tuple[str, int]]:
    """Return the addresses a server listening on ``host:port`` is reached at from here."""
    host = host.strip("[]").lower()
    if host in LOOPBACK or not host:
        return {(name, port) for name in LOOPBACK}
    return {(host, port)}


def breaker_key_of(url: str) -> str:
    """Return the destination of ``url`` as ``scheme://host:port``, the default port filled in.

    The default breaker key: runs to one origin share one circuit breaker, whatever
    their path.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}:{parts.port or DEFAULT_PORTS[parts.scheme]}"


def check_header_names(names: Any) -> list[str]:
    """Return the names of received headers to pass on, lower-cased, or raise."""
    if not isinstance(names, list | tuple) or len(names) > MAX_FORWARD_HEADERS:
        raise InputError(f"forward_headers must be a list of at most {MAX_FORWARD_HEADERS} names")
    checked = []
    for name in names:
        if not isinstance(name, str) or not name or len(name) > 256 or not _token(name):
            raise InputError(f"forward_headers: {str(name)[:40]!r} is not a header name")
        if name.lower() in NOT_PASSED_ON:
            raise InputError(f"forward_headers: {name!r} cannot be passed on")
        checked.append(name.lower())
    return checked


def _token(name: str) -> bool:
    """Tell whether ``name`` is an HTTP field name (an RFC 9110 token)."""
    return all(c.isascii() and (c.isalnum() or c in "!#$%&'*+.^_`|~-") for c in name)


@dataclass(frozen=True)
class Delivery:
    """The request an attempt sends: the body as received, the headers passed on and the
    signature (made fresh for each attempt), where the trigger sends it now."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes
    timeout_seconds: float

    def as_json(self) -> dict[str, Any]:
        """What the API hands a remote worker (the secret stays on the API's side)."""
        fields = asdict(self)
        fields["body"] = base64.b64encode(self.body).decode()
        return fields

    @classmethod
    def from_json(cls, fields: dict[str, Any]) -> Delivery:
        return cls(**{**fields, "body": base64.b64decode(fields["body"])})


FindDelivery = Callable[[Run], Awaitable[Delivery | None]]
"""How a worker gets an attempt's delivery: from the database (``find_delivery``), or
from the API (a remote worker's link)."""


def handler(find: FindDelivery) -> Callable[..., Awaitable[Any]]:
    """Return the task's handler, getting each attempt's request with ``find``."""

    async def forward(**_: Any) -> dict[str, Any]:
        run = current_run()
        try:
            delivery = await find(run)
        except (psycopg.Error, TidegateError) as error:  # the database, or the API's answer
            log.warning(
                "run %d: its request could not be read, sent again in %.0fs: %s",
                run.id,
                FIND_RETRY_SECONDS,
                error,
            )
            # Given back, not failed: no attempt spent, nothing counted for the breaker.
            raise Retry(FIND_RETRY_SECONDS) from error
        if delivery is None:
            raise Discard(f"run {run.id}: no request, or its trigger no longer forwards")
        target = f"{delivery.method} {delivery.url}"
        sync = run.lane == FAST_LANE  # a sync trigger's caller waits for the answer
        try:
            response, answer = await _send(delivery)
        except ForwardError as error:
            if not sync:
                raise
            gateway = {"status": error.status, "headers": {}, "body": {"title": str(error)}}
            raise DownstreamFailing(str(error), reply=gateway) from None
        kept = kept_response(response, answer)
        status = response.status_code
        failing = status >= 500 or status == 429
        if sync:
            if failing:
                raise DownstreamFailing(f"{target} answered {status}", reply=kept)
            return {REPLY_KEY: kept}
        if 200 <= status < 300:
            return kept
        delay = retry_after(response.headers.get("retry-after"))
        if status in (429, 503) and delay is not None:
            raise DownstreamFailing(f"{target} answered {status}", retry_after=delay)
        if failing:
            raise ForwardError(f"{target} answered {status}")
        raise Discard(f"{target} answered {status}", details=kept)

    return forward


def find_delivery(run_id: int) -> Steps[Delivery | None]:
    """Read the run's request and its trigger's forward settings; ``None`` when there is
    no request or the trigger no longer forwards."""
    rows = yield Statement("find_forward", {"run_id": run_id}, dict_row)
    if not rows or rows[0]["forward_url"] is None:
        return None
    found = rows[0]
    body = bytes(found["body"])
    received = found["headers"] or {}
    headers = {name: received[name] for name in found["forward_headers"] if name in received}
    if found["content_type"]:
        headers["content-type"] = found["content_type"]
    if found["forward_secret"]:
        # The same id on every attempt lets the endpoint drop a repeat; the timestamp is
        # fresh, as the endpoint refuses one more than five minutes old.
        webhook_id = f"req_{found['request_id']}"
        timestamp = int(time.time())
        headers["webhook-id"] = webhook_id
        headers["webhook-timestamp"] = str(timestamp)
        headers["webhook-signature"] = sign(found["forward_secret"], webhook_id, timestamp, body)
    return Delivery(
        found["forward_method"],
        found["forward_url"],
        headers,
        body,
        float(found["forward_timeout_seconds"]),
    )


async def _send(delivery: Delivery) -> tuple[httpx.Response, Answer]:
    """Send the request; return the answer and its body, read up to one byte past what
    is kept (so the cut is known, and a huge body is never held).

    One client per attempt, so the task holds nothing between runs: the price is a
    connection (and TLS handshake) per delivery, which a client shared per worker would
    save. The timeout bounds the whole exchange, not each read, so an endpoint that
    trickles its answer cannot hold a slot longer.
    """
    timeout = delivery.timeout_seconds
    target = f"{delivery.method} {delivery.url}"
    # The codings the attempt decodes itself (_read_bounded), whatever httpx would add.
    headers = {"accept-encoding": "gzip, deflate", **delivery.headers}
    try:
        async with asyncio.timeout(timeout), httpx.AsyncClient(timeout=timeout) as client:
            request = client.build_request(
                delivery.method, delivery.url, content=delivery.body, headers=headers
            )
            response = await client.send(request, stream=True)
            try:
                return response, await _read_bounded(response)
            finally:
                await response.aclose()
    except TimeoutError:
        raise ForwardError(f"{target}: no answer within {timeout}s", status=504) from None
    except httpx.HTTPError as error:
        raise ForwardError(f"{target}: {type(error).__name__}: {error}") from error
    except zlib.error as error:
        raise ForwardError(f"{target}: its answer's body does not decode: {error}") from None


@dataclass(frozen=True)
class Answer:
    """The body of an endpoint's answer as kept: its first bytes, and whether they are
    decoded (else they are as sent, in the coding its ``content-encoding`` names)."""

    content: bytes
    decoded: bool = True


async def _read_bounded(response: httpx.Response) -> Answer:
    """Read the answer's body up to one byte past ``MAX_KEPT_BODY_BYTES``, decoded.

    The bound counts decoded bytes, and nothing past it is ever decoded: a gzip body
    inflates up to a thousand times, so a 150 KB answer can hold 150 MB, and decoding
    each piece that arrives whole (as httpx does) held 64 MB at once. A body in a coding
    tidegate does not decode (``br``, several codings) is kept as sent, bounded the same.
    """
    coding = response.headers.get("content-encoding", "").strip().lower()
    wanted = MAX_KEPT_BODY_BYTES + 1
    decoder = None
    kept = bytearray()
    async for piece in response.aiter_raw():
        if coding in CODINGS and decoder is None:
            raw = coding == "deflate" and not _zlib_header(piece)  # as some servers send it
            decoder = zlib.decompressobj(-zlib.MAX_WBITS if raw else CODINGS[coding])
        if decoder is None:
            kept += piece[: wanted - len(kept)]
        else:
            kept += decoder.decompress(piece, wanted - len(kept))
        if len(kept) >= wanted:
            break
    return Answer(bytes(kept), decoded=coding in ("", "identity", *CODINGS))


def _zlib_header(data: bytes) -> bool:
    """Tell whether ``data`` starts with a zlib header (RFC 1950), as ``deflate`` should."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


def kept_response(response: httpx.Response, answer: Answer) -> dict[str, Any]:
    """Return what a run keeps of a response: ``{status, headers, body, ...}``.

    The body is its first ``MAX_KEPT_BODY_BYTES``, as text when it is UTF-8 (without NUL,
    which jsonb cannot hold), else as base64 (``body_base64: true``); ``truncated`` says
    whether it was cut. Headers that belong to the connection or the framing are left
    out, as are values a reply could not carry again; ``content-encoding`` is kept only
    for a body kept as sent.
    """
    content = answer.content
    truncated = len(content) > MAX_KEPT_BODY_BYTES
    content = content[:MAX_KEPT_BODY_BYTES]
    text = _text(content, truncated)
    headers: dict[str, str] = {}
    skipped = NOT_KEPT if answer.decoded else NOT_KEPT - {"content-encoding"}
    for name, value in response.headers.multi_items():
        if name in skipped or not (value.isascii() and value.isprintable()):
            continue
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    kept: dict[str, Any] = {"status": response.status_code, "headers": headers}
    if text is None:
        kept.update(body=base64.b64encode(content).decode(), body_base64=True)
    else:
        kept["body"] = text
    kept["truncated"] = truncated
    return kept


def _text(content: bytes, truncated: bool) -> str | None:
    """Return ``content`` as text, or ``None`` when it is not UTF-8 without NUL.

    A cut body may end inside a character: those last bytes are dropped.
    """
    try:
        text = content.decode()
    except UnicodeDecodeError as error:
        if not (truncated and error.reason == "unexpected end of data"):
            return None
        text = content[: error.start].decode()
    return None if "\x00" in text else text


def retry_after(value: str | None) -> float | None:
    """Return the seconds a ``Retry-After`` asks for, bounded: delta-seconds (ASCII digits)
    or an HTTP date (RFC 9110's three forms), read strictly.

    ``None`` when there is none or it is anything else (``²``, ``1.5``, a date in another
    shape): the run then backs off as after any failure, which the endpoint's status
    decides; a value the endpoint sends never fails the attempt on its own.
    """
    if value is None:
        return None
    value = value.strip()
    if DIGITS.fullmatch(value):  # delta-seconds; past any bound, it is cut to the longest
        seconds = float(value)
    elif not HTTP_DATE.fullmatch(value):
        return None
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)
