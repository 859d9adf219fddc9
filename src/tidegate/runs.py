"""Runs: one execution of a task, as stored in the ``runs`` table.

A run's life::

    scheduled --due--> available --claim--> running --+--> succeeded
        ^               ^     |                      |--> discarded (last attempt failed)
        |               |     v                      |--> cancelled
        |               +-- pending (no live worker has its task; until one starts)
        +---- retry ----+---- rescue / hand back ----+
"""

from __future__ import annotations

import contextvars
import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from psycopg import AsyncCursor, Cursor
from psycopg.rows import RowMaker

from tidegate.errors import InputError
from tidegate.limits import MAX_DELAY_SECONDS, check_json, check_number, parse_json
from tidegate.storage.sql import Statement, Steps

MAX_PROGRESS_BYTES = 65_536
"""The largest progress event, as JSON."""
MAX_ARGS_FILTER_CHARS = 1000
"""The longest args filter of a run list (``args @> filter``), as JSON text."""
MAX_ARGS_FILTER_DEPTH = 8
"""How deep an args filter may nest: deeper than any search an operator types."""


class RunState(StrEnum):
    """The states of a run; mirrors the SQL type ``run_state``."""

    SCHEDULED = "scheduled"
    AVAILABLE = "available"
    PENDING = "pending"
    """Waits for a worker: no live worker has its task (and a workloop for its lane)."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DISCARDED = "discarded"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.DISCARDED, RunState.CANCELLED)


def attempts_shown(attempt: int, max_attempts: int, state: RunState | str) -> str:
    """A run's attempts as every surface shows them: ``2, 19 left`` (``2`` once finished).

    What is left is ``max_attempts - attempt``, the attempts it may still make. A
    ``Retry()``, a ``DownstreamFailing`` or a retry by hand gives an attempt back by
    raising the stored ``max_attempts``, so ``attempt/max_attempts`` would read ``2/21``
    for a run of 20 allowed; what is left stays true through every give-back.
    """
    if RunState(state).finished:
        return str(attempt)
    return f"{attempt}, {max(max_attempts - attempt, 0)} left"


@dataclass(frozen=True)
class Hold:
    """What holds a ready run back besides its turn: its key's circuit breaker, or the
    run its ordered key's line waits behind (``tidegate.policies``, strict order).

    ``breaker`` as ``breaker_state`` names it (``open``, ``forced_open``, ``half_open``),
    ``None`` when no breaker holds the key; ``until``: when an open breaker's cooldown
    ends. ``behind``: the run at the front of the key's line (its run in flight, else its
    earliest not started), ``behind_state`` and ``behind_due`` (its ``scheduled_at``) for
    saying why that one waits; ``None`` when the key is not ordered.
    """

    breaker: str | None
    until: datetime | None
    behind: int | None = None
    behind_state: RunState | None = None
    behind_due: datetime | None = None

    def why_behind(self) -> str:
        """Why the run at the front of the line has not ended: running, retrying, ..."""
        if self.behind_state is None:
            return "?"
        due = self.behind_due.isoformat(timespec="seconds") if self.behind_due else "?"
        return {
            RunState.RUNNING: "running",
            RunState.SCHEDULED: f"due at {due}",
            RunState.PENDING: "waiting for a worker with its task",
            RunState.AVAILABLE: "ready, next to start",
        }.get(self.behind_state, "?")


@dataclass(frozen=True)
class Run:
    """A run as stored; ``errors`` holds one entry per failed attempt."""

    id: int
    project: str
    lane: str
    key: str
    task: str
    args: Any
    state: RunState
    priority: int
    attempt: int
    max_attempts: int
    scheduled_at: datetime
    inserted_at: datetime
    attempted_at: datetime | None
    completed_at: datetime | None
    worker_id: str | None
    lease_expires_at: datetime | None
    result: Any
    errors: list[dict[str, Any]]
    idempotency_key: str | None
    workloop: int | None = None
    """The index, in its worker's spec, of the workloop that last claimed the run."""
    vtime: float = 0.0
    """Where the run stands on its key's fair clock (see storage/functions/key_clock.sql)."""
    rank: float = 0.0
    """The claim order within a lane: ``vtime + priority * 64``."""
    probe: bool = False
    """Whether its last claim took it as a half-open circuit breaker's probe."""
    watched: bool = False
    """Whether a reader of its events waits for it to finish (see storage/schema.sql)."""
    unique_key: str | None = None
    """A unique run's key (``Unique``); ``None`` for any other run."""
    unique_states: tuple[RunState, ...] | None = None
    """The states in which a unique run holds its key."""
    trace_context: dict[str, str] | None = None
    """The W3C trace context (``traceparent``, ``tracestate``) of the span that made the
    run, its enqueue's or a webhook sender's; the execution's span links to it
    (``tidegate.tracing``). ``None`` where no trace was active."""
    duplicate: bool = field(default=False, compare=False)
    """Whether the enqueue that returned this run found it already there (a repeated
    idempotency key, or a unique run's key) and inserted nothing. Not stored: a run read
    from the database is never a duplicate."""
    lane_paused: bool = field(default=False, compare=False)
    """Whether its lane is paused (``tidegate.lanes.pause_lane``), as ``get_run`` read it
    with the run; not stored, and False from any other read."""
    hold: Hold | None = field(default=None, compare=False)
    """The circuit breaker that holds the run, where a reader asked (``with_holds``).
    Not stored: it is the key's, and changes without the run."""

    @property
    def fields(self) -> dict[str, str | int]:
        """What names the run where it is observed: the same names in the metrics' labels,
        the JSON log lines' fields and the spans' attributes."""
        return {
            "run_id": self.id,
            "task": self.task,
            "lane": self.lane,
            "key": self.key,
            "project": self.project,
            "attempt": self.attempt,
        }

    @property
    def reason(self) -> str | None:
        """Why the run is not moving, when that is not plain waiting for its turn."""
        if self.state is RunState.PENDING:
            return f"no live worker has task {self.task!r} for lane {self.lane!r}"
        if self.lane_paused and self.state is RunState.AVAILABLE:
            return f"lane {self.lane!r} is paused"
        if self.hold is not None and self.state is RunState.AVAILABLE and self.hold.breaker:
            if self.hold.breaker == "forced_open":
                return f"key {self.key!r} has its circuit breaker forced open in this lane"
            if self.hold.breaker == "half_open":
                return f"key {self.key!r} has its circuit breaker half-open: probe runs go first"
            until = self.hold.until.isoformat(timespec="seconds") if self.hold.until else "?"
            return f"key {self.key!r} has its circuit breaker open until {until}"
        hold = self.hold
        if hold is not None and hold.behind not in (None, self.id):
            return (
                f"key {self.key!r} is ordered in lane {self.lane!r}: waits behind run "
                f"{hold.behind} ({hold.why_behind()})"
            )
        return None

    @property
    def attempts(self) -> str:
        """The attempts as every surface shows them (``attempts_shown``)."""
        return attempts_shown(self.attempt, self.max_attempts, self.state)

    def progress(self, data: Any) -> None:
        """Report how far the handler has come: ``data`` (JSON, at most 64 KiB) becomes
        an event of the run, streamed live to whoever reads its events (``GET
        /runs/{id}/events``, a sync webhook's caller that asks for server-sent events).

        Call it from the run's own handler. The worker writes a run's events in order,
        before its outcome. From a sync handler (a thread) it waits while the run has
        ``MAX_UNWRITTEN_EVENTS`` (100) events waiting to be written; from an async one it
        returns at once, and past that bound the oldest unwritten event is dropped (an
        async handler that must lose none awaits ``aprogress``). Data JSON cannot hold
        raises ``InputError`` here, where the mistake is.
        """
        sink, text = self._progress_to(data)
        sink.report(self, text)

    async def aprogress(self, data: Any) -> None:
        """``progress`` for async handlers: waits while the run has 100 events waiting to
        be written, so that none is dropped."""
        sink, text = self._progress_to(data)
        await sink.areport(self, text)

    def _progress_to(self, data: Any) -> tuple[ProgressSink, str]:
        sink = _progress.get(None)
        if sink is None or _current_run.get(None) is not self:
            raise RuntimeError("progress is reported from inside the run's own handler")
        check_json(data, "the progress data")
        text = json.dumps(data)
        if len(text) > MAX_PROGRESS_BYTES:
            raise InputError(
                f"the progress data is {len(text)} bytes of JSON, over {MAX_PROGRESS_BYTES}"
            )
        return sink, text

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        """The run ``to_json`` gave (a remote worker's claim carries its runs so)."""
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        for name in _TIMES:
            if values.get(name) is not None:
                values[name] = datetime.fromisoformat(values[name])
        values["state"] = RunState(values["state"])
        if values.get("unique_states") is not None:
            values["unique_states"] = tuple(map(RunState, values["unique_states"]))
        return cls(**values)

    @classmethod
    def from_row(cls, columns: Sequence[str], values: Sequence[Any]) -> Run:
        """The run ``row`` gave under ``columns`` (a remote worker's claim in rows).

        Columns exactly ``RUN_FIELDS`` (an API of the same version) fill the run at once,
        as ``stored_run`` does; any others (an API of another version) go through
        ``from_json``, which takes the fields it knows."""
        if tuple(columns) != RUN_FIELDS:
            return cls.from_json(dict(zip(columns, values, strict=True)))
        row = dict(zip(RUN_FIELDS, values, strict=True))
        for name in _TIMES:
            if row[name] is not None:
                row[name] = datetime.fromisoformat(row[name])
        row["state"] = RunState(row["state"])
        if row["unique_states"] is not None:
            row["unique_states"] = tuple(map(RunState, row["unique_states"]))
        return stored_run(row)

    def row(self) -> tuple[Any, ...]:
        """The run's stored fields in ``RUN_FIELDS`` order, JSON-ready but for timestamps
        (``datetime``): a claim answered in rows names its fields once, not per run."""
        return _stored_values(self)

    def to_json(self) -> dict[str, Any]:
        """Return the run as JSON-ready data (timestamps in ISO 8601), with its reason."""
        data = {
            f.name: value.isoformat() if isinstance(value, datetime) else value
            for f in fields(self)
            if f.name != "hold"
            for value in [getattr(self, f.name)]
        }
        data["reason"] = self.reason
        return data


_NOT_STORED = {"duplicate": False, "lane_paused": False, "hold": None}
"""The fields no column holds, and what a run read from a row of ``runs`` alone has."""
_RUN_FIELDS = tuple(f.name for f in fields(Run) if f.name not in _NOT_STORED)
_RUN_COLUMNS = tuple(name.encode() for name in _RUN_FIELDS)
_LINED_COLUMNS = (*_RUN_COLUMNS, b"in_line")
"""``SELECT *`` of ``runs``: the run's fields, then whether it is in its key's line."""
RUN_FIELDS = _RUN_FIELDS
"""The fields a run's row holds, in the table's order (``Run.row``)."""
_stored_values = operator.attrgetter(*_RUN_FIELDS)


def stored_run(values: dict[str, Any]) -> Run:
    """Build a ``Run`` from a value for every one of its fields, checked by the caller.

    A frozen dataclass's ``__init__`` sets each field with ``object.__setattr__``: 6 µs
    for a run's 24 fields, on the claim's and the batch enqueue's hot paths (a third of
    what the enqueue's Python spends per run). Filling the instance's ``__dict__`` at
    once gives the same object, as frozen as before, in under 1 µs.
    """
    run = object.__new__(Run)
    run.__dict__.update(_NOT_STORED, **values)
    return run


_TIMES = ("scheduled_at", "inserted_at", "attempted_at", "completed_at", "lease_expires_at")


def run_row(cursor: Cursor[Any] | AsyncCursor[Any]) -> RowMaker[Run]:
    """Row factory that builds ``Run`` objects from ``SELECT *`` of ``runs``.

    When the columns are exactly ``Run``'s fields in order (the table's own order), rows
    are built positionally: this sits on the claim's hot path, so the names are read
    from the result itself (``description`` builds an object per column).
    """
    result = cursor.pgresult
    columns = tuple(result.fname(i) for i in range(result.nfields)) if result else ()
    if columns in (_RUN_COLUMNS, _LINED_COLUMNS):

        def make(values: Sequence[Any]) -> Run:
            # The table's last column, in_line, is the claim's alone (runs_key_line):
            # zip stops at the run's fields.
            row = dict(zip(_RUN_FIELDS, values))  # noqa: B905
            row["state"] = RunState(row["state"])
            if row["unique_states"] is not None:
                row["unique_states"] = read_states(row["unique_states"])
            return stored_run(row)

        return make
    names = [column.name for column in cursor.description or ()]
    known = {*_RUN_FIELDS, *_NOT_STORED}
    wanted = [(i, name) for i, name in enumerate(names) if name in known]

    def make_by_name(values: Sequence[Any]) -> Run:
        row = {name: values[i] for i, name in wanted}
        row["state"] = RunState(row["state"])
        if row.get("unique_states") is not None:
            row["unique_states"] = read_states(row["unique_states"])
        return Run(**row)

    return make_by_name


def read_states(array: str) -> tuple[RunState, ...]:
    """Read a ``run_state[]`` as PostgreSQL writes it (``{available,running}``): psycopg
    has no loader for the enum's array, and the labels need no quoting."""
    return tuple(RunState(label) for label in array.strip("{}").split(","))


def get_run(run_id: int) -> Steps[Run | None]:
    """Read one run, and whether its lane is paused (its ``reason``); ``None`` when there
    is none (never made, or pruned)."""
    rows = yield Statement("get_run", {"id": run_id}, run_row)
    return rows[0] if rows else None


def watched_run(run_id: int) -> Steps[Run | None]:
    """Read one run, marked watched first if it has not finished, so that its final
    transition NOTIFYs its id on the completion channel (storage/queries/watch_run.sql).

    For a waiter that LISTENs on that channel before it runs these steps: the run then
    either has finished when it is read, or will be notified.
    """
    yield Statement("watch_run", {"id": run_id})
    return (yield from get_run(run_id))


def args_filter(text: str) -> str:
    """Return the args filter ``text`` of a run list as the JSON text SQL takes, checked.

    A JSON object of at most ``MAX_ARGS_FILTER_CHARS`` characters, nested at most
    ``MAX_ARGS_FILTER_DEPTH`` deep; a run matches when its args contain it (jsonb's
    ``@>``: ``{"a": 1}`` matches ``{"a": 1, "b": 2}``). ``InputError`` says what is wrong.
    """
    what = "the args filter"
    if len(text) > MAX_ARGS_FILTER_CHARS:
        raise InputError(f"{what} is {len(text)} characters, over {MAX_ARGS_FILTER_CHARS}")
    value = parse_json(text, what, MAX_ARGS_FILTER_DEPTH)
    if not isinstance(value, dict):
        raise InputError(f'{what} must be a JSON object, such as {{"order": 7}}, got {text!r}')
    return json.dumps(value)


def list_runs(
    *,
    project: str | None = None,
    lane: str | None = None,
    state: str | None = None,
    task: str | None = None,
    key: str | None = None,
    args: str | None = None,
    limit: int = 50,
    before: int | None = None,
) -> Steps[list[Run]]:
    """Read the newest runs matching every filter given (``None``: any), older than the
    run ``before`` when it is given (the last of the page before). ``args``: a JSON
    object the runs' args contain (``args_filter`` checks it)."""
    params = {
        "project": project,
        "lane": lane,
        "state": state,
        "task": task,
        "key": key,
        "args": args,
        "limit": limit,
        "before": before,
    }
    return (yield Statement("list_runs", params, run_row))


def with_holds(found: list[Run]) -> Steps[list[Run]]:
    """Return ``found`` with what holds each waiting run, for the readers that say why a
    run waits (``GET /runs``, the run's page, ``tidegate runs``): a ready run's circuit
    breaker, and the run an ordered key's waiting runs (ready, delayed, retrying,
    pending) wait behind.

    Per (lane, key) of the waiting runs: one primary-key probe of the breakers (ready runs
    only), and the line's front where the key is ordered (read_order_holds.sql); none
    when no run waits.
    """
    waiting = {(run.lane, run.key) for run in found if _waits(run)}
    if not waiting:
        return found
    lanes, keys = zip(*waiting, strict=True)
    params = {"lanes": list(lanes), "keys": list(keys)}
    rows = yield Statement("read_breaker_holds", params)
    holds = {(lane, key): Hold(breaker, until) for lane, key, breaker, until in rows}
    for lane, key, behind, state, due in (yield Statement("read_order_holds", params)):
        hold = holds.get((lane, key), Hold(None, None))
        holds[lane, key] = replace(
            hold, behind=behind, behind_state=RunState(state), behind_due=due
        )
    return [
        replace(run, hold=holds[run.lane, run.key])
        if _waits(run) and (run.lane, run.key) in holds
        else run
        for run in found
    ]


def _waits(run: Run) -> bool:
    """Whether the run has not started: what a hold may be holding back."""
    return run.state in (RunState.AVAILABLE, RunState.SCHEDULED, RunState.PENDING)


def find_runs(ids: Sequence[int]) -> Steps[list[Run]]:
    """Read the runs of ``ids`` that exist, in no particular order."""
    return (yield Statement("list_runs_by_id", {"ids": list(ids)}, run_row))


def retry_runs(ids: Sequence[int], lane: str, *, channel: str) -> Steps[list[Run]]:
    """Run the finished runs of ``ids`` again in ``lane``, and return them; the others
    are left as they are. ``channel``: the NOTIFY channel that wakes the lane's workers
    (``Tidegate.available_channel``).

    The runs API and the dashboard's Retry button run these same steps: one run goes
    to the ``manual`` lane, many to ``default`` (docs/architecture.md).
    """
    params = {"ids": list(ids), "lane": lane, "channel": channel}
    return (yield Statement("retry_run", params, run_row))


def cancel_run(run_id: int, *, completed_channel: str) -> Steps[Run | None]:
    """Cancel the run if it has not finished, and return it; ``None`` if it had (or
    there is no such run). ``completed_channel``: where a caller waiting for the run
    hears that it ended (``Tidegate.completed_channel``).

    A running attempt's worker learns it at its next heartbeat: an async handler is
    cancelled, a sync one's outcome is not recorded (cancel_run.sql). The runs API, the
    dashboard's Cancel button and ``Tidegate.cancel`` run these same steps.
    """
    cancelled = yield from cancel_runs([run_id], completed_channel=completed_channel)
    return cancelled[0] if cancelled else None


def cancel_runs(ids: Sequence[int], *, completed_channel: str) -> Steps[list[Run]]:
    """Cancel the runs of ``ids`` that have not finished, and return them (``cancel_run``
    for many: a bulk cancel's batch)."""
    params = {"ids": list(ids), "completed_channel": completed_channel}
    return (yield Statement("cancel_run", params, run_row))


BULK_BATCH = 500
"""Runs a bulk retry, cancel or delete changes per statement: each batch is a statement (its own
transaction) that locks its runs for milliseconds, and claims skip locked rows."""
MAX_BULK_RUNS = 100_000
"""The most runs one bulk retry, cancel or delete changes; more are the next call's."""


class BulkAction(StrEnum):
    """What a bulk action does to the runs its filter matches, and which it can change."""

    RETRY = "retry"
    CANCEL = "cancel"
    DELETE = "delete"
    """Only finished runs: an unfinished one is work accepted and not yet done."""

    @property
    def states(self) -> list[str]:
        finished = self is not BulkAction.CANCEL
        return [state.value for state in RunState if state.finished is finished]


@dataclass(frozen=True)
class BulkResult:
    """What a bulk retry, cancel or delete did: how many runs it changed, and whether it stopped
    at its limit with runs left that the filter matches (call again for them)."""

    changed: int
    more: bool


def bulk_runs(
    action: BulkAction,
    filters: dict[str, Any],
    limit: int,
    *,
    available_channel: str,
    completed_channel: str,
    batch: int = BULK_BATCH,
) -> Steps[BulkResult]:
    """Retry, cancel or delete up to ``limit`` runs that match ``filters``
    (``list_runs``' names: project, lane, state, task, key, args), newest first,
    ``batch`` at a time.

    For a connection in autocommit (every driver's), each statement is its own
    transaction: a batch's runs are found without a lock, then changed by the action's
    own statement (``retry_runs``: to the ``default`` lane, as a bulk retry goes;
    ``cancel_runs``; delete_runs.sql, finished runs only), which locks them only while
    it changes them and passes over any that left the action's states meanwhile. No lock
    outlives a batch, and a claim skips a locked row rather than wait for it: a bulk
    action never stalls the workers.
    """
    changed = 0
    before: int | None = None
    while changed < limit:
        size = min(batch, limit - changed)
        params = {**filters, "states": action.states, "before": before, "limit": size}
        found = [row[0] for row in (yield Statement("find_matching_runs", params))]
        done: list[Any]
        if action is BulkAction.RETRY:
            done = yield from retry_runs(found, "default", channel=available_channel)
        elif action is BulkAction.CANCEL:
            done = yield from cancel_runs(found, completed_channel=completed_channel)
        else:
            done = yield Statement("delete_runs", {"ids": found, "states": action.states})
        changed += len(done)
        if len(found) < size:
            return BulkResult(changed, more=False)
        before = found[-1]
    return BulkResult(changed, more=True)


REPLY_KEY = "$reply"
"""A sync run's result shaped ``{"$reply": {"status", "headers", "body"}}`` is the HTTP
reply its webhook's sender gets (api/hooks.py)."""


class Retry(Exception):
    """Raise from a handler to run it again after ``delay_seconds``.

    The attempt does not count against ``max_attempts`` and records no error.
    """

    def __init__(self, delay_seconds: float = 0.0) -> None:
        delay_seconds = _delay(delay_seconds, "the retry's delay_seconds")
        super().__init__(f"retry in {delay_seconds}s")
        self.delay_seconds = delay_seconds


class Cancel(Exception):
    """Raise from a handler to stop its run for good: it ends ``cancelled``."""

    def __init__(self, reason: str = "cancelled by its handler") -> None:
        super().__init__(reason)
        self.reason = reason


class Discard(Exception):
    """Raise from a handler to end its run ``discarded`` now, attempts left or not.

    For a failure no retry can mend (a request the other side refuses for good):
    retrying would only spend time and load. ``reason`` and ``details`` (JSON, such as
    the refusal itself) are kept in the attempt's entry in the run's ``errors``.
    """

    def __init__(self, reason: str = "discarded by its handler", details: Any = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.details = details


class DownstreamFailing(Exception):
    """Raise from a handler when what it calls is failing, not the input it was given.

    The attempt counts as a failure for the key's circuit breaker (see
    ``tidegate.policies``), is recorded in the run's errors, and is given back: the run
    is retried after ``retry_after`` seconds (the downstream's own ``Retry-After``, when
    it sent one), else after the usual backoff, without spending one of its attempts.
    While the key's breaker is open, the run waits unclaimed. Without a breaker policy
    such a run retries for as long as its downstream fails.

    ``reply``: for a run whose caller is waiting (a sync trigger's), the HTTP reply to
    give it now, ``{"status", "headers", "body"}`` as in ``$reply``; the run then ends
    ``discarded`` with that reply as its result, still counted as a failure.
    ``tidegate.forward`` passes a failing endpoint's answer on this way.
    """

    def __init__(
        self,
        reason: str = "the downstream is failing",
        retry_after: float | None = None,
        *,
        reply: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = None if retry_after is None else _delay(retry_after, "retry_after")
        if reply is not None:
            if not isinstance(reply, dict):
                raise InputError(f"reply must be a dict, got {type(reply).__name__}")
            check_json(reply, "the reply")
        self.reply = reply


def _delay(seconds: Any, what: str) -> float:
    """Return a delay a handler asked for, checked (raising in the handler, where the
    mistake is: its attempt fails, saying why)."""
    return check_number(seconds, what, 0.0, MAX_DELAY_SECONDS, whole=False)


_current_run: contextvars.ContextVar[Run] = contextvars.ContextVar("tidegate_current_run")


class ProgressSink(Protocol):
    """Where ``Run.progress`` hands a run's events: the worker's completer."""

    def report(self, run: Run, data: str) -> None: ...

    async def areport(self, run: Run, data: str) -> None: ...


_progress: contextvars.ContextVar[ProgressSink] = contextvars.ContextVar("tidegate_progress")


def current_run() -> Run:
    """Return the run whose handler is executing (raises ``LookupError`` outside one)."""
    return _current_run.get()
