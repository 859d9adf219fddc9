"""What every route of the HTTP API needs: the API process's state, and its answers.

- ``Api``: what one API process holds: settings, a pool, the completion listener,
  the remote workers' waiting claims, the event streams' places, the ledger of webhook
  answers, the rescuer, the trigger cache. ``create_server`` (api/server.py) makes one
  per process and puts it on ``app.state.api``; a route finds it there.
- Errors are short JSON problem bodies (RFC 9457): ``{"title": ..., "status": ...}``
  (``problem``). Bad input gets a 4xx; an unreachable database a 503 with
  ``Retry-After`` (``database_problem``); a 500 is a bug. ``problem_responses``,
  ``COMMON_RESPONSES`` and ``AUTH_RESPONSES`` document them in the OpenAPI document.
- ``JSONAnswer``: JSON that carries a user's values (a run's args and result), at any
  depth the bounds allow.

Every router imports this module; it imports no router (tests/test_layout.py).
"""

from __future__ import annotations

import functools
import json
import logging
from datetime import datetime
from typing import Any

import psycopg
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict

from tidegate.access import ensure_admin_token
from tidegate.api.claims import Claims
from tidegate.api.completions import Completions
from tidegate.api.ledger import Ledger
from tidegate.api.streams import Streams
from tidegate.app import Tidegate
from tidegate.settings import Settings
from tidegate.storage.database import CONNECTION, RECONNECT_SECONDS, transient
from tidegate.storage.sql import Steps, T, adrive
from tidegate.webhooks import Trigger
from tidegate.worker.maintenance import rescue
from tidegate.worker.services import Periodic

log = logging.getLogger("tidegate.ingress")

DATABASE_RETRY_AFTER_SECONDS = 2
POOL_WAIT_SECONDS = 2.0
"""How long a request waits for a connection before it is answered 503."""


class Problem(BaseModel):
    """An error, as RFC 9457 problem details: a title, the status, and details by kind."""

    model_config = ConfigDict(extra="allow")
    title: str
    status: int


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
        "400": "a NUL character in the URL, or a malformed request",
        "408": "the request head or body arrived too slowly",
        "413": "body over its limit",
        "422": "a value outside its bounds (the errors say which)",
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
    status: int, title: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    """Return an RFC 9457 problem response."""
    return JSONResponse(
        {"title": title, "status": status, **extra},
        status_code=status,
        headers=headers,
        media_type="application/problem+json",
    )


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
            kwargs=CONNECTION,
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
