"""Projects and their triggers: what the super admin manages (admin API and CLI).

A *project* is a tenant and the unit of admission policy: its fast-lane cap, its
concurrency, its ingest rate and burst, its backlog cap. A *trigger* is one webhook
endpoint of a project: an unguessable token in its URL, a mode (``async``: acknowledge
once durable; ``sync``: reply with the run's result), the task it runs, an optional
Standard Webhooks signing secret, a body size limit and a sync timeout.

Each operation is written once as ``Steps`` and run on a sync or an async connection.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tidegate.errors import TidegateError
from tidegate.storage.sql import Statement, Steps

PROJECT_LIMITS = ("fast_lane_cap", "concurrency", "ingest_rate", "ingest_burst", "backlog_cap")
TRIGGER_FIELDS = ("mode", "task", "secret", "max_body_bytes", "sync_timeout_seconds", "enabled")


class AdminError(TidegateError, ValueError):
    """A project or trigger change was refused; the message says which value and why."""


class NotFoundError(TidegateError, LookupError):
    """The project or trigger named does not exist."""


class ConflictError(AdminError):
    """A project or trigger with this name exists already."""


def hash_token(token: str) -> str:
    """Return the stored form of an API token (sha256, hex)."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str) -> str:
    """Return a new unguessable token (256 bits of randomness)."""
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def create_project(project_id: str, **limits: Any) -> Steps[dict[str, Any]]:
    """Create a project; its API token is in the result, and shown only this once."""
    _check_limits(limits)
    token = new_token("tgp")
    params: dict[str, Any] = {"id": project_id, "token_hash": hash_token(token)}
    params.update({name: limits.get(name) for name in PROJECT_LIMITS})
    rows = yield Statement("insert_project", params, dict_row)
    return {**rows[0], "token": token}


def update_project(project_id: str, **changes: Any) -> Steps[dict[str, Any]]:
    """Change some limits of a project (``None`` clears one); effective for the next request."""
    _check_limits(changes)
    patch = {name: value for name, value in changes.items() if name in PROJECT_LIMITS}
    rows = yield Statement(
        "update_project", {"id": project_id, "patch": json.dumps(patch)}, dict_row
    )
    if not rows:
        raise NotFoundError(f"no project {project_id!r}")
    return dict(rows[0])


def list_projects(project_id: str | None = None) -> Steps[list[dict[str, Any]]]:
    rows = yield Statement("list_projects", {"id": project_id}, dict_row)
    return [dict(row) for row in rows]


def create_trigger(
    project_id: str, name: str, *, mode: str, task: str, **options: Any
) -> Steps[dict[str, Any]]:
    """Create a trigger of a project; its URL token is in the result."""
    _check_trigger({"mode": mode, "task": task, **options})
    params: dict[str, Any] = {
        "project": project_id,
        "name": name,
        "mode": mode,
        "task": task,
        "token": new_token("tgh"),
    }
    params.update({field: options.get(field) for field in TRIGGER_FIELDS if field not in params})
    rows = yield Statement("insert_trigger", params, dict_row)
    return dict(rows[0])


def update_trigger(trigger_id: int, **changes: Any) -> Steps[dict[str, Any]]:
    _check_trigger(changes)
    patch = {name: value for name, value in changes.items() if name in TRIGGER_FIELDS}
    rows = yield Statement(
        "update_trigger", {"id": trigger_id, "patch": json.dumps(patch)}, dict_row
    )
    if not rows:
        raise NotFoundError(f"no trigger {trigger_id}")
    return dict(rows[0])


def list_triggers(
    project_id: str | None = None, trigger_id: int | None = None
) -> Steps[list[dict[str, Any]]]:
    rows = yield Statement("list_triggers", {"project": project_id, "id": trigger_id}, dict_row)
    return [dict(row) for row in rows]


def domain_error(error: psycopg.Error) -> TidegateError:
    """Turn a constraint violation into the error a caller can act on."""
    constraint = getattr(error.diag, "constraint_name", None) or ""
    messages = {
        "projects_pkey": "a project with this id exists already",
        "projects_id_format": "project id must match [A-Za-z0-9_.-]{1,64}",
        "triggers_name_unique": "a trigger with this name exists already in this project",
        "triggers_project_fkey": "no such project",
        "triggers_mode_valid": "mode must be 'async' or 'sync'",
        "triggers_max_body_range": "max_body_bytes must be 1 to 104857600",
        "triggers_sync_timeout_range": "sync_timeout_seconds must be > 0",
    }
    if constraint == "triggers_project_fkey":
        return NotFoundError(messages[constraint])
    if constraint in ("projects_pkey", "triggers_name_unique"):
        return ConflictError(messages[constraint])
    if constraint in messages:
        return AdminError(messages[constraint])
    if constraint.startswith("projects_") and constraint.endswith("_range"):
        limit = constraint.removeprefix("projects_").removesuffix("_range")
        return AdminError(f"{limit} is out of range")
    raise error


def _check_limits(limits: dict[str, Any]) -> None:
    unknown = set(limits) - set(PROJECT_LIMITS)
    if unknown:
        raise AdminError(
            f"unknown project limit(s) {sorted(unknown)}; known: {list(PROJECT_LIMITS)}"
        )
    for name, value in limits.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise AdminError(f"{name} must be a number, got {value!r}")


def _check_trigger(fields: dict[str, Any]) -> None:
    unknown = set(fields) - set(TRIGGER_FIELDS)
    if unknown:
        raise AdminError(
            f"unknown trigger field(s) {sorted(unknown)}; known: {list(TRIGGER_FIELDS)}"
        )
    if fields.get("mode") not in (None, "async", "sync"):
        raise AdminError(f"mode must be 'async' or 'sync', got {fields['mode']!r}")
    secret = fields.get("secret")
    if secret is not None and not str(secret).startswith("whsec_"):
        raise AdminError("secret must be a Standard Webhooks secret: 'whsec_' + base64")
