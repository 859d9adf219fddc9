"""Per-key policies: concurrency limits, weights and rates, per lane.

Every run has a key (its project unless the enqueue or the task says otherwise). A
policy row for ``(lane, key)`` (or ``(lane, "*")``, the lane's default for keys without
their own) sets:

- ``max_running``: at most this many of the key's runs in flight in the lane;
- ``weight``: the key's share of claims among keys with ready runs (2 = twice 1's);
- ``rate`` and ``rate_burst``: runs started per second, with a burst;
- ``ordered``: strict order (below);
- a circuit breaker (``breaker_*``, below).

Claims enforce them exactly, in the claim's transaction (see
``storage/functions/claim_runs_keyed.sql``); a change holds for the next claim.
``fast_lane`` runs are exempt from the limits: their bound is the admission cap; breakers
hold there too. A project's ``concurrency`` (see ``tidegate.projects``) bounds its runs
in flight across every other lane.

Strict order (``ordered=True``), as SQS FIFO's message groups or Awa's ordering keys: the
key's runs in the lane start one at a time, in the order of their ids (the order they
were enqueued), and each only once every earlier run of the key has finished for good
(succeeded, discarded or cancelled). A run that failed and will retry holds the line
through its backoff; so does a delayed run not yet due, and a run waiting for a worker
with its task: enqueue order, not due order, is the line. Other keys flow past. The
waiting runs' ``reason`` names the run they wait behind; cancelling that run (or its
being discarded after its last attempt) lets the next one go. Enqueues of one key from
concurrent transactions are in the line in the order of their ids as far as each was
committed before the claim looked (a run whose enqueue commits after a later-numbered
run has started goes after it); enqueue from one transaction at a time where that
matters. ``fast_lane`` runs are exempt, as from the other limits.

Circuit breakers (``storage/functions/count_breaker_outcomes.sql``). A key has one when
``breaker_failures`` or ``breaker_ratio`` applies to it:

==============================  =======  ===============================================
field                           default  meaning
==============================  =======  ===============================================
``breaker_failures``                     open after this many failed attempts in the
                                         window...
``breaker_ratio``                        ...or when this share (0-1] of the window's
``breaker_min_attempts``        10       attempts failed, once there are this many
``breaker_window_seconds``      60       the counting window (fixed, restarted when over)
``breaker_cooldown_seconds``    30       how long it stays open the first time
``breaker_max_cooldown_seconds`` 600     a failed probe doubles the cooldown up to this
``breaker_probes``              1        half-open: runs let through at once
==============================  =======  ===============================================

Open, the key's runs are not claimed: they spend no attempt and take no slot, and a
sync webhook of the key gets 503 with the cooldown's remaining time. Failures are the
attempts that raise (timeouts included) or raise ``DownstreamFailing``; a ``Discard``
(bad input), ``Cancel`` or ``Retry`` does not count. An admin can force a breaker open
or closed (``force_breaker``).
"""

from __future__ import annotations

import json
from typing import Any

from psycopg.rows import dict_row

from tidegate.errors import InputError
from tidegate.limits import (
    POLICY_BOUNDS,
    POLICY_FLAGS,
    check_flags,
    check_lane,
    check_numbers,
    check_text,
)
from tidegate.storage.sql import Statement, Steps

POLICY_FIELDS = (*POLICY_BOUNDS, *POLICY_FLAGS)
"""A key policy's fields: numbers bounded by ``tidegate.limits.POLICY_BOUNDS``, and the
yes-or-no ``POLICY_FLAGS``."""
ANY_KEY = "*"
FORCES = ("open", "closed")


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
    yield Statement("delete_stray_breakers", {"lane": lane})
    if fields.get("ordered"):  # the runs enqueued before join the key's line
        yield Statement("line_up_runs", {"lane": lane, "key": key})
    return dict(rows[0])


def clear_key_policy(lane: str, key: str = ANY_KEY) -> Steps[bool]:
    """Remove the policy of ``key`` in ``lane``; tell whether there was one."""
    rows = yield Statement("delete_key_policy", {"lane": lane, "key": key})
    yield Statement("delete_stray_breakers", {"lane": lane})
    return bool(rows)


def list_breakers(lane: str | None = None, limit: int = 1000) -> Steps[list[dict[str, Any]]]:
    """The circuit breakers that are not plainly closed (open, half-open, forced, or
    counting failures), most urgent first: ``state`` is ``closed``, ``open`` (until
    ``open_until``), ``half_open``, ``forced_open`` or ``forced_closed``."""
    rows = yield Statement("list_breakers", {"lane": lane, "limit": limit}, dict_row)
    return [dict(row) for row in rows]


def force_breaker(lane: str, key: str, force: str | None) -> Steps[dict[str, Any] | None]:
    """Force the breaker of ``key`` in ``lane`` open or closed; ``None`` hands it back to
    its policy, closed and counting afresh. Return its state (``None`` once handed back).

    Forced open, the key's runs wait unclaimed and its sync webhooks get 503 until it is
    released; forced closed, its failures are not counted and its runs flow.
    """
    try:
        check_lane(lane)
        check_text(key, "key")
    except InputError as error:
        raise PolicyError(str(error)) from None
    if force is not None and force not in FORCES:
        raise PolicyError(f"force must be one of {list(FORCES)} or null, got {force!r}")
    if force is None:
        yield Statement("release_breaker", {"lane": lane, "key": key})
        return None
    rows = yield Statement("force_breaker", {"lane": lane, "key": key, "force": force}, dict_row)
    return dict(rows[0])


def list_key_policies(
    lane: str | None = None, *, after: tuple[str, str] | None = None, limit: int | None = None
) -> Steps[list[dict[str, Any]]]:
    """Key policies by lane, each lane's default (``*``) first, then by key: after the
    policy ``after`` (its lane and key), at most ``limit`` (``None``: all)."""
    after_lane, after_key = after or (None, None)
    params = {"lane": lane, "after_lane": after_lane, "after_key": after_key, "limit": limit}
    rows = yield Statement("list_key_policies", params, dict_row)
    return [dict(row) for row in rows]


def _check(lane: str, key: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Return the fields checked against their bounds (whole numbers as ints) and the
    flags checked to be ``bool``."""
    unknown = set(fields) - set(POLICY_FIELDS)
    if unknown:
        raise PolicyError(
            f"unknown policy field(s) {sorted(unknown)}; known: {list(POLICY_FIELDS)}"
        )
    try:
        check_lane(lane)
        check_text(key, "key")
        flags = check_flags({name: fields[name] for name in POLICY_FLAGS if name in fields})
        numbers = {name: value for name, value in fields.items() if name not in flags}
        return check_numbers(numbers, POLICY_BOUNDS) | flags
    except InputError as error:
        raise PolicyError(str(error)) from None
