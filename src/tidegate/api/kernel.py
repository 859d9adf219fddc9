"""What every route of the HTTP API needs: the API process's state, and its answers.

- ``Api``: what one API process holds: settings, a pool, the completion listener,
  the remote workers' waiting claims, the event streams' places, the ledger of webhook
  answers, the rescuer, the trigger cache. ``create_server`` (api/server.py) makes one
  per process and puts it on ``app.state.api``; a route finds it there.
- Errors are JSON problem details (RFC 9457), every one made by ``problem``: a
  ``type`` per kind of problem (``ProblemType``, the one table of them) with its stable
  ``title``, the ``status``, and the specifics in ``detail``. Bad input gets a 4xx; an
  unreachable database a 503 with ``Retry-After`` (``database_problem``); a 500 is a
  bug. ``problem_responses``, ``COMMON_RESPONSES`` and ``AUTH_RESPONSES`` document
  them in the OpenAPI document; docs/api.md lists the types.
- ``JSONAnswer``: JSON that carries a user's values (a run's args and result), at any
  depth the bounds allow.
- Lists come in pages (``page``): at most ``limit`` items, in a stable order, the body a
  bare JSON array; a ``Link: <...>; rel="next"`` header names the next page while there
  is one. Its ``cursor`` is the last item's place in the order, read back by
  ``read_cursor``: each page is one index range (keyset), never an OFFSET.

Every router imports this module; it imports no router (tests/test_layout.py).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from enum import Enum
from http import HTTPStatus
from typing import Annotated, Any

import psycopg
from fastapi import HTTPException, Query, Request
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict

from tidegate.access import WorkerCaller, ensure_admin_token
from tidegate.api.claims import Claims
from tidegate.api.completions import Completions
from tidegate.api.ledger import Ledger
from tidegate.api.streams import Streams
from tidegate.app import Tidegate
from tidegate.errors import InputError
from tidegate.limits import check_text
from tidegate.settings import Settings
from tidegate.storage.database import RECONNECT_SECONDS, transient
from tidegate.storage.sql import Steps, T, adrive
from tidegate.webhooks import Trigger
from tidegate.worker.maintenance import rescue
from tidegate.worker.services import Periodic

log = logging.getLogger("tidegate.ingress")

DATABASE_RETRY_AFTER_SECONDS = 2
POOL_WAIT_SECONDS = 2.0
"""How long a request waits for a connection before it is answered 503."""


PROBLEM_TYPE_PREFIX = "tag:tidegate,2026:problems/"
"""Where every problem type's URI begins: a tag URI (RFC 4151), an identifier that does
not change with where the documentation is served; docs/api.md documents each type under
the anchor of its name."""


class ProblemType(Enum):
    """The kinds of problem the API answers with: each a ``type`` URI (its name after
    ``PROBLEM_TYPE_PREFIX``), a ``status`` and a ``title`` that never changes, so a client
    can tell them apart without reading the ``detail``, which says what was wrong this
    time. Where several share a status, the first one declared is what a bare status
    means (``for_status``)."""

    def __init__(self, name: str, status: int, title: str) -> None:
        self.uri = PROBLEM_TYPE_PREFIX + name
        self.status = status
        self.title = title

    BAD_REQUEST = "bad-request", 400, "Malformed request"
    MALFORMED_JSON = "malformed-json", 400, "Malformed JSON body"
    UNAUTHORIZED = "unauthorized", 401, "Authentication required"
    BAD_SIGNATURE = "bad-signature", 401, "Bad webhook signature"
    FORBIDDEN = "forbidden", 403, "Not allowed"
    NOT_FOUND = "not-found", 404, "Not found"
    METHOD_NOT_ALLOWED = "method-not-allowed", 405, "Method not allowed"
    REQUEST_TIMEOUT = "request-timeout", 408, "Request too slow"
    CONFLICT = "conflict", 409, "Conflict with the current state"
    BODY_TOO_LARGE = "body-too-large", 413, "Body too large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported-media-type", 415, "Unsupported content type"
    INVALID_REQUEST = "invalid-request", 422, "Invalid request"
    IDEMPOTENCY_KEY_REUSED = (
        "idempotency-key-reused",
        422,
        "Idempotency key reused with a different body",
    )
    RATE_LIMITED = "rate-limited", 429, "Too many requests"
    HEADERS_TOO_LARGE = "headers-too-large", 431, "Request header fields too large"
    CLIENT_GONE = "client-gone", 499, "Client closed the request"
    INTERNAL_ERROR = "internal-error", 500, "Internal error"
    RUN_FAILED = "run-failed", 502, "The run failed"
    UNAVAILABLE = "unavailable", 503, "Service unavailable"

    @classmethod
    def for_status(cls, status: int) -> ProblemType | None:
        """The kind a bare ``status`` means; ``None`` for a status no kind has."""
        return _BY_STATUS.get(status)


_BY_STATUS: dict[int, ProblemType] = {}
for _kind in ProblemType:
    _BY_STATUS.setdefault(_kind.status, _kind)


class Problem(BaseModel):
    """An error, as RFC 9457 problem details: the ``type`` of problem (a URI, with its
    stable ``title``), the ``status``, the specifics in ``detail``, and members by type
    (``errors`` of an invalid request, ``retry_after`` ..., docs/api.md)."""

    model_config = ConfigDict(extra="allow")
    type: str
    title: str
    status: int
    detail: str


def problem_responses(**described: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses of problem bodies: ``problem_responses(**{"404": "why"})``."""
    return {
        int(status): {
            "description": description,
            "model": Problem,
            "content": {"application/problem+json": {}},
        }
        for status, description in described.items()
    }


COMMON_RESPONSES = problem_responses(
    **{
        "400": "a NUL character in the URL, a malformed request, or a body that is not JSON",
        "408": "the request head or body arrived too slowly",
        "413": "body over its limit",
        "422": "a value outside its bounds (errors: where each is)",
        "431": "request head too large, or too many header fields",
        "503": "database unavailable (Retry-After)",
    }
)
"""What any route may answer: the Guard's refusals, validation, an unreachable database."""
AUTH_RESPONSES = problem_responses(
    **{"401": "missing bearer token", "403": "unknown token, or not allowed for it"}
)


def database_problem(error: psycopg.Error, method: str, path: str) -> JSONResponse:
    """The answer to a database error that reached the HTTP layer, wherever it was raised
    (a route, or the ``Guard`` authenticating a caller).

    An unreachable database is a 503 with ``Retry-After``; a value the database refused
    means a bound of ``tidegate.limits`` is missing: a 422, and a WARNING naming the
    route so that the bound gets added; anything else is a bug (500, logged).
    """
    if transient(error):
        # No SQLSTATE, or a connection class: the server cannot be reached. Otherwise it
        # answered, but cannot serve this now (a deadlock, too many connections, a full
        # disk): both pass by themselves, and the title says which.
        reachable = error.sqlstate is not None and not error.sqlstate.startswith(("08", "57"))
        title = "database busy" if reachable else "database unavailable"
        log.warning("%s %s: %s: %s", method, path, title, error)
        return problem(503, title, {"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)})
    if isinstance(error, psycopg.errors.DataError | psycopg.errors.ProgramLimitExceeded):
        log.warning(
            "%s %s: the database refused a value: [%s] %s", method, path, error.sqlstate, error
        )
        return problem(422, "a value is outside what the database can store")
    log.error("%s %s failed", method, path, exc_info=error)
    return problem(500, "internal error")


CLIENT_GONE = 499
"""The status of a request whose client hung up before its body was in (nginx's "client
closed request"): counted and kept, never sent, since nobody is there to read it."""


def client_gone(method: str, path: str) -> JSONResponse:
    """The answer to a request whose client went away while sending its body.

    One DEBUG line and no traceback: a client that sends half a body and hangs up costs
    the log nothing, or anyone could flood it without a token.
    """
    log.debug("%s %s: the client went away before its body was in", method, path)
    return problem(CLIENT_GONE, "the client went away before its body was in")


class JSONAnswer(JSONResponse):
    """JSON written by ``json.dumps``, timestamps in ISO 8601: for answers that carry a
    user's JSON (a run's args and result, a schedule's args). FastAPI's own serializer
    (pydantic's) stops at about 255 levels of nesting, where ``max_json_depth`` allows
    512: a stored value must never be one the API cannot show."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_iso
        ).encode()


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def problem(
    status: int | ProblemType,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    """Return an RFC 9457 problem response: every error the API answers is made here.

    ``status`` is the problem's type, or a bare status that stands for the first type
    declared with it (``ProblemType.for_status``); a status no type has (one the
    framework answers, such as 406) goes out as ``about:blank`` with the status's own
    phrase for a title, as RFC 9457 says. ``detail`` says what was wrong this time;
    ``extra`` members go beside it.
    """
    if isinstance(status, ProblemType):
        code, type_, title = status.status, status.uri, status.title
    elif (kind := ProblemType.for_status(status)) is not None:
        code, type_, title = kind.status, kind.uri, kind.title
    else:
        code, type_, title = status, "about:blank", HTTPStatus(status).phrase
    return JSONResponse(
        {"type": type_, "title": title, "status": code, "detail": detail, **extra},
        status_code=code,
        headers=headers,
        media_type="application/problem+json",
    )


MAX_PAGE_SIZE = 1000
"""The most items one page of a list holds (``limit``)."""
MAX_CURSOR_CHARS = 2048
"""Longer than any cursor this API gives (a few keys of at most 255 characters)."""

PageSize = Annotated[
    int,
    Query(
        ge=1,
        le=MAX_PAGE_SIZE,
        description="The most items in this page; a Link header (rel=next) names the next.",
    ),
]
Cursor = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=MAX_CURSOR_CHARS,
        description="Where the page starts: the cursor of the Link (rel=next) of the page "
        "before. Opaque: take it from the Link, do not make one.",
    ),
]
PAGED: dict[int | str, dict[str, Any]] = {
    200: {
        "headers": {
            "Link": {
                "description": 'The next page, while there is one: `<URL>; rel="next"`',
                "schema": {"type": "string"},
            }
        }
    },
    **problem_responses(**{"400": "a cursor this API did not give"}),
}
"""The responses of a paged list, for the OpenAPI document."""


def read_cursor(cursor: str | None, *types: type) -> tuple[Any, ...] | None:
    """The place a ``cursor`` stands for: values of ``types``, in the list's order; a
    cursor this API did not give is a 400, never a value the database would refuse."""
    if cursor is None:
        return None
    try:
        values = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(values, list) or len(values) != len(types):
            raise ValueError
        for value, kind in zip(values, types, strict=True):
            if type(value) is not kind:
                raise ValueError
            if isinstance(value, str):
                check_text(value, "a cursor's key")
            elif isinstance(value, int) and not 0 <= value < 2**63:
                raise ValueError
    except (ValueError, binascii.Error, InputError):
        raise HTTPException(400, f"cursor {cursor[:40]!r} is not one this API gave") from None
    return tuple(values)


def page(
    request: Request,
    rows: Sequence[T],
    limit: int,
    place: Callable[[T], Sequence[Any]],
) -> tuple[list[T], dict[str, str]]:
    """One page of a list read with ``limit + 1`` rows: its first ``limit`` rows, and the
    ``Link`` header to the next page when there was one more (``place``: a row's
    values in the list's order, which the next page's cursor starts after).

    The link is relative (RFC 8288 resolves it against the request's URL), with the
    request's own query but for the cursor, so it holds behind a proxy too.
    """
    shown = list(rows[:limit])
    if len(rows) <= limit:
        return shown, {}
    cursor = base64.urlsafe_b64encode(
        json.dumps(list(place(shown[-1])), separators=(",", ":")).encode()
    ).rstrip(b"=")
    url = request.url.include_query_params(cursor=cursor.decode())
    return shown, {"Link": f'<{url.path}?{url.query}>; rel="next"'}


MAX_CLAIMER_NAMES = 100_000
"""The names (worker ids, workloops, tasks) an API process remembers of its claiming
workers (``Claimers``): at most ~30 MB, and 10,000 workers of ten tasks."""


class Claimers:
    """Workers remembered for their claims, by (Authorization, worker id), the longest
    remembered forgotten first, within a budget of the names they hold (each worker its
    id, its workloops and its tasks): a registration may name 1,000 tasks of 255
    characters, so a count of workers alone let one token's workers hold gigabytes."""

    def __init__(self, budget: int = MAX_CLAIMER_NAMES) -> None:
        self.budget = budget
        self.held = 0
        self.workers: dict[tuple[str, str], tuple[WorkerCaller, int]] = {}

    def get(self, key: tuple[str, str]) -> WorkerCaller | None:
        found = self.workers.get(key)
        return found[0] if found else None

    def remember(self, key: tuple[str, str], fleet: WorkerCaller) -> None:
        workloops, tasks = fleet.worker or ([], [])
        size = 1 + len(workloops) + len(tasks)
        self.forget(key)
        if size > self.budget:
            return
        while self.held + size > self.budget:
            self.forget(next(iter(self.workers)))
        self.workers[key] = (fleet, size)
        self.held += size

    def forget(self, key: tuple[str, str]) -> None:
        found = self.workers.pop(key, None)
        if found:
            self.held -= found[1]


class Api:
    """What one API process holds: settings, a pool, the completion listener, the remote
    workers' waiting claims, the event streams' places."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = Tidegate(settings=settings)
        self.pool: AsyncConnectionPool = AsyncConnectionPool(
            self.app.database.conninfo(),
            min_size=2,
            max_size=settings.pool_size,
            kwargs=self.app.database.connection_kwargs(asynchronous=True),
            timeout=POOL_WAIT_SECONDS,
            reconnect_timeout=RECONNECT_SECONDS,
            open=False,
            name="tidegate-ingress",
        )
        self.completions = Completions(self.app.database.aconnect, self.app.completed_channel)
        self.claims = Claims(
            self.app.database.aconnect,
            self.app.available_channel,
            settings.max_claims_per_token,
        )
        self.streams = Streams(settings.max_streams, settings.max_streams_per_caller)
        self.ledger = Ledger(self.pool, settings)
        self.rescuer = Periodic(
            "rescuer",
            settings.rescue_seconds,
            functools.partial(
                rescue, self.pool, self.app.available_channel, self.app.completed_channel
            ),
        )
        """Takes back runs whose leases lapsed, as workers do: with no worker alive, a
        dead worker's runs would otherwise count toward their caps for good."""
        self.claimers = Claimers()
        """Workers whose token the Guard found lately: their claims skip its lookup,
        since the claim's statement checks the token and the worker again (api/guard.py,
        ``Guard.remembered``)."""
        self.triggers: dict[str, tuple[float, Trigger]] = {}
        """Triggers looked up lately, by token, with when each stops being used
        (api/hooks.py); emptied when this process's admin API changes one."""

    async def run(self, steps: Steps[T]) -> T:
        async with self.pool.connection() as conn:
            return await adrive(conn, steps)

    async def transact(self, steps: Steps[T]) -> T:
        """Run ``steps`` in one transaction (``run`` commits each statement)."""
        async with self.pool.connection() as conn, conn.transaction():
            return await adrive(conn, steps)

    async def start(self) -> None:
        await self.pool.open(wait=False)
        self.completions.start()
        self.ledger.start()
        self.rescuer.start()
        generated = await self.run(ensure_admin_token(self.settings.admin_token))
        if generated is not None:
            # Through the log, in its format (one JSON object per line with --log-format
            # json): the operator reads it where every other start-up line goes.
            log.warning(
                "generated the super admin token (shown only now): %s; it is kept (hashed) "
                "in the database, `tidegate admin-token rotate` replaces it",
                generated,
            )

    async def stop(self) -> None:
        await self.completions.stop()
        await self.claims.stop()
        await self.ledger.stop()
        await self.rescuer.stop()
        await self.pool.close()
