"""Per-key policies: concurrency limits, weights and rates, per lane.

Every run has a key (its project unless the enqueue or the task says otherwise). A
policy row for ``(lane, key)`` (or ``(lane, "*")``, the lane's default for keys without
their own) sets:

- ``max_running``: at most this many of the key's runs in flight in the lane;
- ``weight``: the key's share of claims among keys with ready runs (2 = twice 1's);
- ``rate`` and ``rate_burst``: runs started per second, with a burst.

Claims enforce them exactly, in the claim's transaction (see ``claim_runs`` in
migration 0003); a change holds for the next claim. ``fast_lane`` runs are exempt: their
bound is the admission cap. A project's ``concurrency`` (see ``tidegate.projects``)
bounds its runs in flight across every other lane.
"""

from __future__ import annotations

import json
from typing import Any

from psycopg.rows import dict_row

from tidegate.errors import TidegateError
from tidegate.lanes import LANE_NAME
from tidegate.storage.sql import Statement, Steps

POLICY_FIELDS = ("max_running", "weight", "rate", "rate_burst")
ANY_KEY = "*"


class PolicyError(TidegateError, ValueError):
    """A key policy was malformed; the message names the field."""


def set_key_policy(lane: str, key: str = ANY_KEY, **fields: Any) -> Steps[dict[str, Any]]:
    """Set (create or change) fields of the policy of ``key`` in ``lane``.

    Fields not given keep their value; ``None`` clears one (it falls back to the lane's
    default policy).
    """
    _check(lane, fields)
    rows = yield Statement(
        "upsert_key_policy", {"lane": lane, "key": key, "patch": json.dumps(fields)}, dict_row
    )
    return dict(rows[0])


def clear_key_policy(lane: str, key: str = ANY_KEY) -> Steps[bool]:
    """Remove the policy of ``key`` in ``lane``; tell whether there was one."""
    rows = yield Statement("delete_key_policy", {"lane": lane, "key": key})
    return bool(rows)


def list_key_policies(lane: str | None = None) -> Steps[list[dict[str, Any]]]:
    rows = yield Statement("list_key_policies", {"lane": lane}, dict_row)
    return [dict(row) for row in rows]


def _check(lane: str, fields: dict[str, Any]) -> None:
    if not LANE_NAME.fullmatch(lane):
        raise PolicyError(f"lane name {lane!r} must match [A-Za-z0-9_]+")
    unknown = set(fields) - set(POLICY_FIELDS)
    if unknown:
        raise PolicyError(
            f"unknown policy field(s) {sorted(unknown)}; known: {list(POLICY_FIELDS)}"
        )
    lowest = {"max_running": 0, "rate_burst": 1}
    for name, value in fields.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PolicyError(f"{name} must be a number, got {value!r}")
        if name in lowest and (value < lowest[name] or value != int(value)):
            raise PolicyError(f"{name} must be a whole number >= {lowest[name]}, got {value!r}")
        if name in ("weight", "rate") and not value > 0:
            raise PolicyError(f"{name} must be > 0, got {value!r}")
