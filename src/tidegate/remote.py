"""Worker tokens: what a remote worker shows the API (docs/workers.md).

The super admin creates a token for a fleet of remote workers and names the lanes its
workers may claim from (``*``: any lane). A worker registers its workloops with it, and
a workloop whose chain reaches past those lanes is refused: a worker cannot claim
outside its token's lanes. Tokens are stored as sha256 digests and shown once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tidegate.errors import InputError
from tidegate.lanes import WILDCARD
from tidegate.limits import check_identifier, check_lane
from tidegate.projects import NotFoundError, hash_token, new_token
from tidegate.storage.sql import Statement, Steps

MAX_TOKEN_LANES = 64


def check_token_lanes(lanes: Iterable[Any]) -> list[str]:
    """The lanes of a worker token, checked: lane names or ``*``, 1 to 64 of them."""
    checked = sorted({lane if lane == WILDCARD else check_lane(lane) for lane in lanes})
    if not 1 <= len(checked) <= MAX_TOKEN_LANES:
        raise InputError(f"a worker token needs 1 to {MAX_TOKEN_LANES} lanes (or '*')")
    return checked


def chain_allowed(token_lanes: Iterable[str], chain: Iterable[str]) -> str | None:
    """Why a workloop with ``chain`` may not claim under a token with ``token_lanes``, or
    None when it may: every lane it names, and ``*``, must be the token's."""
    allowed = set(token_lanes)
    if WILDCARD in allowed:
        return None
    outside = [lane for lane in chain if lane not in allowed]
    if outside:
        return (
            f"the worker token allows lanes {', '.join(sorted(allowed))}; "
            f"the chain {'>'.join(chain)} also takes {', '.join(outside)}"
        )
    return None


def create_worker_token(name: str, lanes: Iterable[Any]) -> Steps[dict[str, Any]]:
    """Create a worker token; the token is in the result, shown only this once."""
    check_identifier(name, "worker token name")
    checked = check_token_lanes(lanes)
    token = new_token("tgw")
    params = {"name": name, "token_hash": hash_token(token), "lanes": checked}
    rows = yield Statement("insert_worker_token", params)
    created_at = rows[0][0]
    return {"name": name, "lanes": checked, "token": token, "created_at": created_at}


def list_worker_tokens(
    live_seconds: float, *, after: str | None = None, limit: int | None = None
) -> Steps[list[dict[str, Any]]]:
    """The worker tokens by name, each with its lanes and the number of its live
    workers: after the name ``after``, at most ``limit`` (``None``: all)."""
    params = {"live_seconds": live_seconds, "after": after, "limit": limit}
    rows = yield Statement("list_worker_tokens", params)
    return [
        {"name": name, "lanes": lanes, "created_at": created_at, "live_workers": live}
        for name, lanes, created_at, live in rows
    ]


def delete_worker_token(name: str) -> Steps[None]:
    """Delete a token and its workers' rows: their calls are refused from now on, their
    slots no longer count, and the runs they hold are rescued when their leases lapse."""
    if not (yield Statement("delete_worker_token", {"name": name})):
        raise NotFoundError(f"no worker token {name!r}")
