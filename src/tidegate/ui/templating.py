"""The dashboard's HTML: Jinja2 templates shipped as package data, escaped by default.

Every page gets the session's caller (to show or hide what only the super admin sees)
and its CSRF token, which each form carries and ``ui.js`` sends with htmx requests.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, PackageLoader, select_autoescape

from tidegate.access import Session

ENVIRONMENT = Environment(
    loader=PackageLoader("tidegate.ui", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def when(value: datetime | None) -> str:
    """A timestamp as UTC to the second, the way every page shows times."""
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def pretty(value: Any) -> str:
    """JSON indented for a ``<pre>``."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def number(value: float | None) -> str:
    """A figure without a trailing ``.0``; empty for none."""
    if value is None:
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


ENVIRONMENT.filters.update(when=when, pretty=pretty, number=number)


def render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """Render ``template`` with the session's caller and CSRF token."""
    session: Session | None = getattr(request.state, "ui_session", None)
    html = ENVIRONMENT.get_template(template).render(
        caller=session.caller if session else None,
        csrf_token=session.csrf_token if session else "",
        path=request.url.path,
        **context,
    )
    return HTMLResponse(html, status_code=status)
