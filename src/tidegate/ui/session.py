"""Dashboard sessions: sign in with a token, then a cookie; CSRF tokens for every change.

- ``POST /ui/login`` takes the super admin's token or a project's token (the same lookup
  as ``Authorization: Bearer``, by sha256) and opens a session: a row in
  ``ui_sessions`` keyed by the sha256 of a random id, with a random CSRF token, for
  ``ui_session_seconds``, or until the token it was opened with is rotated (the row
  keeps the token's sha256, and a session whose token is no longer its holder's is
  no session). The browser holds the id in the cookie ``tidegate_session``
  (HttpOnly, SameSite=Strict, Path=/ui, Secure over https).
- ``admit`` runs in the ``Guard``, before any body is read: a request under ``/ui``
  (but the sign-in page and the static files) without a live session is refused there,
  so an anonymous POST costs one primary-key probe and never a body. A page asked for
  by a browser is sent to ``/ui/login`` (303); a fragment (``HX-Request``) or the JSON
  API gets 401. With a session, the request carries ``request.state.caller``
  (``Caller``: project None for the super admin) and ``request.state.ui_session``.
- A POST whose ``Origin`` is not this server's ``Host`` is refused (403), the sign-in
  included.
- Every answer under /ui carries ``HEADERS``: a Content-Security-Policy that allows the
  dashboard's own files only and no frame around it, ``X-Frame-Options: DENY``,
  ``X-Content-Type-Options: nosniff``.
- Every POST but the sign-in carries the session's CSRF token, as the form field
  ``csrf_token`` or the header ``X-CSRF-Token`` (htmx); ``check_csrf`` compares it in
  constant time and answers 403 when it is missing or wrong. SameSite=Strict already
  keeps the cookie off cross-site requests; the token guards against the rest
  (a sibling subdomain, a browser without SameSite).
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import parse_qsl, urlsplit

from fastapi import Depends, HTTPException, Request
from psycopg.rows import dict_row
from starlette.responses import RedirectResponse, Response
from starlette.types import Message, Scope, Send

from tidegate.api.auth import Caller
from tidegate.api.kernel import problem
from tidegate.projects import hash_token
from tidegate.storage.sql import Statement, Steps

if TYPE_CHECKING:
    from tidegate.api.kernel import Ingress

COOKIE = "tidegate_session"
PREFIX = "/ui"
PUBLIC = ("/ui/login", "/ui/static/")
"""Paths under /ui that need no session: the sign-in page, the scripts and styles."""
MAX_FORM_FIELDS = 20
"""More fields than any dashboard form has: a body past it is refused (400)."""
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""What a dashboard page may load and do: its own scripts, styles and requests, nothing
inline (no template has an inline script, style or event handler, and htmx is told not
to add its indicator style: base.html's htmx-config), no other site, and no frame around
it. A script injected into a page despite the escaping would not run."""
HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]
"""Sent with every answer under /ui (pages, fragments, static files, redirects, refusals):
no other site may frame the dashboard (clickjacking a Retry or a Replay), no file is
read as another type than it is sent as, and no run's URL leaves in a Referer."""


@dataclass(frozen=True)
class Session:
    """A signed-in dashboard session, as the ``Guard`` found it for this request."""

    id_hash: str
    caller: Caller
    csrf_token: str


def is_dashboard(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def with_headers(send: Send) -> Send:
    """``send`` that adds the dashboard's ``HEADERS`` to the answer it starts."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), *HEADERS]
        await send(message)

    return sending


async def admit(ingress: Ingress, scope: Scope, headers: dict[str, bytes]) -> Response | None:
    """Put the request's session on its state, or return the answer that refuses it."""
    path: str = scope["path"]
    if scope["method"] == "POST" and not same_origin(headers):
        return problem(403, "a cross-site request to the dashboard")
    if path.startswith(PUBLIC):
        return None
    session_id = cookie_value(headers.get("cookie", b""))
    found = await ingress.run(_find(hash_token(session_id))) if session_id else None
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

    Checked on every POST, the sign-in included, which has no session and so no CSRF
    token yet: another site cannot sign a visitor in with a token of its choosing.
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


def current_session(request: Request) -> Session:
    """FastAPI dependency: the session the ``Guard`` found for this request."""
    session: Session = request.state.ui_session
    return session


Current = Annotated[Session, Depends(current_session)]
"""A page's session (a route parameter)."""


def ingress_of(request: Request) -> Ingress:
    """This API process's ``Ingress`` (its pool and settings)."""
    ingress: Ingress = request.app.state.ingress
    return ingress


def rows(name: str, params: dict[str, Any]) -> Steps[list[dict[str, Any]]]:
    """Run one statement; its rows as dicts (what the templates read)."""
    return (yield Statement(name, params, dict_row))


async def read_form(request: Request) -> dict[str, str]:
    """The request's form fields (``application/x-www-form-urlencoded``).

    Parsed with the standard library: the ``Guard`` has bounded the body already
    (``max_api_body_bytes``), and a repeated field keeps its last value.
    """
    body = await request.body()
    try:
        return dict(
            parse_qsl(
                body.decode("utf-8"),
                keep_blank_values=True,
                strict_parsing=False,
                max_num_fields=MAX_FORM_FIELDS,
            )
        )
    except (UnicodeDecodeError, ValueError):
        raise HTTPException(400, "not a form this page sends") from None


async def check_csrf(request: Request, session: Session) -> dict[str, str]:
    """Return the form of a POST whose CSRF token is the session's; else 403."""
    form = await read_form(request)
    given = request.headers.get("x-csrf-token") or form.get("csrf_token", "")
    if not hmac.compare_digest(given.encode(), session.csrf_token.encode()):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page")
    return form


def open_session(caller: Caller, token: str, seconds: float) -> Steps[str]:
    """Store a new session for ``caller``, who signed in with ``token``; return the id
    that goes in the cookie. The session keeps the token's digest: rotating the token
    ends it (``find_ui_session``)."""
    session_id = secrets.token_urlsafe(32)
    yield Statement(
        "insert_ui_session",
        {
            "id_hash": hash_token(session_id),
            "project": caller.project,
            "token_hash": hash_token(token),
            "csrf_token": secrets.token_urlsafe(32),
            "seconds": seconds,
        },
    )
    return session_id


def close_session(id_hash: str) -> Steps[None]:
    yield Statement("delete_ui_session", {"id_hash": id_hash})


def find_token_holder(token: str) -> Steps[Caller | None]:
    """Who holds ``token`` (the lookup ``authenticate`` makes), or None."""
    rows = yield Statement("find_caller", {"token_hash": hash_token(token)})
    return Caller(project=rows[0][0]) if rows else None


def set_cookie(response: Response, session_id: str, seconds: float, *, secure: bool) -> None:
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=int(seconds),
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=secure,
    )


def clear_cookie(response: Response, *, secure: bool) -> None:
    response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict", secure=secure)


def _find(id_hash: str) -> Steps[Session | None]:
    rows = yield Statement("find_ui_session", {"id_hash": id_hash})
    if not rows:
        return None
    project, csrf_token = rows[0]
    return Session(id_hash=id_hash, caller=Caller(project=project), csrf_token=csrf_token)
