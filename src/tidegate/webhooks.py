"""A webhook as tidegate takes it: the trigger it arrives at, the checks of its own
content, and what the admission may answer.

``POST /hooks/{token}`` (api/hooks.py) finds the trigger (``find_trigger``), checks the
request (``validate``: content type, JSON, signature, idempotency key) and admits it in
one statement; the dashboard's Replay (ui/triggers.py) runs the same checks again on a
logged request before it makes a run of it, and replays only what the admission
refused for a reason of the moment (``REPLAYABLE``, from the verdicts declared in
tidegate.admission).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row

from tidegate.admission import REFUSALS, Outcome, Unjudged, Verdict
from tidegate.errors import InputError
from tidegate.forward import breaker_key_of
from tidegate.limits import check_text, parse_json
from tidegate.signatures import MisconfiguredSecret, SignatureError, verify
from tidegate.storage.sql import Statement, Steps
from tidegate.unique import DEFAULT_STATES, Unique

SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
"""A structured-field string (RFC 8941): what the IETF idempotency-key draft sends as
``Idempotency-Key``, in quotes, ``\\`` and ``\"`` escaped."""

REPLAYABLE: frozenset[Outcome] = REFUSALS | {
    Verdict.REPLAYED,
    Verdict.DUPLICATE,
    Unjudged.UNAVAILABLE,
}
"""The outcomes of logged requests that a replay may turn into a run: those refused (or
answered with an earlier run) after ``validate`` passed them. A request refused for its
own content (its signature, its body, its content type) is refused again, never run."""


@dataclass(frozen=True)
class Trigger:
    """A webhook endpoint as the webhook route reads it (find_trigger.sql)."""

    id: int
    project: str
    name: str
    mode: str
    task: str
    secret: str | None
    max_body_bytes: int
    sync_timeout_seconds: float
    enabled: bool
    forward_url: str | None = None
    breaker_key: str | None = None
    unique_period: float | None = None
    """Seconds: webhooks alike within a window of this many make one run; ``None``: each
    admitted webhook makes its own."""
    unique_args: tuple[str, ...] | None = None
    """The fields of the body that make webhooks alike; ``None``: the whole body."""
    unique_states: tuple[str, ...] | None = None
    """The states a run holds its key in; ``None``: ``tidegate.unique``'s default."""

    @property
    def unique(self) -> Unique | None:
        """The trigger's unique option, as an enqueue would give it; ``None``: none."""
        if self.unique_period is None:
            return None
        states = DEFAULT_STATES if self.unique_states is None else self.unique_states
        return Unique(self.unique_period, ("args",), None, states).checked()

    def unique_key(self, unique: Unique, payload: Any) -> str:
        """The unique key of the run a webhook with this body makes: the library's own
        (``Unique.key``) over that run, its args the trigger's name and the body, or only
        the fields of it ``unique_args`` names (a body that is not an object has none).
        The headers, which change with every delivery, never count; neither does the
        lane, so a trigger whose mode changes keeps its keys."""
        body = payload
        if self.unique_args is not None:
            fields = payload if isinstance(payload, dict) else {}
            body = {name: fields[name] for name in self.unique_args if name in fields}
        run = {
            "project": self.project,
            "task": self.task,
            "args": {"body": body, "trigger": self.name},
            "key": self.run_key,
            "scheduled_at": None,
        }
        return unique.key(run)

    @property
    def run_key(self) -> str:
        """The key of the trigger's runs: its project's, or, for a forwarding trigger,
        its breaker key (the destination unless it names another), so that one dead
        endpoint's circuit breaker holds back only the runs bound for it."""
        if self.forward_url is None:
            return self.project
        return self.breaker_key or breaker_key_of(self.forward_url)


def find_trigger(token: str) -> Steps[Trigger | None]:
    """The trigger whose URL carries ``token``, enabled or not; ``None`` if none does."""
    rows = yield Statement("find_trigger", {"token": token}, dict_row)
    if not rows:
        return None
    row = rows[0]
    for name in ("unique_args", "unique_states"):
        row[name] = None if row[name] is None else tuple(row[name])
    return Trigger(**row)


class Invalid(Exception):
    """A webhook refused for what it is (``validate``): its status, title and details."""

    def __init__(self, status: int, title: str, **extra: Any) -> None:
        super().__init__(title)
        self.status = status
        self.title = title
        self.extra = extra


class MalformedJSON(Invalid):
    """A webhook whose body is not JSON, or is JSON PostgreSQL cannot store (400)."""

    def __init__(self, title: str) -> None:
        super().__init__(400, title)


def idempotency_key_of(field: str | None) -> str | None:
    """The key an ``Idempotency-Key`` field carries: a structured-field string's content,
    as the IETF draft sends it (``"a1"`` and ``a1`` are the same key), or the bare value
    that many senders still send."""
    if field is None:
        return None
    quoted = SF_STRING.fullmatch(field)
    return re.sub(r"\\(.)", r"\1", quoted[1]) if quoted else field


def validate(
    secret: str | None,
    headers: Mapping[str, str],
    body: bytes,
    max_json_depth: int,
    now: float | None = None,
) -> tuple[Any, str | None]:
    """Return a webhook's JSON and its idempotency key, or raise ``Invalid`` saying why.

    The checks of a request's own content, after its size: the content type (415), the
    JSON (400), the Standard Webhooks signature when ``secret`` is set (401, or
    ``MisconfiguredSecret`` when the secret itself is not one), the idempotency key
    (400). A replay from the webhook log goes through them again, with ``now`` the time
    the request was received: a request that never passed them cannot be replayed into
    a run. ``headers``: lower-case names, as received.
    """
    content_type = headers.get("content-type", "")
    media_type = content_type.split(";", 1)[0].strip().lower()
    if not (
        media_type == "application/json"
        or (media_type.startswith("application/") and media_type.endswith("+json"))
    ):
        raise Invalid(
            415,
            f"content type {media_type or '(none)'!r} is not JSON",
            accepts=["application/json"],
        )
    try:
        payload = parse_json(body, "the body", max_json_depth)
    except InputError as error:
        raise MalformedJSON(str(error)) from None
    if secret:
        try:
            verify(secret, headers, body, now)
        except MisconfiguredSecret:
            raise
        except SignatureError as error:
            raise Invalid(401, f"bad signature: {error}") from None
        # Only what the signature covers may dedupe: a fresh Idempotency-Key on a
        # captured request must not make it a new one.
        idempotency_key = headers.get("webhook-id")
    else:
        idempotency_key = idempotency_key_of(headers.get("idempotency-key"))
        idempotency_key = idempotency_key or headers.get("webhook-id")
    if idempotency_key is not None:
        try:
            check_text(idempotency_key, "the idempotency key")
        except InputError as error:
            raise Invalid(400, str(error)) from None
    return payload, idempotency_key
