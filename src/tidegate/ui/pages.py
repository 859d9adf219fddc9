"""The dashboard's cluster pages: sign-in, overview (with pausing and resuming a lane),
workers (with the runs each runs now), tasks (attempts per minute of each), projects,
keys, schedules.

Every statement a page runs is given the session's project (None for the super admin)
and filters by it; what is the whole cluster's and cannot be split by project (lane
depths, worker throughput, the workers) is shown to the super admin only.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from tidegate.access import Session, close_session, find_caller, open_session
from tidegate.admission import REFUSALS, Unjudged, Verdict
from tidegate.figures import (
    ACTIVE_STATES,
    COUNT_CAP,
    KEY_SCAN,
    WAITING_CAP,
    WaitingLine,
    fast_lane_projects,
    list_workers,
    read_keys,
    read_lanes,
    waiting_lines,
)
from tidegate.lanes import LaneError, pause_lane, resume_lane
from tidegate.limits import IDENTIFIER, MAX_NAME_CHARS
from tidegate.schedules import list_schedules
from tidegate.ui.session import (
    Current,
    api_of,
    check_csrf,
    clear_cookie,
    read_form,
    rows,
    set_cookie,
)
from tidegate.ui.templating import render

router = APIRouter(prefix="/ui", include_in_schema=False)
ProjectIdPath = Annotated[str, Path(pattern=f"^{IDENTIFIER.pattern}$", max_length=MAX_NAME_CHARS)]

CHART_MINUTES = 30
MAX_CHART_SERIES = 12
"""Lines per chart, the largest first: more than a dozen cannot be told apart."""
MAX_PROJECTS = 100
"""Rows of the projects page: the busiest, like /metrics' ``metrics_max_projects``."""
MAX_KEYS = 100
"""Rows of the keys page."""
MAX_WORKERS = 1000
RUNNING_PER_WORKER = 50
"""Runs listed under each worker, the longest running first: a worker with more slots
shows its oldest, so the page reads at most ``MAX_WORKERS`` times this many runs."""
TASK_MINUTES = 60
"""The tasks page's window: the hour minute_counts keeps."""
MAX_TASK_CHARTS = 20
"""Tasks charted, the most attempts first."""
TASK_OUTCOMES = {
    "completed": ["succeeded"],
    "failed": ["failed", "discarded", "rescued"],
}
"""The tasks page's two series and the attempt outcomes (worker/counters.py) each
counts: a failed attempt is one that raised, retried or not, or whose worker died
under it (rescued). A Retry(), a Cancel and a late outcome are neither."""
MAX_SCHEDULES = 1000
MAX_TOKEN_CHARS = 200
"""Longer than any token tidegate makes: not looked up."""
REFUSED_BY_STATUS = {
    "refused_429": [v.value for v in REFUSALS if v.refusal and v.refusal.status == 429],
    "refused_503": [
        *(v.value for v in REFUSALS if v.refusal and v.refusal.status == 503),
        Unjudged.UNAVAILABLE.value,
    ],
    "answered": [Verdict.ADMITTED.value, Verdict.REPLAYED.value, Verdict.DUPLICATE.value],
}
"""The outcomes the projects page counts as refused with a 429, as refused with a 503,
and as not refused (``read_projects``): the verdicts by their declared status, and the
database's outage; every other outcome was a 4xx."""


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


@router.get("/login")
async def login_page(request: Request) -> HTMLResponse:
    return render(request, "login.html")


@router.post("/login")
async def login(request: Request) -> Response:
    """Open a session for the holder of the token, or show the form again (401)."""
    token = (await read_form(request)).get("token", "").strip()
    api = api_of(request)
    caller = None
    if 0 < len(token) <= MAX_TOKEN_CHARS:
        caller = await api.run(find_caller(token))
    if caller is None:
        return render(request, "login.html", 401, message="Unknown token.")
    seconds = api.settings.ui_session_seconds
    session_id = await api.run(open_session(caller, token, seconds))
    response = RedirectResponse("/ui/", status_code=303)
    set_cookie(response, session_id, seconds, secure=_secure(request))
    return response


@router.post("/logout")
async def logout(request: Request, session: Current) -> Response:
    await check_csrf(request, session)
    await api_of(request).run(close_session(session.id_hash))
    response = RedirectResponse("/ui/login", status_code=303)
    clear_cookie(response, secure=_secure(request))
    return response


@router.get("/")
async def overview(request: Request, session: Current) -> HTMLResponse:
    lanes = []
    if session.caller.admin:
        lanes = await api_of(request).run(read_lanes(api_of(request).settings))
    return render(
        request,
        "overview.html",
        lanes=lanes,
        states=ACTIVE_STATES,
        count_cap=f"{COUNT_CAP:,}",
        minutes=CHART_MINUTES,
    )


@router.get("/fragments/lanes")
async def lanes_fragment(request: Request, session: Current) -> HTMLResponse:
    """The overview's lane rows, polled every 2 s (the super admin's: cluster figures)."""
    _admin_only(session)
    lanes = await api_of(request).run(read_lanes(api_of(request).settings))
    return render(request, "lanes.html", lanes=lanes, states=ACTIVE_STATES)


PAUSED_BY = "dashboard"
"""What a pause made from the dashboard says it came from."""


@router.post("/lanes/pause")
async def pause(request: Request, session: Current) -> RedirectResponse:
    """Pause the form's ``lane``, with its ``reason`` if given, as ``POST
    /admin/lanes/{lane}/pause`` does (the super admin's: lanes are the whole cluster's)."""
    _admin_only(session)
    form = await check_csrf(request, session)
    reason = form.get("reason", "").strip() or None
    try:
        await api_of(request).run(pause_lane(form.get("lane", ""), by=PAUSED_BY, reason=reason))
    except LaneError as error:
        raise HTTPException(422, str(error)) from None
    return RedirectResponse("/ui/", status_code=303)


@router.post("/lanes/resume")
async def resume(request: Request, session: Current) -> RedirectResponse:
    """Resume the form's ``lane`` and wake its workers, as ``POST
    /admin/lanes/{lane}/resume`` does."""
    _admin_only(session)
    form = await check_csrf(request, session)
    api = api_of(request)
    try:
        await api.run(resume_lane(form.get("lane", ""), channel=api.app.available_channel))
    except LaneError as error:
        raise HTTPException(422, str(error)) from None
    return RedirectResponse("/ui/", status_code=303)


@router.get("/api/activity")
async def activity(request: Request, session: Current) -> JSONResponse:
    """The charts' data: counts per minute of the last 30 minutes, one list per series.

    ``{"minutes": [epoch seconds...], "throughput": {"series": [lane...], "counts":
    [[...]...]} or null, "admissions": {"series": [outcome...], "counts": ...}}``.
    Throughput is null for a project: attempts are counted per lane, not per project.
    """
    project = session.caller.project
    found = await api_of(request).run(
        rows("read_activity", {"minutes": CHART_MINUTES, "project": project})
    )
    now = int(time.time()) // 60 * 60
    minutes = [now - 60 * (CHART_MINUTES - 1 - i) for i in range(CHART_MINUTES)]
    return JSONResponse(
        {
            "minutes": minutes,
            "throughput": None if project else _series(found, "attempt", minutes),
            "admissions": _series(found, "admission", minutes),
        }
    )


def _series(found: list[dict[str, Any]], source: str, minutes: list[int]) -> dict[str, Any]:
    position = {minute: i for i, minute in enumerate(minutes)}
    counts: dict[str, list[int]] = {}
    for row in found:
        if row["source"] == source and row["minute"] in position:
            line = counts.setdefault(row["series"], [0] * len(minutes))
            line[position[row["minute"]]] += row["count"]
    largest = sorted(counts, key=lambda name: (-sum(counts[name]), name))[:MAX_CHART_SERIES]
    kept = sorted(largest)
    return {"series": kept, "counts": [counts[name] for name in kept]}


@router.get("/workers")
async def workers(request: Request, session: Current) -> HTMLResponse:
    """Every worker row: the cluster's, so the super admin's only (404 for a project)."""
    _admin_only(session)
    api = api_of(request)
    found = await api.run(list_workers(MAX_WORKERS))
    params = {"workers": [w["id"] for w in found], "per_worker": RUNNING_PER_WORKER}
    running: dict[str, list[dict[str, Any]]] = {}
    for run in await api.run(rows("list_running_runs", params)):
        running.setdefault(run["worker_id"], []).append(run)
    return render(
        request,
        "workers.html",
        workers=found,
        running=running,
        per_worker=RUNNING_PER_WORKER,
        live_seconds=3 * api.settings.heartbeat_seconds,
    )


async def _task_activity(request: Request) -> tuple[list[int], dict[str, dict[str, list[int]]]]:
    """The last ``TASK_MINUTES`` minutes (epoch seconds) and, for each of the busiest
    ``MAX_TASK_CHARTS`` tasks, its attempts per minute by ``TASK_OUTCOMES`` series."""
    found = await api_of(request).run(
        rows(
            "read_task_activity",
            {"minutes": TASK_MINUTES, "max_tasks": MAX_TASK_CHARTS, **TASK_OUTCOMES},
        )
    )
    now = int(time.time()) // 60 * 60
    minutes = [now - 60 * (TASK_MINUTES - 1 - i) for i in range(TASK_MINUTES)]
    position = {minute: i for i, minute in enumerate(minutes)}
    tasks: dict[str, dict[str, list[int]]] = {}
    for row in found:
        series = tasks.setdefault(row["task"], {name: [0] * TASK_MINUTES for name in TASK_OUTCOMES})
        if row["minute"] in position:
            series[row["series"]][position[row["minute"]]] += row["count"]
    return minutes, tasks


@router.get("/tasks")
async def tasks(request: Request, session: Current) -> HTMLResponse:
    """Each task's attempts of the last hour, completed and failed, with a chart of each
    per minute: the super admin's, as attempts are counted per task and lane, not per
    project."""
    _admin_only(session)
    _, found = await _task_activity(request)
    totals: list[dict[str, Any]] = [
        {"task": task, **{name: sum(counts) for name, counts in series.items()}}
        for task, series in found.items()
    ]
    totals.sort(key=lambda row: (-(row["completed"] + row["failed"]), row["task"]))
    return render(request, "tasks.html", tasks=totals, minutes=TASK_MINUTES, limit=MAX_TASK_CHARTS)


@router.get("/api/tasks")
async def task_activity(request: Request, session: Current) -> JSONResponse:
    """The tasks page's charts: ``{"minutes": [epoch seconds...], "tasks": [{"task",
    "series": ["completed", "failed"], "counts": [[...], [...]]}...]}``, the tasks with
    the most attempts first."""
    _admin_only(session)
    minutes, found = await _task_activity(request)
    ordered = sorted(found, key=lambda task: (-sum(map(sum, found[task].values())), task))
    charts = [
        {"task": task, "series": list(TASK_OUTCOMES), "counts": list(found[task].values())}
        for task in ordered
    ]
    return JSONResponse({"minutes": minutes, "tasks": charts})


@router.get("/projects")
async def projects(request: Request, session: Current) -> HTMLResponse:
    api = api_of(request)
    ids: list[str | None] = [session.caller.project]
    if session.caller.admin:
        busiest = await api.run(fast_lane_projects(MAX_PROJECTS, api.settings.fast_lane_cap))
        ids = [busy.project for busy in busiest]
    found = await api.run(
        rows(
            "read_projects",
            {
                "ids": ids,
                "default_cap": api.settings.fast_lane_cap,
                "count_cap": COUNT_CAP,
                **REFUSED_BY_STATUS,
            },
        )
    )
    waiting: dict[str, list[WaitingLine]] = {}
    for line in await api.run(waiting_lines([p["id"] for p in found], 3 * MAX_PROJECTS)):
        waiting.setdefault(line.project, []).append(line)
    return render(request, "projects.html", projects=found, waiting=waiting, limit=MAX_PROJECTS)


@router.get("/projects/{project_id}")
async def project(project_id: ProjectIdPath, request: Request, session: Current) -> HTMLResponse:
    """A project's triggers, each with a link to its webhook log."""
    if not session.caller.admin and project_id != session.caller.project:
        raise HTTPException(404, f"no project {project_id}")
    found = await api_of(request).run(
        rows("list_projects", {"id": project_id, "after": None, "limit": None})
    )
    if not found:
        raise HTTPException(404, f"no project {project_id}")
    triggers = await api_of(request).run(
        rows("list_triggers", {"project": project_id, "id": None, "after": None, "limit": None})
    )
    return render(request, "project.html", project=project_id, triggers=triggers)


@router.get("/keys")
async def keys(request: Request, session: Current) -> HTMLResponse:
    found = await api_of(request).run(read_keys(session.caller.project, MAX_KEYS))
    return render(
        request,
        "keys.html",
        keys=found,
        limit=MAX_KEYS,
        scan_limit=f"{KEY_SCAN:,}",
        waiting_cap=WAITING_CAP,
    )


@router.get("/schedules")
async def schedules(request: Request, session: Current) -> HTMLResponse:
    """Every schedule (a project's own to its session): its timing, next tick, last run."""
    found = await api_of(request).run(list_schedules(session.caller.project, limit=MAX_SCHEDULES))
    return render(request, "schedules.html", schedules=found, limit=MAX_SCHEDULES)


def _admin_only(session: Session) -> None:
    if not session.caller.admin:
        raise HTTPException(404, "the super admin's page")
