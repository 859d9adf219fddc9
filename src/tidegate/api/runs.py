"""The runs API: enqueue a run by its task's name, look at runs, retry them, cancel them.

The super admin sees every run; a project's token sees that project's runs only (any
other run is answered 404, as if it did not exist), and of each failed attempt the error
(type and message) but not the traceback, which names the server's files. A single
retry goes to the ``manual`` lane, a bulk retry to ``default`` (docs/architecture.md).

Runs are answered as ``JSONResponse`` (``json.dumps``), not through FastAPI's response
serializer: pydantic's stops at about 255 levels of nesting, and what a run holds may
nest as deep as ``max_json_depth`` allows (up to 512), so a stored run must never be
one the API cannot show.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Request, Security
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from tidegate import runs
from tidegate.access import Caller
from tidegate.api import events
from tidegate.api.auth import BEARER, current_caller
from tidegate.api.events import EVENT_STREAM
from tidegate.api.kernel import (
    AUTH_RESPONSES,
    PAGED,
    Api,
    Cursor,
    PageSize,
    page,
    problem_responses,
    read_cursor,
)
from tidegate.api.streams import Full
from tidegate.app import NewRun
from tidegate.errors import EnqueueError, InputError
from tidegate.limits import (
    ATTEMPTS,
    IDENTIFIER,
    LANE_NAME,
    MAX_DELAY_SECONDS,
    MAX_ID,
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
    PRIORITY,
    LaneName,
    RunId,
    Text,
    check_text,
)
from tidegate.projects import DEFAULT_PROJECT
from tidegate.runs import Run, RunState

router = APIRouter(
    prefix="/runs", tags=["runs"], dependencies=[Security(BEARER)], responses=AUTH_RESPONSES
)
Authorized = Annotated[Caller, Depends(current_caller)]
RunIdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
MAX_BULK = 10_000
NOT_FOUND = problem_responses(**{"404": "no such run (or not this project's)"})
A_RUN: dict[int | str, dict[str, Any]] = {
    200: {"description": "the run: state, lane, attempts, result, errors, timings"}
}
CONFLICT = problem_responses(**{"409": "the run is not in a state that allows it"})


class NewRunBody(BaseModel):
    """A run to enqueue by its task's name. What it leaves out comes from the settings
    the task's workers declared (tidegate.tasks), then the defaults."""

    model_config = ConfigDict(extra="forbid")

    task: Text
    args: dict[str, Any] = Field(default_factory=dict)
    """The handler's keyword arguments, a JSON object."""
    project: str | None = Field(None, pattern=f"^{IDENTIFIER.pattern}$", max_length=MAX_NAME_CHARS)
    """Default: the calling project's (a project token may enqueue only its own), or
    ``default`` for the admin."""
    lane: LaneName | None = None
    key: Text | None = None
    """Default: the project."""
    priority: int | None = PRIORITY.field()
    max_attempts: int | None = ATTEMPTS.field()
    delay_seconds: float | None = Field(None, ge=0, le=MAX_DELAY_SECONDS, allow_inf_nan=False)
    """Seconds from now before the run is due."""
    idempotency_key: Text | None = None
    """A repeat with the same key (in the project) answers the first run, 200."""


class BulkRetry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[RunId] = Field(min_length=1, max_length=MAX_BULK)


def _shown(run: Run, caller: Caller) -> dict[str, Any]:
    """The run as the caller may see it: a project's token gets no tracebacks."""
    data = run.to_json()
    if not caller.admin:
        data["errors"] = [
            {name: value for name, value in entry.items() if name != "traceback"}
            for entry in data["errors"]
        ]
    return data


async def _visible(request: Request, caller: Caller, run_id: int) -> Run:
    api: Api = request.app.state.api
    found = await api.run(runs.get_run(run_id))
    if found is None or not (caller.admin or found.project == caller.project):
        raise HTTPException(404, f"no run {run_id}")
    return found


@router.get("/{run_id}", responses={**A_RUN, **NOT_FOUND}, operation_id="getRun")
async def get_run(run_id: RunIdPath, request: Request, caller: Authorized) -> JSONResponse:
    """A run: state, lane, attempts, result, errors, timings, and why it waits (``reason``:
    no live worker has its task, or its key's circuit breaker holds it)."""
    api: Api = request.app.state.api
    found = await api.run(runs.with_holds([await _visible(request, caller, run_id)]))
    return JSONResponse(_shown(found[0], caller))


@router.get(
    "/{run_id}/events",
    response_class=Response,
    responses={
        200: {
            "description": "server-sent events: `progress` (each with its id), then one "
            "`result` (the run, as GET /runs/{id} shows it, id `end`) once it finishes",
            "content": {EVENT_STREAM: {}},
        },
        204: {"description": "the client has seen the end already (Last-Event-ID: end)"},
        **problem_responses(
            **{
                "400": "a Last-Event-ID this server did not send",
                "429": "the caller's event streams at their bound (Retry-After)",
                "503": "the server's event streams at their bound (Retry-After)",
            }
        ),
        **NOT_FOUND,
    },
    operation_id="streamRunEvents",
)
async def stream_run_events(
    run_id: RunIdPath,
    request: Request,
    caller: Authorized,
    last_event_id: Annotated[str | None, Header(max_length=MAX_NAME_CHARS)] = None,
) -> Response:
    """A run's progress as it happens, then its end (server-sent events).

    Reconnecting with ``Last-Event-ID`` resumes after that event, on any API process. A
    caller holds at most ``max_streams_per_caller`` streams (429), an API process serves
    at most ``max_streams`` (503).
    """
    try:
        after = events.last_event_id(last_event_id)
    except InputError as error:
        raise HTTPException(400, str(error)) from None
    run = await _visible(request, caller, run_id)
    if after is None:
        return Response(status_code=204)

    def end(finished: Run) -> bytes:
        return events.sse("result", json.dumps(_shown(finished, caller)), events.END_ID)

    api: Api = request.app.state.api
    try:
        give_back = api.streams.take(f"token:{caller.project or '(admin)'}")
    except Full as full:
        raise HTTPException(full.status, full.title, full.headers) from None
    return events.EventStream(
        lambda gone: events.run_events(api, run.id, run.lane, after, end, gone), {}, give_back
    )


@router.get(
    "",
    responses={**PAGED, 200: {**PAGED[200], "description": "the newest runs, newest first"}},
    operation_id="listRuns",
)
async def list_runs(
    request: Request,
    caller: Authorized,
    project: Annotated[
        str | None, Query(pattern=f"^{IDENTIFIER.pattern}$", max_length=MAX_NAME_CHARS)
    ] = None,
    lane: Annotated[
        str | None, Query(pattern=f"^{LANE_NAME.pattern}$", max_length=MAX_NAME_CHARS)
    ] = None,
    state: RunState | None = None,
    task: Annotated[str | None, Query(min_length=1, max_length=MAX_TEXT_CHARS)] = None,
    key: Annotated[str | None, Query(min_length=1, max_length=MAX_TEXT_CHARS)] = None,
    args: Annotated[
        str | None,
        Query(
            max_length=runs.MAX_ARGS_FILTER_CHARS,
            description='runs whose args contain this JSON object (`args @> {"order": 7}`)',
        ),
    ] = None,
    limit: PageSize = 50,
    cursor: Cursor = None,
) -> JSONResponse:
    """The newest runs matching every filter given, a page at a time."""
    before = read_cursor(cursor, int)
    try:
        if key is not None:
            check_text(key, "key")
        contained = None if args is None else runs.args_filter(args)
    except InputError as error:
        raise HTTPException(422, str(error)) from None
    if not caller.admin:
        if project not in (None, caller.project):
            raise HTTPException(403, "a project token lists its own project's runs only")
        project = caller.project
    found = await request.app.state.api.run(
        runs.list_runs(
            project=project,
            lane=lane,
            state=state.value if state else None,
            task=task,
            key=key,
            args=contained,
            limit=limit + 1,
            before=before[0] if before else None,
        )
    )
    shown, link = page(request, found, limit, lambda run: [run.id])
    shown = await request.app.state.api.run(runs.with_holds(shown))
    return JSONResponse([_shown(run, caller) for run in shown], headers=link)


@router.post(
    "",
    status_code=201,
    responses={
        200: {"description": "a repeated idempotency key: the run it made first"},
        201: {"description": "the run, as GET /runs/{id} shows it"},
        **problem_responses(
            **{
                "403": "a project's token enqueueing for another project",
                "422": "a value outside its bounds (args too deep, a bad lane)",
            }
        ),
    },
    operation_id="enqueueRun",
)
async def enqueue_run(body: NewRunBody, request: Request, caller: Authorized) -> JSONResponse:
    """Enqueue a run of a task by its name, for a service that does not have the task's
    code. Lane, priority and max_attempts left out are the task's, as its workers declared
    them when they started (``GET /admin/tasks``); a task no worker declared gets lane
    ``default``, priority 0 and the server's max_attempts."""
    project = body.project or caller.project or DEFAULT_PROJECT
    if not (caller.admin or project == caller.project):
        raise HTTPException(403, f"this token enqueues runs of project {caller.project!r} only")
    fields = body.model_dump(exclude={"task", "args", "project", "delay_seconds"})
    new = NewRun(body.task, body.args, project=project, delay=body.delay_seconds, **fields)
    api: Api = request.app.state.api
    try:
        [run] = await api.run(api.app.enqueue_steps([new]))
    except EnqueueError as error:
        raise HTTPException(422, str(error)) from None
    return JSONResponse(_shown(run, caller), status_code=200 if run.duplicate else 201)


@router.post(
    "/{run_id}/retry", responses={**A_RUN, **NOT_FOUND, **CONFLICT}, operation_id="retryRun"
)
async def retry_run(run_id: RunIdPath, request: Request, caller: Authorized) -> JSONResponse:
    """Run a finished run again, in the ``manual`` lane."""
    await _visible(request, caller, run_id)
    api: Api = request.app.state.api
    channel = api.app.available_channel
    retried = await api.run(runs.retry_runs([run_id], "manual", channel=channel))
    if not retried:
        raise HTTPException(409, f"run {run_id} has not finished")
    return JSONResponse(_shown(retried[0], caller))


@router.post("/retry", operation_id="retryRuns")
async def retry_runs(body: BulkRetry, request: Request, caller: Authorized) -> dict[str, Any]:
    """Run many finished runs again, in the ``default`` lane; unfinished ones are left."""
    api: Api = request.app.state.api
    ids = body.ids
    if not caller.admin:
        mine = await api.run(runs.find_runs(ids))
        ids = [run.id for run in mine if run.project == caller.project]
    channel = api.app.available_channel
    retried = await api.run(runs.retry_runs(ids, "default", channel=channel))
    return {"retried": sorted(run.id for run in retried)}


class Matching(BaseModel):
    """The runs a bulk retry or cancel acts on: the run list's filters, and how many."""

    model_config = ConfigDict(extra="forbid")

    project: str | None = Field(None, pattern=f"^{IDENTIFIER.pattern}$", max_length=MAX_NAME_CHARS)
    lane: str | None = Field(None, pattern=f"^{LANE_NAME.pattern}$", max_length=MAX_NAME_CHARS)
    state: RunState | None = None
    task: str | None = Field(None, min_length=1, max_length=MAX_TEXT_CHARS)
    key: str | None = Field(None, min_length=1, max_length=MAX_TEXT_CHARS)
    args: dict[str, Any] | None = Field(
        None, description='runs whose args contain this object (`{"order": 7}`)'
    )
    limit: int = Field(1000, ge=1, le=runs.MAX_BULK_RUNS)


async def _bulk(
    action: runs.BulkAction, body: Matching, request: Request, caller: Caller
) -> runs.BulkResult:
    """Run a bulk action on the runs ``body`` matches, held to the caller's project."""
    if not caller.admin:
        if body.project not in (None, caller.project):
            raise HTTPException(403, "a project token acts on its own project's runs only")
        body = body.model_copy(update={"project": caller.project})
    try:
        for name in ("task", "key"):
            if (value := getattr(body, name)) is not None:
                check_text(value, name)
        contained = None if body.args is None else runs.args_filter(json.dumps(body.args))
    except InputError as error:
        raise HTTPException(422, str(error)) from None
    filters = {**body.model_dump(exclude={"limit"}), "args": contained}
    api: Api = request.app.state.api
    return await api.run(
        runs.bulk_runs(
            action,
            filters,
            body.limit,
            available_channel=api.app.available_channel,
            completed_channel=api.app.completed_channel,
        )
    )


@router.post("/retry-matching", operation_id="retryMatchingRuns")
async def retry_matching_runs(
    body: Matching, request: Request, caller: Authorized
) -> dict[str, Any]:
    """Run again, in the ``default`` lane, up to ``limit`` finished runs that match the
    filters, newest first, in batches that never hold a lock a claim waits for.
    ``more``: it stopped at its limit, and more may match."""
    done = await _bulk(runs.BulkAction.RETRY, body, request, caller)
    return {"retried": done.changed, "more": done.more}


@router.post("/cancel-matching", operation_id="cancelMatchingRuns")
async def cancel_matching_runs(
    body: Matching, request: Request, caller: Authorized
) -> dict[str, Any]:
    """Cancel up to ``limit`` unfinished runs that match the filters, newest first, in
    batches (as ``retry-matching``); a running attempt learns it as a single cancel's does."""
    done = await _bulk(runs.BulkAction.CANCEL, body, request, caller)
    return {"cancelled": done.changed, "more": done.more}


@router.post("/delete-matching", operation_id="deleteMatchingRuns")
async def delete_matching_runs(
    body: Matching, request: Request, caller: Authorized
) -> dict[str, Any]:
    """Delete up to ``limit`` finished runs that match the filters, newest first, in
    batches (as ``retry-matching``), as the pruner does at the end of their retention;
    an unfinished run is never deleted (cancel it first)."""
    done = await _bulk(runs.BulkAction.DELETE, body, request, caller)
    return {"deleted": done.changed, "more": done.more}


@router.post(
    "/{run_id}/cancel", responses={**A_RUN, **NOT_FOUND, **CONFLICT}, operation_id="cancelRun"
)
async def cancel_run(run_id: RunIdPath, request: Request, caller: Authorized) -> JSONResponse:
    """Cancel a run that has not finished. A running attempt's worker learns it at its
    next heartbeat: an async handler is cancelled, a sync one's outcome is not recorded."""
    await _visible(request, caller, run_id)
    api: Api = request.app.state.api
    channel = api.app.completed_channel
    cancelled = await api.run(runs.cancel_run(run_id, completed_channel=channel))
    if cancelled is None:
        raise HTTPException(409, f"run {run_id} has finished already")
    return JSONResponse(_shown(cancelled, caller))
