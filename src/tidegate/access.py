"""Who holds a token, and the dashboard's sessions: the lookups behind every caller.

- The super admin's token. One rule, whatever the number of API processes: its sha256
  is kept in the database (``admin_tokens``). When ``TIDEGATE_ADMIN_TOKEN`` is set, a
  starting server stores it (replacing the one before); when it is not, the stored one
  stays; when none is stored yet, the first server generates one, stores it and prints
  it once (``ensure_admin_token``). ``tidegate admin-token rotate`` replaces it
  (``set_admin_token``), and every running server honours the new one at the next
  request: the hash is read per request, never cached.
- A project's token (returned when the project is created): the runs of that project.
- A worker token (``tidegate worker-tokens create``): the ``/workers`` protocol of remote
  workers, in the token's lanes only (``tidegate.remote``).
- A dashboard session, opened with the super admin's token or a project's: a row of
  ``ui_sessions`` keyed by the sha256 of a random id (the id goes in the browser's
  cookie), with a random CSRF token, until it expires or the token it was opened with
  is rotated (docs/dashboard.md).

Tokens and session ids are stored and looked up as sha256 digests, never in clear. The
API's ``Guard`` (api/guard.py) runs ``find_caller``, ``find_worker_token`` and
``find_session`` before any body is read; the dashboard's sign-in and the CLI run the
same steps.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from tidegate.projects import hash_token, new_token
from tidegate.storage.sql import Statement, Steps


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: the super admin (``project`` is None) or one project."""

    project: str | None

    @property
    def admin(self) -> bool:
        return self.project is None


@dataclass(frozen=True)
class WorkerCaller:
    """A remote worker's fleet: the name of its worker token, and the lanes it allows;
    for a call of one worker's own (``/workers/{id}/...``), that worker's id and, if it
    registered with this token, its workloops and tasks, read with the token."""

    token: str
    lanes: tuple[str, ...]
    worker_id: str | None = None
    worker: tuple[list[Any], list[str]] | None = None
    token_hash: str = ""


@dataclass(frozen=True)
class Session:
    """A signed-in dashboard session."""

    id_hash: str
    caller: Caller
    csrf_token: str


def find_caller(token: str) -> Steps[Caller | None]:
    """Who holds ``token``: the super admin or a project; ``None`` for nobody."""
    rows = yield Statement("find_caller", {"token_hash": hash_token(token)})
    return Caller(project=rows[0][0]) if rows else None


def find_worker_token(token: str, worker_id: str | None) -> Steps[WorkerCaller | None]:
    """The worker token ``token`` is, with its lanes, and the worker ``worker_id`` of
    it (when named), in one statement; ``None`` if the token is none."""
    token_hash = hash_token(token)
    rows = yield Statement("find_worker_token", {"token_hash": token_hash, "worker_id": worker_id})
    if not rows:
        return None
    name, lanes, workloops, tasks = rows[0]
    worker = (workloops, tasks) if workloops is not None else None
    return WorkerCaller(name, tuple(lanes), worker_id, worker, token_hash)


def set_admin_token(token: str) -> Steps[None]:
    """Make ``token`` the super admin's, replacing the one before."""
    yield Statement("upsert_admin_token", {"token_hash": hash_token(token)})


def ensure_admin_token(configured: str | None) -> Steps[str | None]:
    """Apply the admin-token rule at a server's start: store ``configured`` when it is
    set; else, when no token is stored yet, generate one and store it. Return the token
    generated, for the operator to see once; ``None`` when none was (a configured
    token, or another server's first)."""
    if configured:
        yield from set_admin_token(configured)
        return None
    token = new_token("tga")
    stored = yield Statement("insert_admin_token", {"token_hash": hash_token(token)})
    return token if stored else None


def find_session(session_id: str) -> Steps[Session | None]:
    """The live session whose cookie holds ``session_id``; ``None`` when it has expired,
    was closed, or its token has been rotated since (find_ui_session.sql)."""
    id_hash = hash_token(session_id)
    rows = yield Statement("find_ui_session", {"id_hash": id_hash})
    if not rows:
        return None
    project, csrf_token = rows[0]
    return Session(id_hash=id_hash, caller=Caller(project=project), csrf_token=csrf_token)


def open_session(caller: Caller, token: str, seconds: float) -> Steps[str]:
    """Store a new session for ``caller``, who signed in with ``token``; return the id
    that goes in the cookie. The session keeps the token's digest: rotating the token
    ends it (``find_session``)."""
    session_id = secrets.token_urlsafe(32)
    yield Statement(
        "insert_ui_session",
        {
            "id_hash": hash_token(session_id),
            "project": caller.project,
            "token_hash": hash_token(token),
            "csrf_token": secrets.token_urlsafe(32),
            "seconds": seconds,
        },
    )
    return session_id


def close_session(id_hash: str) -> Steps[None]:
    """End a session (signing out), on every API process at once."""
    yield Statement("delete_ui_session", {"id_hash": id_hash})
