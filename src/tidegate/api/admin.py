"""The admin API (super admin only): projects, their limits, triggers, schedules, and
lanes (key policies, breakers, pauses).

A change to a project's limits holds for the next request: admission reads the
project's row inside every admission transaction, nothing is cached. Every field and
parameter carries the bounds of ``tidegate.limits``: a value past one is a 422 naming
the field, never a database error.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

import psycopg
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response, Security
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool
from starlette.convertors import PathConvertor, register_url_convertor

from tidegate import forward
from tidegate.api.auth import BEARER, current_caller
from tidegate.api.kernel import (
    AUTH_RESPONSES,
    MAX_PAGE_SIZE,
    PAGED,
    Api,
    Cursor,
    JSONAnswer,
    PageSize,
    page,
    problem_responses,
    read_cursor,
)
from tidegate.errors import InputError
from tidegate.figures import read_lanes
from tidegate.lanes import FAST_LANE, LaneError, pause_lane, resume_lane
from tidegate.limits import (
    IDENTIFIER,
    LANE_NAME,
    MAX_ID,
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
    POLICY_BOUNDS,
    PROJECT_BOUNDS,
    SCHEDULE_BOUNDS,
    TRIGGER_BOUNDS,
    ProjectId,
    Text,
    TriggerName,
)
from tidegate.policies import (
    PolicyError,
    clear_key_policy,
    force_breaker,
    list_breakers,
    list_key_policies,
    set_key_policy,
)
from tidegate.projects import (
    MAX_UNIQUE_ARGS,
    AdminError,
    ConflictError,
    NotFoundError,
    create_project,
    create_trigger,
    domain_error,
    list_projects,
    list_triggers,
    rotate_project_token,
    rotate_trigger_token,
    update_project,
    update_trigger,
)
from tidegate.runs import RunState
from tidegate.schedules import (
    ScheduleError,
    create_schedule,
    delete_schedule,
    get_schedule,
    list_schedules,
    update_schedule,
)
from tidegate.signatures import check_secret
from tidegate.storage.sql import Statement, Steps
from tidegate.tasks import list_tasks
from tidegate.unique import DEFAULT_STATES, REQUIRED_STATES
from tidegate.webhooks import KeyFrom

log = logging.getLogger("tidegate.ingress")
router = APIRouter(
    prefix="/admin",
    tags=["admin"],
    dependencies=[Security(BEARER), Depends(current_caller)],
    responses=AUTH_RESPONSES,
)
NOT_FOUND = problem_responses(**{"404": "no such project, trigger, policy or schedule"})
CONFLICT = problem_responses(**{"409": "it exists already, or the id is reserved"})

ProjectIdPath = Annotated[str, Path(pattern=f"^{IDENTIFIER.pattern}$", max_length=MAX_NAME_CHARS)]
LanePath = Annotated[str, Path(pattern=f"^{LANE_NAME.pattern}$", max_length=MAX_NAME_CHARS)]
LaneQuery = Annotated[
    str | None, Query(pattern=f"^{LANE_NAME.pattern}$", max_length=MAX_NAME_CHARS)
]


class KeyConvertor(PathConvertor):
    """A key in a URL path: any text, slashes (a destination's ``https://...``, sent
    percent-encoded or not) and line breaks included; its bounds are checked after."""

    regex = "[\\s\\S]+"


register_url_convertor("key", KeyConvertor())

KeyPath = Annotated[
    str, Path(min_length=1, max_length=MAX_TEXT_CHARS, description="a key, or * for the lane")
]
TriggerIdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
TriggerNamePath = Annotated[str, Path(pattern=f"^{IDENTIFIER.pattern}$", max_length=MAX_NAME_CHARS)]
ScheduleNamePath = Annotated[str, Path(min_length=1, max_length=MAX_TEXT_CHARS)]
Secret = Annotated[
    str,
    Field(max_length=200, description="Standard Webhooks secret: whsec_ + base64 of 24-64 bytes"),
    AfterValidator(check_secret),
]


def _checked(check: Any) -> AfterValidator:
    """A pydantic validator from a ``tidegate`` check: its ``InputError`` becomes a 422."""

    def validate(value: Any) -> Any:
        try:
            return check(value)
        except InputError as error:
            raise ValueError(str(error)) from None

    return AfterValidator(validate)


ForwardUrl = Annotated[
    str,
    Field(max_length=forward.MAX_URL_CHARS, description="http(s) URL the webhooks are sent to"),
    _checked(forward.check_url),
]
ForwardHeaders = Annotated[
    list[str],
    Field(
        max_length=forward.MAX_FORWARD_HEADERS,
        description="names of the received headers to pass on",
    ),
    _checked(forward.check_header_names),
]

KeyFromText = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_TEXT_CHARS,
        description="where each run takes its key: a JSON pointer into the body "
        "(RFC 6901, /data/order/id; at most 32 levels) or header:Header-Name (an HTTP field "
        "name of 1 to 64 characters, not a credential). A webhook that carries no key "
        "there (absent; not a string or a number; not 1 to 255 characters; the header "
        "sent twice) is refused 422. null: the project's key (a forwarding trigger's: "
        "its breaker key, and key_from must stay null)",
        examples=["/data/order/id", "header:X-Shop-Domain"],
    ),
    _checked(lambda text: KeyFrom.parse(text).text),
]


class ProjectLimits(BaseModel):
    """A project's limits, each within its bound (``tidegate.limits.PROJECT_BOUNDS``)."""

    model_config = ConfigDict(extra="forbid")

    fast_lane_cap: int | None = PROJECT_BOUNDS["fast_lane_cap"].field(
        description="in-flight fast-lane runs; null: the server default"
    )
    concurrency: int | None = PROJECT_BOUNDS["concurrency"].field(
        description="in-flight runs outside the fast lane"
    )
    ingest_rate: float | None = PROJECT_BOUNDS["ingest_rate"].field(
        description="webhooks per second; null: unlimited"
    )
    ingest_burst: int | None = PROJECT_BOUNDS["ingest_burst"].field(
        description="webhooks allowed at once above the rate"
    )
    backlog_cap: int | None = PROJECT_BOUNDS["backlog_cap"].field(
        description="ready runs per lane; null: unlimited"
    )


class NewProject(ProjectLimits):
    id: ProjectId


class TriggerFields(BaseModel):
    """A trigger's fields; its numbers within their bounds (``TRIGGER_BOUNDS``)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["async", "sync"] | None = None
    task: Text | None = None
    secret: Secret | None = None
    max_body_bytes: int | None = TRIGGER_BOUNDS["max_body_bytes"].field()
    sync_timeout_seconds: float | None = TRIGGER_BOUNDS["sync_timeout_seconds"].field()
    enabled: bool | None = None
    forward_url: ForwardUrl | None = Field(
        None, description="deliver each webhook here (task tidegate.forward); null: do not"
    )
    forward_method: Literal["POST", "PUT", "PATCH"] | None = None
    forward_headers: ForwardHeaders | None = None
    forward_timeout_seconds: float | None = TRIGGER_BOUNDS["forward_timeout_seconds"].field()
    forward_secret: Secret | None = Field(
        None, description="sign what is sent (Standard Webhooks); never shown back"
    )
    breaker_key: Text | None = Field(
        None, description="the circuit breaker's key; default: the URL's scheme://host:port"
    )
    unique_period: float | None = TRIGGER_BOUNDS["unique_period"].field(
        description="seconds: webhooks alike within a window of this many make one run, and "
        "the others are answered with it; null: each webhook makes its own run"
    )
    unique_args: list[Text] | None = Field(
        None,
        max_length=MAX_UNIQUE_ARGS,
        description="the fields of the body that make webhooks alike; null: the whole body",
    )
    unique_states: list[RunState] | None = Field(
        None,
        description="the states a run holds its key in (with "
        f"{', '.join(REQUIRED_STATES)}); null: {', '.join(DEFAULT_STATES)}",
    )
    key_from: KeyFromText | None = None


class NewTrigger(TriggerFields):
    name: TriggerName
    mode: Literal["async", "sync"]
    task: Text | None = Field(None, description="may be left out when forward_url is set")


async def _apply(request: Request, steps: Steps[Any]) -> Any:
    ingress: Api = request.app.state.api
    try:
        return await ingress.run(steps)
    except psycopg.errors.IntegrityError as error:
        raise _http(domain_error(error)) from None
    except (AdminError, LaneError, NotFoundError, PolicyError, ScheduleError) as error:
        raise _http(error) from None


def _http(error: Exception) -> HTTPException:
    if isinstance(error, NotFoundError):
        return HTTPException(404, str(error))
    if isinstance(error, ConflictError):
        return HTTPException(409, str(error))
    return HTTPException(422, str(error))


async def _shown(request: Request, trigger: dict[str, Any]) -> dict[str, Any]:
    """The trigger with its URL, and a warning when no live worker has its task.

    Not an error: a fleet may be mid-deploy. But a typo in a task's name would otherwise
    only show once webhooks wait (async) or are refused (sync).
    """
    ingress: Api = request.app.state.api
    params = {
        "lanes": [FAST_LANE if trigger["mode"] == "sync" else None],  # None: the task's
        "tasks": [trigger["task"]],
        "live_seconds": 3 * ingress.settings.heartbeat_seconds,
    }
    warnings = []
    [(lane, _, has_worker, _, _)] = await ingress.run(_rows("find_task_workers", params))
    if not has_worker:
        warnings.append(
            f"no live worker has task {trigger['task']!r} for lane {lane!r}: its webhooks "
            + ("are refused (503)" if lane == FAST_LANE else "wait")
            + " until one starts"
        )
        log.warning("trigger %d (%s): %s", trigger["id"], trigger["name"], warnings[0])
    return {**trigger, "url": f"/hooks/{trigger['token']}", "warnings": warnings}


def _own_addresses(request: Request) -> set[tuple[str, int]]:
    """Where this server is reached: the address the admin's request came to (its
    ``Host``), and the one it listens on (every loopback name, listening on loopback or
    on every address). A forward URL to a ``/hooks/`` path there would loop."""
    settings = request.app.state.api.settings
    came_to = forward.address_of(str(request.url))
    return {came_to, *forward.own_addresses(settings.host, settings.port)}


def _rows(name: str, params: dict[str, Any]) -> Steps[list[Any]]:
    return (yield Statement(name, params))


@router.post("/projects", status_code=201, responses=CONFLICT, operation_id="createProject")
async def post_project(body: NewProject, request: Request) -> dict[str, Any]:
    """Create a project; the response holds its API token, shown only this once."""
    limits = body.model_dump(exclude={"id"}, exclude_unset=True)
    return await _apply(request, create_project(body.id, **limits))  # type: ignore[no-any-return]


@router.get("/projects", responses=PAGED, operation_id="listProjects")
async def get_projects(
    request: Request, response: Response, limit: PageSize = MAX_PAGE_SIZE, cursor: Cursor = None
) -> list[dict[str, Any]]:
    """The projects in id order, a page at a time."""
    after = read_cursor(cursor, str)
    steps = list_projects(after=after[0] if after else None, limit=limit + 1)
    shown, link = page(request, await _apply(request, steps), limit, lambda p: [p["id"]])
    response.headers.update(link)
    return shown


@router.get("/projects/{project_id}", responses=NOT_FOUND, operation_id="getProject")
async def get_project(project_id: ProjectIdPath, request: Request) -> dict[str, Any]:
    found = await _apply(request, list_projects(project_id))
    if not found:
        raise HTTPException(404, f"no project {project_id!r}")
    return found[0]  # type: ignore[no-any-return]


@router.patch("/projects/{project_id}", responses=NOT_FOUND, operation_id="updateProject")
async def patch_project(
    project_id: ProjectIdPath, body: ProjectLimits, request: Request
) -> dict[str, Any]:
    """Change limits (only the fields sent; null clears one). Holds for the next request."""
    changes = body.model_dump(exclude_unset=True)
    return await _apply(request, update_project(project_id, **changes))  # type: ignore[no-any-return]


@router.post(
    "/projects/{project_id}/token/rotate", responses=NOT_FOUND, operation_id="rotateProjectToken"
)
async def post_project_token_rotation(
    project_id: ProjectIdPath, request: Request
) -> dict[str, Any]:
    """Give the project a new API token, shown only this once. The old one is refused from
    the next request on, and the dashboard sessions opened with it end."""
    return await _apply(request, rotate_project_token(project_id))  # type: ignore[no-any-return]


@router.post(
    "/projects/{project_id}/triggers",
    status_code=201,
    responses={**NOT_FOUND, **CONFLICT},
    operation_id="createTrigger",
)
async def post_trigger(
    project_id: ProjectIdPath, body: NewTrigger, request: Request
) -> dict[str, Any]:
    """Create a trigger; ``url`` is where its webhooks go.

    With a ``forward_url``, the task is ``tidegate.forward`` (leave ``task`` out).
    """
    fields = body.model_dump(exclude={"name", "mode", "task"}, exclude_unset=True)
    steps = create_trigger(
        project_id,
        body.name,
        mode=body.mode,
        task=body.task,
        own_addresses=_own_addresses(request),
        **fields,
    )
    created = await _apply(request, steps)
    return await _shown(request, created)


@router.get("/projects/{project_id}/triggers", responses=PAGED, operation_id="listTriggers")
async def get_triggers(
    project_id: ProjectIdPath,
    request: Request,
    response: Response,
    limit: PageSize = MAX_PAGE_SIZE,
    cursor: Cursor = None,
) -> list[dict[str, Any]]:
    """The project's triggers in id order, a page at a time."""
    after = read_cursor(cursor, int)
    steps = list_triggers(project_id, after=after[0] if after else None, limit=limit + 1)
    shown, link = page(request, await _apply(request, steps), limit, lambda t: [t["id"]])
    response.headers.update(link)
    return [await _shown(request, t) for t in shown]


@router.post(
    "/projects/{project_id}/triggers/{name}/rotate",
    responses=NOT_FOUND,
    operation_id="rotateTriggerUrl",
)
async def post_trigger_rotation(
    project_id: ProjectIdPath, name: TriggerNamePath, request: Request
) -> dict[str, Any]:
    """Give the trigger a new URL (``url``). The old one answers 404 at once here and
    within a second in every other API process (each keeps a trigger it looked up for
    up to a second)."""
    rotated = await _apply(request, rotate_trigger_token(project_id, name))
    request.app.state.api.triggers.clear()  # this process drops the old URL at once
    return await _shown(request, rotated)


@router.patch("/triggers/{trigger_id}", responses=NOT_FOUND, operation_id="updateTrigger")
async def patch_trigger(
    trigger_id: TriggerIdPath, body: TriggerFields, request: Request
) -> dict[str, Any]:
    changes = body.model_dump(exclude_unset=True)
    updated = await _apply(request, update_trigger(trigger_id, _own_addresses(request), **changes))
    request.app.state.api.triggers.clear()  # this process uses the change at once
    return await _shown(request, updated)


class KeyPolicy(BaseModel):
    """A key's policy in a lane, each field within its bound (``POLICY_BOUNDS``)."""

    model_config = ConfigDict(extra="forbid")

    max_running: int | None = POLICY_BOUNDS["max_running"].field(
        description="the key's runs in flight; null: no limit"
    )
    weight: float | None = POLICY_BOUNDS["weight"].field(
        description="the key's share of claims (default 1)"
    )
    rate: float | None = POLICY_BOUNDS["rate"].field(
        description="runs started per second; null: no limit"
    )
    rate_burst: int | None = POLICY_BOUNDS["rate_burst"].field(
        description="starts at once above the rate"
    )
    breaker_failures: int | None = POLICY_BOUNDS["breaker_failures"].field(
        description="circuit breaker: open after this many failed attempts in the window"
    )
    breaker_ratio: float | None = POLICY_BOUNDS["breaker_ratio"].field(
        description="or: open when this share of the window's attempts failed"
    )
    breaker_min_attempts: int | None = POLICY_BOUNDS["breaker_min_attempts"].field(
        description="the ratio needs at least this many attempts (default 10)"
    )
    breaker_window_seconds: float | None = POLICY_BOUNDS["breaker_window_seconds"].field(
        description="the window failures are counted in (default 60)"
    )
    breaker_cooldown_seconds: float | None = POLICY_BOUNDS["breaker_cooldown_seconds"].field(
        description="how long it stays open at first (default 30)"
    )
    breaker_max_cooldown_seconds: float | None = POLICY_BOUNDS[
        "breaker_max_cooldown_seconds"
    ].field(description="each failed probe doubles the cooldown up to this (default 600)")
    breaker_probes: int | None = POLICY_BOUNDS["breaker_probes"].field(
        description="half-open: probe runs at once (default 1)"
    )
    ordered: StrictBool | None = Field(
        None,
        description="the key's runs start one at a time, in enqueue order; a failed run "
        "that will retry holds the ones behind it (null: the lane's default, else no)",
    )


class BreakerForce(BaseModel):
    model_config = ConfigDict(extra="forbid")

    force: Literal["open", "closed"] | None = Field(
        description="open: its runs wait and its sync webhooks get 503; closed: failures "
        "are not counted; null: back to its policy, closed and counting afresh"
    )


@router.put("/lanes/{lane}/keys/{key:key}", operation_id="setKeyPolicy")
async def put_key_policy(
    lane: LanePath, key: KeyPath, body: KeyPolicy, request: Request
) -> dict[str, Any]:
    """Set a key's policy in a lane (key ``*``: the lane's default); the next claim sees it."""
    return await _apply(request, set_key_policy(lane, key, **body.model_dump(exclude_unset=True)))  # type: ignore[no-any-return]


@router.get("/lanes/{lane}/keys", responses=PAGED, operation_id="listKeyPolicies")
async def get_key_policies(
    lane: LanePath,
    request: Request,
    response: Response,
    limit: PageSize = MAX_PAGE_SIZE,
    cursor: Cursor = None,
) -> list[dict[str, Any]]:
    """The lane's key policies, its default (key ``*``) first, then by key, a page at a
    time."""
    after = read_cursor(cursor, str, str)
    steps = list_key_policies(lane, after=after, limit=limit + 1)
    found = await _apply(request, steps)
    shown, link = page(request, found, limit, lambda p: [p["lane"], p["key"]])
    response.headers.update(link)
    return shown


@router.delete(
    "/lanes/{lane}/keys/{key:key}",
    status_code=204,
    responses=NOT_FOUND,
    operation_id="deleteKeyPolicy",
)
async def delete_key_policy(lane: LanePath, key: KeyPath, request: Request) -> None:
    if not await _apply(request, clear_key_policy(lane, key)):
        raise HTTPException(404, f"no policy for key {key!r} in lane {lane!r}")


@router.get("/breakers", operation_id="listBreakers")
async def get_breakers(request: Request, lane: LaneQuery = None) -> list[dict[str, Any]]:
    """The circuit breakers that are open, half-open, forced, or counting failures."""
    return await _apply(request, list_breakers(lane))  # type: ignore[no-any-return]


@router.put("/lanes/{lane}/breakers/{key:key}", operation_id="setBreaker")
async def put_breaker(
    lane: LanePath, key: KeyPath, body: BreakerForce, request: Request
) -> dict[str, Any]:
    """Force a key's circuit breaker open or closed, or hand it back to its policy."""
    shown = await _apply(request, force_breaker(lane, key, body.force))
    return shown or {"lane": lane, "key": key, "state": "closed"}


class LanePause(BaseModel):
    """What a pause may say: why (``tidegate.limits.Text``'s bounds)."""

    model_config = ConfigDict(extra="forbid")

    reason: Text | None = Field(None, description="why: shown wherever the pause is listed")


PAUSED_BY = "admin API"
"""What a pause made through this API says it came from."""


@router.get("/lanes", operation_id="listLanes")
async def get_lanes(request: Request) -> list[dict[str, Any]]:
    """Every lane (the built-in ones, the paused ones, those with runs; at most
    ``metrics_max_lanes``): its runs by state, its lag, and whether, since when, from
    where and why it is paused."""
    lanes = await _apply(request, read_lanes(request.app.state.api.settings))
    return [lane.to_json() for lane in lanes]


@router.post(
    "/lanes/{lane}/pause",
    responses=problem_responses(**{"422": "too many lanes paused"}),
    operation_id="pauseLane",
)
async def post_lane_pause(
    lane: LanePath, request: Request, body: LanePause | None = None
) -> dict[str, Any]:
    """Pause the lane: once this answers, no claim that starts takes its runs (on any
    worker, local or remote); running runs go on to their end, new runs wait, its sync
    webhooks get 503. Pausing a paused lane keeps since when and takes the new reason."""
    reason = body.reason if body else None
    paused = await _apply(request, pause_lane(lane, by=PAUSED_BY, reason=reason))
    log.info("lane %s paused by the %s: %s", lane, PAUSED_BY, reason or "no reason given")
    return paused.to_json()  # type: ignore[no-any-return]


@router.post("/lanes/{lane}/resume", operation_id="resumeLane")
async def post_lane_resume(lane: LanePath, request: Request) -> dict[str, Any]:
    """Resume the lane and wake its workers; a lane that was not paused is left as it is
    (``resumed``: whether it was paused)."""
    channel = request.app.state.api.app.available_channel
    resumed = await _apply(request, resume_lane(lane, channel=channel))
    if resumed:
        log.info("lane %s resumed by the %s", lane, PAUSED_BY)
    return {"lane": lane, "paused": False, "resumed": resumed}


class ScheduleFields(BaseModel):
    """A schedule's fields (tidegate.schedules); lane, key, priority and max_attempts left
    null come from the task, as the worker that has it enqueues."""

    model_config = ConfigDict(extra="forbid")

    task: Text | None = None
    args: dict[str, Any] | None = None
    lane: (
        Annotated[str, Field(pattern=f"^{LANE_NAME.pattern}$", max_length=MAX_NAME_CHARS)] | None
    ) = None
    key: Text | None = None
    priority: int | None = SCHEDULE_BOUNDS["priority"].field()
    max_attempts: int | None = SCHEDULE_BOUNDS["max_attempts"].field()
    cron: str | None = Field(
        None, max_length=255, description="5 fields, 6 with seconds first, or @daily etc."
    )
    interval_seconds: float | None = SCHEDULE_BOUNDS["interval_seconds"].field()
    timezone: str | None = Field(None, max_length=64, description="IANA name; default UTC")
    catch_up: Literal["once", "all", "skip"] | None = Field(
        None, description="after downtime: the newest missed tick (once), each (all), none"
    )
    catch_up_limit: int | None = SCHEDULE_BOUNDS["catch_up_limit"].field()
    overlap: Literal["allow", "skip"] | None = Field(
        None, description="while its last run has yet to finish: another run, or none"
    )
    paused: bool | None = None


class NewSchedule(ScheduleFields):
    name: Text
    task: Text


@router.post(
    "/projects/{project_id}/schedules",
    status_code=201,
    responses={**NOT_FOUND, **CONFLICT},
    operation_id="createSchedule",
)
async def post_schedule(
    project_id: ProjectIdPath, body: NewSchedule, request: Request
) -> JSONAnswer:
    """Create a schedule: a cron expression or an interval; its first tick is after now."""
    fields = body.model_dump(exclude_unset=True, exclude={"name", "task"})
    depth = request.app.state.api.settings.max_json_depth
    steps = create_schedule(project_id, body.name, body.task, max_json_depth=depth, **fields)
    return JSONAnswer(await _apply(request, steps), status_code=201)


@router.get("/schedules", responses=PAGED, operation_id="listSchedules")
async def get_schedules(
    request: Request,
    project: Annotated[
        str | None, Query(pattern=f"^{IDENTIFIER.pattern}$", max_length=MAX_NAME_CHARS)
    ] = None,
    limit: PageSize = MAX_PAGE_SIZE,
    cursor: Cursor = None,
) -> JSONAnswer:
    """Schedules (of a project, or of all) by project and name, a page at a time: next
    tick, last run and its state, errors."""
    after = read_cursor(cursor, str, str)
    steps = list_schedules(project, limit=limit + 1, after=after)
    found = await _apply(request, steps)
    shown, link = page(request, found, limit, lambda s: [s["project"], s["name"]])
    return JSONAnswer(shown, headers=link)


@router.get("/tasks", responses=PAGED, operation_id="listTasks")
async def get_tasks(
    request: Request, limit: PageSize = MAX_PAGE_SIZE, cursor: Cursor = None
) -> JSONAnswer:
    """The tasks the workers declared, by name, a page at a time: the lane, priority,
    max_attempts and timeout a run enqueued by the task's name gets (``max_attempts``
    null: the server's default), who declared them and when."""
    (after,) = read_cursor(cursor, str) or (None,)
    found = await _apply(request, list_tasks(limit + 1, after=after))
    shown, link = page(request, [t.to_json() for t in found], limit, lambda t: [t["name"]])
    return JSONAnswer(shown, headers=link)


@router.get(
    "/projects/{project_id}/schedules/{name:key}", responses=NOT_FOUND, operation_id="getSchedule"
)
async def get_one_schedule(
    project_id: ProjectIdPath, name: ScheduleNamePath, request: Request
) -> JSONAnswer:
    return JSONAnswer(await _apply(request, get_schedule(project_id, name)))


@router.patch(
    "/projects/{project_id}/schedules/{name:key}",
    responses=NOT_FOUND | CONFLICT,
    operation_id="updateSchedule",
)
async def patch_schedule(
    project_id: ProjectIdPath, name: ScheduleNamePath, body: ScheduleFields, request: Request
) -> JSONAnswer:
    """Change a schedule; ``{"paused": true}`` pauses it, ``false`` resumes it from the
    first tick after now. A schedule declared in code can only be paused or resumed."""
    depth = request.app.state.api.settings.max_json_depth
    changes = body.model_dump(exclude_unset=True)
    steps = update_schedule(project_id, name, max_json_depth=depth, **changes)
    return JSONAnswer(await _apply(request, steps))


@router.delete(
    "/projects/{project_id}/schedules/{name:key}",
    status_code=204,
    responses=NOT_FOUND,
    operation_id="deleteSchedule",
)
async def delete_one_schedule(
    project_id: ProjectIdPath, name: ScheduleNamePath, request: Request
) -> None:
    """Delete a schedule; its runs stay."""
    if not await _apply(request, delete_schedule(project_id, name)):
        raise HTTPException(404, f"no schedule {name!r} in project {project_id!r}")
