"""``POST /hooks/{token}``: validate, admit, persist, acknowledge (or wait and reply).

Validation comes before anything is stored, cheapest first: unknown or disabled trigger
404, body (with the headers kept beside it) too large 413 (on ``Content-Length`` and
again while reading, so a client that lies cannot push more), unsupported content type
415, JSON that is malformed or that PostgreSQL cannot store (NUL, lone surrogates, NaN,
nesting past ``max_json_depth``) 400, bad Standard Webhooks signature 401, no run key
where the trigger's ``key_from`` says (tidegate.webhooks.KeyFrom) 422. Then one
database call admits or rejects (``admit_webhook``): 429 for the project's ingest rate
or fast-lane cap, 503 when no worker can take a fast-lane run, the fast lane is paused
or the run's key has its circuit breaker open (sync), or the backlog is full. A refusal
by the ingest rate, the fast-lane cap or the backlog cap gives the caller a place in the
waiting room (tidegate.admission): its ticket in ``Tidegate-Place``, which it sends back
when it comes back at its ``Retry-After``.
An admitted async webhook is answered 202 once its request and run are committed; a
sync one waits for its run. Every admission commits through the WAL flush, a sync one
too: its run is on disk before a worker can start it, so a database crash cannot undo a
run that has executed (docs/guarantees.md).

Every answer is counted, and a request to a known trigger that made no run is kept for
the webhook log, by this process's ``Ledger`` (api/ledger.py): in memory, written
about once a second after the answer, never in the request's own path.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from psycopg.rows import dict_row
from starlette.requests import ClientDisconnect

from tidegate.admission import (
    MAX_PLACES,
    PLACE_FIELD,
    PLACE_GRACE_SECONDS,
    RETRY_AFTER_MIN_SECONDS,
    Outcome,
    Unjudged,
    Verdict,
    place_field,
    ticket,
)
from tidegate.api import events
from tidegate.api.guard import CLOSE
from tidegate.api.kernel import (
    CLIENT_GONE,
    Api,
    ProblemType,
    client_gone,
    database_problem,
    problem,
    problem_responses,
)
from tidegate.api.ledger import LoggedRequest
from tidegate.api.streams import Full
from tidegate.errors import InputError
from tidegate.lanes import FAST_LANE
from tidegate.limits import MAX_ID
from tidegate.runs import REPLY_KEY, Run, RunState, get_run
from tidegate.signatures import MisconfiguredSecret
from tidegate.storage.sql import Statement, Steps
from tidegate.tracing import STATUS_ATTRIBUTE, Span, span
from tidegate.webhooks import (
    KEPT_HEADERS_EXCLUDED,
    Invalid,
    MalformedJSON,
    NoRunKey,
    Trigger,
    find_trigger,
    validate,
)

router = APIRouter(tags=["webhooks"])
log = logging.getLogger("tidegate.ingress")

MAX_TOKEN_CHARS = 128
"""Longer than any trigger token: not looked up."""
TRIGGER_CACHE_SECONDS = 1.0
"""How long an API process goes on using a trigger it looked up. A change made through
another process (another API process, the CLI) applies within this; one made through
this process's admin API, at once."""
TRIGGER_CACHE_SIZE = 10_000
"""Triggers an API process keeps at most; a full cache starts over."""
FIELD_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
"""An HTTP field name (RFC 9110 token)."""
FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]{0,8192}")
"""An HTTP field value: tabs, visible ASCII, Latin-1 (no CR, LF or other controls)."""
FRAMING_FIELDS = frozenset({"content-length", "transfer-encoding", "connection"})
NO_CONTENT = frozenset({204, 205, 304})
"""Fields the server sets from the reply itself; a handler's would contradict them."""
DUPLICATE_FIELD = "Tidegate-Duplicate"
"""Says (``true``) that a unique trigger's webhook made no run: the run named is the one
that held its key (the library's ``Run.duplicate``)."""


OUTCOMES = {
    400: Unjudged.BAD_REQUEST,
    401: Unjudged.BAD_SIGNATURE,
    404: Unjudged.UNKNOWN_TRIGGER,
    413: Unjudged.TOO_LARGE,
    415: Unjudged.NOT_JSON,
    CLIENT_GONE: Unjudged.DISCONNECTED,
}
"""The outcome of a request refused before admission, by its status. An answer no
outcome names (a 422 or a 500 from a database error: a bug) is counted as
``status_<status>``."""


VERDICT_TYPES = {Verdict.KEY_REUSED: ProblemType.IDEMPOTENCY_KEY_REUSED}
"""The problem type of a refusal whose status alone does not name it."""


class BodyTooLarge(Exception):
    pass


@router.post(
    "/hooks/{token}",
    status_code=202,
    responses={
        200: {"description": "sync trigger: the run's result (or the handler's own reply)"},
        202: {"description": "accepted: durable, will run (or still running, for sync)"},
        **problem_responses(
            **{
                "400": "malformed JSON, or JSON PostgreSQL cannot store (the detail says why)",
                "401": "bad or missing signature",
                "404": "unknown or disabled trigger",
                "413": "body (with the headers kept) over the trigger's limit",
                "415": "content type is not JSON",
                "422": "the idempotency key (Idempotency-Key, or webhook-id) of an earlier "
                "request, with another body; or no run key where the trigger's key_from "
                "says (absent, not a string or a number, or not 1 to 255 characters)",
                "429": "the project's ingest rate or fast-lane cap (Retry-After, RateLimit), "
                "or its event streams at their bound",
                "502": "sync trigger: the run failed (its id is in the body)",
                "503": "no worker can take it, its lane is paused (the problem's `lane`), "
                "its key's circuit breaker is open, backlog full, the server's event "
                "streams at their bound, or database unavailable",
            }
        ),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "Any JSON document (application/json or application/*+json).",
            "content": {"application/json": {"schema": {}}},
        }
    },
    operation_id="receiveWebhook",
)
async def receive(token: str, request: Request) -> Response:
    """Receive one webhook."""
    ingress: Api = request.app.state.api
    started = time.monotonic()
    note = Note(received_at=datetime.now(UTC))
    with span("admit", parent=request.headers) as admitting:
        try:
            response = await _receive(ingress, token, request, note)
        except psycopg.Error as error:
            response = database_problem(error, request.method, request.url.path)
            note.outcome = Unjudged.UNAVAILABLE if response.status_code == 503 else None
        except ClientDisconnect:
            response = client_gone(request.method, request.url.path)
        _record(ingress, note, response, time.monotonic() - started, admitting)
    return response


@dataclass
class Note:
    """What is known of a webhook as it is validated and admitted: what the ledger keeps."""

    received_at: datetime
    trigger: Trigger | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    """None while the body is unread (a refusal before it: the log keeps none)."""
    content_type: str | None = None
    idempotency_key: str | None = None
    outcome: Outcome | None = None
    """The admission's verdict, once made, or why none was; else the status says
    (``OUTCOMES``)."""
    run_id: int | None = None


def _record(ingress: Api, note: Note, response: Response, seconds: float, admitting: Span) -> None:
    """Count the answer; keep a request to a known trigger that made no run for the log."""
    status = response.status_code
    outcome: str = note.outcome or OUTCOMES.get(status) or f"status_{status}"
    trigger = note.trigger
    project, mode = (trigger.project, trigger.mode) if trigger else ("", "")
    ingress.ledger.count(project, mode, outcome, status, seconds)
    admitting.note(project=project, mode=mode, outcome=outcome, **{STATUS_ATTRIBUTE: status})
    if trigger is not None:
        admitting.note(trigger=trigger.name)
    if note.run_id is not None:
        admitting.note(run_id=note.run_id)
    if trigger is None or outcome == Verdict.ADMITTED:
        return
    body = note.body or b""
    limit = ingress.settings.webhook_log_body_bytes
    detail = ""
    if response.media_type == "application/problem+json":
        detail = json.loads(bytes(response.body)).get("detail", "")
    ingress.ledger.keep(
        LoggedRequest(
            trigger_id=trigger.id,
            project=trigger.project,
            outcome=outcome,
            status=status,
            detail=detail,
            run_id=note.run_id,
            idempotency_key=note.idempotency_key,
            content_type=note.content_type,
            headers=note.headers,
            body=body[:limit],
            body_truncated=note.body is None or len(body) > limit,
            received_at=note.received_at,
        )
    )


async def _receive(ingress: Api, token: str, request: Request, note: Note) -> Response:
    settings = ingress.settings
    found = await _trigger(ingress, token) if len(token) <= MAX_TOKEN_CHARS else None
    if found is None:
        return problem(404, "unknown trigger")
    trigger: Trigger = found
    note.trigger = trigger
    # The headers kept with the request count against the same limit as the body.
    headers = {k: v for k, v in request.headers.items() if k not in KEPT_HEADERS_EXCLUDED}
    note.headers = headers
    note.content_type = request.headers.get("content-type")
    if not trigger.enabled:
        note.outcome = Unjudged.DISABLED
        return problem(404, "unknown trigger")
    limit = min(trigger.max_body_bytes, settings.max_body_bytes)
    declared = request.headers.get("content-length")
    if declared is not None and int(declared) > limit:  # whole_number: the Guard checked
        return problem(413, f"body over {limit} bytes", CLOSE, max_bytes=limit)
    headers_size = sum(len(k) + len(v) for k, v in headers.items())
    if headers_size >= limit:
        return problem(413, f"headers and body over {limit} bytes", CLOSE, max_bytes=limit)
    try:
        body = await _read_body(request, limit - headers_size)
    except BodyTooLarge:
        return problem(413, f"headers and body over {limit} bytes", CLOSE, max_bytes=limit)
    note.body = body
    content_type = request.headers.get("content-type", "")
    try:
        payload, idempotency_key = validate(
            trigger.secret, request.headers, body, settings.max_json_depth
        )
    except MisconfiguredSecret as error:
        log.error("trigger %d (%s): its secret is invalid: %s", trigger.id, trigger.name, error)
        return problem(ProblemType.BAD_SIGNATURE, "bad signature")
    except MalformedJSON as malformed:
        return problem(ProblemType.MALFORMED_JSON, malformed.title)
    except Invalid as invalid:
        kind = ProblemType.BAD_SIGNATURE if invalid.status == 401 else invalid.status
        return problem(kind, invalid.title, **invalid.extra)
    note.idempotency_key = idempotency_key
    try:
        key = trigger.key_of(payload, request.headers.items())
    except NoRunKey as reason:
        note.outcome = Unjudged.NO_RUN_KEY
        return problem(422, str(reason), key_from=trigger.key_from)

    stream_after = None
    give_back: Callable[[], None] = _nothing
    if trigger.mode == "sync" and events.wants_events(request.headers.get("accept")):
        try:
            stream_after = events.last_event_id(request.headers.get("last-event-id"))
        except InputError as error:
            return problem(400, str(error))
        if stream_after is None:  # it has seen the end: only the end again
            stream_after = MAX_ID
        # Before the admission: a stream refused makes no run (a repeat of an admitted
        # request, which any sender can make, streams too).
        try:
            give_back = ingress.streams.take(f"hooks:{trigger.project}")
        except Full as full:
            note.outcome = Unjudged.TOO_MANY_STREAMS
            return problem(full.status, full.title, full.headers)

    # A sync trigger's runs go to the fast lane, whose slots its callers wait for; an
    # async one's to the lane its task declares (admit_webhook reads it), else default.
    lane = FAST_LANE if trigger.mode == "sync" else None
    response = None
    try:
        decision = await ingress.run(
            _admit(
                ingress,
                trigger,
                lane,
                key,
                payload,
                body,
                headers,
                content_type,
                idempotency_key,
                ticket(request.headers.get(PLACE_FIELD)),
            )
        )
        note.outcome = Verdict(decision["decision"])
        note.run_id = decision["run_id"]
        response = await _answer(
            ingress, trigger, lane, key, decision, idempotency_key, stream_after, give_back
        )
        return response
    finally:
        if not isinstance(response, events.EventStream):  # no stream: its place is free
            give_back()


async def _answer(
    ingress: Api,
    trigger: Trigger,
    lane: str | None,
    key: str,
    decision: dict[str, Any],
    idempotency_key: str | None,
    stream_after: int | None,
    give_back: Callable[[], None],
) -> Response:
    """The answer to an admission's verdict: a refusal as its ``Refusal`` says
    (tidegate.admission), else the run's. A sync caller that asked for server-sent events
    (``stream_after``: the last event it has seen) gets the run's progress as it happens,
    then its reply as the ``result`` event, in a stream that gives its place back
    (``give_back``) when it ends. ``lane`` is the fast lane's for a sync trigger, ``None``
    for an async one (its task's declared lane, chosen in admit_webhook: no refusal of an
    async webhook names a lane); ``key`` the run's key (``Trigger.key_of``)."""
    verdict = Verdict(decision["decision"])
    refusal = verdict.refusal
    if refusal is not None:
        detail = refusal.detail.format(
            key=key, task=trigger.task, lane=lane, idempotency_key=idempotency_key
        )
        kind = VERDICT_TYPES.get(verdict, refusal.status)
        if refusal.wait is None:
            return problem(kind, detail)
        wait = refusal.wait(decision["retry_after"])
        fields = LIMIT_FIELDS[refusal.limits](decision, 0, wait) if refusal.limits else {}
        extra: dict[str, Any] = (
            {"cap": decision["fast_lane_cap"]} if refusal.limits == "fast_lane" else {}
        )
        if verdict is Verdict.LANE_PAUSED:
            extra["lane"] = lane
        if refusal.limits and decision["retry_after"] is not None:
            # What the whole seconds of t and Retry-After round up: the due time, to the
            # millisecond (a parameter the draft's clients ignore).
            fields["RateLimit"] += f";due={max(decision['retry_after'], 0):.3f}"
        if decision["place"] is not None:
            fields[PLACE_FIELD] = place_field(
                decision["place"], decision["place_ahead"], decision["retry_after"]
            )
        return problem(kind, detail, {**fields, "Retry-After": str(wait)}, **extra)
    limits = _rate_limit_headers(decision)
    run_id = decision["run_id"]
    if verdict is Verdict.REPLAYED:
        limits = {"Idempotent-Replayed": "true"}
    if verdict is Verdict.DUPLICATE:
        limits = {DUPLICATE_FIELD: "true"}
    location = {"Location": f"/runs/{run_id}"}
    if trigger.mode == "async":
        return JSONResponse(
            {
                "run_id": run_id,
                "request_id": decision["request_id"],
                "status_url": f"/runs/{run_id}",
            },
            status_code=202,
            headers={**limits, **location},
        )
    if stream_after is not None:
        after = stream_after  # an int, for the closure

        def stream(gone: asyncio.Event) -> AsyncGenerator[bytes]:
            return events.run_events(
                ingress,
                run_id,
                FAST_LANE,
                after,
                _reply_event,
                gone,
                trigger.sync_timeout_seconds,
                _pending_event,
            )

        return events.EventStream(stream, {**limits, **location}, give_back)
    # A repeat or a duplicate waits for a run that may have ended: it looks first.
    run = await _wait_for(
        ingress, run_id, trigger.sync_timeout_seconds, look_first=verdict is not Verdict.ADMITTED
    )
    if run is None or not run.state.finished:
        return JSONResponse(
            {
                "run_id": run_id,
                "state": run.state if run else None,
                "status_url": f"/runs/{run_id}",
            },
            status_code=202,
            headers={**limits, **location},
        )
    return _reply(run, {**limits, **location})


async def _wait_for(ingress: Api, run_id: int, timeout: float, *, look_first: bool) -> Run | None:
    """Wait (LISTEN, never polling) until the run finishes or ``timeout`` passes."""
    loop_time = asyncio.get_running_loop().time
    deadline = loop_time() + timeout
    run = await ingress.run(get_run(run_id)) if look_first else None
    while run is None or not run.state.finished:
        remaining = deadline - loop_time()
        if remaining <= 0:
            break
        await ingress.completions.wait(run_id, remaining)
        run = await ingress.run(get_run(run_id))
    return run


def _reply_event(run: Run) -> bytes:
    """The last event of a sync caller's stream: what the plain answer would have been
    (status, the reply's own header fields, body), as JSON."""
    response = _reply(run, {})
    content = bytes(response.body)
    media = response.media_type or ""
    body: Any
    data: dict[str, Any] = {"run_id": run.id, "state": run.state, "status": response.status_code}
    if media.endswith("json") and content:
        body = json.loads(content)
    else:
        try:
            body = content.decode()
        except UnicodeDecodeError:
            body, data["body_base64"] = base64.b64encode(content).decode(), True
    framing = {"content-length", "content-type"}
    data["headers"] = {k: v for k, v in response.headers.items() if k not in framing}
    data["content_type"] = media or None
    data["body"] = body
    return events.sse("result", json.dumps(data), events.END_ID)


def _pending_event(run: Run) -> bytes:
    """The last event of a sync caller's stream when its run outlasts the trigger's sync
    timeout: where to look for the run (it goes on)."""
    data = {"run_id": run.id, "state": run.state, "status_url": f"/runs/{run.id}"}
    return events.sse("pending", json.dumps(data), events.END_ID)


def _reply(run: Run, headers: dict[str, str]) -> Response:
    """The sync caller's answer: the run's ``$reply`` if it has one (a failed run may:
    a forwarding run passes on the endpoint's failure), else its result, else 502."""
    result = run.result
    has_reply = isinstance(result, dict) and isinstance(result.get(REPLY_KEY), dict)
    if run.state is not RunState.SUCCEEDED and not has_reply:
        # The sender is not authenticated: it learns the run's id and state, not what
        # the handler's error said (the project sees that in GET /runs/{id}).
        return problem(502, f"the run ended {run.state}", headers, run_id=run.id, state=run.state)
    if has_reply:
        try:
            return _handler_reply(result[REPLY_KEY], headers)
        except ValueError as error:
            # The reply may carry what the sender sent (an echoed header, a status it
            # chose): a reply HTTP cannot carry is the handler's failure, not the server's.
            log.warning("run %d (task %s): its reply cannot be sent: %s", run.id, run.task, error)
            return problem(
                502, "the run's reply is not a valid HTTP response", headers, run_id=run.id
            )
    return JSONResponse(result, status_code=200, headers=headers)


def _handler_reply(reply: dict[str, Any], headers: dict[str, str]) -> Response:
    """The HTTP response a handler's ``$reply`` describes; ``ValueError`` if none can be.

    ``status`` a whole number from 200 to 599; ``headers`` an object of field names
    (RFC 9110 tokens) to values of visible Latin-1 text, none of the fields the server
    frames the response with (``content-length``, ``transfer-encoding``, ``connection``).
    A status that carries no content (204, 205, 304) goes without the reply's body, as
    HTTP requires: sent with one, the connection broke mid-response. A body that is
    bytes travels as base64 text with ``body_base64: true`` (tidegate.forward's results
    do), and goes out decoded.
    """
    status = reply.get("status", 200)
    if isinstance(status, bool) or not isinstance(status, int) or not 200 <= status <= 599:
        raise ValueError(f"status {str(status)[:40]!r} is not a whole number from 200 to 599")
    fields = reply.get("headers") or {}
    if not isinstance(fields, dict):
        raise ValueError("headers is not an object")
    extra = {}
    for name, value in fields.items():
        text = str(value)
        if not FIELD_NAME.fullmatch(name) or name.lower() in FRAMING_FIELDS:
            raise ValueError(f"{name[:40]!r} is not a header field a reply may set")
        if not FIELD_VALUE.fullmatch(text):
            raise ValueError(f"the value of {name!r} is not visible Latin-1 text")
        extra[name] = text
    body = reply.get("body")
    if status in NO_CONTENT:
        return Response(status_code=status, headers={**headers, **extra})
    if reply.get("body_base64") is True and isinstance(body, str):
        content, media = base64.b64decode(body, validate=True), "application/octet-stream"
    else:
        content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        media = "text/plain" if isinstance(body, str) else "application/json"
    return Response(content, status_code=status, headers={**headers, **extra}, media_type=media)


def _limit_fields(policy: str, quota: int, unit: str, remaining: int, reset: int) -> dict[str, str]:
    """The IETF draft's rate-limit fields, and the older ones for older clients."""
    return {
        "RateLimit-Policy": f'"{policy}";q={quota};qu="{unit}"',
        "RateLimit": f'"{policy}";r={remaining};t={reset}',
        "RateLimit-Limit": str(quota),
        "RateLimit-Remaining": str(remaining),
        "RateLimit-Reset": str(reset),
    }


def _fast_lane_headers(decision: Mapping[str, Any], remaining: int, reset: int) -> dict[str, str]:
    return _limit_fields(
        "fast_lane", decision["fast_lane_cap"], "concurrent-requests", remaining, reset
    )


def _ingest_headers(decision: Mapping[str, Any], remaining: int, reset: int) -> dict[str, str]:
    return _limit_fields("ingest", decision["ingest_burst"], "requests", remaining, reset)


LIMIT_FIELDS: dict[str, Callable[[Mapping[str, Any], int, int], dict[str, str]]] = {
    "ingest": _ingest_headers,
    "fast_lane": _fast_lane_headers,
}
"""The rate-limit fields a refusal carries (``Refusal.limits``), by the limit it names."""


def _rate_limit_headers(decision: Mapping[str, Any]) -> dict[str, str]:
    """The rate-limit fields of an admitted request: the fast lane's when it has one."""
    if decision["fast_lane_cap"] is not None:
        remaining = decision["fast_lane_remaining"]
        return _fast_lane_headers(
            decision, remaining, 0 if remaining > 0 else RETRY_AFTER_MIN_SECONDS
        )
    if decision["ingest_remaining"] is not None:
        remaining = decision["ingest_remaining"]
        return _ingest_headers(decision, remaining, 0 if remaining > 0 else RETRY_AFTER_MIN_SECONDS)
    return {}


async def _read_body(request: Request, limit: int) -> bytes:
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


async def _trigger(ingress: Api, token: str) -> Trigger | None:
    """Return the trigger of ``token``: from this process's cache if it was looked up
    less than ``TRIGGER_CACHE_SECONDS`` ago (one round trip per webhook, not two), else
    from the database. Unknown tokens are not kept: they cost a lookup each, as before."""
    now = time.monotonic()
    cached = ingress.triggers.get(token)
    if cached is not None and cached[0] > now:
        return cached[1]
    found = await ingress.run(find_trigger(token))
    if found is not None:
        if len(ingress.triggers) >= TRIGGER_CACHE_SIZE:
            ingress.triggers.clear()
        ingress.triggers[token] = (now + TRIGGER_CACHE_SECONDS, found)
    return found


def _admit(
    ingress: Api,
    trigger: Trigger,
    lane: str | None,
    key: str,
    payload: Any,
    body: bytes,
    headers: dict[str, str],
    content_type: str,
    idempotency_key: str | None,
    place: uuid.UUID | None,
) -> Steps[dict[str, Any]]:
    settings = ingress.settings
    unique = trigger.unique
    rows = yield Statement(
        "admit_webhook",
        {
            "trigger_id": trigger.id,
            "project": trigger.project,
            "lane": lane,
            "task": trigger.task,
            # Every per-key part of the admission (the breaker, the backlog cap) and the
            # run's clock and policies take this key: the one the webhook carries.
            "key": key,
            "args": json.dumps({"body": payload, "headers": headers, "trigger": trigger.name}),
            # A sync caller is waiting: it gets the first attempt's outcome, and retries
            # are its own to make. Async runs retry with backoff, as often as the task
            # declares (admit_webhook), else as often as the settings say.
            "max_attempts": 1 if lane == FAST_LANE else None,
            "default_max_attempts": settings.max_attempts,
            "idempotency_key": idempotency_key,
            "content_type": content_type,
            "headers": json.dumps(headers),
            "body": body,
            "default_fast_lane_cap": settings.fast_lane_cap,
            "live_seconds": 3 * settings.heartbeat_seconds,
            "channel": ingress.app.available_channel,
            "ticket": place,
            "place_grace": PLACE_GRACE_SECONDS,
            "max_places": MAX_PLACES,
            "unique_key": None if unique is None else trigger.unique_key(unique, payload, key),
            "unique_states": None if unique is None else list(unique.states),
        },
        dict_row,
    )
    return dict(rows[0])


def _nothing() -> None:
    pass
