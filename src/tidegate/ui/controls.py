"""The dashboard's changes to limits: a key's policy, a key's circuit breaker, a
schedule's pause.

Each runs the admin API's own step (``tidegate.policies.set_key_policy``,
``clear_key_policy``, ``force_breaker``; ``tidegate.schedules.update_schedule``), so the
dashboard, ``PUT /admin/lanes/{lane}/keys/{key}``, ``PUT
/admin/lanes/{lane}/breakers/{key}``, ``PATCH /admin/projects/{id}/schedules/{name}``
and the CLI check the same bounds and change the same rows. They are the super admin's,
as in the admin API: a project's session gets 404 for every page and form here, and its
pages show no link to them.

A change that stops work or loses settings is confirmed first, as Cancel is: the
breaker's page says what forcing it open does before its button does it, and clearing a
policy has a page of its own. Editing a policy is its own form; pausing or resuming a
schedule is a button, as pausing a lane is (undone by the other button).
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from tidegate.access import Session
from tidegate.errors import InputError
from tidegate.limits import POLICY_BOUNDS, check_lane, check_text
from tidegate.policies import PolicyError, clear_key_policy, force_breaker, set_key_policy
from tidegate.projects import NotFoundError
from tidegate.schedules import update_schedule
from tidegate.ui.session import Current, api_of, check_csrf, rows
from tidegate.ui.templating import render

router = APIRouter(prefix="/ui", include_in_schema=False)

EDITED = ("max_running", "weight", "rate", "rate_burst")
"""The policy fields the dashboard's form edits; the breaker's own fields stay with the
CLI and the admin API (``tidegate keys set``), which the form leaves as they are."""
ORDERED = {"": None, "yes": True, "no": False}
"""The form's choices for strict order: the lane's default (none of its own), or on, or
off for this key whatever the default says; anything else is no value."""
FORCES = {"open": "open", "closed": "closed", "auto": None}
"""The breaker page's buttons and what each asks of ``force_breaker`` (auto: back to
its policy)."""
MAX_NUMBER_CHARS = 32
"""Longer than any number a policy field holds: not parsed."""


def _admin_only(session: Session) -> None:
    if not session.caller.admin:
        raise HTTPException(404, "the super admin's page")


def _lane_and_key(values: Any) -> tuple[str, str]:
    """The ``lane`` and ``key`` of a query or a form, checked (422 when malformed)."""
    lane, key = values.get("lane", ""), values.get("key", "")
    try:
        check_lane(lane)
        check_text(key, "key")
    except InputError as error:
        raise HTTPException(422, str(error)) from None
    return lane, key


def _number(name: str, text: str) -> float | None:
    """A policy field of the form: empty is no value (the lane's default applies)."""
    text = text.strip()
    if not text:
        return None
    try:
        if len(text) > MAX_NUMBER_CHARS:
            raise ValueError
        value = float(text)
        if not math.isfinite(value):
            raise ValueError
    except ValueError:
        raise HTTPException(422, f"{name} must be {POLICY_BOUNDS[name]}, got {text!r}") from None
    return value


@router.get("/keys/policy")
async def policy_form(request: Request, session: Current) -> HTMLResponse:
    """The form to change a key's policy in a lane, filled with its own values."""
    _admin_only(session)
    lane, key = _lane_and_key(request.query_params)
    found = await api_of(request).run(rows("find_key_policy", {"lane": lane, "key": key}))
    return render(
        request,
        "policy.html",
        lane=lane,
        key=key,
        policy=found[0] if found else None,
        fields=EDITED,
        bounds=POLICY_BOUNDS,
        action="edit",
    )


@router.post("/keys/policy")
async def set_policy(request: Request, session: Current) -> RedirectResponse:
    """Set the form's fields of the key's policy, as ``PUT /admin/lanes/{lane}/keys/{key}``
    does; an empty field clears that field (the lane's default applies)."""
    _admin_only(session)
    form = await check_csrf(request, session)
    lane, key = _lane_and_key(form)
    fields: dict[str, Any] = {name: _number(name, form.get(name, "")) for name in EDITED}
    fields["ordered"] = ORDERED.get(str(form.get("ordered", "")))
    try:
        await api_of(request).run(set_key_policy(lane, key, **fields))
    except PolicyError as error:
        raise HTTPException(422, str(error)) from None
    return RedirectResponse("/ui/keys", status_code=303)


@router.get("/keys/policy/clear")
async def confirm_clear(request: Request, session: Current) -> HTMLResponse:
    """Say what clearing the key's policy does, with the button that does it."""
    _admin_only(session)
    lane, key = _lane_and_key(request.query_params)
    found = await api_of(request).run(rows("find_key_policy", {"lane": lane, "key": key}))
    if not found:
        raise HTTPException(404, f"no policy for key {key!r} in lane {lane!r}")
    return render(
        request,
        "policy.html",
        lane=lane,
        key=key,
        policy=found[0],
        fields=EDITED,
        bounds=POLICY_BOUNDS,
        action="clear",
    )


@router.post("/keys/policy/clear")
async def clear_policy(request: Request, session: Current) -> RedirectResponse:
    """Remove the key's policy, as ``DELETE /admin/lanes/{lane}/keys/{key}`` does."""
    _admin_only(session)
    form = await check_csrf(request, session)
    lane, key = _lane_and_key(form)
    if not await api_of(request).run(clear_key_policy(lane, key)):
        raise HTTPException(404, f"no policy for key {key!r} in lane {lane!r}")
    return RedirectResponse("/ui/keys", status_code=303)


@router.get("/keys/breaker")
async def breaker_page(request: Request, session: Current) -> HTMLResponse:
    """The key's circuit breaker as it stands, and what each way of forcing it does,
    each with its button (the confirmation: nothing changes until one is pressed)."""
    _admin_only(session)
    lane, key = _lane_and_key(request.query_params)
    found = await api_of(request).run(rows("find_breaker", {"lane": lane, "key": key}))
    return render(request, "breaker.html", lane=lane, key=key, breaker=found[0] if found else None)


@router.post("/keys/breaker")
async def set_breaker(request: Request, session: Current) -> RedirectResponse:
    """Force the key's breaker open or closed, or hand it back to its policy (auto), as
    ``PUT /admin/lanes/{lane}/breakers/{key}`` does."""
    _admin_only(session)
    form = await check_csrf(request, session)
    lane, key = _lane_and_key(form)
    force = form.get("force", "")
    if force not in FORCES:
        raise HTTPException(422, f"force must be one of {list(FORCES)}, got {force[:20]!r}")
    try:
        await api_of(request).run(force_breaker(lane, key, FORCES[force]))
    except PolicyError as error:
        raise HTTPException(422, str(error)) from None
    return RedirectResponse("/ui/keys/breaker?" + _query(lane, key), status_code=303)


def _query(lane: str, key: str) -> str:
    return urlencode({"lane": lane, "key": key})


async def _pause_schedule(request: Request, session: Session, paused: bool) -> RedirectResponse:
    _admin_only(session)
    form = await check_csrf(request, session)
    project, name = form.get("project", ""), form.get("name", "")
    try:
        await api_of(request).run(update_schedule(project, name, paused=paused))
    except NotFoundError as error:
        raise HTTPException(404, str(error)) from None
    except InputError as error:
        raise HTTPException(422, str(error)) from None
    return RedirectResponse("/ui/schedules", status_code=303)


@router.post("/schedules/pause")
async def pause_schedule(request: Request, session: Current) -> RedirectResponse:
    """Pause the form's schedule (``project``, ``name``): no runs until it is resumed, as
    ``tidegate schedules pause`` does."""
    return await _pause_schedule(request, session, paused=True)


@router.post("/schedules/resume")
async def resume_schedule(request: Request, session: Current) -> RedirectResponse:
    """Resume the form's schedule from its first tick after now, as ``tidegate schedules
    resume`` does."""
    return await _pause_schedule(request, session, paused=False)
