"""Who may call the admin, runs and metrics APIs and the remote workers' protocol:
``Authorization: Bearer <token>``.

The super admin's token (``/admin``, ``/metrics``, and every run), a project's token (its
own runs), a worker token (``/workers``, in its lanes): ``tidegate.access`` says how
each is kept and looked up. ``authenticate`` runs in the ``Guard`` middleware, from the
headers alone, before any body is read: a caller without a valid token costs one
indexed lookup, never a body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.security import HTTPBearer

from tidegate.access import Caller, WorkerCaller, find_caller, find_worker_token

if TYPE_CHECKING:
    from tidegate.api.kernel import Api

BEARER = HTTPBearer(
    auto_error=False,
    description="The super admin's token, or a project's token (its own runs only).",
)
"""The security scheme the OpenAPI document declares (the Authorize button of /docs)."""


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


async def authenticate(api: Api, authorization: str | None, *, admin: bool) -> Caller:
    """Return who holds the bearer token of ``authorization``, or raise ``Refused``."""
    caller = await api.run(find_caller(_bearer(authorization)))
    if caller is None:
        raise Refused(403, "unknown token")
    if admin and not caller.admin:
        raise Refused(403, "the super admin's token is required")
    return caller


async def authenticate_worker(
    api: Api, authorization: str | None, worker_id: str | None
) -> WorkerCaller:
    """Return the worker token of ``authorization``, with the worker ``worker_id`` of it
    when the call names one, or raise ``Refused``."""
    fleet = await api.run(find_worker_token(_bearer(authorization), worker_id))
    if fleet is None:
        raise Refused(403, "unknown worker token")
    return fleet


def current_caller(request: Request) -> Caller:
    """FastAPI dependency: the caller the ``Guard`` authenticated for this request."""
    caller: Caller = request.state.caller
    return caller
