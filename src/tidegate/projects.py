"""Projects and their triggers: what the super admin manages (admin API and CLI).

A *project* is a tenant and the unit of admission policy: its fast-lane cap, its
concurrency, its ingest rate and burst, its backlog cap. A *trigger* is one webhook
endpoint of a project: an unguessable token in its URL, a mode (``async``: acknowledge
once durable; ``sync``: reply with the run's result), the task it runs, an optional
Standard Webhooks signing secret, a body size limit and a sync timeout. A trigger with
a ``forward_url`` delivers its webhooks there (task ``tidegate.forward``, ``forward.py``).
A trigger with ``key_from`` keys each run by a field of the webhook's body or one of its
headers (``tidegate.webhooks.KeyFrom``); a forwarding trigger's runs keep their
destination's key.

Each operation is written once as ``Steps`` and run on a sync or an async connection.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Collection
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tidegate import forward
from tidegate.errors import InputError, TidegateError
from tidegate.lanes import FAST_LANE
from tidegate.limits import (
    PROJECT_BOUNDS,
    TRIGGER_BOUNDS,
    check_identifier,
    check_numbers,
    check_text,
)
from tidegate.runs import read_states
from tidegate.signatures import check_secret
from tidegate.storage.sql import Statement, Steps
from tidegate.unique import Unique
from tidegate.webhooks import KeyFrom

DEFAULT_PROJECT = "default"
PROJECT_LIMITS = tuple(PROJECT_BOUNDS)
"""A project's limits, each bounded by ``tidegate.limits.PROJECT_BOUNDS``."""
TRIGGER_FIELDS = (
    "mode",
    "task",
    "secret",
    "max_body_bytes",
    "sync_timeout_seconds",
    "enabled",
    "forward_url",
    "forward_method",
    "forward_headers",
    "forward_timeout_seconds",
    "forward_secret",
    "breaker_key",
    "unique_period",
    "unique_args",
    "unique_states",
    "key_from",
)
MAX_UNIQUE_ARGS = 32
"""The most fields of a body a unique trigger's webhooks are alike by (the CHECK
triggers_unique_args_range)."""


class AdminError(InputError):
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


TOKEN_CHARS = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""What ``new_token`` writes (a prefix and URL-safe base64), with room to spare."""


def create_project(project_id: str, **limits: Any) -> Steps[dict[str, Any]]:
    """Create a project; its API token is in the result, and shown only this once.

    The id ``default`` is reserved: it is where the library enqueues runs without a
    project, and a token for it would see them all.
    """
    try:
        check_identifier(project_id, "project id")
    except InputError as error:
        raise AdminError(str(error)) from None
    if project_id == DEFAULT_PROJECT:
        raise ConflictError(
            f"project id {DEFAULT_PROJECT!r} is reserved: the library enqueues runs there"
        )
    limits = _check_limits(limits)
    token = new_token("tgp")
    params: dict[str, Any] = {"id": project_id, "token_hash": hash_token(token)}
    params.update({name: limits.get(name) for name in PROJECT_LIMITS})
    rows = yield Statement("insert_project", params, dict_row)
    return {**rows[0], "token": token}


def update_project(project_id: str, **changes: Any) -> Steps[dict[str, Any]]:
    """Change some limits of a project (``None`` clears one); effective for the next request."""
    changes = _check_limits(changes)
    patch = {name: value for name, value in changes.items() if name in PROJECT_LIMITS}
    rows = yield Statement(
        "update_project", {"id": project_id, "patch": json.dumps(patch)}, dict_row
    )
    if not rows:
        raise NotFoundError(f"no project {project_id!r}")
    return dict(rows[0])


def rotate_project_token(project_id: str) -> Steps[dict[str, Any]]:
    """Give a project a new API token; the result holds it, shown only this once.

    The old token is refused from the next request on, in every API process, and the
    dashboard sessions opened with it end.
    """
    token = new_token("tgp")
    rows = yield Statement(
        "rotate_project_token", {"id": project_id, "token_hash": hash_token(token)}, dict_row
    )
    if not rows:
        raise NotFoundError(f"no project {project_id!r}")
    return {**rows[0], "token": token}


def list_projects(
    project_id: str | None = None, *, after: str | None = None, limit: int | None = None
) -> Steps[list[dict[str, Any]]]:
    """Projects in id order: after the id ``after``, at most ``limit`` (``None``: all)."""
    params = {"id": project_id, "after": after, "limit": limit}
    rows = yield Statement("list_projects", params, dict_row)
    return [dict(row) for row in rows]


def create_trigger(
    project_id: str,
    name: str,
    *,
    mode: str,
    task: str | None = None,
    own_addresses: Collection[tuple[str, int]] = (),
    **options: Any,
) -> Steps[dict[str, Any]]:
    """Create a trigger of a project; its URL token is in the result.

    ``task`` may be left out when the trigger forwards (``forward_url``): it is
    ``tidegate.forward`` then, and no other task is allowed. A ``forward_url`` that is a
    hook of this tidegate is refused (``check_no_loop``, with ``own_addresses``).
    """
    try:
        check_identifier(name, "trigger name")
    except InputError as error:
        raise AdminError(str(error)) from None
    if task is None and options.get("forward_url") is not None:
        task = forward.FORWARD_TASK
    if task is None:
        raise AdminError("a trigger needs a task, or a forward_url")
    options = _check_trigger({"mode": mode, "task": task, **options})
    if options.get("forward_url") is not None:
        yield from check_no_loop(options["forward_url"], own_addresses)
    params: dict[str, Any] = {
        "project": project_id,
        "name": name,
        "mode": mode,
        "task": task,
        "token": new_token("tgh"),
    }
    params.update({field: options.get(field) for field in TRIGGER_FIELDS if field not in params})
    rows = yield Statement("insert_trigger", params, dict_row)
    return shown_trigger(rows[0])


def trigger_warnings(trigger: dict[str, Any], live_seconds: float) -> Steps[list[str]]:
    """Say what is wrong with a trigger that is not an error: no live worker (one that
    beat within ``live_seconds``) has its task for the lane its webhooks take.

    A fleet may be mid-deploy, so the trigger is made all the same; but a typo in a
    task's name would otherwise only show once webhooks wait (async) or are refused
    (sync). The admin API and ``tidegate triggers`` show these.
    """
    given = FAST_LANE if trigger["mode"] == "sync" else None  # None: the task's declared
    params = {"lanes": [given], "tasks": [trigger["task"]], "live_seconds": live_seconds}
    [(lane, _, has_worker, _, _)] = yield Statement("find_task_workers", params)
    if has_worker:
        return []
    waits = "are refused (503)" if lane == FAST_LANE else "wait"
    return [
        f"no live worker has task {trigger['task']!r} for lane {lane!r}: its webhooks "
        f"{waits} until one starts"
    ]


def update_trigger(
    trigger_id: int, own_addresses: Collection[tuple[str, int]] = (), **changes: Any
) -> Steps[dict[str, Any]]:
    """Change the fields given; a ``forward_url`` makes the task ``tidegate.forward``.

    Clearing the ``forward_url`` (``None``) needs the task the webhooks go to instead. A
    ``forward_url`` that is a hook of this tidegate is refused, as ``create_trigger`` does.
    """
    if changes.get("forward_url") is not None:
        changes.setdefault("task", forward.FORWARD_TASK)
    elif "forward_url" in changes and changes.get("task") in (None, forward.FORWARD_TASK):
        raise AdminError("clearing forward_url needs the task the webhooks go to instead")
    changes = _check_trigger(changes)
    if changes.get("forward_url") is not None:
        yield from check_no_loop(changes["forward_url"], own_addresses)
    if "unique_period" in changes and changes["unique_period"] is None:
        # Not unique any more: what said how goes too (triggers_unique_needs_period).
        changes.update(unique_args=None, unique_states=None)
    patch = {name: value for name, value in changes.items() if name in TRIGGER_FIELDS}
    rows = yield Statement(
        "update_trigger", {"id": trigger_id, "patch": json.dumps(patch)}, dict_row
    )
    if not rows:
        raise NotFoundError(f"no trigger {trigger_id}")
    return shown_trigger(rows[0])


def rotate_trigger_token(project_id: str, name: str) -> Steps[dict[str, Any]]:
    """Give trigger ``name`` of a project a new URL token (in the result): its old URL
    finds no trigger, at once in the API process that rotates it and within
    ``TRIGGER_CACHE_SECONDS`` (a second) in the others."""
    rows = yield Statement(
        "rotate_trigger_token",
        {"project": project_id, "name": name, "token": new_token("tgh")},
        dict_row,
    )
    if not rows:
        raise NotFoundError(f"no trigger {name!r} in project {project_id!r}")
    return shown_trigger(rows[0])


def check_no_loop(url: str, own_addresses: Collection[tuple[str, int]]) -> Steps[None]:
    """Raise ``AdminError`` when ``url`` is a hook of this tidegate: its webhooks would
    be forwarded back in, each delivery a new webhook, for ever.

    Refused: the URL of any trigger of this database, whatever the host it names (a
    proxy, another name of this machine), the trigger's own included; and any
    ``/hooks/`` path on one of ``own_addresses`` (where the server is reached).
    """
    token = forward.hook_token(url)
    if token is None:
        return
    found = []
    if TOKEN_CHARS.fullmatch(token):
        found = yield Statement("find_trigger", {"token": token}, dict_row)
    if found:
        raise AdminError(
            f"forward_url is the URL of trigger {found[0]['name']!r} of project "
            f"{found[0]['project']!r}: forwarding there would loop"
        )
    if forward.address_of(url) in own_addresses:
        raise AdminError("forward_url is a /hooks/ URL of this server: forwarding there would loop")


def list_triggers(
    project_id: str | None = None,
    trigger_id: int | None = None,
    *,
    after: int | None = None,
    limit: int | None = None,
) -> Steps[list[dict[str, Any]]]:
    """Triggers in id order: after the id ``after``, at most ``limit`` (``None``: all)."""
    params = {"project": project_id, "id": trigger_id, "after": after, "limit": limit}
    rows = yield Statement("list_triggers", params, dict_row)
    return [shown_trigger(row) for row in rows]


def shown_trigger(row: dict[str, Any]) -> dict[str, Any]:
    """Return a trigger as the admin API and CLI show it.

    The forward secret signs what tidegate sends: it is a credential toward the
    endpoint, so only whether one is set is shown. The breaker key shown is the one in
    force: the one given, else the forward URL's destination.
    """
    shown = dict(row)
    shown["forward_secret_set"] = shown.pop("forward_secret", None) is not None
    if shown.get("forward_url") is not None and shown.get("breaker_key") is None:
        shown["breaker_key"] = forward.breaker_key_of(shown["forward_url"])
    if shown.get("unique_states") is not None:
        shown["unique_states"] = list(read_states(shown["unique_states"]))
    return shown


def domain_error(error: psycopg.Error) -> TidegateError:
    """Turn a constraint violation into the error a caller can act on."""
    constraint = getattr(error.diag, "constraint_name", None) or ""
    messages = {
        "projects_pkey": "a project with this id exists already",
        "projects_id_format": "project id must match [A-Za-z0-9_.-]{1,64}",
        "triggers_name_unique": "a trigger with this name exists already in this project",
        "triggers_project_fkey": "no such project",
        "triggers_mode_valid": "mode must be 'async' or 'sync'",
        "triggers_max_body_range": f"max_body_bytes must be {TRIGGER_BOUNDS['max_body_bytes']}",
        "triggers_sync_timeout_range": (
            f"sync_timeout_seconds must be {TRIGGER_BOUNDS['sync_timeout_seconds']}"
        ),
        "triggers_forward_task": "a trigger with a forward_url runs task 'tidegate.forward'",
        "triggers_forward_url_valid": "forward_url must be an http(s) URL",
        "triggers_forward_method_valid": "forward_method must be POST, PUT or PATCH",
        "triggers_forward_headers_range": "forward_headers holds at most 32 names",
        "triggers_forward_timeout_range": (
            f"forward_timeout_seconds must be {TRIGGER_BOUNDS['forward_timeout_seconds']}"
        ),
        "triggers_breaker_key_range": "breaker_key must be 1 to 255 characters",
        "triggers_unique_args_range": f"unique_args holds at most {MAX_UNIQUE_ARGS} names",
        "triggers_unique_needs_period": "unique_args and unique_states need a unique_period",
        "triggers_key_from_valid": (
            "key_from must be a JSON pointer (/field/0/name) or header:Header-Name"
        ),
        "triggers_key_from_not_forwarding": (
            "a forwarding trigger's runs are keyed by their destination (breaker_key): "
            "key_from must be null while forward_url is set"
        ),
        "schedules_name_unique": "a schedule with this name exists already in this project",
        "worker_tokens_pkey": "a worker token with this name exists already",
    }
    if constraint == "triggers_project_fkey":
        return NotFoundError(messages[constraint])
    if constraint in (
        "projects_pkey",
        "triggers_name_unique",
        "schedules_name_unique",
        "worker_tokens_pkey",
    ):
        return ConflictError(messages[constraint])
    if constraint in messages:
        return AdminError(messages[constraint])
    if constraint.startswith("projects_") and constraint.endswith("_range"):
        limit = constraint.removeprefix("projects_").removesuffix("_range")
        bound = PROJECT_BOUNDS.get(limit)
        return AdminError(f"{limit} must be {bound}" if bound else f"{limit} is out of range")
    if error.sqlstate == "23502":  # not_null_violation: a value the checks let through
        return AdminError(f"{getattr(error.diag, 'column_name', None) or 'a field'} must be given")
    if error.sqlstate == "23514":  # check_violation of a constraint named nowhere above
        return AdminError(f"a value is out of range ({constraint})")
    raise error


def _check_limits(limits: dict[str, Any]) -> dict[str, Any]:
    """Return the limits checked against their bounds (whole numbers as ints)."""
    unknown = set(limits) - set(PROJECT_LIMITS)
    if unknown:
        raise AdminError(
            f"unknown project limit(s) {sorted(unknown)}; known: {list(PROJECT_LIMITS)}"
        )
    try:
        return check_numbers(limits, PROJECT_BOUNDS)
    except InputError as error:
        raise AdminError(str(error)) from None


def _check_unique(fields: dict[str, Any]) -> dict[str, Any]:
    """Return the unique fields among ``fields`` checked, as ``Unique.checked`` checks an
    enqueue's option: the states in their canonical order, each name of the body once."""
    checked: dict[str, Any] = {}
    names = fields.get("unique_args")
    if names is not None:
        if (
            isinstance(names, str)
            or not isinstance(names, list | tuple)
            or len(names) > MAX_UNIQUE_ARGS
        ):
            raise InputError(f"unique_args must be a list of at most {MAX_UNIQUE_ARGS} names")
        for name in names:
            check_text(name, "a name of unique_args")
        checked["unique_args"] = sorted(set(names))
    states = fields.get("unique_states")
    if states is not None:
        if isinstance(states, str) or not isinstance(states, list | tuple):
            raise InputError(f"unique_states must be a list of run states, got {states!r}")
        option = Unique(states=states)
        checked["unique_states"] = [str(state) for state in option.checked().states]
    return checked


def _check_trigger(fields: dict[str, Any]) -> dict[str, Any]:
    """Return the trigger's fields checked against their bounds."""
    unknown = set(fields) - set(TRIGGER_FIELDS)
    if unknown:
        raise AdminError(
            f"unknown trigger field(s) {sorted(unknown)}; known: {list(TRIGGER_FIELDS)}"
        )
    checked = dict(fields)
    try:
        if fields.get("mode") not in (None, "async", "sync"):
            raise InputError(f"mode must be 'async' or 'sync', got {fields['mode']!r}")
        if fields.get("task") is not None:
            check_text(fields["task"], "task")
        if fields.get("secret") is not None:
            check_secret(str(fields["secret"]))
        if fields.get("forward_secret") is not None:
            check_secret(str(fields["forward_secret"]))
        if fields.get("forward_url") is not None:
            forward.check_url(fields["forward_url"])
            if fields.get("task") not in (None, forward.FORWARD_TASK):
                raise InputError(
                    f"a trigger with a forward_url runs task {forward.FORWARD_TASK!r},"
                    f" not {fields['task']!r}"
                )
        if fields.get("forward_method") not in (None, *forward.METHODS):
            raise InputError(
                f"forward_method must be one of {list(forward.METHODS)},"
                f" got {fields['forward_method']!r}"
            )
        if fields.get("forward_headers") is not None:
            checked["forward_headers"] = forward.check_header_names(fields["forward_headers"])
        if fields.get("breaker_key") is not None:
            check_text(fields["breaker_key"], "breaker_key")
        if fields.get("key_from") is not None:
            KeyFrom.parse(fields["key_from"])
            if fields.get("forward_url") is not None:
                raise InputError(
                    "a forwarding trigger's runs are keyed by their destination "
                    "(breaker_key): give key_from or forward_url, not both"
                )
        checked.update(_check_unique(fields))
        numbers = {name: fields[name] for name in TRIGGER_BOUNDS if name in fields}
        checked.update(check_numbers(numbers, TRIGGER_BOUNDS))
    except (InputError, ValueError) as error:
        raise AdminError(str(error)) from None
    return checked
