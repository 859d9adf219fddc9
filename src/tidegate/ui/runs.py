"""The dashboard's runs: a filtered list, newest first, and each run with Retry and Cancel.

A project's session reads its own runs only: the list is filtered by its project
whatever the form says, and another project's run answers 404, as in the runs API.
The list has a tab per state with how many runs of it match the other filters (counted
up to ``TAB_COUNT_CAP``), and searches by key and by args (``args @> {...}``, as ``GET
/runs?args=`` and ``tidegate runs --args``).

Retry and Cancel are confirmed first: the run's page links to a page that says what
will happen (``GET /ui/runs/{id}/retry``), whose form makes the change (the POST). They
run the runs API's own steps (``tidegate.runs``: ``retry_runs``, ``cancel_run``).
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Path, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from tidegate.access import Session
from tidegate.errors import InputError
from tidegate.limits import MAX_ID, check_identifier, check_lane, check_text, whole_number
from tidegate.runs import (
    MAX_ARGS_FILTER_CHARS,
    BulkAction,
    Run,
    RunState,
    args_filter,
    bulk_runs,
    cancel_run,
    get_run,
    retry_runs,
    with_holds,
)
from tidegate.ui.session import Current, api_of, check_csrf, rows
from tidegate.ui.templating import render

router = APIRouter(prefix="/ui", include_in_schema=False)
RunIdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
PAGE = 50
FILTERS = ("state", "lane", "project", "task", "key", "args")
TAB_COUNT_CAP = 1000
"""The most runs a state's tab counts (shown ``1000+`` past it): a tab costs at most
that many rows of the table, however many match."""


def _filters(request: Request, session: Session) -> dict[str, str | None]:
    """The list's filters from the query string, checked; an empty field is no filter.

    A project's session is held to its project, whatever the query says.
    """
    query = request.query_params
    found: dict[str, str | None] = {name: query.get(name) or None for name in FILTERS}
    try:
        if found["state"] is not None and found["state"] not in RunState.__members__.values():
            raise InputError(f"state {found['state']!r} is not one of {', '.join(RunState)}")
        if found["lane"] is not None:
            check_lane(found["lane"])
        if found["project"] is not None:
            check_identifier(found["project"], "project")
        for name in ("task", "key"):
            if found[name] is not None:
                check_text(found[name], name)
        if found["args"] is not None:
            args_filter(found["args"])
    except InputError as error:
        raise HTTPException(422, str(error)) from None
    if not session.caller.admin:
        found["project"] = session.caller.project
    return found


def _searched(filters: dict[str, str | None]) -> dict[str, str | None]:
    """The statements' parameters of checked filters: the args filter as the JSON text
    SQL takes (``args_filter``)."""
    return {**filters, "args": filters["args"] and args_filter(filters["args"])}


def _shown(filters: dict[str, str | None], session: Session) -> dict[str, str]:
    """The filters a link to the same list carries (a project's session: not its
    project, which the list adds itself)."""
    kept = {name: value for name, value in filters.items() if value is not None}
    if not session.caller.admin:
        kept.pop("project", None)
    return kept


def _before(request: Request) -> int | None:
    raw = request.query_params.get("before") or None
    if raw is None:
        return None
    before = whole_number(raw)
    if before is None or before < 1:
        raise HTTPException(422, f"before must be a run id, 1 to {MAX_ID}")
    return before


@router.get("/runs")
async def runs(request: Request, session: Current) -> HTMLResponse:
    """A page of runs, newest first; ``before`` (a run id) pages back (keyset)."""
    filters = _filters(request, session)
    before = _before(request)
    searched = _searched(filters)
    params = {**searched, "before": before, "limit": PAGE}
    api = api_of(request)
    found = await api.run(rows("list_runs_page", params))
    counted = await api.run(rows("count_runs_by_state", {**searched, "cap": TAB_COUNT_CAP}))
    kept = _shown(filters, session)
    older = None
    if len(found) == PAGE:
        older = "/ui/runs?" + urlencode({**kept, "before": found[-1]["id"]})
    others = {name: value for name, value in kept.items() if name != "state"}
    tabs = [("all", None, "/ui/runs?" + urlencode(others))] + [
        (row["state"], row["runs"], "/ui/runs?" + urlencode({**others, "state": row["state"]}))
        for row in counted
    ]
    shown = {**kept, **({"before": str(before)} if before else {})}
    return render(
        request,
        "runs.html",
        here="/ui/runs" + (f"?{urlencode(shown)}" if shown else ""),
        runs=found,
        filters=filters,
        before=before,
        older=older,
        tabs=tabs,
        query=urlencode(kept),
        finished=_matched(counted, filters["state"], BulkAction.RETRY),
        unfinished=_matched(counted, filters["state"], BulkAction.CANCEL),
        cap=TAB_COUNT_CAP,
        args_chars=MAX_ARGS_FILTER_CHARS,
    )


@router.get("/runs/{run_id}")
async def run_page(run_id: RunIdPath, request: Request, session: Current) -> HTMLResponse:
    return render(request, "run.html", run=await _held(request, session, run_id))


@router.get("/fragments/runs/{run_id}")
async def run_fragment(run_id: RunIdPath, request: Request, session: Current) -> HTMLResponse:
    """The run's state, result, errors and buttons: polled every 2 s until it finishes."""
    return render(request, "run_live.html", run=await _held(request, session, run_id))


@router.get("/runs/{run_id}/retry")
async def confirm_retry(run_id: RunIdPath, request: Request, session: Current) -> HTMLResponse:
    """Say what Retry does to this run, with the button that does it (a POST)."""
    run = await _visible(request, session, run_id)
    if not run.state.finished:
        raise HTTPException(409, f"run {run_id} has not finished")
    return render(request, "confirm.html", run=run, action="retry")


@router.get("/runs/{run_id}/cancel")
async def confirm_cancel(run_id: RunIdPath, request: Request, session: Current) -> HTMLResponse:
    """Say what Cancel does to this run (running: per kind of handler), with its button."""
    run = await _visible(request, session, run_id)
    if run.state.finished:
        raise HTTPException(409, f"run {run_id} has finished already")
    return render(request, "confirm.html", run=run, action="cancel")


@router.post("/runs/{run_id}/retry")
async def retry(run_id: RunIdPath, request: Request, session: Current) -> RedirectResponse:
    """Run a finished run again in the ``manual`` lane, as ``POST /runs/{id}/retry`` does."""
    await check_csrf(request, session)
    await _visible(request, session, run_id)
    api = api_of(request)
    channel = api.app.available_channel
    if not await api.run(retry_runs([run_id], "manual", channel=channel)):
        raise HTTPException(409, f"run {run_id} has not finished")
    return RedirectResponse(f"/ui/runs/{run_id}", status_code=303)


@router.post("/runs/{run_id}/cancel")
async def cancel(run_id: RunIdPath, request: Request, session: Current) -> RedirectResponse:
    """Cancel a run that has not finished, as ``POST /runs/{id}/cancel`` does."""
    await check_csrf(request, session)
    await _visible(request, session, run_id)
    api = api_of(request)
    channel = api.app.completed_channel
    if await api.run(cancel_run(run_id, completed_channel=channel)) is None:
        raise HTTPException(409, f"run {run_id} has finished already")
    return RedirectResponse(f"/ui/runs/{run_id}", status_code=303)


def _matched(counted: list[dict[str, Any]], state: str | None, action: BulkAction) -> str:
    """How many of the listed runs (by the tabs' counts) ``action`` could change: ``0``,
    ``12``, or ``1000+`` when a state's count stopped at its cap."""
    parts = [
        row["runs"]
        for row in counted
        if row["state"] in action.states and state in (None, row["state"])
    ]
    return f"{sum(parts)}{'+' if any(part >= TAB_COUNT_CAP for part in parts) else ''}"


BULK_LIMIT = 10_000
"""The most runs one press of a bulk button changes: past it, the page says more match
and the button can be pressed again."""
BulkPath = Annotated[BulkAction, Path()]


@router.get("/bulk/{action}")
async def confirm_bulk(action: BulkPath, request: Request, session: Current) -> HTMLResponse:
    """Say what a bulk retry or cancel of the list's runs will do, with its button."""
    filters = _filters(request, session)
    counted = await api_of(request).run(
        rows("count_runs_by_state", {**_searched(filters), "cap": TAB_COUNT_CAP})
    )
    return render(
        request,
        "bulk.html",
        action=action,
        filters={name: value for name, value in filters.items() if value is not None},
        query=urlencode(_shown(filters, session)),
        matching=_matched(counted, filters["state"], action),
        limit=BULK_LIMIT,
    )


@router.post("/bulk/{action}")
async def bulk(action: BulkPath, request: Request, session: Current) -> HTMLResponse:
    """Retry or cancel up to ``BULK_LIMIT`` runs the list's filters match, in batches
    (``tidegate.runs.bulk_runs``, as ``POST /runs/retry-matching`` does)."""
    await check_csrf(request, session)
    filters = _filters(request, session)
    api = api_of(request)
    done = await api.run(
        bulk_runs(
            action,
            _searched(filters),
            BULK_LIMIT,
            available_channel=api.app.available_channel,
            completed_channel=api.app.completed_channel,
        )
    )
    query = urlencode(_shown(filters, session))
    return render(request, "bulk.html", action=action, query=query, done=done, limit=BULK_LIMIT)


async def _held(request: Request, session: Session, run_id: int) -> Run:
    """``_visible``, with the circuit breaker that holds it, if one does."""
    run = await _visible(request, session, run_id)
    return (await api_of(request).run(with_holds([run])))[0]


async def _visible(request: Request, session: Session, run_id: int) -> Run:
    """The run, if the session may see it; 404 otherwise, as if it did not exist."""
    found = await api_of(request).run(get_run(run_id))
    caller = session.caller
    if found is None or not (caller.admin or found.project == caller.project):
        raise HTTPException(404, f"no run {run_id}")
    return found
