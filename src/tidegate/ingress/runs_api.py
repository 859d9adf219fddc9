"""The runs API: look at runs, retry them, cancel them.

The super admin sees every run; a project's token sees that project's runs only (any
other run is answered 404, as if it did not exist). A single retry goes to the
``manual`` lane, a bulk retry to ``default`` (DESIGN.md, "Lanes").
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, Field

from tidegate.ingress.auth import Caller, require_caller
from tidegate.ingress.server import Ingress
from tidegate.runs import Run, RunState, run_row
from tidegate.storage.sql import Statement, Steps

router = APIRouter(prefix="/runs", tags=["runs"])
Authorized = Annotated[Caller, Depends(require_caller)]
MAX_BULK = 10_000


class BulkRetry(BaseModel):
    ids: list[int] = Field(min_length=1, max_length=MAX_BULK)


def _runs(name: str, params: dict[str, Any]) -> Steps[list[Run]]:
    return (yield Statement(name, params, run_row))


async def _visible(request: Request, caller: Caller, run_id: int) -> Run:
    ingress: Ingress = request.app.state.ingress
    found = await ingress.run(_runs("get_run", {"id": run_id}))
    if not found or not (caller.admin or found[0].project == caller.project):
        raise HTTPException(404, f"no run {run_id}")
    return found[0]


@router.get("/{run_id}")
async def get_run(run_id: int, request: Request, caller: Authorized) -> dict[str, Any]:
    """A run: state, lane, attempts, result, errors, timings."""
    return (await _visible(request, caller, run_id)).to_json()


@router.get("")
async def list_runs(
    request: Request,
    caller: Authorized,
    project: str | None = None,
    lane: str | None = None,
    state: RunState | None = None,
    task: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[dict[str, Any]]:
    """The newest runs matching every filter given."""
    if not caller.admin:
        if project not in (None, caller.project):
            raise HTTPException(403, "a project token lists its own project's runs only")
        project = caller.project
    params = {
        "project": project,
        "lane": lane,
        "state": state.value if state else None,
        "task": task,
        "limit": limit,
    }
    found = await request.app.state.ingress.run(_runs("list_runs", params))
    return [run.to_json() for run in found]


@router.post("/{run_id}/retry")
async def retry_run(run_id: int, request: Request, caller: Authorized) -> dict[str, Any]:
    """Run a finished run again, in the ``manual`` lane."""
    await _visible(request, caller, run_id)
    ingress: Ingress = request.app.state.ingress
    retried = await ingress.run(_runs("retry_run", _retry_params(ingress, [run_id], "manual")))
    if not retried:
        raise HTTPException(409, f"run {run_id} has not finished")
    return retried[0].to_json()


@router.post("/retry")
async def retry_runs(body: BulkRetry, request: Request, caller: Authorized) -> dict[str, Any]:
    """Run many finished runs again, in the ``default`` lane; unfinished ones are left."""
    ingress: Ingress = request.app.state.ingress
    ids = body.ids
    if not caller.admin:
        mine = await ingress.run(_runs("list_runs_by_id", {"ids": ids}))
        ids = [run.id for run in mine if run.project == caller.project]
    retried = await ingress.run(_runs("retry_run", _retry_params(ingress, ids, "default")))
    return {"retried": sorted(run.id for run in retried)}


@router.post("/{run_id}/cancel")
async def cancel_run(run_id: int, request: Request, caller: Authorized) -> dict[str, Any]:
    """Cancel a run that has not finished (a running attempt is not interrupted)."""
    await _visible(request, caller, run_id)
    ingress: Ingress = request.app.state.ingress
    params = {"id": run_id, "completed_channel": ingress.app.completed_channel}
    cancelled = await ingress.run(_runs("cancel_run", params))
    if not cancelled:
        raise HTTPException(409, f"run {run_id} has finished already")
    return cancelled[0].to_json()


def _retry_params(ingress: Ingress, ids: list[int], lane: str) -> dict[str, Any]:
    return {"ids": ids, "lane": lane, "channel": ingress.app.available_channel}
