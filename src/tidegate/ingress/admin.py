"""The admin API (super admin only): projects, their limits, and their triggers.

A change to a project's limits holds for the next request: admission reads the
project's row inside every admission transaction, nothing is cached.
"""

from __future__ import annotations

from typing import Any, Literal

import psycopg
from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, Field

from tidegate.ingress.auth import require_admin
from tidegate.ingress.server import Ingress
from tidegate.policies import PolicyError, clear_key_policy, list_key_policies, set_key_policy
from tidegate.projects import (
    AdminError,
    ConflictError,
    NotFoundError,
    create_project,
    create_trigger,
    domain_error,
    list_projects,
    list_triggers,
    update_project,
    update_trigger,
)
from tidegate.storage.sql import Steps

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)])
PROJECT_ID = r"^[A-Za-z0-9_.-]{1,64}$"


class ProjectLimits(BaseModel):
    fast_lane_cap: int | None = Field(
        None, ge=0, description="in-flight fast-lane runs; null: the server default"
    )
    concurrency: int | None = Field(None, ge=1, description="in-flight runs outside the fast lane")
    ingest_rate: float | None = Field(
        None, gt=0, description="webhooks per second; null: unlimited"
    )
    ingest_burst: int | None = Field(
        None, ge=1, description="webhooks allowed at once above the rate"
    )
    backlog_cap: int | None = Field(None, ge=0, description="ready runs per lane; null: unlimited")


class NewProject(ProjectLimits):
    id: str = Field(pattern=PROJECT_ID)


class TriggerFields(BaseModel):
    mode: Literal["async", "sync"] | None = None
    task: str | None = Field(None, min_length=1)
    secret: str | None = Field(None, pattern=r"^whsec_[A-Za-z0-9+/=]+$")
    max_body_bytes: int | None = Field(None, ge=1, le=104_857_600)
    sync_timeout_seconds: float | None = Field(None, gt=0, le=3600)
    enabled: bool | None = None


class NewTrigger(TriggerFields):
    name: str = Field(pattern=PROJECT_ID)
    mode: Literal["async", "sync"]
    task: str = Field(min_length=1)


async def _apply(request: Request, steps: Steps[Any]) -> Any:
    ingress: Ingress = request.app.state.ingress
    try:
        return await ingress.run(steps)
    except psycopg.errors.IntegrityError as error:
        raise _http(domain_error(error)) from None
    except (AdminError, NotFoundError, PolicyError) as error:
        raise _http(error) from None


def _http(error: Exception) -> HTTPException:
    if isinstance(error, NotFoundError):
        return HTTPException(404, str(error))
    if isinstance(error, ConflictError):
        return HTTPException(409, str(error))
    return HTTPException(422, str(error))


def _with_url(trigger: dict[str, Any]) -> dict[str, Any]:
    return {**trigger, "url": f"/hooks/{trigger['token']}"}


@router.post("/projects", status_code=201)
async def post_project(body: NewProject, request: Request) -> dict[str, Any]:
    """Create a project; the response holds its API token, shown only this once."""
    limits = body.model_dump(exclude={"id"}, exclude_unset=True)
    return await _apply(request, create_project(body.id, **limits))  # type: ignore[no-any-return]


@router.get("/projects")
async def get_projects(request: Request) -> list[dict[str, Any]]:
    return await _apply(request, list_projects())  # type: ignore[no-any-return]


@router.get("/projects/{project_id}")
async def get_project(project_id: str, request: Request) -> dict[str, Any]:
    found = await _apply(request, list_projects(project_id))
    if not found:
        raise HTTPException(404, f"no project {project_id!r}")
    return found[0]  # type: ignore[no-any-return]


@router.patch("/projects/{project_id}")
async def patch_project(project_id: str, body: ProjectLimits, request: Request) -> dict[str, Any]:
    """Change limits (only the fields sent; null clears one). Holds for the next request."""
    changes = body.model_dump(exclude_unset=True)
    return await _apply(request, update_project(project_id, **changes))  # type: ignore[no-any-return]


@router.post("/projects/{project_id}/triggers", status_code=201)
async def post_trigger(project_id: str, body: NewTrigger, request: Request) -> dict[str, Any]:
    """Create a trigger; ``url`` is where its webhooks go."""
    fields = body.model_dump(exclude={"name", "mode", "task"}, exclude_unset=True)
    created = await _apply(
        request, create_trigger(project_id, body.name, mode=body.mode, task=body.task, **fields)
    )
    return _with_url(created)


@router.get("/projects/{project_id}/triggers")
async def get_triggers(project_id: str, request: Request) -> list[dict[str, Any]]:
    return [_with_url(t) for t in await _apply(request, list_triggers(project_id))]


@router.patch("/triggers/{trigger_id}")
async def patch_trigger(trigger_id: int, body: TriggerFields, request: Request) -> dict[str, Any]:
    changes = body.model_dump(exclude_unset=True)
    return _with_url(await _apply(request, update_trigger(trigger_id, **changes)))


class KeyPolicy(BaseModel):
    max_running: int | None = Field(
        None, ge=0, description="the key's runs in flight; null: no limit"
    )
    weight: float | None = Field(None, gt=0, description="the key's share of claims (default 1)")
    rate: float | None = Field(None, gt=0, description="runs started per second; null: no limit")
    rate_burst: int | None = Field(None, ge=1, description="starts at once above the rate")


@router.put("/lanes/{lane}/keys/{key}")
async def put_key_policy(lane: str, key: str, body: KeyPolicy, request: Request) -> dict[str, Any]:
    """Set a key's policy in a lane (key ``*``: the lane's default); the next claim sees it."""
    return await _apply(request, set_key_policy(lane, key, **body.model_dump(exclude_unset=True)))  # type: ignore[no-any-return]


@router.get("/lanes/{lane}/keys")
async def get_key_policies(lane: str, request: Request) -> list[dict[str, Any]]:
    return await _apply(request, list_key_policies(lane))  # type: ignore[no-any-return]


@router.delete("/lanes/{lane}/keys/{key}", status_code=204)
async def delete_key_policy(lane: str, key: str, request: Request) -> None:
    if not await _apply(request, clear_key_policy(lane, key)):
        raise HTTPException(404, f"no policy for key {key!r} in lane {lane!r}")
