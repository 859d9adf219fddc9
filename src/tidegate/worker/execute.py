"""Run one attempt of a run's handler and turn what happened into an ``Outcome``.

Async handlers run on the event loop, sync handlers in the worker's thread pool. A
task's ``timeout`` bounds the attempt: an async handler is cancelled; a sync handler's
thread cannot be stopped from outside, so the attempt is recorded as failed and the
thread's eventual return is ignored.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import random
import traceback
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tidegate.app import Task
from tidegate.errors import UnknownTaskError
from tidegate.runs import Cancel, Retry, Run, RunState, _current_run
from tidegate.settings import Settings

MAX_TRACEBACK_CHARS = 4000


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
    delay_seconds: float = 0.0
    max_attempts: int = 1

    def as_row(self) -> dict[str, Any]:
        """Return the outcome as one element of ``complete_runs``' JSON batch."""
        row = {
            "id": self.run_id,
            "attempt": self.attempt,
            "state": self.state.value,
            "delay_seconds": self.delay_seconds,
            "max_attempts": self.max_attempts,
        }
        if self.result is not None:
            row["result"] = self.result
        if self.error is not None:
            row["error"] = self.error
        return row


async def execute(run: Run, task: Task | None, executor: Executor, settings: Settings) -> Outcome:
    """Run the handler of ``run`` once and return its outcome; never raises but cancel."""
    token = _current_run.set(run)
    try:
        if task is None:
            raise UnknownTaskError(f"no task named {run.task!r} is registered on this worker")
        if task.is_async:
            pending = task.fn(**run.args)
        else:
            call = functools.partial(contextvars.copy_context().run, task.fn, **run.args)
            pending = asyncio.get_running_loop().run_in_executor(executor, call)
        result = await asyncio.wait_for(pending, task.timeout) if task.timeout else await pending
        return _finished(run, RunState.SUCCEEDED, result=_result_json(result))
    except Retry as retry:
        # A requested retry is not a failure: it gives the attempt back.
        return _finished(
            run,
            RunState.SCHEDULED,
            delay_seconds=retry.delay_seconds,
            max_attempts=run.max_attempts + 1,
        )
    except Cancel as cancel:
        return _finished(run, RunState.CANCELLED, error=_error(run, f"Cancel: {cancel.reason}"))
    except TimeoutError:
        timeout = task.timeout if task else None
        return _failed(run, task, settings, f"TimeoutError: attempt exceeded {timeout}s", None)
    except Exception as exc:
        return _failed(run, task, settings, f"{type(exc).__name__}: {exc}", exc)
    finally:
        _current_run.reset(token)


def backoff_seconds(attempt: int, settings: Settings) -> float:
    """Return the wait before the attempt after ``attempt``: exponential, equal jitter.

    ``base * 2**(attempt-1)``, capped at ``backoff_max_seconds``; half of it fixed, half
    random, so that runs failing together do not come back together.
    """
    ceiling = min(
        settings.backoff_max_seconds, settings.backoff_base_seconds * 2.0 ** (attempt - 1)
    )
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def _failed(
    run: Run, task: Task | None, settings: Settings, message: str, exc: BaseException | None
) -> Outcome:
    error = _error(run, message, exc)
    if run.attempt >= run.max_attempts:
        return _finished(run, RunState.DISCARDED, error=error)
    delay = (
        task.backoff(run.attempt)
        if task and task.backoff
        else backoff_seconds(run.attempt, settings)
    )
    return _finished(run, RunState.SCHEDULED, error=error, delay_seconds=delay)


def _finished(
    run: Run,
    state: RunState,
    *,
    result: str | None = None,
    error: str | None = None,
    delay_seconds: float = 0.0,
    max_attempts: int | None = None,
) -> Outcome:
    return Outcome(
        run_id=run.id,
        attempt=run.attempt,
        lane=run.lane,
        state=state,
        result=result,
        error=error,
        delay_seconds=delay_seconds,
        max_attempts=max_attempts or run.max_attempts,
    )


def _error(run: Run, message: str, exc: BaseException | None = None) -> str:
    entry: dict[str, Any] = {
        "attempt": run.attempt,
        "at": datetime.now(UTC).isoformat(),
        "error": message,
    }
    if exc is not None:
        entry["traceback"] = "".join(traceback.format_exception(exc))[-MAX_TRACEBACK_CHARS:]
    return json.dumps(entry)


def _result_json(result: Any) -> str | None:
    if result is None:
        return None
    try:
        return json.dumps(result)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a handler's result must be JSON, got {type(result).__name__}") from exc
