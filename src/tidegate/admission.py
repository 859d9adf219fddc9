"""The admission's verdicts, each with its answer, and the other outcomes of a webhook.

``storage/functions/admit_webhook.sql`` decides whether a webhook that passed its own
checks becomes a run, and returns one of ``Verdict``'s values (tests/test_verdicts.py
reads the file and fails when the two sets differ). Each refusal carries its HTTP answer
(``Refusal``): the status, the detail, where its ``Retry-After`` comes from and which
rate-limit fields go with it, so that ``POST /hooks/{token}`` answers by looking the
verdict up. A webhook answered before (or without) a verdict has an ``Unjudged``
outcome instead. Both are the ``outcome`` of ``tidegate_webhooks_total``, of the minute
counts and of the webhook log (docs/metrics.md lists them).

A caller refused by a limit that frees room in turn (the ingest rate, the fast-lane cap,
the backlog cap) is given a place in that limit's line, the waiting room: a ticket in
the ``Tidegate-Place`` field and a ``Retry-After`` that is when room will be free for
it. Room goes to the places first in line; a caller that sends its ticket back at its
time is admitted before anyone refused after it, and a place whose caller does not come
back within ``PLACE_GRACE_SECONDS`` of its time lapses (docs/waiting-room.md).
``Retry-After`` is whole seconds, rounded up: the due time to the millisecond is the
``due`` parameter of the ``RateLimit`` field (and of ``PLACE_FIELD``).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

RETRY_AFTER_MIN_SECONDS = 1
RETRY_AFTER_MAX_SECONDS = 60
NO_WORKER_RETRY_SECONDS = 5
"""Retry-After when no worker can take a sync run: about how long a worker takes to start."""
PLACE_FIELD = "Tidegate-Place"
"""The field a refused caller's ticket comes in, and goes back in."""
PLACE_GRACE_SECONDS = 2.0
"""How long past the whole second it was told a place waits for its caller: room held
for a caller that does not come back is free again this long after its time."""
MAX_PLACES = 10_000
"""Live places a line holds at most; a caller refused past them gets no place."""
FORCED_OPEN_RETRY_SECONDS = 60
"""Retry-After while a key's breaker is forced open: no cooldown says when it ends."""
PAUSED_RETRY_SECONDS = 30
"""Retry-After while the fast lane is paused: no time is set for its resumption."""


def estimated(seconds: float | None) -> int:
    """Whole seconds of the admission's estimate, clamped to a sane range; the least when
    it has none (no run finished lately)."""
    if seconds is None:
        return RETRY_AFTER_MIN_SECONDS
    return max(RETRY_AFTER_MIN_SECONDS, min(RETRY_AFTER_MAX_SECONDS, math.ceil(seconds)))


def cooldown(seconds: float | None) -> int:
    """Whole seconds until an open breaker's cooldown ends: what the caller should wait,
    not clamped (a cooldown doubles up to its policy's cap); ``None``: forced open."""
    if seconds is None:
        return FORCED_OPEN_RETRY_SECONDS
    return max(RETRY_AFTER_MIN_SECONDS, math.ceil(seconds))


def worker_start(_: float | None) -> int:
    """``NO_WORKER_RETRY_SECONDS``, whatever the admission said."""
    return NO_WORKER_RETRY_SECONDS


def paused(_: float | None) -> int:
    """``PAUSED_RETRY_SECONDS``, whatever the admission said."""
    return PAUSED_RETRY_SECONDS


def placed(seconds: float | None) -> int:
    """Whole seconds until a place's due time, rounded up so that room is free when the
    caller comes: the truth, however long, not clamped."""
    return max(RETRY_AFTER_MIN_SECONDS, math.ceil(seconds or 0))


def ticket(field: str | None) -> uuid.UUID | None:
    """The ticket a caller brought back in ``PLACE_FIELD`` (as it was sent: the ticket in
    quotes, then its parameters), or None: a field that holds none is no place, as a
    forged or lapsed ticket is none."""
    if not field:
        return None
    try:
        return uuid.UUID(field.split(";", 1)[0].strip().strip('"'))
    except ValueError:
        return None


def place_field(place: uuid.UUID, ahead: int, wait: float) -> str:
    """The ``PLACE_FIELD`` of a refusal: the ticket (a structured field's string), the
    places ahead of it and, to the millisecond, the seconds until it is due that
    ``Retry-After`` rounds up."""
    return f'"{place}";ahead={ahead};due={max(wait, 0):.3f}'


@dataclass(frozen=True)
class Refusal:
    """How a refusing verdict is answered: a problem with ``status`` and ``detail``, and a
    ``Retry-After`` of ``wait(retry_after)`` whole seconds (``retry_after``: what the
    admission returned with it), or none without ``wait`` (a request that will never be
    admitted as it is).

    ``detail`` is a ``str.format`` template: ``{key}`` is the run's key, ``{task}`` the
    trigger's task, ``{lane}`` the run's lane, ``{idempotency_key}`` the request's
    idempotency key. ``limits`` names
    the rate-limit fields that go with it (the IETF
    draft's ``RateLimit-Policy`` and ``RateLimit``, and the older ``RateLimit-*``): the
    project's ingest rate, or its fast-lane cap, which the problem's body also states
    (``cap``).
    """

    status: int
    detail: str
    wait: Callable[[float | None], int] | None = None
    limits: Literal["ingest", "fast_lane"] | None = None


class Verdict(StrEnum):
    """What ``admit_webhook`` decided, in the order it checks (admit_webhook.sql says why
    each); ``refusal`` is ``None`` for the three that answer with a run."""

    refusal: Refusal | None

    def __new__(cls, value: str, refusal: Refusal | None = None) -> Verdict:
        member = str.__new__(cls, value)
        member._value_ = value
        member.refusal = refusal
        return member

    REPLAYED = "replayed"
    KEY_REUSED = (
        "key_reused",
        Refusal(422, "idempotency key {idempotency_key!r} was first sent with another body"),
    )
    DUPLICATE = "duplicate"
    RATE_LIMITED = (
        "rate_limited",
        Refusal(429, "the project's ingest rate is exceeded", placed, "ingest"),
    )
    LANE_PAUSED = (
        "lane_paused",
        Refusal(503, "lane {lane!r} is paused: its runs wait until it is resumed", paused),
    )
    BREAKER_OPEN = (
        "breaker_open",
        Refusal(
            503, "the circuit breaker of key {key!r} is open: its downstream is failing", cooldown
        ),
    )
    OVER_CAP = (
        "over_cap",
        Refusal(429, "the project's fast-lane cap is reached", placed, "fast_lane"),
    )
    NO_WORKER = (
        "no_worker",
        Refusal(
            503,
            "no live worker has task {task!r} and a slot that takes the fast lane",
            worker_start,
        ),
    )
    NO_CAPACITY = "no_capacity", Refusal(503, "no worker has a free fast-lane slot", estimated)
    BACKLOG_FULL = "backlog_full", Refusal(503, "the project's backlog is full", placed)
    ADMITTED = "admitted"


REFUSALS = frozenset(verdict for verdict in Verdict if verdict.refusal is not None)
"""The verdicts that make no run. Each came after the request passed every check of its
own: for a reason of the moment (a limit, the workers' capacity, a breaker, a paused
lane), or for an
idempotency key used before with another body."""


class Unjudged(StrEnum):
    """The outcome of a webhook answered without a verdict: refused by a check of its
    own before the admission, or never admitted for want of the client or the database."""

    UNKNOWN_TRIGGER = "unknown_trigger"
    DISABLED = "disabled"
    TOO_LARGE = "too_large"
    NOT_JSON = "not_json"
    BAD_REQUEST = "bad_request"
    BAD_SIGNATURE = "bad_signature"
    NO_RUN_KEY = "no_run_key"
    """422: the webhook carries no run key where its trigger's ``key_from`` says."""
    TOO_MANY_STREAMS = "too_many_streams"
    DISCONNECTED = "disconnected"
    UNAVAILABLE = "unavailable"


Outcome = Verdict | Unjudged
"""The outcome of a webhook: what ``/metrics``, the minute counts and the webhook log say."""
