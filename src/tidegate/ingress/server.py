"""The HTTP server: ``POST /hooks/{token}``, the runs and admin APIs, health checks.

Build it with ``create_server()`` (settings from ``TIDEGATE_*``), which is what
``tidegate serve`` hands to uvicorn, one instance per API process. Each process keeps a
small async pool and one LISTEN connection for sync replies; nothing it holds in memory
is needed by another process to be correct.

Errors are short JSON problem bodies (RFC 9457): ``{"title": ..., "status": ...}``.
Bad input gets a 4xx; an unreachable database a 503 with ``Retry-After``; a 500 is a bug.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from tidegate.app import Tidegate
from tidegate.ingress.completions import Completions
from tidegate.settings import Settings
from tidegate.storage.database import RECONNECT_SECONDS
from tidegate.storage.migrate import latest_version
from tidegate.storage.sql import Steps, T, adrive

log = logging.getLogger("tidegate.ingress")

DATABASE_RETRY_AFTER_SECONDS = 2
POOL_WAIT_SECONDS = 2.0
"""How long a request waits for a connection before it is answered 503."""


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


class Ingress:
    """What one API process holds: settings, a pool, the completion listener."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = Tidegate(settings=settings)
        self.pool: AsyncConnectionPool = AsyncConnectionPool(
            self.app.database.conninfo(),
            min_size=2,
            max_size=settings.pool_size,
            kwargs={"autocommit": True},
            timeout=POOL_WAIT_SECONDS,
            reconnect_timeout=RECONNECT_SECONDS,
            open=False,
            name="tidegate-ingress",
        )
        self.completions = Completions(self.app.database.aconnect, self.app.completed_channel)
        self.admin_token_hash: str | None = None

    async def run(self, steps: Steps[T]) -> T:
        async with self.pool.connection() as conn:
            return await adrive(conn, steps)

    async def start(self) -> None:
        await self.pool.open(wait=False)
        self.completions.start()
        from tidegate.ingress.auth import load_admin_token

        self.admin_token_hash = await load_admin_token(self)

    async def stop(self) -> None:
        await self.completions.stop()
        await self.pool.close()


def create_server(settings: Settings | None = None) -> FastAPI:
    """Build the ASGI app for one API process."""
    from tidegate.ingress import admin, hooks, runs_api

    ingress = Ingress(settings or Settings.from_env())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await ingress.start()
        try:
            yield
        finally:
            await ingress.stop()

    server = FastAPI(
        title="tidegate",
        summary="Webhook ingress with admission control, runs on PostgreSQL",
        version="0.1.0",
        lifespan=lifespan,
    )
    server.state.ingress = ingress
    server.include_router(hooks.router)
    server.include_router(runs_api.router)
    server.include_router(admin.router)

    @server.exception_handler(psycopg.OperationalError)
    @server.exception_handler(PoolTimeout)
    async def database_unavailable(request: Request, error: Exception) -> JSONResponse:
        log.warning("database unavailable: %s", error)
        return problem(
            503,
            "database unavailable",
            {"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
        )

    @server.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return problem(error.status_code, str(error.detail), dict(error.headers or {}))

    @server.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        return problem(422, "invalid request", errors=jsonable_errors(error))

    @server.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process is up (it does not look at the database)."""
        return {"status": "ok"}

    @server.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        """The database answers and its schema is the one this code needs."""
        async with ingress.pool.connection() as conn:
            cursor = await conn.execute("SELECT coalesce(max(version), 0) FROM migrations")
            row = await cursor.fetchone()
        version, wanted = (row[0] if row else 0), latest_version()
        if version != wanted:
            return problem(
                503,
                f"schema is at version {version}, this server needs {wanted}",
                {"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
            )
        return JSONResponse({"status": "ready", "schema_version": version})

    return server


def jsonable_errors(error: RequestValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in error.errors()
    ]
