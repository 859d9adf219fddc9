"""The dashboard's HTML: Jinja2 templates shipped as package data, escaped by default.

Every page gets the session's caller (to show or hide what only the super admin sees),
its CSRF token, which each form carries and ``ui.js`` sends with htmx requests, and
``here``, its own address: a list page polls it for its rows (htmx's ``hx-select``). A
list with filters or pages gives its own ``here``, with the query of the filters and
the page it shows as it read them (never what else the address held), so a refresh
keeps them.

Times have one format on every page: how long ago, or how soon (``3.2 s ago``, ``in 5
min``), with the UTC time to the second in the element's title (``moment``); lengths of
time read ``1.2 s``, ``4.5 min`` (``span``), as in ``took 1.2 s``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from tidegate.access import Session
from tidegate.runs import attempts_shown

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


def span(seconds: float | None) -> str:
    """A length of time the way every page shows it: ``0.4 s``, ``12 s``, ``4.5 min``,
    ``3.0 h``, ``2.0 d``; empty for none."""
    if seconds is None:
        return ""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


def moment(value: datetime | str | None, now: datetime | None = None) -> Markup:
    """A time as every page shows it: how long ago or how soon, in a ``<time>`` whose
    title is the UTC time to the second (a tooltip), and ``datetime`` its ISO form.

    ``value`` may be ISO 8601 text (the ``at`` of a run's stored errors).
    """
    if value is None or value == "":
        return Markup("")
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    told = f"{span(seconds)} ago" if seconds >= 0 else f"in {span(-seconds)}"
    return Markup('<time datetime="{}" title="{} UTC">{}</time>').format(
        value.astimezone(UTC).isoformat(), when(value), told
    )


def took(started: datetime | None, ended: datetime | None) -> str:
    """How long an attempt took, ``took 1.2 s``; empty unless it has both ends."""
    if started is None or ended is None:
        return ""
    return f"took {span(max((ended - started).total_seconds(), 0.0))}"


def pretty(value: Any) -> str:
    """JSON indented for a ``<pre>``."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def number(value: float | None) -> str:
    """A figure without a trailing ``.0``; empty for none."""
    if value is None:
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


ENVIRONMENT.filters.update(
    moment=moment, span=span, pretty=pretty, number=number, attempts=attempts_shown
)
ENVIRONMENT.globals.update(took=took)


def render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """Render ``template`` with the session's caller and CSRF token."""
    session: Session | None = getattr(request.state, "ui_session", None)
    html = ENVIRONMENT.get_template(template).render(
        caller=session.caller if session else None,
        csrf_token=session.csrf_token if session else "",
        path=request.url.path,
        **({"here": request.url.path} | context),
    )
    return HTMLResponse(html, status_code=status)


def error_page(request: Request, status: int, detail: str) -> HTMLResponse | None:
    """The dashboard's HTML answer for an error of a page a browser asked for, or
    ``None`` where the problem's JSON is the answer (every other client, the charts'
    ``/ui/api/*``, an htmx fragment).

    A browser's navigation accepts ``text/html``; a 404 or 409 of the dashboard then
    reads as a page with the navigation, not as raw JSON.
    """
    path = request.url.path
    if not (path == "/ui" or path.startswith("/ui/")) or path.startswith("/ui/api/"):
        return None
    if "hx-request" in request.headers or "text/html" not in request.headers.get("accept", ""):
        return None
    title = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    return render(request, "error.html", status, code=status, title=title, detail=detail)
