"""Remote workers: the claim protocol over HTTP (docs/workers.md), and their tokens.

A remote worker talks to the API, never to PostgreSQL. The API does for it what a local
worker does for itself, with the same statements, so every rule holds unchanged: it
registers the worker's workloops and tasks in the workers table (admission counts its
fast-lane slots like anyone's), claims with ``claim_runs`` along the registered chain
(lane order, key limits, fairness, breakers, only the worker's tasks), renews leases
with ``beat_worker``, and writes outcomes and progress with ``complete_runs``, whose
guard (running, same attempt, same worker) means a worker completes only what it holds.

- ``POST /workers``: register (workloops, tasks); each chain must stay within the
  token's lanes. A task given with its settings is declared for every process
  (tidegate.tasks), as a local worker declares its own when it starts, by a token for
  every lane only (a scoped one could route other tasks' runs into its lanes).
- ``POST /workers/{id}/claim``: runs for one workloop, at most its free slots (counted
  here from the runs it holds: slots are never lent, whatever the client asks); a long
  poll, answered as soon as runs are claimed or empty after ``wait_seconds``.
- ``POST /workers/{id}/heartbeat``: renew the leases of the runs it names; the answer
  says which it no longer holds (cancelled, or rescued). Each beat also stages due and
  pending runs and rescues lapsed leases, as a local worker's services do.
- ``POST /workers/{id}/runs/{run_id}/outcome`` and ``/progress``, or in batches as the
  worker's completer makes them, ``POST /workers/{id}/complete`` (the Python worker's
  form, worker/link.py); ``POST /workers/{id}/stop`` hands back what it could not
  finish and removes the worker.
- ``GET /workers/{id}/runs/{run_id}/delivery``: what a forwarding attempt sends, signed.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NoReturn, get_type_hints

import psycopg
from fastapi import APIRouter, HTTPException, Path, Query, Request, Response, Security
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from psycopg.rows import class_row
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from tidegate.access import WorkerCaller
from tidegate.api.auth import BEARER, Refused, authenticate_worker
from tidegate.api.claims import Busy
from tidegate.api.events import disconnected
from tidegate.api.kernel import (
    AUTH_RESPONSES,
    MAX_PAGE_SIZE,
    PAGED,
    Api,
    Cursor,
    PageSize,
    log,
    page,
    problem_responses,
    read_cursor,
)
from tidegate.errors import ConfigError, InputError
from tidegate.forward import find_delivery
from tidegate.lanes import DEFAULT_LANE, WILDCARD, chain_admits, parse_workloops
from tidegate.limits import (
    MAX_DELAY_SECONDS,
    MAX_TEXT_CHARS,
    TASK_BOUNDS,
    LaneName,
    RunId,
    Text,
    check_json,
    parse_json,
)
from tidegate.projects import NotFoundError, domain_error
from tidegate.remote import (
    chain_allowed,
    create_worker_token,
    delete_worker_token,
    list_worker_tokens,
)
from tidegate.runs import MAX_PROGRESS_BYTES, RUN_FIELDS, Run, RunState, get_run
from tidegate.storage.sql import Statement, Steps
from tidegate.tasks import TaskSettings, declare_tasks
from tidegate.worker.counters import DURATION_BUCKETS, MAX_BEAT_ATTEMPTS
from tidegate.worker.execute import reported_outcome
from tidegate.worker.maintenance import rescue
from tidegate.worker.runtime import CLAIM_HEAD_SCAN, CLAIM_SCAN_LIMIT


class WorkerBearer(HTTPBearer):
    """The worker token as OpenAPI documents it, and the dependency that hands a route
    the caller the ``Guard`` authenticated with it (the header is not read again).

    One dependency, not the scheme beside a dependency of its own: FastAPI's bookkeeping
    per dependency and request (its cache key, a look for OAuth scopes that unwraps the
    callable) was 93 of the 1,527 Python calls an API process made per remote claim
    (docs/benchmarks.md, "Remote workers"). Async, though it awaits nothing: FastAPI
    runs a plain callable in a thread."""

    async def __call__(self, request: Request) -> WorkerCaller:  # type: ignore[override]
        caller = request.state.caller
        if not isinstance(caller, WorkerCaller):  # not reachable through the Guard
            raise HTTPException(403, "a worker token is required")
        return caller


WORKER_BEARER = WorkerBearer(scheme_name="WorkerToken", description="A worker token (tgw_...).")


class WorkerRoute(APIRoute):
    """A route of the worker protocol. Those whose endpoint takes the worker's id, a body
    model, the request and the caller (``claim``, ``complete``, ``heartbeat``, ``stop``:
    a worker's cycle, and its end) are served lean when the call is well formed: the caller the
    Guard found is the worker the path names, and the body is JSON its model accepts,
    read and checked in one call (``model_validate_json``). Anything else, FastAPI's own
    handler serves (its answers, its 422s: the body read once, kept by the request).

    FastAPI's handler reads a body with ``json.loads``, then checks it, and solves the
    route's dependencies, per request: served so, a claim of 32 runs carrying their
    outcomes costs an API process a quarter less CPU (docs/benchmarks.md, "Remote
    workers"). OpenAPI is the route's own, unchanged."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        standard = super().get_route_handler()
        hints = get_type_hints(self.endpoint)
        model = hints.get("body")
        if set(hints) - {"return"} != {"worker_id", "body", "request", "fleet"} or not (
            isinstance(model, type) and issubclass(model, BaseModel)
        ):
            return standard
        endpoint, status = self.endpoint, self.status_code or 200

        async def handler(request: Request) -> Response:
            worker_id = request.path_params.get("worker_id")
            caller = getattr(request.state, "caller", None)
            if (
                worker_id is None
                or not isinstance(caller, WorkerCaller)
                or caller.worker_id != worker_id
                or not _json_type(request.headers.get("content-type", ""))
            ):
                return await standard(request)
            try:
                body = model.model_validate_json(await request.body())
            except ValidationError:
                return await standard(request)
            answer = await endpoint(worker_id=worker_id, body=body, request=request, fleet=caller)
            return answer if isinstance(answer, Response) else JSONResponse(answer, status)

        return handler


def _json_type(content_type: str) -> bool:
    """Whether a content type is one FastAPI reads as JSON (``application/json`` or
    ``application/*+json``)."""
    kind = content_type.partition(";")[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


router = APIRouter(
    prefix="/workers", tags=["workers"], responses=AUTH_RESPONSES, route_class=WorkerRoute
)
admin_router = APIRouter(
    prefix="/admin/worker-tokens",
    tags=["admin"],
    dependencies=[Security(BEARER)],
    responses=AUTH_RESPONSES,
)
MAX_WAIT_SECONDS = 60.0
MAX_JSON_TEXT = 16 * 1024 * 1024
"""The longest result or error, as JSON text, in a batch of outcomes."""
MAX_DEMAND = 1000
CLAIM_FORMATS = ("objects", "rows")
"""How a claim's runs may be answered: ``objects``, each as ``GET /runs/{id}`` shows it
(the default, what every worker understands), or ``rows``, the fields named once in
``columns`` and each run an array of their values (``Run.row``): under half the JSON,
written in 6 µs per run instead of 11 and read in 4 instead of 8. Registration lists
them, so that a worker asks for ``rows`` only of an API that has it."""
NOT_YOURS = problem_responses(**{"404": "no such worker of this token (or no such run)"})
BUSY = problem_responses(
    **{"429": "a claim of this workloop is waiting, or the token's claims are at their bound"}
)
NOT_HELD = problem_responses(
    **{"409": "the worker does not hold this attempt (cancelled, rescued, or finished)"}
)
WorkerId = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]
RunIdPath = Annotated[int, Path(ge=1, le=2**63 - 1)]
Attempt = Annotated[int, Field(ge=1, le=32767)]


Fleet = Annotated[WorkerCaller, Security(WORKER_BEARER)]
"""The worker token's caller; every route of ``router`` takes it."""


class TaskDeclaration(BaseModel):
    """A task a remote worker has, with the settings its code gives it: runs enqueued by
    the task's name anywhere take them, unless the enqueue says otherwise
    (tidegate.tasks)."""

    model_config = ConfigDict(extra="forbid")

    name: Text
    lane: LaneName = DEFAULT_LANE
    max_attempts: int | None = TASK_BOUNDS["max_attempts"].field()
    """``null``: the enqueuer's default."""
    timeout_seconds: float | None = TASK_BOUNDS["timeout_seconds"].field()
    priority: int = TASK_BOUNDS["priority"].field(0)
    key_function: Text | None = None
    """The name of the function that computes a run's key, for the operator to read."""


class Registration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workloops: str = Field(min_length=1, max_length=1000, examples=["fast_lane:1 manual>*:4"])
    tasks: list[Text | TaskDeclaration] = Field(min_length=1, max_length=1000)
    """The tasks it has (it is given runs of these only): each a name, or a name with
    its settings, which the API declares for every process (a bare name declares
    nothing)."""
    host: str | None = Field(default=None, min_length=1, max_length=MAX_TEXT_CHARS)
    """What to show for it in the workers lists (the client's address by default)."""


class OutcomeRow(BaseModel):
    """An attempt's outcome as the worker made it (``complete_runs``' row): what the
    Python worker sends, its handler's result and error already JSON text."""

    model_config = ConfigDict(extra="forbid")
    id: RunId
    attempt: Attempt
    state: Literal["scheduled", "succeeded", "discarded", "cancelled"]
    result: str | None = Field(default=None, max_length=MAX_JSON_TEXT)
    error: str | None = Field(default=None, max_length=MAX_JSON_TEXT)
    delay_seconds: float = Field(default=0.0, ge=0, le=MAX_DELAY_SECONDS, allow_inf_nan=False)
    max_attempts: int = Field(ge=1, le=32767)
    verdict: Literal["success", "failure"] | None = None


OUTCOME_ROWS = TypeAdapter(list[OutcomeRow])
"""Dumps a batch of outcome rows as JSON in one call (a quarter of the time of
``model_dump`` per row, then ``json.dumps``)."""


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workloop: int = Field(ge=0, le=63)
    """The index of the workloop, in the registered spec."""
    demand: int = Field(ge=1, le=MAX_DEMAND)
    """How many runs it would take; the API gives at most the workloop's free slots."""
    wait_seconds: float = Field(default=30.0, ge=0, le=MAX_WAIT_SECONDS, allow_inf_nan=False)
    format: Literal["objects", "rows"] = "objects"
    """How the runs are answered (``CLAIM_FORMATS``)."""
    outcomes: list[OutcomeRow] = Field(default_factory=list, max_length=10_000)
    """Outcomes of the workloop's runs, written (as ``complete`` writes them) before its
    free slots are counted, in the claim's transaction: the slots they free are claimed
    at once, in one call instead of two. The answer's ``recorded`` and ``breakers`` say
    what was written; it comes at once, runs or not (no long poll)."""


class Counted(BaseModel):
    """Attempts a worker finished since its last beat, by task, lane and outcome (the
    metrics' ``tidegate_attempts`` and durations; worker/counters.py).

    At most ``MAX_BEAT_ATTEMPTS`` per beat, and no more in the histogram than there were
    attempts; the route checks that the task is one the worker registered, and the lane
    one its workloops take."""

    model_config = ConfigDict(extra="forbid")
    task: Text
    lane: LaneName
    outcome: Literal[
        "claimed",
        "succeeded",
        "failed",
        "retry_requested",
        "discarded",
        "cancelled",
        "late",
        "rescued",
    ]
    attempts: int = Field(ge=0, le=MAX_BEAT_ATTEMPTS)
    seconds: float = Field(ge=0, le=1e12, allow_inf_nan=False)
    buckets: list[Annotated[int, Field(ge=0, le=MAX_BEAT_ATTEMPTS)]] = Field(
        min_length=len(DURATION_BUCKETS) + 1,
        max_length=len(DURATION_BUCKETS) + 1,
        description="How many of the attempts took up to each bound of the histogram "
        f"(seconds: {', '.join(map(str, DURATION_BUCKETS))}), then longer.",
    )

    @model_validator(mode="after")
    def no_more_timed_than_counted(self) -> Counted:
        if sum(self.buckets) > self.attempts:
            raise ValueError(
                f"counters: the histogram of {self.task!r} in {self.lane!r} ({self.outcome}) "
                f"holds {sum(self.buckets)} attempts, more than the {self.attempts} counted"
            )
        return self


class Heartbeat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_ids: list[RunId] = Field(default_factory=list, max_length=10_000)
    """The runs it holds: their leases are renewed. A run it does not name lapses."""
    counters: list[Counted] = Field(default_factory=list, max_length=10_000)
    """One row per (task, lane, outcome)."""

    @field_validator("counters")
    @classmethod
    def one_row_per_series(cls, counters: list[Counted]) -> list[Counted]:
        series = [(c.task, c.lane, c.outcome) for c in counters]
        if len(set(series)) < len(series):
            raise ValueError("counters: one row per (task, lane, outcome)")
        return counters


class EventRow(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_id: RunId
    attempt: Attempt
    data: str = Field(max_length=MAX_PROGRESS_BYTES)
    """JSON text."""


class Completion(BaseModel):
    model_config = ConfigDict(extra="forbid")
    outcomes: list[OutcomeRow] = Field(default_factory=list, max_length=10_000)
    events: list[EventRow] = Field(default_factory=list, max_length=10_000)


class Succeeded(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: Literal["succeeded"]
    attempt: Attempt
    result: Any = None


class Failed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: Literal["failed"]
    attempt: Attempt
    error: str = Field(min_length=1, max_length=2000)


class RetryLater(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: Literal["retry"]
    attempt: Attempt
    delay_seconds: float = Field(default=0.0, ge=0, le=MAX_DELAY_SECONDS, allow_inf_nan=False)


class Cancelled(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: Literal["cancelled"]
    attempt: Attempt
    reason: str = Field(default="cancelled by its handler", min_length=1, max_length=2000)


class Discarded(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: Literal["discarded"]
    attempt: Attempt
    reason: str = Field(default="discarded by its handler", min_length=1, max_length=2000)
    details: Any = None


Report = Annotated[
    Succeeded | Failed | RetryLater | Cancelled | Discarded, Field(discriminator="state")
]


class Progress(BaseModel):
    model_config = ConfigDict(extra="forbid")
    attempt: Attempt
    data: Any


class Stop(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hand_back: list[RunId] = Field(default_factory=list, max_length=10_000)
    """Runs it holds and did not finish: available again, the attempt not counted."""


class NewWorkerToken(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    lanes: list[LaneName | Literal["*"]] = Field(min_length=1, max_length=64)


# -- the protocol -----------------------------------------------------------------------


@router.post(
    "",
    status_code=201,
    responses=problem_responses(**{"422": "a chain outside the token's lanes, or shares"}),
    operation_id="registerWorker",
)
async def register(body: Registration, request: Request, fleet: Fleet) -> dict[str, Any]:
    """Register a worker: its workloops and tasks. Its id names it in every other call."""
    api: Api = request.app.state.api
    try:
        specs = parse_workloops(body.workloops)
    except ConfigError as error:
        raise HTTPException(422, str(error)) from None
    for spec in specs:
        refusal = chain_allowed(fleet.lanes, spec.chain)
        if refusal:
            raise HTTPException(422, refusal)
        if spec.shares:
            # The API claims along a registered chain; the shares' split is made from the
            # workloop's own runs per lane, which only a worker on PostgreSQL holds.
            raise HTTPException(
                422,
                f"workloop {str(spec)!r}: shares are for workers on PostgreSQL; give "
                "a remote worker's workloops chains ('a>b>*:4')",
            )
    worker_id = f"remote:{fleet.token}:{secrets.token_hex(6)}"
    workloops = [{"chain": list(s.chain), "slots": s.slots, "busy": 0} for s in specs]
    client = request.client.host if request.client else "?"
    names = {task if isinstance(task, str) else task.name for task in body.tasks}
    beat = _beat(api, worker_id, workloops, sorted(names), fleet, [])
    beat["host"] = body.host or client
    await api.run(_renewed(beat))
    declared = [
        TaskSettings(**task.model_dump()) for task in body.tasks if not isinstance(task, str)
    ]
    if declared and WILDCARD not in fleet.lanes:
        # A declaration routes every run enqueued by the task's name: from a token
        # scoped to some lanes, it could draw other tasks' runs into them.
        log.warning(
            "worker %s: its token is for lanes %s only, so its task settings are not "
            "declared (a token for every lane may declare them)",
            worker_id,
            ",".join(fleet.lanes),
        )
        declared = []
    await api.run(declare_tasks(declared, worker_id))
    settings = api.settings
    return {
        "worker_id": worker_id,
        "lease_seconds": settings.lease_seconds,
        "heartbeat_seconds": settings.heartbeat_seconds,
        "workloops": workloops,
        "claim_formats": list(CLAIM_FORMATS),
        "claim_outcomes": True,
    }


@router.post("/{worker_id}/claim", responses={**NOT_YOURS, **BUSY}, operation_id="claimRuns")
async def claim(worker_id: WorkerId, body: Claim, request: Request, fleet: Fleet) -> Response:
    """Claim runs for one workloop along its chain: answered as soon as any are claimed,
    or with none after ``wait_seconds`` (a long poll). ``runs``: each as ``GET
    /runs/{id}`` shows it. One claim at a time per workloop, and
    ``max_claims_per_token`` per worker token, on each API process (429 past them;
    api/claims.py says how a waiting claim is woken).

    One statement does it all (functions/claim_workloop.sql): the outcomes carried, the
    workloop's count under its lock, the claim; its runs come as the JSON the database
    wrote, into the answer unread (in rows; objects are made from them). FastAPI's
    serializer is not used: a run may nest deeper than it goes (``max_json_depth`` up to
    512)."""
    api: Api = request.app.state.api
    workloops, tasks = _own(fleet, worker_id)
    if body.workloop >= len(workloops):
        raise HTTPException(422, f"the worker has {len(workloops)} workloop(s)")
    loop = workloops[body.workloop]
    chain = tuple(loop["chain"])
    settings = api.settings
    outcomes = body.outcomes
    _check_outcomes(outcomes, settings.max_json_depth)
    params = {
        "token_hash": fleet.token_hash,
        "worker_id": worker_id,
        "workloop": body.workloop,
        "slots": loop["slots"],
        "demand": body.demand,
        "lanes": [lane for lane in chain if lane != "*"],
        "wildcard": "*" in chain,
        "demands": None,
        "others_demand": None,
        "lease_seconds": settings.lease_seconds,
        "scan_limit": CLAIM_SCAN_LIMIT,
        "head_scan": CLAIM_HEAD_SCAN,
        "tasks": tasks,
        "live_seconds": 3 * settings.heartbeat_seconds,
        "outcomes": _batch(outcomes) if outcomes else None,
        "completed_channel": api.app.completed_channel,
        "channel": api.app.available_channel,
    }
    written: dict[str, Any] = {}
    clock = asyncio.get_running_loop().time
    deadline = clock() + body.wait_seconds
    place = (worker_id, body.workloop)
    # Whether the client left: watched only while the claim waits (most are answered at
    # once, and a task per claim cost each a few loop turns).
    gone: asyncio.Future[None] | None = None
    try:
        async with api.claims.claiming(fleet.token, place, (chain, tuple(tasks)), deadline) as turn:
            while True:
                turn.look()
                [claimed] = await api.run(_claim(params))
                if claimed.free is None:  # the token or the worker is gone
                    await _gone(api, request, worker_id)
                if outcomes:  # written with the first look only
                    params["outcomes"] = None
                    written = await _settled_claim(api, worker_id, outcomes, claimed)
                turn.looked(asked=min(body.demand, claimed.free), got=claimed.claimed)
                # A claim that carried outcomes is answered at once, runs or not: its
                # worker learns what was written now, not at the end of a long poll.
                if claimed.free <= 0 or claimed.claimed or written or clock() >= deadline:
                    return _claimed(claimed, body.format, written)
                gone = gone or asyncio.ensure_future(disconnected(request.receive))
                await turn.sleep(deadline - clock(), gone)
                if gone.done() or clock() >= deadline:
                    return _claimed(None, body.format, written)
    except Busy as busy:
        raise HTTPException(429, busy.title, {"Retry-After": str(busy.retry_after)}) from None
    finally:
        if gone is not None:
            gone.cancel()


@router.post("/{worker_id}/heartbeat", responses=NOT_YOURS, operation_id="sendHeartbeat")
async def heartbeat(
    worker_id: WorkerId, body: Heartbeat, request: Request, fleet: Fleet
) -> dict[str, Any]:
    """Say the worker is alive and renew the leases of the runs it names; ``lost`` are
    those it no longer holds (cancelled meanwhile, or rescued after a lapse)."""
    api: Api = request.app.state.api
    workloops, tasks = _own(fleet, worker_id)
    refusal = _foreign_counter(body.counters, workloops, tasks)
    if refusal is not None:
        raise HTTPException(422, refusal)
    beat = _beat(api, worker_id, workloops, tasks, fleet, body.run_ids)
    beat["counters"] = json.dumps([counted.model_dump() for counted in body.counters])
    renewed = set(await api.run(_renewed(beat)))
    await _maintain(api, workloops, tasks)
    return {"renewed": sorted(renewed), "lost": sorted(set(body.run_ids) - renewed)}


@router.post(
    "/{worker_id}/runs/{run_id}/outcome",
    responses={**NOT_YOURS, **NOT_HELD},
    operation_id="reportOutcome",
)
async def outcome(
    worker_id: WorkerId, run_id: RunIdPath, body: Report, request: Request, fleet: Fleet
) -> dict[str, Any]:
    """Report how the attempt ended: ``succeeded`` (``result``), ``failed`` (``error``:
    retried with backoff, or discarded after the last attempt), ``retry``
    (``delay_seconds``, the attempt given back), ``cancelled`` or ``discarded``."""
    api: Api = request.app.state.api
    _own(fleet, worker_id)
    run = await _held(api, worker_id, run_id, body.attempt)
    report = body.model_dump()
    for name in ("result", "details"):
        try:
            check_json(report.get(name), f"the {name}", api.settings.max_json_depth)
        except InputError as error:
            raise HTTPException(422, str(error)) from None
    reported = reported_outcome(run, report, api.settings)
    row = OutcomeRow.model_construct(**reported.as_row())  # made here: nothing to check
    recorded, _ = await _write(api, worker_id, [row], [])
    if run_id not in recorded:
        raise HTTPException(409, f"run {run_id}: attempt {body.attempt} is not this worker's")
    return {"run_id": run_id, "state": reported.state}


@router.post("/{worker_id}/complete", responses=NOT_YOURS, operation_id="completeRuns")
async def complete(
    worker_id: WorkerId, body: Completion, request: Request, fleet: Fleet
) -> dict[str, Any]:
    """Write a batch of outcomes and progress events as the worker made them (the Python
    worker's form of ``outcome`` and ``progress``). ``recorded``: the outcomes written;
    the others came after their runs had left the worker, and are noted in their runs'
    errors. ``breakers``: circuit breakers the outcomes opened or closed."""
    api: Api = request.app.state.api
    _own(fleet, worker_id)
    _check_outcomes(body.outcomes, api.settings.max_json_depth)
    for event in body.events:
        try:
            parse_json(event.data, f"run {event.run_id}'s progress data")
        except InputError as error:
            raise HTTPException(422, str(error)) from None
    events = [event.model_dump() for event in body.events]
    recorded, breakers = await _write(api, worker_id, body.outcomes, events)
    return {"recorded": sorted(recorded), "breakers": breakers}


@router.post(
    "/{worker_id}/runs/{run_id}/progress",
    status_code=204,
    responses={**NOT_YOURS, **NOT_HELD},
    operation_id="reportProgress",
)
async def progress(
    worker_id: WorkerId, run_id: RunIdPath, body: Progress, request: Request, fleet: Fleet
) -> Response:
    """Report a progress event of the attempt (as ``run.progress`` does in Python)."""
    api: Api = request.app.state.api
    _own(fleet, worker_id)
    await _held(api, worker_id, run_id, body.attempt)
    try:
        check_json(body.data, "the progress data")
    except InputError as error:
        raise HTTPException(422, str(error)) from None
    data = json.dumps(body.data)
    if len(data) > MAX_PROGRESS_BYTES:
        raise HTTPException(422, f"the progress data is over {MAX_PROGRESS_BYTES} bytes of JSON")
    event = {"run_id": run_id, "attempt": body.attempt, "data": data}
    await _write(api, worker_id, [], [event])
    return Response(status_code=204)


@router.get(
    "/{worker_id}/runs/{run_id}/delivery",
    responses={**NOT_YOURS, **NOT_HELD},
    operation_id="getDelivery",
)
async def delivery(
    worker_id: WorkerId,
    run_id: RunIdPath,
    attempt: Annotated[int, Query(ge=1, le=32767)],
    request: Request,
    fleet: Fleet,
) -> dict[str, Any]:
    """The request a forwarding run's attempt sends (the built-in task
    ``tidegate.forward``): method, URL, headers (signed here when the trigger has a
    secret, which never leaves the API), body (base64) and timeout. ``delivery`` is null
    when the run has no request or its trigger no longer forwards: the run is then
    discarded."""
    api: Api = request.app.state.api
    _own(fleet, worker_id)
    await _held(api, worker_id, run_id, attempt)
    found = await api.run(find_delivery(run_id))
    return {"delivery": found.as_json() if found else None}


@router.post("/{worker_id}/stop", responses=NOT_YOURS, operation_id="stopWorker")
async def stop(worker_id: WorkerId, body: Stop, request: Request, fleet: Fleet) -> dict[str, int]:
    """A worker going away: hand back the runs it names, then remove it (its slots stop
    counting at once). Runs it holds and does not name are rescued when their leases
    lapse."""
    api: Api = request.app.state.api
    _own(fleet, worker_id)
    released = await api.run(_stop(api, worker_id, body.hand_back))
    return {"handed_back": released}


# -- worker tokens (the super admin's) --------------------------------------------------


@admin_router.post(
    "",
    status_code=201,
    responses=problem_responses(**{"409": "name taken"}),
    operation_id="createWorkerToken",
)
async def create_token(body: NewWorkerToken, request: Request) -> dict[str, Any]:
    """Create a worker token for the lanes named (``*``: any); shown only this once."""
    api: Api = request.app.state.api
    created: dict[str, Any] = await _admin(api.run(create_worker_token(body.name, body.lanes)))
    return created


@admin_router.get("", responses=PAGED, operation_id="listWorkerTokens")
async def list_tokens(
    request: Request, response: Response, limit: PageSize = MAX_PAGE_SIZE, cursor: Cursor = None
) -> list[dict[str, Any]]:
    """The worker tokens by name, a page at a time: lanes, and how many live workers use
    each."""
    api: Api = request.app.state.api
    live = 3 * api.settings.heartbeat_seconds
    after = read_cursor(cursor, str)
    steps = list_worker_tokens(live, after=after[0] if after else None, limit=limit + 1)
    shown, link = page(request, await api.run(steps), limit, lambda t: [t["name"]])
    response.headers.update(link)
    return shown


@admin_router.delete(
    "/{name}",
    status_code=204,
    responses=problem_responses(**{"404": "none"}),
    operation_id="deleteWorkerToken",
)
async def delete_token(
    name: Annotated[str, Path(pattern=r"^[A-Za-z0-9_.-]{1,64}$")], request: Request
) -> Response:
    """Delete a worker token: its workers are refused from the next call on."""
    api: Api = request.app.state.api
    await _admin(api.run(delete_worker_token(name)))
    return Response(status_code=204)


async def _admin(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except NotFoundError as error:
        raise HTTPException(404, str(error)) from None
    except InputError as error:
        raise HTTPException(422, str(error)) from None
    except psycopg.errors.IntegrityError as error:
        raise HTTPException(409, str(domain_error(error))) from None


# -- steps ------------------------------------------------------------------------------


def _own(fleet: WorkerCaller, worker_id: str) -> tuple[list[Any], list[str]]:
    """The worker's workloops and tasks, read with its token (api/guard.py); 404 unless
    it registered with this token."""
    if fleet.worker is None or fleet.worker_id != worker_id:
        raise HTTPException(404, f"no worker {worker_id!r} of this token (register again)")
    return fleet.worker


async def _held(api: Api, worker_id: str, run_id: int, attempt: int) -> Run:
    """The run, if this worker holds this attempt of it; else 404 or 409."""
    run = await api.run(get_run(run_id))
    if run is None:
        raise HTTPException(404, f"no run {run_id}")
    if not (
        run.state is RunState.RUNNING and run.worker_id == worker_id and run.attempt == attempt
    ):
        raise HTTPException(409, f"run {run_id}: attempt {attempt} is not this worker's")
    return run


def _claimed(claimed: Claimed | None, format: str, written: dict[str, Any]) -> Response:
    """A claim's answer, its runs as objects or in rows (``CLAIM_FORMATS``), and what
    was written of the outcomes it carried. Rows go out as the database wrote them."""
    columns, rows = (claimed.columns, claimed.runs) if claimed else (list(RUN_FIELDS), "[]")
    extra = "".join(f',"{name}":{json.dumps(value)}' for name, value in written.items())
    if format == "rows":
        text = f'{{"columns":{json.dumps(columns)},"rows":{rows}{extra}}}'
    else:
        runs = [Run.from_row(columns, row).to_json() for row in json.loads(rows)]
        text = f'{{"runs":{json.dumps(runs, ensure_ascii=False)}{extra}}}'
    return Response(text.encode(), media_type="application/json")


async def _settled_claim(
    api: Api, worker_id: str, outcomes: list[OutcomeRow], claimed: Claimed
) -> dict[str, Any]:
    """What was written of the outcomes a claim carried, as its answer says it; those
    that came too late are noted in their runs."""
    recorded = set(claimed.recorded or ())
    await _note_late(api, worker_id, outcomes, recorded)
    return {"recorded": sorted(recorded), "breakers": json.loads(claimed.breakers or "[]")}


def _foreign_counter(counters: list[Counted], workloops: list[Any], tasks: list[str]) -> str | None:
    """Why a heartbeat's counters are refused: a task the worker did not register, or a
    lane none of its workloops takes (so none within its token's lanes); else None.

    A worker counts only attempts of runs it could claim. Unchecked, one worker's names
    (1,000 that sort first) pushed every other series out of ``/metrics`` for good."""
    registered = set(tasks)
    chains = [tuple(loop["chain"]) for loop in workloops]
    for row in counters:
        if row.task not in registered:
            return f"counters: task {row.task!r} is not one this worker registered"
        if not any(chain_admits(chain, row.lane) for chain in chains):
            return f"counters: lane {row.lane!r} is not one this worker's workloops take"
    return None


def _beat(
    api: Api,
    worker_id: str,
    workloops: list[Any],
    tasks: list[str],
    fleet: WorkerCaller,
    run_ids: list[int],
) -> dict[str, Any]:
    return {
        "worker_id": worker_id,
        "host": "",
        "pid": 0,
        "workloops": json.dumps(workloops),
        "tasks": tasks,
        "run_ids": run_ids,
        "lease_seconds": api.settings.lease_seconds,
        "counters": "[]",
        "token": fleet.token,
    }


async def _maintain(api: Api, workloops: list[Any], tasks: list[str]) -> None:
    """What a local worker's stager and rescuer do, done at a remote worker's beat: due
    runs and pending runs of its tasks made available, lapsed leases rescued."""
    channel = api.app.available_channel
    chains = [loop["chain"] for loop in workloops]
    staging = {
        "channel": channel,
        "tasks": tasks,
        "lanes": sorted({lane for chain in chains for lane in chain if lane != "*"}),
        "wildcard": any("*" in chain for chain in chains),
        "limit": 5000,
    }
    await api.run(_statement("stage_runs", staging))
    await rescue(api.pool, channel, api.app.completed_channel)


def _check_outcomes(rows: list[OutcomeRow], depth: int) -> None:
    """422 for an outcome whose result or error is not JSON within ``depth``."""
    for row in rows:
        for name in ("result", "error"):
            text = getattr(row, name)
            try:
                if text is not None:
                    parse_json(text, f"run {row.id}'s {name}", depth)
            except InputError as error:
                raise HTTPException(422, str(error)) from None


def _batch(rows: list[OutcomeRow]) -> str:
    """Outcome rows as ``complete_runs`` takes them: one JSON array."""
    return OUTCOME_ROWS.dump_json(rows, exclude_none=True).decode()


def _completion(
    api: Api, worker_id: str, outcomes: list[OutcomeRow], events: list[dict[str, Any]]
) -> dict[str, Any]:
    """``complete_runs``' parameters."""
    return {
        "worker_id": worker_id,
        "completed_channel": api.app.completed_channel,
        "channel": api.app.available_channel,
        "outcomes": _batch(outcomes),
        "events": json.dumps(events),
    }


async def _write(
    api: Api, worker_id: str, outcomes: list[OutcomeRow], events: list[dict[str, Any]]
) -> tuple[set[int], list[dict[str, str]]]:
    """Write outcomes and events with ``complete_runs``, as the worker's own completer
    would; note in their runs the outcomes that came too late. Return the ids recorded
    and the breaker changes."""
    rows = await api.run(_complete(_completion(api, worker_id, outcomes, events)))
    recorded = {row[0] for row in rows if row[0] is not None}
    breakers = [
        {"lane": lane, "key": key, "change": change}
        for _, lane, key, change in rows
        if change is not None
    ]
    await _note_late(api, worker_id, outcomes, recorded)
    return recorded, breakers


async def _note_late(
    api: Api, worker_id: str, outcomes: list[OutcomeRow], recorded: set[int]
) -> None:
    """Note in their runs the outcomes that were not recorded: they came too late."""
    late = [
        {"id": o.id, "attempt": o.attempt, "state": o.state}
        for o in outcomes
        if o.id not in recorded
    ]
    if late:
        params = {"worker_id": worker_id, "outcomes": json.dumps(late)}
        await api.run(_statement("note_late_outcomes", params))


async def _gone(api: Api, request: Request, worker_id: str) -> NoReturn:
    """A claim that found its worker's token or registration gone (the Guard had
    remembered it: ``Guard.remembered``): forget it, and refuse as the Guard's lookup
    would have (403 for a token no longer known, 404 for a worker no longer
    registered)."""
    authorization = request.headers.get("authorization", "")
    api.claimers.forget((authorization, worker_id))
    try:
        fleet = await authenticate_worker(api, authorization, worker_id)
    except Refused as refused:
        raise HTTPException(refused.status, refused.title) from None
    _own(fleet, worker_id)  # raises 404
    # Found again between the two reads: the next claim goes by the lookup.
    raise HTTPException(503, "the worker's token changed: claim again", {"Retry-After": "1"})


@dataclass(frozen=True)
class Claimed:
    """What a claim did (functions/claim_workloop.sql): the workloop's free slots, the
    runs it took (``runs``: their rows as one JSON array, each in ``columns``' order),
    and, where it carried outcomes, the ids recorded and the breakers' changes (JSON)."""

    free: int | None
    claimed: int
    columns: list[str]
    runs: str
    recorded: list[int] | None
    breakers: str | None


def _claim(params: dict[str, Any]) -> Steps[list[Claimed]]:
    return (yield Statement("claim_workloop", params, class_row(Claimed)))


def _renewed(params: dict[str, Any]) -> Steps[list[int]]:
    rows = yield Statement("beat_worker", params)
    return list(rows[0][0])


def _complete(params: dict[str, Any]) -> Steps[list[Any]]:
    return (yield Statement("complete_runs", params))


def _stop(api: Api, worker_id: str, ids: list[int]) -> Steps[int]:
    params = {"ids": ids, "worker_id": worker_id, "channel": api.app.available_channel}
    rows = yield Statement("release_runs", params)
    yield Statement("delete_worker", {"worker_id": worker_id})
    return int(rows[0][0])


def _statement(name: str, params: dict[str, Any]) -> Steps[None]:
    yield Statement(name, params)
