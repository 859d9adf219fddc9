"""Lane chains and workloop specs.

A *chain* is the ordered list of lanes a claim may take from:

- filter mode (no ``*``): only the named lanes, in chain order;
- preference mode (``*`` last): the named lanes first, in order, then every other lane.

A *workloop spec* splits a worker's slots into independent groups, each with its own
chain: ``"fast_lane:1 manual>*:4"`` is one slot that only runs ``fast_lane`` and four
slots that prefer ``manual`` and take anything. Groups never lend slots to each other.

A chain is strict preference: ``a>b>*`` takes ``b`` only when ``a`` ran short, so a busy
``a`` starves ``b``. A workloop can instead give its lanes *shares* of its slots:
``"a=3,b=1/2,*:12"`` guarantees ``b`` two slots whenever it has work, and divides the
other slots 3 to 1 to 1 between ``a``, ``b`` and every other lane (``*``: one share for
them together) among those that have work. A lane without work lends its share to the
lanes that have some; the slots come back as the borrowers' runs finish (nothing is
preempted). ``share_demands`` says how many runs each lane's share asks for in a claim.

A lane can be *paused* (``pause_lane``), as River's ``QueuePause`` and Oban's
``pause_queue``: a row in ``paused_lanes``, so the pause holds for every worker, local
or remote, and outlives every process. From the pause's commit on, no claim that starts
takes a run of the lane (a claim whose statement began before may still finish); runs
already running go on to their end; new runs are accepted and wait; a sync webhook
(the fast lane) is refused 503 ``lane_paused``. ``resume_lane`` wakes the lane's
workers as an enqueue does.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import class_row

from tidegate.errors import ConfigError, InputError
from tidegate.limits import (
    LANE_NAME,
    MAX_SHARE_WEIGHT,
    MAX_SHARES,
    MAX_SLOTS,
    check_lane,
    check_text,
    whole_number,
)
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
            raise ConfigError(f"lane name {lane!r} must match [A-Za-z0-9_]{{1,64}}")
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
class Share:
    """One lane's part of a workloop's slots (``lane=weight/minimum``): ``minimum`` slots
    whenever the lane has work, and ``weight`` parts of the slots beyond every lane's
    minimum. ``lane`` is ``*`` for one share taken by every lane the workloop does not
    name."""

    lane: str
    weight: int = 1
    minimum: int = 0

    def __str__(self) -> str:
        if self.minimum:
            return f"{self.lane}={self.weight}/{self.minimum}"
        return self.lane if self.weight == 1 else f"{self.lane}={self.weight}"


@dataclass(frozen=True)
class WorkloopSpec:
    """One group of slots and the lanes its claims take: along a chain, or, with
    ``shares``, by share (``chain`` then lists the shared lanes, ``*`` last)."""

    chain: tuple[str, ...]
    slots: int
    shares: tuple[Share, ...] = ()

    @property
    def named_lanes(self) -> tuple[str, ...]:
        return tuple(lane for lane in self.chain if lane != WILDCARD)

    @property
    def wildcard(self) -> bool:
        return WILDCARD in self.chain

    def __str__(self) -> str:
        lanes = ",".join(map(str, self.shares)) if self.shares else ">".join(self.chain)
        return f"{lanes}:{self.slots}"


def parse_workloops(spec: str) -> tuple[WorkloopSpec, ...]:
    """Parse ``"fast_lane:1 manual>*:4"`` (chains) or ``"a=3,b=1/2,*:12"`` (shares) into
    workloops, or raise ``ConfigError`` naming the group and what was wrong in it."""
    groups = spec.split()
    if not groups:
        raise ConfigError("a workloop spec needs at least one group, e.g. 'manual>*:4'")
    loops = []
    for group in groups:
        lanes_text, colon, slots_text = group.rpartition(":")
        if not colon:
            raise ConfigError(f"workloop {group!r} needs a slot count, e.g. '{group}:4'")
        slots = whole_number(slots_text, MAX_SLOTS)
        if slots is None or slots < 1:
            raise ConfigError(
                f"workloop {group!r}: slots must be a whole number from 1 to {MAX_SLOTS}"
            )
        try:
            if "," in lanes_text or "=" in lanes_text:
                shares = parse_shares(lanes_text, slots)
                chain = tuple(s.lane for s in shares if s.lane != WILDCARD)
                if any(s.lane == WILDCARD for s in shares):
                    chain += (WILDCARD,)
                loops.append(WorkloopSpec(chain=chain, slots=slots, shares=shares))
            else:
                loops.append(WorkloopSpec(chain=parse_chain(lanes_text), slots=slots))
        except ConfigError as error:
            raise ConfigError(f"workloop {group!r}: {error}") from None
    return tuple(loops)


def parse_shares(text: str, slots: int) -> tuple[Share, ...]:
    """Parse ``"a=3,b=1/2,*"`` (``lane``, ``lane=weight`` or ``lane=weight/minimum``) for a
    workloop of ``slots`` slots, or raise ``ConfigError`` naming the bad part."""
    if ">" in text:
        raise ConfigError(
            "a workloop takes its lanes either along a chain ('a>b>*') or by shares "
            "('a=3,b=1'), not both"
        )
    parts = text.split(",")
    if len(parts) > MAX_SHARES:
        raise ConfigError(f"at most {MAX_SHARES} lanes may have shares, got {len(parts)}")
    shares: list[Share] = []
    for part in parts:
        lane, equals, amounts = part.partition("=")
        if lane != WILDCARD and not LANE_NAME.fullmatch(lane):
            raise ConfigError(f"lane name {lane!r} must match [A-Za-z0-9_]{{1,64}} or be '*'")
        if any(share.lane == lane for share in shares):
            raise ConfigError(f"lane {lane!r} has two shares")
        weight_text, slash, minimum_text = amounts.partition("/")
        weight = whole_number(weight_text, MAX_SHARE_WEIGHT) if equals else 1
        if weight is None or weight < 1:
            raise ConfigError(
                f"share {part!r}: the weight after '=' must be a whole number from 1 to "
                f"{MAX_SHARE_WEIGHT}, e.g. '{lane}=3'"
            )
        minimum = whole_number(minimum_text, slots) if slash else 0
        if minimum is None:
            raise ConfigError(
                f"share {part!r}: the minimum after '/' must be a whole number of slots "
                f"from 0 to {slots}, e.g. '{lane}={weight}/1'"
            )
        shares.append(Share(lane, weight, minimum))
    guaranteed = sum(share.minimum for share in shares)
    if guaranteed > slots:
        raise ConfigError(
            f"the minimums add up to {guaranteed} slots, more than the workloop's {slots}"
        )
    return tuple(shares)


def share_demands(
    shares: Sequence[Share], held: Sequence[int], free: int, dry: Collection[int]
) -> list[int]:
    """Split ``free`` slots among ``shares``: how many runs each asks for in a claim.

    ``held``: each share's runs in the workloop now; ``dry``: the shares whose lanes came
    up short since they were last told of work, which ask for nothing (their slots are
    lent to the others). Each slot goes, one at a time, to a share below its minimum
    (the furthest below first), else to the one with the fewest runs beyond its minimum
    for its weight (Sainte-Laguë's divisors, ``(n + 0.5) / weight``): a saturated
    workloop's lanes then hold ``minimum + weight / total weight`` of the slots beyond
    the minimums, each within a slot of it. Nothing is taken back from a share that
    holds more (it borrowed while the others were dry): it asks for nothing until its
    runs finish and the others catch up.
    """
    demands = [0] * len(shares)

    def behind(index: int) -> tuple[int, float, int]:
        share, count = shares[index], held[index] + demands[index]
        if count < share.minimum:
            return 0, count - share.minimum, index
        return 1, (count - share.minimum + 0.5) / share.weight, index

    queue = [behind(index) for index in range(len(shares)) if index not in dry]
    heapq.heapify(queue)
    for _ in range(free if queue else 0):
        index = heapq.heappop(queue)[2]
        demands[index] += 1
        heapq.heappush(queue, behind(index))
    return demands


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
