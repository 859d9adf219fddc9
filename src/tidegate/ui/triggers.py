"""A trigger's webhook log, each request as it arrived, and its replay.

The log merges the admitted requests (``requests``) with those answered without a new
run (``request_log``: refused, or a repeat of an admitted one), newest first, a page
at a time on the keyset (received_at, kind, id). A project's session sees its own
triggers only: any other trigger id, or a request of another trigger, is a 404.

Replay enqueues a new run of the trigger's task with the args shaped exactly as
ingress shapes them (``{"body", "headers", "trigger"}``), with the project as key (or,
for a trigger with ``key_from``, the key the request carries, as ingress takes it), as
an async trigger's run: in the lane, priority and max_attempts its task's workers
declared (tidegate.tasks), else ``default``. A sync trigger's runs go to ``fast_lane``
because a caller waits for them, and nobody waits for a replay. Only a request that
passed ingress's checks of its own content can be replayed: one admitted, or refused by
the admission (a limit of the moment), its content type, JSON and signature checked
again, and its run key taken again (``_replayable``).
A request refused for its signature or its body, or whose body was kept truncated (the
run would get a body that was never sent), cannot.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Path, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from tidegate.access import Session
from tidegate.app import NewRun
from tidegate.errors import EnqueueError, InputError
from tidegate.limits import MAX_ID, parse_json, whole_number
from tidegate.runs import RunState
from tidegate.signatures import MisconfiguredSecret
from tidegate.ui.session import Current, api_of, check_csrf, rows
from tidegate.ui.templating import render
from tidegate.webhooks import REPLAYABLE, Invalid, KeyFrom, NoRunKey, validate

router = APIRouter(prefix="/ui", include_in_schema=False)
IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
Kind = Literal["admitted", "refused"]
PAGE = 50
SYNC_STATUS = {RunState.SUCCEEDED: 200, RunState.DISCARDED: 502, RunState.CANCELLED: 502}
"""What a sync caller got for a run in each finished state; 202 while it was running."""


async def _trigger(request: Request, session: Session, trigger_id: int) -> dict[str, Any]:
    """The trigger, if the session may see it; 404 otherwise."""
    found = await api_of(request).run(
        rows(
            "list_triggers",
            {"project": session.caller.project, "id": trigger_id, "after": None, "limit": None},
        )
    )
    if not found:
        raise HTTPException(404, f"no trigger {trigger_id}")
    return found[0]


def _keyset(raw: str | None) -> tuple[datetime | None, str | None, int | None]:
    """``before=<kind>.<id>.<received_at ISO 8601>``: the last row of the page before."""
    if not raw:
        return None, None, None
    kind, _, rest = raw.partition(".")
    number, _, moment = rest.partition(".")
    request_id = whole_number(number)
    try:
        if kind not in ("admitted", "refused") or request_id is None:
            raise ValueError
        return datetime.fromisoformat(moment), kind, request_id
    except ValueError:
        raise HTTPException(422, "before is not a position in this log") from None


@router.get("/triggers/{trigger_id}/log")
async def log(trigger_id: IdPath, request: Request, session: Current) -> HTMLResponse:
    trigger = await _trigger(request, session, trigger_id)
    before_at, before_kind, before_id = _keyset(request.query_params.get("before"))
    found = await api_of(request).run(
        rows(
            "read_trigger_log",
            {
                "trigger_id": trigger_id,
                "project": session.caller.project,
                "before_at": before_at,
                "before_kind": before_kind,
                "before_id": before_id,
                "limit": PAGE,
            },
        )
    )
    for row in found:
        if row["kind"] == "admitted":
            row["status"] = _admitted_status(trigger["mode"], row["run_state"])
            if trigger["mode"] == "sync" and row["run_state"]:
                row["outcome"] = f"admitted ({row['run_state']})"
    older = None
    if len(found) == PAGE:
        last = found[-1]
        position = f"{last['kind']}.{last['id']}.{last['received_at'].isoformat()}"
        older = f"/ui/triggers/{trigger_id}/log?" + urlencode({"before": position})
    here = request.url.path
    if before_at is not None:
        here += "?" + urlencode({"before": request.query_params["before"]})
    return render(
        request,
        "trigger_log.html",
        here=here,
        trigger=trigger,
        rows=found,
        older=older,
        older_than=before_at,
    )


def _admitted_status(mode: str, run_state: str | None) -> int:
    if mode == "async" or run_state is None:
        return 202
    return SYNC_STATUS.get(RunState(run_state), 202)


async def _entry(
    request: Request, session: Session, trigger_id: int, kind: str, request_id: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    trigger = await _trigger(request, session, trigger_id)
    found = await api_of(request).run(
        rows(
            "get_logged_request",
            {
                "kind": kind,
                "id": request_id,
                "trigger_id": trigger_id,
                "project": session.caller.project,
            },
        )
    )
    if not found:
        raise HTTPException(404, f"no request {request_id} in this log")
    entry = found[0]
    if entry["kind"] == "admitted":
        entry["status"] = 202 if trigger["mode"] == "async" else None
    return trigger, entry


def _payload(request: Request, entry: dict[str, Any]) -> Any:
    """The body as ingress parsed it; ``InputError`` when it is not JSON tidegate takes."""
    return parse_json(bytes(entry["body"]), "the body", api_of(request).settings.max_json_depth)


class NotReplayable(Exception):
    """Why a logged request cannot be replayed."""


def _replayable(
    request: Request, trigger: dict[str, Any], entry: dict[str, Any]
) -> tuple[Any, str]:
    """Return the body a replay of this request runs with and its run key, or raise
    ``NotReplayable``.

    A replay passes what the request passed when it arrived, checked again: only a
    request admitted, or refused by the admission (a limit, capacity, a breaker: a
    reason of the moment), qualifies; the trigger must be enabled; and its content type,
    JSON and signature must pass ``validate`` now, against the trigger's secret as it is
    now, at the time the request was received; a trigger with ``key_from`` must find
    its key in the request's body or kept headers, as ingress does. A request refused
    for its signature, or for what it holds, is never replayed into a run.
    """
    if entry["body_truncated"]:
        raise NotReplayable("only the start of its body was kept")
    if entry["kind"] == "refused" and entry["outcome"] not in REPLAYABLE:
        raise NotReplayable(
            f"it was refused for what it is ({entry['outcome']}), and would be again"
        )
    if not trigger["enabled"]:
        raise NotReplayable("the trigger is disabled")
    try:
        payload, _ = validate(
            trigger["secret"],
            entry["headers"],
            bytes(entry["body"]),
            api_of(request).settings.max_json_depth,
            now=entry["received_at"].timestamp(),
        )
    except MisconfiguredSecret:
        raise NotReplayable("the trigger's signing secret is not a valid one") from None
    except Invalid as invalid:
        raise NotReplayable(invalid.title) from None
    if trigger["key_from"] is None:
        return payload, trigger["project"]
    try:
        return payload, KeyFrom.parse(trigger["key_from"]).key(payload, entry["headers"].items())
    except NoRunKey as reason:
        raise NotReplayable(str(reason)) from None


@router.get("/triggers/{trigger_id}/log/{kind}/{request_id}")
async def logged_request(
    trigger_id: IdPath, kind: Kind, request_id: IdPath, request: Request, session: Current
) -> HTMLResponse:
    """A request as it arrived: headers, body (indented when it is JSON), and Replay."""
    trigger, entry = await _entry(request, session, trigger_id, kind, request_id)
    raw = bytes(entry["body"])
    try:
        body = json.dumps(_payload(request, entry), indent=2, ensure_ascii=False)
    except InputError:
        body = raw.decode("utf-8", errors="replace")
    why_not = ""
    try:
        _replayable(request, trigger, entry)
    except NotReplayable as reason:
        why_not = f"Cannot be replayed: {reason}."
    return render(
        request,
        "request.html",
        trigger=trigger,
        entry=entry,
        body=body,
        replayable=not why_not,
        why_not=why_not,
    )


@router.post("/triggers/{trigger_id}/log/{kind}/{request_id}/replay")
async def replay(
    trigger_id: IdPath, kind: Kind, request_id: IdPath, request: Request, session: Current
) -> RedirectResponse:
    """Enqueue a new run of the trigger's task from this request; go to the run's page."""
    await check_csrf(request, session)
    trigger, entry = await _entry(request, session, trigger_id, kind, request_id)
    try:
        payload, key = _replayable(request, trigger, entry)
    except NotReplayable as reason:
        raise HTTPException(409, f"cannot be replayed: {reason}") from None
    args = {"body": payload, "headers": entry["headers"], "trigger": trigger["name"]}
    api = api_of(request)
    new = NewRun(
        trigger["task"],
        args,
        project=trigger["project"],
        key=key,
    )
    try:
        runs = await api.run(api.app.enqueue_steps([new]))
    except EnqueueError as error:
        raise HTTPException(409, f"cannot be replayed: {error}") from None
    return RedirectResponse(f"/ui/runs/{runs[0].id}", status_code=303)
