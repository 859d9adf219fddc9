"""The bounds of every value that enters tidegate, and the checks that hold them.

Each bound encodes what PostgreSQL and the code downstream can hold, so that a value a
boundary accepts (an HTTP model, a CLI option, a setting, a library argument) never
fails deeper, in a claim, a completion or a response:

==========================  ===============================  ===========================
value                       bound                            why
==========================  ===============================  ===========================
project id, trigger name    ``[A-Za-z0-9_.-]``, 1-64 chars   URLs, log lines, indexes
lane name                   ``[A-Za-z0-9_]``, 1-64 chars     lane chains use ``>`` ``:``
key, idempotency key,       1-255 chars, no NUL, no lone     PostgreSQL text holds no
task name                   surrogate                        NUL; btree entries are
                                                             bounded (~2.7 kB)
JSON: args, webhook         nesting <= ``max_json_depth``    jsonb holds no NUL and no
bodies, results             (64), strings and keys without   NaN; deep nesting exhausts
                            NUL or lone surrogates, finite   the recursion of every
                            numbers, integers up to 4,300    serializer; Python parses
                            digits                           no longer integers
counts (caps, limits)       0 .. 2**31 - 1                   integer columns
run ids                     1 .. 2**63 - 1                   bigint
a workloop's slots          1 .. 10,000                      a local worker's threads;
                                                             admission sums slots as
                                                             integers
whole numbers in text       ASCII digits ``[0-9]`` only      ``str.isdigit`` takes ``²``,
(headers, query, specs)                                      which ``int`` refuses
rates, per second           0.001 .. 1,000,000               1/rate must be an interval
retry delays, seconds       0 .. 31,536,000 (a year)         a timestamp must hold them
weights                     0.001 .. 1,000                   1/weight is a clock step
bearer tokens               1-255 visible ASCII characters   what an Authorization
                                                             header can carry
==========================  ===============================  ===========================

Every check raises ``InputError`` naming the value and its bound. The ``Annotated``
types carry the same bounds into pydantic models (HTTP bodies, path and query
parameters), where a violation is a 422 with the field's location.

**Each field's range, declared once.** The numbers a project, a trigger, a key policy, a
schedule and the settings hold have their ranges here, one ``Bound`` per field, in a
table per kind (``PROJECT_BOUNDS``, ``TRIGGER_BOUNDS``, ``POLICY_BOUNDS``,
``SCHEDULE_BOUNDS``, ``SETTING_BOUNDS``). Every boundary is built from them: the library's
checks (``Bound.check``), the admin API's models (``Bound.field``), the CLI's options
(``cli.bounded``). The database's CHECK constraints cannot import them and restate them
instead; tests/test_bounds.py reads the constraints back from a migrated schema and
fails when one says other than its declaration.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from tidegate.errors import InputError

MAX_NAME_CHARS = 64
MAX_TEXT_CHARS = 255
DEFAULT_MAX_JSON_DEPTH = 64
MAX_INT_DIGITS = 4300
"""Python's own limit on converting a decimal string to an int (sys.int_info)."""
_INT_BOUND = 10**MAX_INT_DIGITS
"""The smallest integer of more than ``MAX_INT_DIGITS`` digits, computed once."""
MAX_COUNT = 2**31 - 1
MAX_ID = 2**63 - 1
MAX_SLOTS = 10_000
"""The most slots a workloop may have. The workers table holds the same bound (the CHECK
workers_slots_bounded, schema.sql): admission reads every workloop's slots as an
integer, and one worker's row past it made every sync webhook for its tasks, and
``/metrics``, fail."""
MAX_SHARE_WEIGHT = 1000
"""The largest weight of a lane's share in a workloop (``a=3,b=1:8``): a ratio of 1,000
to 1 is past any split a group of slots can make."""
MAX_SHARES = 64
"""The most lanes a workloop may give shares to: every claim of it passes them all."""
MIN_RATE = 0.001
MAX_RATE = 1_000_000.0
MIN_WEIGHT = 0.001
MAX_WEIGHT = 1000.0
MAX_DELAY_SECONDS = 365 * 24 * 3600.0
MAX_BODY_BYTES = 100 * 1024 * 1024
"""The most any body may be: a webhook's (the server's and each trigger's limit), an API
request's, the webhook log's copy of one."""
MAX_BREAKER_SECONDS = 86400.0
"""A circuit breaker's longest window and first cooldown: a day."""
MAX_DURATION_SECONDS = 10 * 365 * 24 * 3600.0
"""Ten years: any duration past it is a mistake, and PostgreSQL intervals stay exact."""

IDENTIFIER = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A project id or a trigger name."""
DOT_SEGMENTS = frozenset({".", ".."})
LANE_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
"""A lane name."""
DIGITS = re.compile(r"[0-9]+")
"""A whole number written as text: ASCII digits only. ``str.isdigit`` (and ``isdecimal``,
``isnumeric``) also takes ``²`` (U+00B2), the Arabic-Indic ``U+0661`` and other Unicode
digits, some of which ``int`` refuses (a ValueError deep in a handler: a 500) and some
of which it reads (a number no client meant to send)."""
TOKEN = re.compile(r"[\x21-\x7e]{1,255}")
"""A bearer token: visible ASCII, no spaces, as ``Authorization: Bearer <token>`` carries
it (a token with a space, an accent or a leading blank could never be sent back)."""


def check_text(value: Any, what: str, max_chars: int = MAX_TEXT_CHARS) -> str:
    """Return ``value`` if it is text PostgreSQL can store and index, else raise.

    1 to ``max_chars`` characters, no NUL, no lone surrogate (text that is not UTF-8).
    """
    if not isinstance(value, str):
        raise InputError(f"{what} must be text, got {type(value).__name__}")
    if not 1 <= len(value) <= max_chars:
        raise InputError(f"{what} must be 1 to {max_chars} characters, got {len(value)}")
    _check_chars(value, what)
    return value


def check_identifier(value: Any, what: str) -> str:
    """Return a project id or trigger name, or raise naming the allowed form.

    Not ``.`` or ``..``: in a URL (``/admin/projects/..``) those are dot segments, which
    HTTP clients resolve away, so such a project could not be reached by its own path.
    """
    if not isinstance(value, str) or not IDENTIFIER.fullmatch(value):
        raise InputError(f"{what} must match [A-Za-z0-9_.-]{{1,64}}, got {_show(value)}")
    if value in DOT_SEGMENTS:
        raise InputError(f"{what} must not be {value!r}, which a URL path cannot carry")
    return value


def check_lane(value: Any, what: str = "lane name") -> str:
    """Return a lane name, or raise naming the allowed form."""
    if not isinstance(value, str) or not LANE_NAME.fullmatch(value):
        raise InputError(f"{what} must match [A-Za-z0-9_]{{1,64}}, got {_show(value)}")
    return value


def whole_number(text: str, high: int = MAX_ID) -> int | None:
    """Return ``text`` as a whole number from 0 to ``high``, or ``None`` when it is not one.

    For whole numbers that arrive as text (a header, a query parameter, a workloop's slot
    count): ASCII digits only (``DIGITS``), and, leading zeros aside, no longer than
    ``high``, so that ``int`` never meets more digits than it converts (4,300).
    """
    if not DIGITS.fullmatch(text):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(high)):
        return None
    value = int(digits)
    return value if value <= high else None


def check_number(value: Any, what: str, low: float, high: float, *, whole: bool) -> float:
    """Return ``value`` if it is a finite number from ``low`` to ``high``, else raise.

    ``whole``: it must be a whole number, and comes back as an ``int`` (``2.0`` -> ``2``).
    """
    checked: float = Bound(low, high, whole).check(value, what)
    return checked


@dataclass(frozen=True)
class Bound:
    """The range of one number: from ``low`` to ``high``, finite, a whole number or not;
    ``above``: more than ``low``, never ``low`` itself (a duration of 0 is none).

    One per field, in the tables below; every boundary is made from it, so that the API,
    the CLI, the library and (through tests/test_bounds.py) the database agree.
    """

    low: float
    high: float
    whole: bool = False
    above: bool = False

    def __contains__(self, value: Any) -> bool:
        """Whether ``value`` is a number within the bound (``bool`` is not a number)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if isinstance(value, float) and not (
            math.isfinite(value) and (not self.whole or value.is_integer())
        ):
            return False
        return (self.low < value if self.above else self.low <= value) and value <= self.high

    def __str__(self) -> str:
        """What a value must be, for a message: ``a whole number from 1 to 1000``."""
        kind = "a whole number" if self.whole else "a number"
        if self.above:
            return f"{kind} over {self.low} and up to {self.high}"
        return f"{kind} from {self.low} to {self.high}"

    def check(self, value: Any, what: str) -> Any:
        """Return ``value`` (an ``int`` when whole: ``2.0`` -> ``2``), or raise
        ``InputError`` naming ``what`` and the bound."""
        if value not in self:
            raise InputError(f"{what} must be {self}, got {_show(value)}")
        return int(value) if self.whole else float(value)

    def field(self, default: Any = None, **options: Any) -> Any:
        """A pydantic ``Field`` that holds the bound (on an ``int | None`` or ``float |
        None`` too); ``options`` as ``Field`` takes them (``description``)."""
        options["gt" if self.above else "ge"] = self.low
        if not self.whole:
            options["allow_inf_nan"] = False
        return Field(default, le=self.high, **options)


Bounds = dict[str, Bound]
"""The ranges of named numbers: ``{field: Bound}``."""


def check_numbers(values: dict[str, Any], bounds: Bounds) -> dict[str, Any]:
    """Return ``values`` checked against ``bounds`` (``Bound.check``); ``None`` passes."""
    return {
        name: None if value is None else bounds[name].check(value, name)
        for name, value in values.items()
    }


def check_flags(values: dict[str, Any]) -> dict[str, Any]:
    """Return ``values`` if each is ``True``, ``False`` or ``None``, else raise naming it."""
    for name, value in values.items():
        if value is not None and not isinstance(value, bool):
            raise InputError(f"{name} must be true, false or null, got {_show(value)}")
    return values


COUNT = Bound(0, MAX_COUNT, whole=True)
"""How many of something, none allowed: an integer column."""
POSITIVE_COUNT = Bound(1, MAX_COUNT, whole=True)
RATE = Bound(MIN_RATE, MAX_RATE)
"""Per second: 1/rate becomes an interval in every admission or claim."""
PRIORITY = Bound(0, 9, whole=True)
"""A run's priority: 0 runs first (runs_priority_range)."""
ATTEMPTS = Bound(1, 1000, whole=True)
"""A run's max_attempts."""
DURATION = Bound(0, MAX_DURATION_SECONDS, above=True)
"""A duration setting, in seconds."""

PROJECT_BOUNDS: Bounds = {
    "fast_lane_cap": COUNT,
    "concurrency": POSITIVE_COUNT,
    "ingest_rate": RATE,
    "ingest_burst": POSITIVE_COUNT,
    "backlog_cap": COUNT,
}
"""A project's limits (tidegate.projects; the CHECKs projects_*_range)."""
UNIQUE_PERIOD = Bound(1, MAX_DELAY_SECONDS)
"""A unique run's period (tidegate.unique): a run enqueued with a unique option, and a
trigger's unique webhooks."""
TRIGGER_BOUNDS: Bounds = {
    "max_body_bytes": Bound(1, MAX_BODY_BYTES, whole=True),
    "sync_timeout_seconds": Bound(0.001, 3600.0),
    "forward_timeout_seconds": Bound(0.001, 300.0),
    "unique_period": UNIQUE_PERIOD,
}
"""A trigger's numbers (tidegate.projects; the CHECKs triggers_*_range)."""
POLICY_BOUNDS: Bounds = {
    "max_running": COUNT,
    "weight": Bound(MIN_WEIGHT, MAX_WEIGHT),
    "rate": RATE,
    "rate_burst": POSITIVE_COUNT,
    "breaker_failures": POSITIVE_COUNT,
    "breaker_ratio": Bound(0.01, 1.0),
    "breaker_min_attempts": POSITIVE_COUNT,
    "breaker_window_seconds": Bound(0.1, MAX_BREAKER_SECONDS),
    "breaker_cooldown_seconds": Bound(0.1, MAX_BREAKER_SECONDS),
    "breaker_max_cooldown_seconds": Bound(0.1, 7 * MAX_BREAKER_SECONDS),
    "breaker_probes": Bound(1, 1000, whole=True),
}
"""A key policy's fields (tidegate.policies; the CHECKs key_policies_*_range)."""
POLICY_FLAGS = ("ordered",)
"""A key policy's yes-or-no fields (tidegate.policies): true, false, or None (cleared, the
lane's default holds). No range to declare: ``check_flags`` takes a ``bool`` and nothing
else, so ``1`` or ``"yes"`` is refused where it enters, as a number out of range is."""
TASK_BOUNDS: Bounds = {
    "priority": PRIORITY,
    "max_attempts": ATTEMPTS,
    "timeout_seconds": DURATION,
}
"""A task's declared numbers (``@app.task``, a remote worker's registration; the CHECKs
tasks_*_range)."""
SCHEDULE_BOUNDS: Bounds = {
    "priority": PRIORITY,
    "max_attempts": ATTEMPTS,
    "interval_seconds": Bound(1.0, 10 * 365 * 24 * 3600.0),
    "catch_up_limit": Bound(1, 10_000, whole=True),
}
"""A schedule's numbers (tidegate.schedules; the CHECKs schedules_*_range)."""
SETTING_BOUNDS: Bounds = {
    **dict.fromkeys(
        (
            "lease_seconds",
            "heartbeat_seconds",
            "poll_seconds",
            "stage_seconds",
            "rescue_seconds",
            "schedule_seconds",
            "retention_seconds",
            "prune_seconds",
            "shutdown_grace_seconds",
            "backoff_base_seconds",
            "backoff_max_seconds",
            "read_timeout_seconds",
            "body_timeout_seconds",
            "ui_session_seconds",
        ),
        DURATION,
    ),
    "prune_batch": Bound(1, 100_000, whole=True),
    "max_attempts": ATTEMPTS,
    "pool_size": Bound(1, 1000, whole=True),
    "max_body_bytes": TRIGGER_BOUNDS["max_body_bytes"],
    "api_processes": Bound(1, 256, whole=True),
    "max_json_depth": Bound(1, 512, whole=True),
    "max_api_body_bytes": Bound(1, MAX_BODY_BYTES, whole=True),
    "max_head_bytes": Bound(1024, 1024 * 1024, whole=True),
    "max_headers": Bound(8, 1000, whole=True),
    "fast_lane_cap": PROJECT_BOUNDS["fast_lane_cap"],
    "port": Bound(0, 65535, whole=True),
    "metrics_max_lanes": Bound(3, 10_000, whole=True),
    "metrics_max_projects": Bound(0, 10_000, whole=True),
    "metrics_max_keys": Bound(0, 10_000, whole=True),
    "webhook_log_size": Bound(0, 1_000_000, whole=True),
    "webhook_log_body_bytes": Bound(0, MAX_BODY_BYTES, whole=True),
    "max_claims_per_token": Bound(1, 1_000_000, whole=True),
    "max_streams": Bound(1, 1_000_000, whole=True),
    "max_streams_per_caller": Bound(1, 1_000_000, whole=True),
}
"""Every number among the settings (tidegate.settings): what the columns and the code can
hold; each duration more than 0 and at most ten years."""


def check_token(value: Any, what: str) -> str:
    """Return a bearer token (1-255 visible ASCII characters), or raise."""
    if not isinstance(value, str) or not TOKEN.fullmatch(value):
        raise InputError(
            f"{what} must be 1 to 255 visible ASCII characters (no spaces), "
            "as an Authorization header carries it"
        )
    return value


def check_json(value: Any, what: str, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> None:
    """Raise unless ``value`` is JSON that jsonb stores and every reader reads back.

    Objects with text keys, arrays (lists or tuples), text, finite numbers, booleans and
    null, nested at most ``max_depth`` deep (a scalar is depth 0, ``[1]`` depth 1).
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_chars(item, what)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if abs(item) >= _INT_BOUND:
                raise InputError(f"{what} holds an integer of more than {MAX_INT_DIGITS} digits")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InputError(f"{what} holds {item!r}, which JSON cannot represent")
        elif isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                raise InputError(f"{what} is nested deeper than {max_depth} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise InputError(f"{what} has a key that is not text: {key!r}")
                    _check_chars(key, what)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
        else:
            raise InputError(f"{what} holds a {type(item).__name__}, which is not JSON")


def parse_json(data: bytes | str, what: str, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> Any:
    """Parse JSON strictly and check it (``check_json``); raise ``InputError`` saying why.

    Strict: no ``NaN`` or ``Infinity``, no number that overflows a float (``1e309``), no
    integer past 4,300 digits, valid text. Bytes may be UTF-8, or UTF-16 or UTF-32 (with a
    BOM, or as RFC 4627 detects them), as ``json`` reads them: each is held to the same
    checks, and refused for the same reasons.
    """
    full_check = False
    try:
        if isinstance(data, bytes):
            encoding = json.detect_encoding(data)
            if not encoding.startswith("utf-8"):
                # Decoded here as json would: the test for escapes below must read text
                # (in UTF-16 a "\u" is not those two bytes), and a lone surrogate may
                # come unescaped ("surrogatepass"), so the whole value is checked.
                data = data.decode(encoding, "surrogatepass")
                full_check = True
        value = _strict_loads(data)
    except RecursionError:
        raise InputError(f"{what} is nested deeper than {max_depth} levels") from None
    except UnicodeDecodeError as error:
        name = error.encoding.upper().replace("-SIG", "")
        raise InputError(f"{what} is not {name}: {error.reason} at byte {error.start}") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{what} is malformed JSON: {error}") from None
    # UTF-8 (or ASCII) without a backslash escape cannot hold NUL or a lone surrogate:
    # strict parsing refuses raw control characters and invalid UTF-8. Only the nesting
    # is left to check.
    escaped = ("\\u" if isinstance(data, str) else b"\\u") in data  # type: ignore[operator]
    if escaped or full_check:
        check_json(value, what, max_depth)
    else:
        _check_depth(value, what, max_depth)
    return value


def _strict_loads(data: bytes | str) -> Any:
    """``json.loads`` with the strict hooks, on the one decoder made for them: given hooks,
    ``json.loads`` makes a decoder (and its scanner) at every call."""
    if isinstance(data, bytes):
        data = data.decode(json.detect_encoding(data), "surrogatepass")
    elif data.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", data, 0)
    return _STRICT.decode(data)


def _check_depth(value: Any, what: str, max_depth: int) -> None:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= max_depth:
                raise InputError(f"{what} is nested deeper than {max_depth} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def _check_chars(text: str, what: str) -> None:
    if "\x00" in text:
        raise InputError(f"{what} contains a NUL character (\\u0000), which cannot be stored")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            f"{what} contains a lone surrogate (e.g. \\ud800), which is not valid text"
        ) from None


def _refuse_constant(name: str) -> Any:
    raise InputError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputError(f"the number {text[:40]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise InputError(f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(text)


_STRICT = json.JSONDecoder(
    parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int
)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _validated(check: Any, what: str) -> AfterValidator:
    def validate(value: Any) -> Any:
        try:
            return check(value, what)
        except InputError as error:
            raise ValueError(str(error)) from None

    return AfterValidator(validate)


ProjectId = Annotated[
    str,
    Field(pattern=f"^{IDENTIFIER.pattern}$", max_length=MAX_NAME_CHARS),
    _validated(check_identifier, "project id"),
]
TriggerName = Annotated[
    str,
    Field(pattern=f"^{IDENTIFIER.pattern}$", max_length=MAX_NAME_CHARS),
    _validated(check_identifier, "trigger name"),
]
LaneName = Annotated[str, Field(pattern=f"^{LANE_NAME.pattern}$", max_length=MAX_NAME_CHARS)]
Text = Annotated[
    str, Field(min_length=1, max_length=MAX_TEXT_CHARS), _validated(check_text, "text")
]
"""A key, an idempotency key or a task name."""
RunId = Annotated[int, Field(ge=1, le=MAX_ID)]
