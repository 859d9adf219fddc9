"""The HTTP server: ``create_server`` assembles the API's routers, the ``Guard`` and the
dashboard into the ASGI app of one API process.

``tidegate serve`` hands ``create_server`` (settings from ``TIDEGATE_*``) to uvicorn,
one instance per API process. Each process keeps a small async pool and one LISTEN
connection for sync replies; nothing it holds in memory is needed by another process to
be correct. The ``Guard`` middleware refuses what needs no route (docs/security.md),
and ``/docs`` serves its assets from the package, so it works offline.

This is the only module that imports the routers (and the dashboard's ``install``);
nothing but ``tidegate serve`` and the tests imports it (tests/test_layout.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from tidegate import __version__
from tidegate.api import admin, health, hooks, metrics, runs, workers
from tidegate.api.guard import Guard
from tidegate.api.kernel import (
    COMMON_RESPONSES,
    Api,
    ProblemType,
    client_gone,
    database_problem,
    problem,
)
from tidegate.settings import Settings
from tidegate.ui import install as install_dashboard


def create_server(settings: Settings | None = None) -> FastAPI:
    """Build the ASGI app for one API process."""
    api = Api(settings or Settings.from_env())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await api.start()
        try:
            yield
        finally:
            await api.stop()

    server = FastAPIOffline(
        title="tidegate",
        summary="Webhook ingress with admission control, runs on PostgreSQL",
        version=__version__,
        lifespan=lifespan,
        responses=COMMON_RESPONSES,
    )
    server.state.api = api
    server.add_middleware(Guard, api=api)
    server.include_router(hooks.router)
    server.include_router(runs.router)
    server.include_router(admin.router)
    server.include_router(workers.router)
    server.include_router(workers.admin_router)
    server.include_router(metrics.router)
    install_dashboard(server)
    server.include_router(health.router)

    @server.exception_handler(psycopg.Error)
    async def database_error(request: Request, error: psycopg.Error) -> JSONResponse:
        return database_problem(error, request.method, request.url.path)

    @server.exception_handler(ClientDisconnect)
    async def disconnected(request: Request, _: ClientDisconnect) -> JSONResponse:
        return client_gone(request.method, request.url.path)

    @server.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return problem(error.status_code, str(error.detail), dict(error.headers or {}))

    @server.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        return validation_problem(error)

    return server


def validation_problem(error: RequestValidationError) -> JSONResponse:
    """A body that does not parse is malformed (400, where it broke); one that parses but
    fails the models' checks is invalid (422, with each failing value's location in
    ``errors``)."""
    errors = error.errors()
    for e in errors:
        if e.get("type") == "json_invalid":
            where = e.get("loc", ())[-1]
            reason = (e.get("ctx") or {}).get("error", e.get("msg", ""))
            return problem(
                ProblemType.MALFORMED_JSON, f"the body is not JSON: {reason} (at character {where})"
            )
    detail = "; ".join(
        f"{'.'.join(str(part) for part in e.get('loc', ()))}: {e.get('msg', '')}"
        for e in errors[:3]
    )
    jsonable = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in errors
    ]
    return problem(ProblemType.INVALID_REQUEST, detail or "invalid request", errors=jsonable)
