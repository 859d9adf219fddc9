"""Who may call the admin and runs APIs: ``Authorization: Bearer <token>``.

- The super admin's token. One rule, whatever the number of API processes: its sha256
  is kept in the database (``admin_tokens``). When ``TIDEGATE_ADMIN_TOKEN`` is set, a
  starting server stores it (replacing the one before); when it is not, the stored one
  stays; when none is stored yet, the first server generates one, stores it and prints
  it once. ``tidegate admin-token rotate`` replaces it, and every running server honours
  the new one at the next request: the hash is read per request, never cached.
- A project's token (returned when the project is created): the runs of that project.
- A worker token (``tidegate worker-tokens create``): the ``/workers`` protocol of remote
  workers, in the token's lanes only (``tidegate.remote``).

``authenticate`` runs in the ``Guard`` middleware, from the headers alone, before any
body is read: a caller without a valid token costs one indexed lookup, never a body.
Tokens are stored and looked up as sha256 digests, never in clear.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.security import HTTPBearer

from tidegate.projects import hash_token, new_token
from tidegate.storage.sql import Statement, Steps

if TYPE_CHECKING:
    from tidegate.api.kernel import Ingress

log = logging.getLogger("tidegate.ingress")
BEARER = HTTPBearer(
    auto_error=False,
    description="The super admin's token, or a project's token (its own runs only).",
)
"""The security scheme the OpenAPI document declares (the Authorize button of /docs)."""


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: the super admin (``project`` is None) or one project."""

    project: str | None

    @property
    def admin(self) -> bool:
        return self.project is None


class Refused(Exception):
    """A request refused before its body was read: 401 or 403, with a title."""

    def __init__(self, status: int, title: str) -> None:
        super().__init__(title)
        self.status = status
        self.title = title


def _bearer(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or ``Refused`` (401)."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Refused(401, "missing bearer token")
    return token


async def authenticate(ingress: Ingress, authorization: str | None, *, admin: bool) -> Caller:
    """Return who holds the bearer token of ``authorization``, or raise ``Refused``."""
    rows = await ingress.run(_caller(hash_token(_bearer(authorization))))
    if not rows:
        raise Refused(403, "unknown token")
    caller = Caller(project=rows[0][0])
    if admin and not caller.admin:
        raise Refused(403, "the super admin's token is required")
    return caller


@dataclass(frozen=True)
class WorkerCaller:
    """A remote worker's fleet: the name of its worker token, and the lanes it allows."""

    token: str
    lanes: tuple[str, ...]


async def authenticate_worker(ingress: Ingress, authorization: str | None) -> WorkerCaller:
    """Return the worker token of ``authorization``, or raise ``Refused``."""
    rows = await ingress.run(_worker_token(hash_token(_bearer(authorization))))
    if not rows:
        raise Refused(403, "unknown worker token")
    name, lanes = rows[0]
    return WorkerCaller(token=name, lanes=tuple(lanes))


def current_caller(request: Request) -> Caller:
    """FastAPI dependency: the caller the ``Guard`` authenticated for this request."""
    caller: Caller = request.state.caller
    return caller


async def load_admin_token(ingress: Ingress) -> None:
    """Apply the admin-token rule at start: store the configured token, or make one."""
    if ingress.settings.admin_token:
        await ingress.run(set_admin_token(ingress.settings.admin_token))
        return
    token = new_token("tga")
    if await ingress.run(_first_admin_token(hash_token(token))):
        # Through the log, in its format (one JSON object per line with --log-format
        # json): the operator reads it where every other start-up line goes.
        log.warning(
            "generated the super admin token (shown only now): %s; it is kept (hashed) in "
            "the database, `tidegate admin-token rotate` replaces it",
            token,
        )


def set_admin_token(token: str) -> Steps[None]:
    """Make ``token`` the super admin's, replacing the one before."""
    yield Statement("upsert_admin_token", {"token_hash": hash_token(token)})


def _first_admin_token(token_hash: str) -> Steps[bool]:
    """Store a first admin token; tell whether it was stored (none was before)."""
    return bool((yield Statement("insert_admin_token", {"token_hash": token_hash})))


def _caller(token_hash: str) -> Steps[list[tuple[str | None]]]:
    return (yield Statement("find_caller", {"token_hash": token_hash}))


def _worker_token(token_hash: str) -> Steps[list[tuple[str, list[str]]]]:
    return (yield Statement("find_worker_token", {"token_hash": token_hash}))
