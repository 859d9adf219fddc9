"""What every request meets first: the refusals that need no body and no route.

``Guard`` wraps the whole application as plain ASGI, so it runs before FastAPI reads a
body or matches a route:

- more than ``max_headers`` header fields: 431 (the head's size and read time are
  bounded in ``tidegate.api.protocol``);
- a NUL character in the path or the query (``%00``): 400, PostgreSQL text cannot hold
  one, whatever parameter it would become;
- ``/admin/*``, ``/runs*`` and ``/metrics`` (the admin's only, like ``/admin``), and
  ``/workers*`` (a worker token's, ``tidegate.remote``): the bearer token is checked
  from the headers alone, and a caller without a valid one gets 401/403 before a byte
  of its body is read, whatever body it announces; the caller goes
  to the routes as ``request.state.caller``. This runs outside FastAPI's exception
  handlers, so a database error while looking the token up is answered here, as a
  route's would be (503 when unreachable);
- ``/ui`` (the dashboard): the session is found from its cookie, the same way before
  any body is read (``tidegate.access.find_session``): a page without one is sent to
  the sign-in page, anything else is answered 401, and a POST from another origin 403;
  every answer under ``/ui`` gets the dashboard's security headers
  (``DASHBOARD_HEADERS``: CSP, no framing, nosniff);
- a body over its limit: 413, on ``Content-Length`` and again while it arrives (the JSON
  APIs: ``max_api_body_bytes``; the webhook route applies its trigger's own limit);
- a body that stops arriving for ``read_timeout_seconds``, or that is not all in within
  ``body_timeout_seconds`` of the head (a trickle of a byte now and then): 408.

Refusals of a request whose body was not read close the connection: the server does not
read a body it will not use.
"""

from __future__ import annotations

import asyncio
from http.cookies import SimpleCookie
from urllib.parse import urlsplit

import psycopg
from starlette.exceptions import HTTPException
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tidegate.access import WorkerCaller, find_session
from tidegate.api.auth import Refused, authenticate, authenticate_worker
from tidegate.api.kernel import Api, database_problem, problem
from tidegate.limits import whole_number

AUTHENTICATED = ("/admin", "/runs", "/metrics")
WORKERS = "/workers"
"""The remote workers' protocol: a worker token, not an admin's or a project's."""


def worker_named(path: str) -> str | None:
    """The worker a call of the protocol is about (``/workers/{id}/...``), or None."""
    parts = path.split("/", 3)
    return parts[2] if len(parts) == 4 and parts[1] == WORKERS[1:] else None


CLAIM = "/claim"

ADMIN_ONLY = ("/admin", "/metrics")
CLOSE = {"Connection": "close"}
DASHBOARD = "/ui"
DASHBOARD_PUBLIC = ("/ui/login", "/ui/static/")
"""Paths under /ui that need no session: the sign-in page, the scripts and styles."""
COOKIE = "tidegate_session"
"""The cookie that holds a dashboard session's id (ui/session.py sets it)."""
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""What a dashboard page may load and do: its own scripts, styles and requests, nothing
inline (no template has an inline script, style or event handler, and htmx is told not
to add its indicator style: base.html's htmx-config), no other site, and no frame around
it. A script injected into a page despite the escaping would not run."""
DASHBOARD_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]
"""Sent with every answer under /ui (pages, fragments, static files, redirects, refusals):
no other site may frame the dashboard (clickjacking a Retry or a Replay), no file is
read as another type than it is sent as, and no run's URL leaves in a Referer."""


class BodyTooLarge(HTTPException):
    """The body went past its limit while it was being read (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"body over {limit} bytes", CLOSE)


class BodyTooSlow(HTTPException):
    """The body stopped arriving, or arrived too slowly to be in on time (408)."""

    def __init__(self, title: str) -> None:
        super().__init__(408, title, CLOSE)


class Guard:
    """ASGI middleware: NUL in the URL, authentication, body limits and timeouts."""

    def __init__(self, app: ASGIApp, api: Api) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = self.api.settings
        path: str = scope["path"]
        if is_dashboard(path):
            send = with_dashboard_headers(send)  # its refusals below included
        headers = {name.decode("latin-1"): value for name, value in scope["headers"]}
        length = headers.get("content-length", b"")
        with_body = bool(length.strip(b"0")) or b"chunked" in headers.get("transfer-encoding", b"")
        declared = whole_number(length.decode("latin-1")) if length else None
        refusal = self._malformed(scope, length, declared)
        answer: Response | None = None
        if refusal is None and path.startswith((WORKERS, *AUTHENTICATED)):
            authorization = headers.get("authorization", b"").decode("latin-1")
            try:
                if path.startswith(WORKERS):
                    caller: object = self.remembered(scope, authorization) or (
                        await self._worker(authorization, worker_named(path))
                    )
                else:
                    caller = await authenticate(
                        self.api, authorization, admin=path.startswith(ADMIN_ONLY)
                    )
                scope.setdefault("state", {})["caller"] = caller
            except Refused as refused:
                challenge = {"WWW-Authenticate": "Bearer"} if refused.status == 401 else {}
                refusal = (refused.status, refused.title, challenge)
            except psycopg.Error as error:
                answer = database_problem(error, scope["method"], path)
        elif refusal is None and is_dashboard(path):
            try:
                answer = await admit_dashboard(self.api, scope, headers)
            except psycopg.Error as error:
                answer = database_problem(error, scope["method"], path)
        limit = None if path.startswith("/hooks/") else settings.max_api_body_bytes
        if refusal is None and limit is not None and declared is not None and declared > limit:
            refusal = (413, f"body over {limit} bytes", {})
        if refusal is not None:
            status, title, extra = refusal
            answer = problem(status, title, extra)
        if answer is not None:
            if with_body:
                answer.headers.update(CLOSE)
            await answer(scope, receive, send)
            return
        body = GuardedBody(
            receive, limit, settings.read_timeout_seconds, settings.body_timeout_seconds
        )
        body.complete = not with_body

        async def closing_send(message: Message) -> None:
            # An answer begun before the body is all in ends the connection (the server
            # does not read on for a body it will not use): it must say so, or a client
            # reusing the connection finds it closed under its next request.
            if message["type"] == "http.response.start" and not body.complete:
                headers = list(message.get("headers", ()))
                if not any(name.lower() == b"connection" for name, _ in headers):
                    message["headers"] = [*headers, (b"connection", b"close")]
            await send(message)

        await self.app(scope, body.receive, closing_send)

    def remembered(self, scope: Scope, authorization: str) -> WorkerCaller | None:
        """The worker of a claim (``POST /workers/{id}/claim``) whose token this process
        found lately (within ``Claimers``' budget), or None. A claim is a remote worker's
        every cycle: its lookup was one round trip in three of the API's work per claim.
        The claim's own statement checks the token and the worker again
        (functions/claim_workloop.sql), and one that finds either gone forgets the worker
        here, then answers as the lookup would: a deleted token's workers are still
        refused from their next call on, and a body is read only under a token that was
        valid at its worker's last call."""
        worker_id = worker_named(scope["path"])
        if scope["method"] != "POST" or scope["path"] != f"{WORKERS}/{worker_id}{CLAIM}":
            return None
        return self.api.claimers.get((authorization, str(worker_id)))

    async def _worker(self, authorization: str, worker_id: str | None) -> WorkerCaller:
        fleet = await authenticate_worker(self.api, authorization, worker_id)
        if worker_id is not None and fleet.worker is not None:
            self.api.claimers.remember((authorization, worker_id), fleet)
        return fleet

    def _malformed(
        self, scope: Scope, length: bytes, declared: int | None
    ) -> tuple[int, str, dict[str, str]] | None:
        settings = self.api.settings
        if len(scope["headers"]) > settings.max_headers:
            return 431, f"more than {settings.max_headers} header fields", {}
        if "\x00" in scope["path"] or b"%00" in scope["query_string"]:
            return 400, "a NUL character (%00) in the URL", {}
        if length and declared is None:
            return 400, "Content-Length is not a number", {}
        return None


def is_dashboard(path: str) -> bool:
    return path == DASHBOARD or path.startswith(DASHBOARD + "/")


def with_dashboard_headers(send: Send) -> Send:
    """``send`` that adds ``DASHBOARD_HEADERS`` to the answer it starts."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), *DASHBOARD_HEADERS]
        await send(message)

    return sending


async def admit_dashboard(api: Api, scope: Scope, headers: dict[str, bytes]) -> Response | None:
    """Put a dashboard request's session on its state (``caller``: the ``Caller``,
    ``ui_session``: the ``Session``), or return the answer that refuses it.

    A page asked for by a browser without a live session is sent to ``/ui/login``
    (303); a fragment (``HX-Request``), the JSON API or a POST gets 401. An anonymous
    POST costs one primary-key probe and never a body.
    """
    path: str = scope["path"]
    if scope["method"] == "POST" and not same_origin(headers):
        return problem(403, "a cross-site request to the dashboard")
    if path.startswith(DASHBOARD_PUBLIC):
        return None
    session_id = cookie_value(headers.get("cookie", b""))
    found = await api.run(find_session(session_id)) if session_id else None
    if found is None:
        fragment = "hx-request" in headers or path.startswith(("/ui/api/", "/ui/fragments/"))
        if fragment or scope["method"] not in ("GET", "HEAD"):
            return problem(401, "not signed in (or the session has expired)")
        return RedirectResponse("/ui/login", status_code=303)
    state = scope.setdefault("state", {})
    state["caller"] = found.caller
    state["ui_session"] = found
    return None


def same_origin(headers: dict[str, bytes]) -> bool:
    """Whether a browser's ``Origin`` (when it sends one) is this server's own ``Host``.

    Checked on every POST to the dashboard, the sign-in included, which has no session
    and so no CSRF token yet: another site cannot sign a visitor in with a token of its
    choosing.
    """
    origin = headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin.decode("latin-1")).netloc == headers.get("host", b"").decode("latin-1")


def cookie_value(header: bytes) -> str | None:
    """The session id in a ``Cookie`` header, if any (bounded: no longer than a token)."""
    cookies: SimpleCookie = SimpleCookie()
    try:
        cookies.load(header.decode("latin-1"))
    except Exception:  # a malformed Cookie header is no session, not a 500
        return None
    morsel = cookies.get(COOKIE)
    if morsel is None or not 0 < len(morsel.value) <= 128:
        return None
    return morsel.value


class GuardedBody:
    """``receive`` wrapped: the body within ``limit`` bytes, each part within ``timeout``
    seconds, all of it within ``body_timeout`` seconds from now."""

    def __init__(
        self, receive: Receive, limit: int | None, timeout: float, body_timeout: float
    ) -> None:
        self._receive = receive
        self.limit = limit
        self.timeout = timeout
        self.body_timeout = body_timeout
        self.deadline = asyncio.get_running_loop().time() + body_timeout
        self.received = 0
        self.complete = False
        """Whether the body is all in (or there is none)."""

    async def receive(self) -> Message:
        if self.complete:  # waiting for a disconnect, not for a slow client
            return await self._receive()
        now = asyncio.get_running_loop().time()
        wait = max(0.0, min(self.timeout, self.deadline - now))
        try:
            message = await asyncio.wait_for(self._receive(), wait)
        except TimeoutError:
            if asyncio.get_running_loop().time() >= self.deadline:
                title = f"the body was not all in within {self.body_timeout:g}s"
            else:
                title = f"no part of the body arrived for {self.timeout:g}s"
            raise BodyTooSlow(title) from None
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.complete = not message.get("more_body", False)
            if self.limit is not None and self.received > self.limit:
                raise BodyTooLarge(self.limit)
        return message
