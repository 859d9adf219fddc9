"""The HTTP server: ``create_server`` assembles the API's routers, the ``Guard`` and the
dashboard into the ASGI app of one API process.

``tidegate serve`` hands ``create_server`` (settings from ``TIDEGATE_*``) to uvicorn,
one instance per API process. Each process keeps a small async pool and one LISTEN
connection for sync replies; nothing it holds in memory is needed by another process to
be correct. The ``Guard`` middleware refuses what needs no route (docs/security.md),
and ``/docs`` and ``/redoc`` serve their assets from the package, so they work offline.

This is the only module that imports the routers (and the dashboard's ``install``);
nothing but ``tidegate serve`` and the tests imports it (tests/test_layout.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
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
from tidegate.ui.templating import error_page

REDOC = "/redoc"
OFFLINE_DOCS = "/static-offline-docs"
"""Where ``FastAPIOffline`` serves the docs' scripts, styles and icon from the package."""
REDOC_POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "worker-src 'self' blob:; frame-ancestors 'none'; base-uri 'none'"
)
"""What ``/redoc`` may load: the server's own files. ReDoc's script draws the Redocly
logo from a CDN in its sidebar, whatever it is told; this policy stops that request
before it leaves the browser (the image then hides itself). Its styles are inline."""


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
        redoc_url=None,
        title="tidegate",
        summary="Webhook ingress with admission control, runs on PostgreSQL",
        version=__version__,
        lifespan=lifespan,
        responses=COMMON_RESPONSES,
    )
    server.state.api = api
    server.add_middleware(Guard, api=api)
    server.include_router(hooks.router)
    server.include_router(workers.router)
    server.include_router(runs.router)
    server.include_router(admin.router)
    server.include_router(workers.admin_router)
    server.include_router(metrics.router)
    install_dashboard(server)
    server.include_router(health.router)

    @server.get(REDOC, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        """The API's reference (ReDoc), from the package's own files, with a policy that
        keeps it from loading anything from another site (``REDOC_POLICY``)."""
        root = request.scope.get("root_path", "")
        page = get_redoc_html(
            openapi_url=f"{root}{server.openapi_url}",
            title="tidegate - ReDoc",
            redoc_js_url=f"{root}{OFFLINE_DOCS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{OFFLINE_DOCS}/favicon.png",
            with_google_fonts=False,
        )
        page.headers["Content-Security-Policy"] = REDOC_POLICY
        return page

    @server.exception_handler(psycopg.Error)
    async def database_error(request: Request, error: psycopg.Error) -> JSONResponse:
        return database_problem(error, request.method, request.url.path)

    @server.exception_handler(ClientDisconnect)
    async def disconnected(request: Request, _: ClientDisconnect) -> JSONResponse:
        return client_gone(request.method, request.url.path)

    @server.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        page = error_page(request, error.status_code, str(error.detail))
        if page is not None:
            page.headers.update(error.headers or {})
            return page
        return problem(error.status_code, str(error.detail), dict(error.headers or {}))

    @server.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> Response:
        answer = validation_problem(error)
        page = error_page(request, answer.status_code, json.loads(bytes(answer.body))["detail"])
        return answer if page is None else page

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
