"""Dashboard sessions as the pages see them: sign in with a token, then a cookie; CSRF
tokens for every change.

- ``POST /ui/login`` takes the super admin's token or a project's token (the same lookup
  as ``Authorization: Bearer``: ``tidegate.access.find_caller``) and opens a session
  (``tidegate.access.open_session``) for ``ui_session_seconds``, or until the token it
  was opened with is rotated. The browser holds its id in the cookie
  ``tidegate_session`` (HttpOnly, SameSite=Strict, Path=/ui, Secure over https).
- The ``Guard`` (api/guard.py) finds the session before any body is read, refuses a
  request under ``/ui`` without one, and puts it on the request's state: a page reads it
  as ``Current`` (``request.state.ui_session``), its caller as ``session.caller``
  (project None for the super admin). The Guard also refuses a POST whose ``Origin``
  is not this server's ``Host`` (403), and gives every answer under /ui the dashboard's
  security headers.
- Every POST but the sign-in carries the session's CSRF token, as the form field
  ``csrf_token`` or the header ``X-CSRF-Token`` (htmx); ``check_csrf`` compares it in
  constant time and answers 403 when it is missing or wrong. SameSite=Strict already
  keeps the cookie off cross-site requests; the token guards against the rest
  (a sibling subdomain, a browser without SameSite).
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import parse_qsl

from fastapi import Depends, HTTPException, Request
from psycopg.rows import dict_row
from starlette.responses import Response

from tidegate.access import Session
from tidegate.api.guard import COOKIE, DASHBOARD
from tidegate.storage.sql import Statement, Steps

if TYPE_CHECKING:
    from tidegate.api.kernel import Api

MAX_FORM_FIELDS = 20
"""More fields than any dashboard form has: a body past it is refused (400)."""


def current_session(request: Request) -> Session:
    """FastAPI dependency: the session the ``Guard`` found for this request."""
    session: Session = request.state.ui_session
    return session


Current = Annotated[Session, Depends(current_session)]
"""A page's session (a route parameter)."""


def api_of(request: Request) -> Api:
    """This API process's ``Api`` (its pool and settings)."""
    api: Api = request.app.state.api
    return api


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


def set_cookie(response: Response, session_id: str, seconds: float, *, secure: bool) -> None:
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=int(seconds),
        path=DASHBOARD,
        httponly=True,
        samesite="strict",
        secure=secure,
    )


def clear_cookie(response: Response, *, secure: bool) -> None:
    response.delete_cookie(COOKIE, path=DASHBOARD, httponly=True, samesite="strict", secure=secure)
