"""Test an application's tasks against a real database: the harness, and the pytest
plugin's fixtures that give it (``_tidegate_pytest``, loaded by pytest wherever tidegate
is installed: ``tidegate_database_url``, ``tidegate_schema``, ``tidegate_app`` bound to
that schema and migrated, ``tidegate_harness``).

::

    def test_signup_sends_a_welcome(tidegate_harness):
        signup("a@example.com")                                   # enqueues
        tidegate_harness.assert_enqueued(send_welcome, args={"to": "a@example.com"})
        [done] = tidegate_harness.drain()                         # a worker, in-process
        assert done.state == "succeeded"

    def test_welcome_retries_a_bounce(tidegate_harness):
        performed = tidegate_harness.perform(send_welcome, {"to": "bounce@example.com"})
        assert performed.state == "scheduled" and performed.error is not None

``drain`` runs a real worker (the same claim, execution and outcome as ``tidegate
worker``); ``perform`` runs one handler the way a worker's attempt does
(worker/execute.py), without a database. Nothing here needs pytest: a ``Harness(app)``
serves ``unittest`` and Django's test cases as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tidegate.app import NewRun, Task, Tidegate
from tidegate.errors import UnknownTaskError
from tidegate.runs import Run, RunState, _progress, run_row
from tidegate.storage.database import Database
from tidegate.storage.sql import Statement, Steps, adrive
from tidegate.worker.execute import execute
from tidegate.worker.runtime import Worker
from tidegate.worker.services import fetch

DRAIN_SETTINGS: dict[str, Any] = {
    "workloops": "*:1",
    "poll_seconds": 0.1,
    "stage_seconds": 0.02,
}
"""The worker ``drain`` runs: one slot taking every lane, so runs execute one at a time
in claim order; a retry that comes due at once (``Retry()``) is staged within 20 ms."""
DRAIN_CHECK_SECONDS = 0.01
DRAIN_TIMEOUT_SECONDS = 60.0
"""How long ``drain`` works before it fails the test: far past any test's runs."""
"""How often ``drain`` asks the database whether a run is left to do."""


@contextlib.contextmanager
def bound(app: Tidegate, **settings: Any) -> Iterator[Tidegate]:
    """Point ``app`` at other settings (``database_url``, ``schema``) for the block, then
    back: the code under test keeps using the object it imported."""
    saved = app.settings, app.database, app._async_pool, app._worker_checks
    app.settings = app.settings.replace(**settings)
    app.database = Database(app.settings)
    app._async_pool, app._worker_checks = None, {}
    try:
        yield app
    finally:
        app.close()
        app.settings, app.database, app._async_pool, app._worker_checks = saved


@dataclass(frozen=True)
class Performed:
    """What one attempt of a handler came to (``Harness.perform``)."""

    state: RunState
    """``succeeded``; ``scheduled`` (to run again: a failure with attempts left, or
    ``Retry``); ``cancelled`` (``Cancel``); ``discarded`` (``Discard``, or a failure of
    the last attempt)."""
    result: Any
    """What the handler returned (as JSON gives it back)."""
    error: dict[str, Any] | None
    """The attempt's entry in the run's ``errors`` (``error``, ``traceback``,
    ``details``); ``None`` when it succeeded or asked for a ``Retry``."""
    delay_seconds: float
    """When ``scheduled``: how long before the next attempt."""
    progress: list[Any]
    """What the handler reported with ``progress`` / ``aprogress``, in order."""
    run: Run
    """The run the handler was given (``current_run()``)."""


@dataclass
class _Progress:
    """A ``ProgressSink`` that keeps a performed run's events."""

    events: list[Any] = field(default_factory=list)

    def report(self, run: Run, data: str) -> None:
        self.events.append(json.loads(data))

    async def areport(self, run: Run, data: str) -> None:
        self.report(run, data)


class Harness:
    """Look at what an app enqueued, and run its tasks in-process."""

    def __init__(self, app: Tidegate) -> None:
        self.app = app

    def enqueued(
        self, task: str | Task | None = None, args: dict[str, Any] | None = None
    ) -> list[Run]:
        """The runs not started yet (scheduled, available, pending), oldest first: of
        ``task`` (``None``: any), whose args contain ``args`` (``None``: any)."""
        return self.app.execute(_find_enqueued(task, args))

    def assert_enqueued(self, task: str | Task, args: dict[str, Any] | None = None) -> Run:
        """Assert that a run of ``task`` whose args contain ``args`` waits to start;
        return the oldest such run. The failure lists what is enqueued instead."""
        found = self.enqueued(task, args)
        if not found:
            name = task if isinstance(task, str) else task.name
            others = [run.args for run in self.enqueued(task)]
            wanted = "" if args is None else f" with args containing {args!r}"
            raise AssertionError(
                f"no run of {name!r}{wanted} is enqueued; "
                + (f"its enqueued runs' args: {others!r}" if others else "none of it is")
            )
        return found[0]

    def drain(self, timeout: float | None = DRAIN_TIMEOUT_SECONDS) -> list[Run]:
        """Run every due run of the app's tasks in-process until none is left, and
        return the runs it worked, as they stand after (``state``, ``result``,
        ``errors``), in id order. Not from a running event loop: await ``adrain``."""
        return asyncio.run(self.adrain(timeout))

    async def adrain(self, timeout: float | None = DRAIN_TIMEOUT_SECONDS) -> list[Run]:
        """Async form of ``drain``.

        A worker of this app (``DRAIN_SETTINGS``) claims, executes and completes runs as
        ``tidegate worker`` does, runs its handlers enqueue included, until no run of
        its tasks is ready, pending, running, or scheduled and due, and every outcome
        is written. A run scheduled for later (a retry's backoff, ``delay=``), or of a
        paused lane (``Tidegate.pause_lane``), is left as it is.

        Raises ``TimeoutError`` when runs are still due after ``timeout`` seconds
        (``None``: no bound): a handler that never returns, or runs that enqueue runs
        for ever, fail the test instead of hanging it.
        """
        worker = Worker(self.app, self.app.settings.replace(**DRAIN_SETTINGS))
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop), name="tidegate.drain")
        left = None
        try:
            async with asyncio.timeout(timeout):
                await _unless_stopped(worker.started, running)
                tasks = {"tasks": list(worker.tasks)}
                while True:
                    await _unless_stopped(worker.completer.settled, running)
                    [(left,)] = await fetch(worker.pool, "count_due_runs", tasks)
                    if left == 0 and worker.completer.settled.is_set():
                        break
                    await asyncio.sleep(DRAIN_CHECK_SECONDS)
            async with worker.pool.connection() as conn:
                return await adrive(conn, _find_by_worker(worker.id))
        except TimeoutError:
            raise TimeoutError(
                f"drain: runs still due after {timeout} s ({left} at the last count): "
                "a handler that does not return, or runs that enqueue more for ever?"
            ) from None
        finally:
            stop.set()
            await running

    def perform(
        self, task: str | Task, args: dict[str, Any] | None = None, **options: Any
    ) -> Performed:
        """Run ``task``'s handler once with ``args``, as a worker's attempt does, and say
        what came of it. Not from a running event loop: await ``aperform``."""
        return asyncio.run(self.aperform(task, args, **options))

    async def aperform(
        self,
        task: str | Task,
        args: dict[str, Any] | None = None,
        *,
        attempt: int = 1,
        **options: Any,
    ) -> Performed:
        """Async form of ``perform``.

        The run is made as ``enqueue`` would make it (``options``: ``NewRun``'s, such as
        ``key`` or ``max_attempts``), but not stored: its id is 0. ``attempt`` says which
        attempt this is (a failure of the last one discards the run). The handler gets
        it as ``current_run()``; its ``progress`` is kept in ``Performed.progress``; a
        sync handler runs in a thread, with the task's timeout, as on a worker.
        """
        handler = task if isinstance(task, Task) else self.app.tasks.get(task)
        if handler is None:
            raise UnknownTaskError(f"task {task!r} is not registered on this app")
        row = self.app.resolve(NewRun(task, args, **options))
        now = datetime.now(UTC)
        run = Run(
            id=0,
            project=row["project"],
            lane=row["lane"],
            key=row["key"],
            task=row["task"],
            args=row["args"],
            state=RunState.RUNNING,
            priority=row["priority"],
            attempt=attempt,
            max_attempts=row["max_attempts"],
            scheduled_at=row["scheduled_at"] or now,
            inserted_at=now,
            attempted_at=now,
            completed_at=None,
            worker_id=None,
            lease_expires_at=None,
            result=None,
            errors=[],
            idempotency_key=row["idempotency_key"],
        )
        sink = _Progress()
        token = _progress.set(sink)
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidegate-perform") as pool:
                outcome = await execute(run, handler, pool, self.app.settings)
        finally:
            _progress.reset(token)
        return Performed(
            state=outcome.state,
            result=None if outcome.result is None else json.loads(outcome.result),
            error=None if outcome.error is None else json.loads(outcome.error),
            delay_seconds=outcome.delay_seconds,
            progress=sink.events,
            run=run,
        )


async def _unless_stopped(event: asyncio.Event, worker: asyncio.Task[None]) -> None:
    """Wait for ``event``; raise the worker's error (or say it stopped) if it ends first."""
    waiting = asyncio.create_task(event.wait())
    await asyncio.wait([waiting, worker], return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if worker.done():
        worker.result()
        raise RuntimeError("the drain's worker stopped before every due run was done")


def _find_enqueued(task: str | Task | None, args: dict[str, Any] | None) -> Steps[list[Run]]:
    name = task.name if isinstance(task, Task) else task
    params = {"task": name, "args": None if args is None else json.dumps(args)}
    return (yield Statement("find_enqueued_runs", params, run_row))


def _find_by_worker(worker_id: str) -> Steps[list[Run]]:
    return (yield Statement("find_runs_by_worker", {"worker_id": worker_id}, run_row))
