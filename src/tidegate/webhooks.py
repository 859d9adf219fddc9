"""A webhook as tidegate takes it: the trigger it arrives at, the checks of its own
content, and what the admission may answer.

``POST /hooks/{token}`` (api/hooks.py) finds the trigger (``find_trigger``), checks the
request (``validate``: content type, JSON, signature, idempotency key) and admits it in
one statement; the dashboard's Replay (ui/triggers.py) runs the same checks again on a
logged request before it makes a run of it, and replays only what the admission
refused for a reason of the moment (``REPLAYABLE``, from the verdicts declared in
tidegate.admission).

A trigger's runs take its project's key, or a forwarding trigger's breaker key; a
trigger with ``key_from`` (``KeyFrom``) takes each run's key from the webhook itself, a
field of its body or one of its headers, so that one account's webhooks are capped,
ordered and rate-limited apart from another's. A webhook that does not carry the key
is refused 422 (``NoRunKey``), never keyed otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from psycopg.rows import dict_row

from tidegate.admission import REFUSALS, Outcome, Unjudged, Verdict
from tidegate.errors import InputError
from tidegate.forward import breaker_key_of
from tidegate.limits import MAX_TEXT_CHARS, check_text, parse_json
from tidegate.signatures import MisconfiguredSecret, SignatureError, verify
from tidegate.storage.sql import Statement, Steps
from tidegate.unique import DEFAULT_STATES, Unique

SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
"""A structured-field string (RFC 8941): what the IETF idempotency-key draft sends as
``Idempotency-Key``, in quotes, ``\\`` and ``\"`` escaped."""

KEPT_HEADERS_EXCLUDED = frozenset({"authorization", "cookie", "proxy-authorization"})
"""The received headers never kept with a request (nor in the webhook log): credentials."""
KEY_FROM_HEADER = "header:"
"""How ``key_from`` names a header: ``header:X-Shop-Domain``."""
MAX_KEY_POINTER_TOKENS = 32
"""The most reference tokens (levels) a ``key_from`` JSON pointer has."""
MAX_KEY_HEADER_CHARS = 64
"""The longest header name ``key_from`` may name."""
HEADER_NAME = re.compile(rf"[!#$%&'*+.^_`|~0-9A-Za-z-]{{1,{MAX_KEY_HEADER_CHARS}}}")
"""A header ``key_from`` may name: an HTTP field name (RFC 9110 token)."""
POINTER = re.compile(rf"(?:/(?:[^/~]|~[01])*){{1,{MAX_KEY_POINTER_TOKENS}}}")
"""A ``key_from`` JSON pointer (RFC 6901): 1 to ``MAX_KEY_POINTER_TOKENS`` tokens, each
after a ``/``, with ``~`` only in the escapes ``~0`` (``~``) and ``~1`` (``/``); the whole
document (the empty pointer) is no key. The database's CHECK triggers_key_from_valid
restates these forms (tests/test_trigger_keys.py holds the two to each other)."""


class NoRunKey(Exception):
    """A webhook that does not carry its trigger's run key (``KeyFrom.key``): the reason."""


@dataclass(frozen=True)
class KeyFrom:
    """Where a trigger's runs take their key: a JSON pointer into the webhook's body
    (``/data/order/id``) or a header (``header:X-Shop-Domain``), declared once here: the
    admin API's model, the CLI and the trigger's check parse it with ``parse``.

    The key is the value found: a string as it is, a number as JSON writes it (``42``,
    ``4.5``; Python's shortest form for a fraction, ``1000.0`` for ``1e3``), 1 to 255
    characters, the bound of every key (``tidegate.limits``). Anything else is no key:
    the field absent, ``null``, a boolean, an object or an array, an empty or longer
    value, a header absent or sent more than once. That webhook is refused 422 rather
    than run under a key its sender did not mean: a default key would be shared by every
    such webhook, and escape the per-key limits it was set up to meet.
    """

    pointer: tuple[str, ...] | None
    """The pointer's reference tokens, unescaped; ``None`` for a header."""
    header: str | None
    """The header's name in lower case, as received headers are read; ``None`` for a
    pointer."""
    text: str
    """As declared."""

    @classmethod
    def parse(cls, text: object) -> KeyFrom:
        """Return the source ``text`` declares, or raise ``InputError`` saying what is
        wrong and what would be right."""
        value = check_text(text, "key_from")
        if value.startswith(KEY_FROM_HEADER):
            name = value.removeprefix(KEY_FROM_HEADER)
            if not HEADER_NAME.fullmatch(name):
                raise InputError(
                    f"key_from: {name[:40]!r} is not a header name (1 to "
                    f"{MAX_KEY_HEADER_CHARS} of the characters an HTTP field name has)"
                )
            if name.lower() in KEPT_HEADERS_EXCLUDED:
                raise InputError(f"key_from: header {name!r} is a credential, never kept")
            return cls(None, name.lower(), value)
        if not POINTER.fullmatch(value):
            raise InputError(
                "key_from must be a JSON pointer (RFC 6901: /field/0/name, at most "
                f"{MAX_KEY_POINTER_TOKENS} levels, ~ only as ~0 or ~1) or "
                f"{KEY_FROM_HEADER}Header-Name, got {value[:40]!r}"
            )
        tokens = value[1:].split("/")
        return cls(tuple(t.replace("~1", "/").replace("~0", "~") for t in tokens), None, value)

    def key(self, payload: Any, headers: Iterable[tuple[str, str]]) -> str:
        """Return the run key a webhook with this body and these headers (lower-case
        names, every field as received: a header sent twice is twice) carries, or raise
        ``NoRunKey`` saying why none."""
        if self.header is not None:
            values = [value for name, value in headers if name.lower() == self.header]
            if not values:
                raise NoRunKey(f"the webhook has no header {self.header!r} to key its run by")
            if len(values) > 1:
                raise NoRunKey(f"header {self.header!r} was sent {len(values)} times")
            return _key_text(values[0], f"header {self.header!r}")
        assert self.pointer is not None
        found = payload
        for token in self.pointer:
            if isinstance(found, dict) and token in found:
                found = found[token]
            elif (
                isinstance(found, list)
                and ARRAY_INDEX.fullmatch(token)
                and (len(token) <= len(str(len(found))) and int(token) < len(found))
            ):
                found = found[int(token)]
            else:
                raise NoRunKey(f"the body has no {self.text!r} to key its run by")
        if isinstance(found, bool) or not isinstance(found, str | int | float):
            raise NoRunKey(
                f"the body's {self.text!r} is {JSON_KINDS[type(found)]}, not a string or a number"
            )
        text = found if isinstance(found, str) else json.dumps(found)
        return _key_text(text, f"the body's {self.text!r}")


ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")
"""A pointer's token that names an element of an array (RFC 6901)."""
JSON_KINDS = {type(None): "null", bool: "a boolean", dict: "an object", list: "an array"}


def _key_text(text: str, what: str) -> str:
    """``text`` as a run key, or ``NoRunKey``: 1 to 255 characters of storable text."""
    if not 1 <= len(text) <= MAX_TEXT_CHARS:
        raise NoRunKey(f"{what} is {len(text)} characters; a key is 1 to {MAX_TEXT_CHARS}")
    try:
        return check_text(text, what)
    except InputError as error:
        raise NoRunKey(str(error)) from None


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
    key_from: str | None = None
    """Where each run takes its key from the webhook (``KeyFrom``); ``None``: ``run_key``."""

    @cached_property
    def key_source(self) -> KeyFrom | None:
        """``key_from`` parsed, once per trigger looked up; ``None``: none."""
        return None if self.key_from is None else KeyFrom.parse(self.key_from)

    def key_of(self, payload: Any, headers: Iterable[tuple[str, str]]) -> str:
        """The key of the run a webhook with this body and these headers makes: the one
        it carries where ``key_from`` says, else ``run_key``; ``NoRunKey`` when it
        carries none (``KeyFrom.key``)."""
        source = self.key_source
        return self.run_key if source is None else source.key(payload, headers)

    @property
    def unique(self) -> Unique | None:
        """The trigger's unique option, as an enqueue would give it; ``None``: none."""
        if self.unique_period is None:
            return None
        states = DEFAULT_STATES if self.unique_states is None else self.unique_states
        return Unique(self.unique_period, ("args",), None, states).checked()

    def unique_key(self, unique: Unique, payload: Any, key: str) -> str:
        """The unique key of the run a webhook with this body makes under run key
        ``key`` (``key_of``): the library's own (``Unique.key``) over that run, its args
        the trigger's name and the body, or only the fields of it ``unique_args`` names
        (a body that is not an object has none).
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
            "key": key,
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
