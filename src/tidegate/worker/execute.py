"""Run one attempt of a run's handler and turn what happened into an ``Outcome``.

Async handlers run on the event loop, sync handlers in the worker's thread pool. A
task's ``timeout`` bounds the attempt: an async handler is cancelled, and the attempt
ends once it has stopped. A thread cannot be stopped from outside, so a sync handler
past its timeout, or still running when the worker shuts down, is waited for: its run
stays leased and its slot taken until the thread returns. A run is never retried or
handed back while its handler may still be executing (docs/architecture.md, invariant 8).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import random
import traceback
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from tidegate.app import Task
from tidegate.errors import InputError
from tidegate.limits import check_json
from tidegate.runs import (
    REPLY_KEY,
    Cancel,
    Discard,
    DownstreamFailing,
    Retry,
    Run,
    RunState,
    _current_run,
)
from tidegate.settings import Settings

log = logging.getLogger("tidegate.worker")

MAX_TRACEBACK_CHARS = 4000
MAX_MESSAGE_CHARS = 2000

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


@dataclass(frozen=True)
class Outcome:
    """What an attempt came to, as ``complete_runs`` writes it."""

    run_id: int
    attempt: int
    lane: str
    state: RunState
    result: str | None = None
    """The result as JSON text."""
    error: str | None = None
    """This attempt's error entry as JSON text."""
    message: str | None = None
    """The error in one line, ``Type: message``, for the log."""
    delay_seconds: float = 0.0
    max_attempts: int = 1
    verdict: str | None = None
    """What the attempt tells of the key's downstream, for its circuit breaker:
    ``"success"``, ``"failure"``, or ``None`` (a Retry, Cancel or Discard tells nothing:
    bad input must not open its tenant's circuit)."""
    raised: ExcInfo | None = field(default=None, repr=False, compare=False)
    """What the handler raised, with its traceback from the handler's own frame on
    (``handler_traceback``), for the worker's log line; never written."""

    def as_row(self) -> dict[str, Any]:
        """Return the outcome as one element of ``complete_runs``' JSON batch."""
        row = {
            "id": self.run_id,
            "attempt": self.attempt,
            "state": self.state.value,
            "delay_seconds": self.delay_seconds,
            "max_attempts": self.max_attempts,
            "verdict": self.verdict,
        }
        if self.result is not None:
            row["result"] = self.result
        if self.error is not None:
            row["error"] = self.error
        return row


async def execute(run: Run, task: Task, executor: Executor, settings: Settings) -> Outcome:
    """Run the handler of ``run`` once and return its outcome.

    Never raises, but ``CancelledError`` when an async handler was cancelled (the
    worker's shutdown): it has stopped then, and the run can be handed back.
    """
    token = _current_run.set(run)
    try:
        if task.is_async:
            pending = task.fn(**run.args)
            result = (
                await asyncio.wait_for(pending, task.timeout) if task.timeout else await pending
            )
        else:
            result = await _in_thread(run, task, executor)
        return _finished(
            run, RunState.SUCCEEDED, result=_result_json(result, settings), verdict="success"
        )
    except DownstreamFailing as failing:
        return _downstream_failing(run, task, settings, failing)
    except Retry as retry:
        # A requested retry is not a failure: it gives the attempt back.
        return _finished(
            run,
            RunState.SCHEDULED,
            delay_seconds=retry.delay_seconds,
            max_attempts=run.max_attempts + 1,
        )
    except Cancel as cancel:
        error, message = _error(run, f"Cancel: {cancel.reason}")
        return _finished(run, RunState.CANCELLED, error=error, message=message)
    except Discard as discard:
        error, message = _error(
            run, f"Discard: {discard.reason}", details=_details(discard.details, settings)
        )
        return _finished(run, RunState.DISCARDED, error=error, message=message)
    except TimeoutError:
        return _failed(run, task, settings, f"TimeoutError: attempt exceeded {task.timeout}s", None)
    except Exception as exc:
        return _failed(run, task, settings, f"{type(exc).__name__}: {exc}", exc)
    finally:
        _current_run.reset(token)


async def _in_thread(run: Run, task: Task, executor: Executor) -> Any:
    """Run a sync handler in the pool; return (or raise) only once its thread is done.

    Past the task's timeout the attempt fails, but only after the thread returns. When
    the worker cancels it (shutdown past its grace period), the thread is waited for and
    its own result is the attempt's outcome: it did run to the end.
    """
    call = functools.partial(contextvars.copy_context().run, task.fn, **run.args)
    thread = asyncio.get_running_loop().run_in_executor(executor, call)
    try:
        return await asyncio.wait_for(asyncio.shield(thread), task.timeout)
    except TimeoutError:
        log.warning(
            "run %d (task %s): past its %ss timeout; a thread cannot be stopped, so the run "
            "stays leased until the handler returns",
            run.id,
            run.task,
            task.timeout,
        )
        await _settled(thread)
        raise
    except asyncio.CancelledError:
        await _settled(thread)
        return thread.result()


async def _settled(future: asyncio.Future[Any]) -> None:
    """Wait until ``future`` is done, whatever cancels the waiting meanwhile."""
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([future])


def backoff_seconds(attempt: int, settings: Settings) -> float:
    """Return the wait before the attempt after ``attempt``: exponential, equal jitter.

    ``base * 2**(attempt-1)``, capped at ``backoff_max_seconds``; half of it fixed, half
    random, so that runs failing together do not come back together.
    """
    ceiling = min(
        settings.backoff_max_seconds, settings.backoff_base_seconds * 2.0 ** (attempt - 1)
    )
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def handler_traceback(exc: BaseException, handler: Any) -> ExcInfo:
    """Return ``exc`` with its traceback from the frame of ``handler`` on.

    The frames above it are tidegate's own, asyncio's and the thread pool's, which
    called the handler: the same for every failure, they would open each stored error
    and log line before the frames that tell what went wrong. A failure raised before
    the handler ran (arguments it does not take) keeps the whole traceback.
    """
    code = getattr(handler, "__code__", None)
    frames = exc.__traceback__
    while frames is not None and frames.tb_frame.f_code is not code:
        frames = frames.tb_next
    return type(exc), exc, frames or exc.__traceback__


def _failed(
    run: Run, task: Task | None, settings: Settings, message: str, exc: BaseException | None
) -> Outcome:
    raised = None if exc is None else handler_traceback(exc, task.fn if task else None)
    error, message = _error(run, message, raised)
    if run.attempt >= run.max_attempts:
        return _finished(
            run,
            RunState.DISCARDED,
            error=error,
            message=message,
            verdict="failure",
            raised=raised,
        )
    return _finished(
        run,
        RunState.SCHEDULED,
        error=error,
        message=message,
        delay_seconds=_backoff(run, task, settings),
        verdict="failure",
        raised=raised,
    )


def _downstream_failing(
    run: Run, task: Task, settings: Settings, failing: DownstreamFailing
) -> Outcome:
    """A failure that gives the attempt back (or, with a reply, ends the run with it)."""
    if failing.reply is not None:
        try:
            result = _result_json({REPLY_KEY: failing.reply}, settings)
        except TypeError as exc:  # nested deeper than max_json_depth
            return _failed(run, task, settings, f"TypeError: {exc}", exc)
        error, message = _error(run, f"DownstreamFailing: {failing.reason}")
        return _finished(
            run, RunState.DISCARDED, result=result, error=error, message=message, verdict="failure"
        )
    error, message = _error(run, f"DownstreamFailing: {failing.reason}")
    delay = failing.retry_after
    return _finished(
        run,
        RunState.SCHEDULED,
        error=error,
        message=message,
        delay_seconds=_backoff(run, task, settings) if delay is None else delay,
        max_attempts=run.max_attempts + 1,
        verdict="failure",
    )


def _backoff(run: Run, task: Task | None, settings: Settings) -> float:
    if task is not None and task.backoff:
        return task.backoff(run.attempt)
    return backoff_seconds(run.attempt, settings)


def reported_outcome(run: Run, report: dict[str, Any], settings: Settings) -> Outcome:
    """The outcome a remote worker reports for its attempt of ``run``, as ``execute``
    would have made it of what a local handler did (api/workers.py):

    - ``succeeded`` with ``result``: the handler returned it;
    - ``failed`` with ``error``: it raised (backoff, or discarded after the last attempt);
    - ``retry`` with ``delay_seconds``: ``Retry``; ``cancelled`` with ``reason``:
      ``Cancel``; ``discarded`` with ``reason`` and ``details``: ``Discard``.

    The report was validated at the boundary: its result and details are JSON.
    """
    state = report["state"]
    if state == "succeeded":
        result = report.get("result")
        encoded = None if result is None else json.dumps(result)
        return _finished(run, RunState.SUCCEEDED, result=encoded, verdict="success")
    if state == "failed":
        return _failed(run, None, settings, _storable(report["error"]), None)
    if state == "retry":
        return _finished(
            run,
            RunState.SCHEDULED,
            delay_seconds=report["delay_seconds"],
            max_attempts=run.max_attempts + 1,
        )
    if state == "cancelled":
        error, message = _error(run, f"Cancel: {report['reason']}")
        return _finished(run, RunState.CANCELLED, error=error, message=message)
    error, message = _error(run, f"Discard: {report['reason']}", details=report.get("details"))
    return _finished(run, RunState.DISCARDED, error=error, message=message)


def _finished(
    run: Run,
    state: RunState,
    *,
    result: str | None = None,
    error: str | None = None,
    message: str | None = None,
    delay_seconds: float = 0.0,
    max_attempts: int | None = None,
    verdict: str | None = None,
    raised: ExcInfo | None = None,
) -> Outcome:
    return Outcome(
        run_id=run.id,
        attempt=run.attempt,
        lane=run.lane,
        state=state,
        result=result,
        error=error,
        message=message,
        delay_seconds=delay_seconds,
        max_attempts=max_attempts or run.max_attempts,
        verdict=verdict,
        raised=raised,
    )


def _error(
    run: Run, message: str, raised: ExcInfo | None = None, *, details: Any = None
) -> tuple[str, str]:
    """Return an attempt's error entry (JSON text) and its one-line message."""
    message = _storable(message)[:MAX_MESSAGE_CHARS]
    entry: dict[str, Any] = {
        "attempt": run.attempt,
        "at": datetime.now(UTC).isoformat(),
        "error": message,
    }
    if raised is not None:
        shown = "".join(traceback.format_exception(*raised))
        entry["traceback"] = _storable(shown)[-MAX_TRACEBACK_CHARS:]
    if details is not None:
        entry["details"] = details
    return json.dumps(entry), message


def _details(details: Any, settings: Settings) -> Any:
    """Return a ``Discard``'s details if jsonb can hold them, else why they were dropped.

    The run must end discarded whatever its handler put in them.
    """
    try:
        check_json(details, "the discard's details", settings.max_json_depth)
    except InputError as error:
        return {"dropped": str(error)}
    return details


def _storable(text: str) -> str:
    """Return ``text`` with what jsonb cannot hold (NUL, lone surrogates) spelled out.

    An exception's message is whatever a handler put in it; it must not stop the
    attempt's outcome from being written.
    """
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def _result_json(result: Any, settings: Settings) -> str | None:
    if result is None:
        return None
    try:
        check_json(result, "the handler's result", settings.max_json_depth)
    except InputError as error:
        raise TypeError(str(error)) from None
    return json.dumps(result)
