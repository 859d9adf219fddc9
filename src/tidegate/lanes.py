"""Lane chains and workloop specs.

A *chain* is the ordered list of lanes a claim may take from:

- filter mode (no ``*``): only the named lanes, in chain order;
- preference mode (``*`` last): the named lanes first, in order, then every other lane.

A *workloop spec* splits a worker's slots into independent groups, each with its own
chain: ``"fast_lane:1 manual>*:4"`` is one slot that only runs ``fast_lane`` and four
slots that prefer ``manual`` and take anything. Groups never lend slots to each other.

A lane can be *paused* (``pause_lane``), as River's ``QueuePause`` and Oban's
``pause_queue``: a row in ``paused_lanes``, so the pause holds for every worker, local
or remote, and outlives every process. From the pause's commit on, no claim that starts
takes a run of the lane (a claim whose statement began before may still finish); runs
already running go on to their end; new runs are accepted and wait; a sync webhook
(the fast lane) is refused 503 ``lane_paused``. ``resume_lane`` wakes the lane's
workers as an enqueue does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import class_row

from tidegate.errors import ConfigError, InputError
from tidegate.limits import LANE_NAME, MAX_SLOTS, check_lane, check_text, whole_number
from tidegate.storage.sql import Statement, Steps

WILDCARD = "*"
DEFAULT_CHAIN: tuple[str, ...] = ("manual", WILDCARD)
FAST_LANE = "fast_lane"
DEFAULT_LANE = "default"
"""The lane of a run whose task names none, outside a sync webhook's and a manual run's."""
BUILTIN_LANES = frozenset({FAST_LANE, "manual", DEFAULT_LANE})
"""Lanes tidegate itself puts runs in: sync webhooks, manual retries, everything else."""


def parse_chain(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Parse ``"manual>*"`` (or a list of names) into a validated chain.

    Raises ``ConfigError`` naming the bad part: an empty chain, a malformed lane name,
    ``*`` anywhere but last, or a lane named twice.
    """
    parts = text.split(">") if isinstance(text, str) else list(text)
    if not parts or parts == [""]:
        raise ConfigError("a lane chain needs at least one lane, e.g. 'manual>*'")
    seen: set[str] = set()
    for position, lane in enumerate(parts):
        if lane == WILDCARD:
            if position != len(parts) - 1:
                raise ConfigError(f"'*' must be the last lane of a chain, got {'>'.join(parts)!r}")
        elif not LANE_NAME.fullmatch(lane):
            raise ConfigError(f"lane name {lane!r} must match [A-Za-z0-9_]{1, 64}")
        if lane in seen:
            raise ConfigError(f"lane {lane!r} appears twice in chain {'>'.join(parts)!r}")
        seen.add(lane)
    return tuple(parts)


def chain_or_default(text: str | list[str] | None) -> tuple[str, ...]:
    """Parse a chain from untrusted input; anything malformed falls back to the default."""
    if text is None:
        return DEFAULT_CHAIN
    try:
        return parse_chain(text)
    except ConfigError:
        return DEFAULT_CHAIN


def chain_admits(chain: tuple[str, ...], lane: str) -> bool:
    """Tell whether a claim with this chain can ever take a run of ``lane``."""
    return lane in chain or WILDCARD in chain


@dataclass(frozen=True)
class WorkloopSpec:
    """One group of slots and the chain its claims follow."""

    chain: tuple[str, ...]
    slots: int

    @property
    def named_lanes(self) -> tuple[str, ...]:
        return tuple(lane for lane in self.chain if lane != WILDCARD)

    @property
    def wildcard(self) -> bool:
        return WILDCARD in self.chain

    def __str__(self) -> str:
        return f"{'>'.join(self.chain)}:{self.slots}"


def parse_workloops(spec: str) -> tuple[WorkloopSpec, ...]:
    """Parse ``"fast_lane:1 manual>*:4"`` into workloops, or raise ``ConfigError``."""
    groups = spec.split()
    if not groups:
        raise ConfigError("a workloop spec needs at least one group, e.g. 'manual>*:4'")
    loops = []
    for group in groups:
        chain_text, colon, slots_text = group.rpartition(":")
        if not colon:
            raise ConfigError(f"workloop {group!r} needs a slot count, e.g. '{group}:4'")
        slots = whole_number(slots_text, MAX_SLOTS)
        if slots is None or slots < 1:
            raise ConfigError(
                f"workloop {group!r}: slots must be a whole number from 1 to {MAX_SLOTS}"
            )
        try:
            chain = parse_chain(chain_text)
        except ConfigError as error:
            raise ConfigError(f"workloop {group!r}: {error}") from None
        loops.append(WorkloopSpec(chain=chain, slots=slots))
    return tuple(loops)


def default_workloops(slots: int) -> tuple[WorkloopSpec, ...]:
    """Return the default: one group of ``slots`` that prefers ``manual`` and takes anything."""
    return (WorkloopSpec(chain=DEFAULT_CHAIN, slots=slots),)


MAX_PAUSED_LANES = 1000
"""Lanes paused at once, at most: every claim reads them all (claim_runs.sql)."""


class LaneError(InputError):
    """A lane could not be paused: a malformed name or reason, or too many paused."""


@dataclass(frozen=True)
class PausedLane:
    """A paused lane: since when, from where (the admin API, the dashboard, the CLI and
    its user) and why (the operator's words, or None)."""

    lane: str
    paused_at: datetime
    paused_by: str
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        """The pause as the admin API and the CLI show it."""
        return {
            "lane": self.lane,
            "paused": True,
            "paused_at": self.paused_at.isoformat(),
            "paused_by": self.paused_by,
            "reason": self.reason,
        }


def pause_lane(lane: str, *, by: str, reason: str | None = None) -> Steps[PausedLane]:
    """Pause ``lane`` (paused already: keep since when, take ``by`` and ``reason``) and
    return it; a claim that starts after this commits takes none of its runs.

    ``reason``: 1 to 255 characters, shown wherever the pause is listed, never to a
    webhook's sender. Raises ``LaneError`` for a malformed value, or when
    ``MAX_PAUSED_LANES`` other lanes are paused.
    """
    try:
        check_lane(lane)
        check_text(by, "paused_by")
        if reason is not None:
            check_text(reason, "reason")
    except InputError as error:
        raise LaneError(str(error)) from None
    params = {"lane": lane, "by": by, "reason": reason, "max_paused": MAX_PAUSED_LANES}
    rows = yield Statement("pause_lane", params, class_row(PausedLane))
    if not rows:
        raise LaneError(f"{MAX_PAUSED_LANES} lanes are paused already: resume one first")
    return rows[0]  # type: ignore[no-any-return]


def resume_lane(lane: str, *, channel: str) -> Steps[bool]:
    """Resume ``lane`` and wake its workers (a NOTIFY on ``channel``, the app's
    ``available_channel``, at commit); return whether it was paused."""
    try:
        check_lane(lane)
    except InputError as error:
        raise LaneError(str(error)) from None
    return bool((yield Statement("resume_lane", {"lane": lane, "channel": channel})))


def paused_lanes() -> Steps[dict[str, PausedLane]]:
    """The paused lanes, by name."""
    rows = yield Statement("list_paused_lanes", {}, class_row(PausedLane))
    return {paused.lane: paused for paused in rows}
