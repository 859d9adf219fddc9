"""The dashboard, ``/ui``: server-rendered pages of the cluster, its projects and runs.

Served by every API process (``create_server`` calls ``install``); the pages are
Jinja2 templates, kept fresh by htmx fragments, with uPlot charts; both are vendored
under ``static/``, so the dashboard works offline and needs no build step.

Access (docs/dashboard.md): sign in at ``/ui/login`` with the super admin's token or a
project's; the session lives in a cookie (ui/session.py), found by the ``Guard``
(api/guard.py) before any body is read. A project's session sees its own project only:
every statement of every page is filtered by it, and another project's run, trigger
or request answers 404. Every POST carries the session's CSRF token.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles


def install(server: FastAPI) -> None:
    """Add the dashboard's routes and static files to ``server``."""
    from tidegate.ui import controls, pages, runs, triggers

    server.include_router(pages.router)
    server.include_router(controls.router)
    server.include_router(runs.router)
    server.include_router(triggers.router)
    server.mount("/ui/static", StaticFiles(packages=[("tidegate.ui", "static")]), name="ui-static")
