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

from tidegate.errors import InputError
from tidegate.limits import (
    MAX_COUNT,
    MAX_RATE,
    MAX_WEIGHT,
    MIN_RATE,
    MIN_WEIGHT,
    Bounds,
    check_lane,
    check_numbers,
    check_text,
)
from tidegate.storage.sql import Statement, Steps

POLICY_FIELDS = ("max_running", "weight", "rate", "rate_burst")
ANY_KEY = "*"


class PolicyError(InputError):
    """A key policy was malformed; the message names the field."""


def set_key_policy(lane: str, key: str = ANY_KEY, **fields: Any) -> Steps[dict[str, Any]]:
    """Set (create or change) fields of the policy of ``key`` in ``lane``.

    Fields not given keep their value; ``None`` clears one (it falls back to the lane's
    default policy).
    """
    fields = _check(lane, key, fields)
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


FIELD_BOUNDS: Bounds = {
    "max_running": (0, MAX_COUNT, True),
    "weight": (MIN_WEIGHT, MAX_WEIGHT, False),
    "rate": (MIN_RATE, MAX_RATE, False),
    "rate_burst": (1, MAX_COUNT, True),
}
"""Each policy field's range and whether it is a whole number (tidegate.limits)."""


def _check(lane: str, key: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Return the fields checked against their bounds (whole numbers as ints)."""
    unknown = set(fields) - set(POLICY_FIELDS)
    if unknown:
        raise PolicyError(
            f"unknown policy field(s) {sorted(unknown)}; known: {list(POLICY_FIELDS)}"
        )
    try:
        check_lane(lane)
        check_text(key, "key")
        return check_numbers(fields, FIELD_BOUNDS)
    except InputError as error:
        raise PolicyError(str(error)) from None
