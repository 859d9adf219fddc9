"""The library's front door: ``Tidegate``, tasks, and enqueueing runs.

::

    app = Tidegate()                       # embedded PostgreSQL, or TIDEGATE_DATABASE_URL

    @app.task(lane="default", max_attempts=5, timeout=30)
    async def send_email(to: str, subject: str) -> dict:
        ...

    app.migrate()
    run = app.enqueue(send_email, {"to": "a@example.com", "subject": "hi"})
    runs = app.enqueue_many([NewRun(send_email, {...}) for ...])   # one statement
    app.enqueue(send_email, {...}, connection=conn)   # in the caller's transaction
    app.result(run.id, timeout=60)                    # wait for the run's result
    app.run_worker("fast_lane:1 manual>*:4")

Every operation has a sync form (``enqueue``) and an async one (``aenqueue``); both run
the same steps (``storage.sql.Steps``), only the connection differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import sys
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar, overload

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from tidegate import forward, policies, schedules
from tidegate.errors import (
    ConfigError,
    EnqueueError,
    InputError,
    ResultTimeout,
    RunCancelled,
    RunFailed,
    SchemaError,
    UnavailableError,
    UnknownRunError,
)
from tidegate.lanes import DEFAULT_LANE as DEFAULT_LANE  # re-exported: api/, ui/ import it
from tidegate.lanes import FAST_LANE, PausedLane, pause_lane, resume_lane
from tidegate.limits import (
    ATTEMPTS,
    PRIORITY,
    check_identifier,
    check_json,
    check_lane,
    check_text,
)
from tidegate.projects import DEFAULT_PROJECT
from tidegate.runs import (
    Run,
    RunState,
    args_filter,
    cancel_run,
    get_run,
    list_runs,
    run_row,
    stored_run,
    watched_run,
)
from tidegate.schedules import Declared
from tidegate.settings import Settings
from tidegate.storage.database import Database, describe_failure
from tidegate.storage.migrate import check_schema, migrate
from tidegate.storage.sql import Statement, Steps, adrive, drive, in_schema
from tidegate.tasks import TaskSettings, find_tasks
from tidegate.tracing import Span, carrier, span
from tidegate.unique import Unique

MAX_DELAY = timedelta(days=3650)
WORKER_CHECK_SECONDS = 60.0
"""How often, at most, an enqueue looks whether a live worker has its task."""
MISSING_OBJECTS = ("42P01", "42883", "3F000")
"""SQLSTATEs of a statement on a schema that is not migrated: undefined table, undefined
function, invalid schema name."""
RESULT_POLL_SECONDS = 5.0
"""How long ``result`` waits for its run's notification before it reads the run again
anyway: a safety net only, since the run's end NOTIFYs the completion channel."""
LIBRARY_PAUSE = "library"
"""Where a pause made with ``Tidegate.pause_lane`` says it came from."""

log = logging.getLogger("tidegate")

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Task:
    """A registered handler and the defaults of the runs enqueued for it."""

    name: str
    fn: Callable[..., Any]
    lane: str = DEFAULT_LANE
    max_attempts: int | None = None
    timeout: float | None = None
    """Seconds an attempt may take; ``None`` for no limit."""
    priority: int = 0
    key: Callable[[dict[str, Any]], str] | None = None
    """Computes a run's concurrency/fairness key from its args (default: its project)."""
    backoff: Callable[[int], float] | None = None
    """Seconds to wait before attempt ``n + 1`` after attempt ``n`` failed."""

    @functools.cached_property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @functools.cached_property
    def settings(self) -> TaskSettings:
        """What a worker declares of the task for every process (``tidegate.tasks``)."""
        key = self.key
        return TaskSettings(
            name=self.name,
            lane=self.lane,
            max_attempts=self.max_attempts,
            timeout_seconds=self.timeout,
            priority=self.priority,
            key_function=None if key is None else f"{key.__module__}.{key.__qualname__}",
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


@dataclass(frozen=True)
class NewRun:
    """A run to enqueue; options left ``None`` come from the task, then the defaults."""

    task: str | Task
    args: dict[str, Any] | None = None
    project: str = DEFAULT_PROJECT
    lane: str | None = None
    key: str | None = None
    priority: int | None = None
    run_at: datetime | None = None
    delay: float | timedelta | None = None
    """Seconds (or a timedelta) from now; the run is ``scheduled`` until then."""
    idempotency_key: str | None = None
    max_attempts: int | None = None
    unique: Unique | None = None
    """Insert the run only if no run like it is there already (``tidegate.unique``)."""


class Tidegate:
    """A tidegate application: its settings, database, and registered tasks."""

    def __init__(
        self, database_url: str | None = None, *, settings: Settings | None = None, **options: Any
    ) -> None:
        self.settings = settings or Settings.from_env(database_url=database_url, **options)
        self.database = Database(self.settings)
        self.tasks: dict[str, Task] = {}
        # Every app can forward: a trigger's forward_url needs no code of the user's.
        self.tasks[forward.FORWARD_TASK] = Task(
            forward.FORWARD_TASK,
            forward.handler(lambda run: self.aexecute(forward.find_delivery(run.id))),
            timeout=None,
        )
        self.schedules: dict[tuple[str, str], Declared] = {}
        """The schedules declared with ``periodic``, by (project, name)."""
        self._async_pool: (
            tuple[asyncio.AbstractEventLoop, AsyncConnectionPool, asyncio.Task[None]] | None
        ) = None
        """``aexecute``'s pool, the loop it serves, and the task that closes it (``_pool_on``)."""
        self._worker_checks: dict[tuple[str, str], float] = {}
        """When each (lane, task) was last found to have a live worker, or not."""
        self._keys_warned: set[str] = set()
        """The tasks enqueued by name whose key function this process has been warned of."""

    @property
    def available_channel(self) -> str:
        """The NOTIFY channel that wakes workers; the payload is the lane."""
        return f"{self.settings.schema}.available"

    @property
    def completed_channel(self) -> str:
        """The NOTIFY channel of finished fast-lane runs and watched runs; the payload is
        the run id."""
        return f"{self.settings.schema}.completed"

    # -- tasks --------------------------------------------------------------------

    @overload
    def task(self, fn: F) -> Task: ...

    @overload
    def task(
        self,
        fn: None = None,
        *,
        name: str | None = None,
        lane: str = DEFAULT_LANE,
        max_attempts: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        key: Callable[[dict[str, Any]], str] | None = None,
        backoff: Callable[[int], float] | None = None,
    ) -> Callable[[F], Task]: ...

    def task(
        self,
        fn: F | None = None,
        *,
        name: str | None = None,
        lane: str = DEFAULT_LANE,
        max_attempts: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        key: Callable[[dict[str, Any]], str] | None = None,
        backoff: Callable[[int], float] | None = None,
    ) -> Task | Callable[[F], Task]:
        """Register a handler, as ``@app.task`` or ``@app.task(name=..., lane=...)``.

        The handler is called with the run's args as keyword arguments; an ``async def``
        runs on the worker's event loop, a plain ``def`` in its thread pool. Its return
        value (JSON) becomes the run's result.
        """

        def register(fn: F) -> Task:
            task = Task(
                name=name or task_name(fn),
                fn=fn,
                lane=lane,
                max_attempts=max_attempts,
                timeout=timeout,
                priority=priority,
                key=key,
                backoff=backoff,
            )
            try:
                task.settings.checked()  # what every process will read of it
            except InputError as error:
                raise ConfigError(f"task {task.name!r}: {error}") from None
            self.tasks[task.name] = task
            return task

        return register(fn) if fn is not None else register

    def periodic(
        self,
        cron: str | None = None,
        *,
        every: float | timedelta | None = None,
        timezone: str = "UTC",
        name: str | None = None,
        args: dict[str, Any] | None = None,
        project: str = DEFAULT_PROJECT,
        lane: str | None = None,
        key: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        catch_up: str = schedules.DEFAULT_CATCH_UP,
        catch_up_limit: int = schedules.DEFAULT_CATCH_UP_LIMIT,
        overlap: str = "allow",
    ) -> Callable[[F | Task], Task]:
        """Run a task on a schedule: ``@app.periodic("0 8 * * MON", timezone="Europe/Berlin")``
        (or ``every=30`` seconds) above ``@app.task(...)``, a plain function (made a task
        with the defaults), or called on a task: ``app.periodic(every=60)(send_digest)``.

        Each worker with the task writes the schedule when it starts (and deletes the
        schedules of its tasks the code no longer declares); every tick makes exactly one
        run, however many workers run. ``name`` (default: the task's name) tells a task's
        schedules apart; options left ``None`` come from the task, as for ``enqueue``.
        See ``tidegate.schedules`` for the timing, DST, and the ``catch_up`` and
        ``overlap`` policies.
        """
        seconds = every.total_seconds() if isinstance(every, timedelta) else every

        def declare(target: F | Task) -> Task:
            task = target if isinstance(target, Task) else self.task(target)
            declared_name = name or task.name
            try:
                fields = schedules.new_schedule(
                    project,
                    declared_name,
                    task.name,
                    self.settings.max_json_depth,
                    args=args,
                    lane=lane,
                    key=key,
                    priority=priority,
                    max_attempts=max_attempts,
                    cron=cron,
                    interval_seconds=seconds,
                    timezone=timezone,
                    catch_up=catch_up,
                    catch_up_limit=catch_up_limit,
                    overlap=overlap,
                )
            except InputError as error:
                raise ConfigError(f"schedule {declared_name!r}: {error}") from None
            if lane is None and task.lane == FAST_LANE:  # the task's lane, at each tick
                raise ConfigError(f"schedule {declared_name!r}: {schedules.NO_FAST_LANE}")
            if (project, declared_name) in self.schedules:
                raise ConfigError(
                    f"schedule {declared_name!r} of project {project!r} is declared twice: "
                    "give each schedule of a task its own name="
                )
            self.schedules[(project, declared_name)] = Declared(project, declared_name, fields)
            return task

        return declare

    # -- enqueue ------------------------------------------------------------------

    def enqueue(
        self,
        task: str | Task,
        args: dict[str, Any] | None = None,
        *,
        connection: psycopg.Connection[Any] | None = None,
        **options: Any,
    ) -> Run:
        """Enqueue one run and return it (the original one for a repeated idempotency key);
        with ``connection``, in that connection's transaction (see ``enqueue_many``)."""
        return self.enqueue_many([NewRun(task, args, **options)], connection=connection)[0]

    def enqueue_many(
        self, runs: Iterable[NewRun], *, connection: psycopg.Connection[Any] | None = None
    ) -> list[Run]:
        """Enqueue runs in one statement; return them in input order.

        With ``connection``, a psycopg ``Connection`` of the application's own, the runs
        are inserted in its transaction, which the caller commits or rolls back: they
        become visible and wake the workers of their lanes when it commits, and vanish
        if it rolls back. Its ``search_path`` is tidegate's only while the enqueue runs.
        On a connection in autocommit mode outside a transaction block, the enqueue is a
        transaction of its own, committed before it returns, as any statement there is.
        """
        new = list(runs)
        with _enqueue_span(new):
            if connection is None:
                return self.execute(self.enqueue_steps(new))
            return self._execute_in(connection, self.enqueue_steps(new))

    async def aenqueue(
        self,
        task: str | Task,
        args: dict[str, Any] | None = None,
        *,
        connection: psycopg.AsyncConnection[Any] | None = None,
        **options: Any,
    ) -> Run:
        """Async form of ``enqueue``; ``connection`` is a psycopg ``AsyncConnection``."""
        new = [NewRun(task, args, **options)]
        return (await self.aenqueue_many(new, connection=connection))[0]

    async def aenqueue_many(
        self, runs: Iterable[NewRun], *, connection: psycopg.AsyncConnection[Any] | None = None
    ) -> list[Run]:
        """Async form of ``enqueue_many``; ``connection`` is a psycopg ``AsyncConnection``."""
        new = list(runs)
        with _enqueue_span(new):
            if connection is None:
                return await self.aexecute(self.enqueue_steps(new))
            return await self._aexecute_in(connection, self.enqueue_steps(new))

    def enqueue_steps(self, new: Sequence[NewRun]) -> Steps[list[Run]]:
        """The steps of ``enqueue_many``, for a caller that runs them on a connection of
        its own (the API process, on its pool: ``POST /runs``, the dashboard's Replay).

        Every run is resolved here, before any connection is used (bad input fails at
        once), and the insert is the only round trip. A run named by a task this app
        lacks takes the settings the task's workers declared (``tidegate.tasks``): the
        insert fills what the enqueue leaves open from the declaration, in its own
        statement. Only a unique run of such a task, whose unique key may hang on its
        lane, reads the declarations first: one more statement, on the same connection
        and in the same transaction.
        """
        by_name = [n for n in new if isinstance(n.task, str) and n.task not in self.tasks]
        if not any(n.unique is not None for n in by_name):
            rows = [self.resolve(n, in_database=True) for n in new]
            keyless = {str(n.task) for n in by_name if not n.key}
            return self.insert_steps(rows, keyless=keyless)
        names = sorted({str(n.task) for n in by_name})
        for name in names:  # before the lookup sends them
            try:
                check_text(name, "task name")
            except InputError as error:
                raise EnqueueError(str(error)) from None
        return self._enqueue_declared(new, names)

    def _enqueue_declared(self, new: Sequence[NewRun], names: list[str]) -> Steps[list[Run]]:
        """``enqueue_steps`` for runs of tasks named only: read their declarations first."""
        declared = yield from find_tasks(names)
        rows = [
            self.resolve(n, declared.get(n.task) if isinstance(n.task, str) else None) for n in new
        ]
        return (yield from self.insert_steps(rows))

    def insert_steps(
        self, rows: list[dict[str, Any]], *, keyless: Collection[str] = ()
    ) -> Steps[list[Run]]:
        """The steps that insert rows ``resolve`` made; they return the runs in input
        order (the original run for a repeated idempotency key). ``keyless``: tasks of
        runs enqueued by name without a key (warned of if their key is computed)."""
        if not rows:
            return []
        yield from self._warn_of_tasks_without_worker(rows, keyless)
        context = carrier()  # the enqueue's span, where one records
        if context is not None:
            rows = [{**row, "trace_context": context} for row in rows]
        defaults = {
            "channel": self.available_channel,
            "default_max_attempts": self.settings.max_attempts,
        }
        if len(rows) == 1:
            one = {**rows[0], "args": json.dumps(rows[0]["args"], default=_iso)}
            if context is not None:
                one["trace_context"] = json.dumps(context)
            params = {**one, **defaults}
            inserted = yield Statement("insert_run", params, dict_row)
        else:
            # A field left out reads as NULL (jsonb_to_recordset): the fields a run does
            # not set (scheduled_at, idempotency_key) cost neither the encoding nor the
            # server's parse (1.13 times the batch rate, PostgreSQL 15).
            unset = [{k: v for k, v in row.items() if v is not None} for row in rows]
            runs = json.dumps(unset, default=_iso)
            params = {"runs": runs, **defaults}
            inserted = yield Statement("insert_runs", params, dict_row)
        # The runs without an idempotency or unique key and those with one are two
        # inserts, each handing out ids in input order among its own runs; an input
        # whose key is taken inserted nothing and is read back below, as a duplicate.
        inserted.sort(key=lambda r: r["id"])
        plain = iter([r for r in inserted if _claims(r) is None])
        keyed = [r for r in inserted if _claims(r) is not None]
        fresh = {_claims(r) for r in keyed}
        taken = iter(keyed)
        results: list[Run | None] = []
        for row in rows:
            claims = _claims(row)
            if claims is None:
                results.append(_new_run(row, next(plain)))
            elif claims in fresh:
                fresh.discard(claims)  # a second use of a key in the batch is a repeat
                results.append(_new_run(row, next(taken)))
            else:
                results.append(None)
        for project in {
            row["project"]
            for row, run in zip(rows, results, strict=True)
            if run is None and row["idempotency_key"] is not None
        }:
            keys = [
                r["idempotency_key"]
                for r, run in zip(rows, results, strict=True)
                if run is None and r["project"] == project and r["idempotency_key"] is not None
            ]
            found = yield Statement("find_runs_by_key", {"project": project, "keys": keys}, run_row)
            by_key = {run.idempotency_key: run for run in found}
            results = [
                _duplicate(by_key.get(row["idempotency_key"]))
                if run is None and row["project"] == project
                else run
                for row, run in zip(rows, results, strict=True)
            ]
        held = [
            row["unique_key"]
            for row, run in zip(rows, results, strict=True)
            if run is None and row["unique_key"] is not None
        ]
        if held:
            found = yield Statement("find_unique_runs", {"keys": held}, run_row)
            by_unique = {run.unique_key: run for run in found}
            results = [
                _duplicate(by_unique.get(row["unique_key"])) if run is None else run
                for row, run in zip(rows, results, strict=True)
            ]
        if any(run is None for run in results):
            # The original left (pruned, or out of its unique states) between the insert
            # and the read: insert again.
            missing = [row for row, run in zip(rows, results, strict=True) if run is None]
            again = iter((yield from self.insert_steps(missing)))
            results = [run if run is not None else next(again) for run in results]
        return [run for run in results if run is not None]

    def _warn_of_tasks_without_worker(
        self, rows: Sequence[dict[str, Any]], keyless: Collection[str]
    ) -> Steps[None]:
        """Warn when runs are enqueued for a task no live worker has (their lane's, the
        declared one where the row has none yet), and when a task of ``keyless`` computes
        its keys with code this process lacks.

        Not an error: a fleet may be mid-deploy, and the runs wait (``pending``) until
        such a worker starts. Each (lane, task) is looked up at most once a minute per
        process, so enqueueing costs no extra round trip in the steady state.
        """
        now = time.monotonic()
        due = sorted(
            {(row["lane"], row["task"]) for row in rows}
            - {
                route
                for route, at in self._worker_checks.items()
                if now - at < WORKER_CHECK_SECONDS
            },
            key=lambda route: (route[0] or "", route[1]),
        )
        if not due:
            return
        params = {
            "lanes": [lane for lane, _ in due],
            "tasks": [task for _, task in due],
            "live_seconds": 3 * self.settings.heartbeat_seconds,
        }
        found = yield Statement("find_task_workers", params)
        for lane, task, has_worker, given_lane, key_function in found:
            self._worker_checks[(given_lane, task)] = now
            if task in keyless and key_function is not None and task not in self.tasks:
                self._warn_of_key_function(task, key_function)
            if not has_worker:
                log.warning(
                    "no live worker has task %r for lane %r: its runs wait until one starts "
                    "(tidegate worker --app <module>:<app>)",
                    task,
                    lane,
                )

    def resolve(
        self, n: NewRun, declared: TaskSettings | None = None, *, in_database: bool = False
    ) -> dict[str, Any]:
        """Resolve one ``NewRun`` against its task and the defaults into a row to insert.

        The task is this app's (``n.task``, or the one registered under its name), else
        the settings its workers ``declared`` (``tidegate.tasks``); a value ``n`` gives
        wins over either. ``in_database``: for a task this app lacks, leave the lane,
        priority and max_attempts ``n`` does not give as ``None``, for the insert to
        fill from the declaration (insert_run.sql). Every value is checked against
        ``tidegate.limits`` here, so that nothing the enqueue accepts fails in the
        database or in a worker.
        """
        task = n.task if isinstance(n.task, Task) else self.tasks.get(n.task)
        name = n.task if isinstance(n.task, str) else n.task.name
        settings = task.settings if task is not None else declared
        fill = in_database and task is None and declared is None
        args = {} if n.args is None else n.args
        try:
            check_text(name, "task name")
            if not isinstance(args, dict):
                raise EnqueueError(f"args of {name!r} must be a JSON object (dict), got {args!r}")
            check_json(args, f"args of {name!r}", self.settings.max_json_depth)
            check_identifier(n.project, "project id")
            lane = n.lane or (settings.lane if settings else None if fill else DEFAULT_LANE)
            if lane is not None:
                check_lane(lane)
            key = n.key or (task.key(args) if task and task.key else n.project)
            if not n.key and task is None and settings and settings.key_function:
                self._warn_of_key_function(name, settings.key_function)
            check_text(key, f"key of a run of {name!r}")
            if n.idempotency_key is not None:
                check_text(n.idempotency_key, "idempotency key")
            if n.unique is not None and not isinstance(n.unique, Unique):
                raise EnqueueError(f"unique must be a Unique, got {n.unique!r}")
            unique = n.unique.checked() if n.unique is not None else None
        except InputError as error:
            raise EnqueueError(str(error)) from None
        priority = n.priority
        if priority is None:
            priority = settings.priority if settings else None if fill else 0
        if priority is not None and (not isinstance(priority, int) or priority not in PRIORITY):
            raise EnqueueError(
                f"priority of {name!r} must be {PRIORITY.low} (first) to {PRIORITY.high}, "
                f"got {priority!r}"
            )
        max_attempts = (
            n.max_attempts
            or (settings.max_attempts if settings else None)
            or (None if fill else self.settings.max_attempts)
        )
        if max_attempts is not None and (
            not isinstance(max_attempts, int) or max_attempts not in ATTEMPTS
        ):
            raise EnqueueError(
                f"max_attempts of {name!r} must be {ATTEMPTS.low} to {ATTEMPTS.high}, "
                f"got {max_attempts!r}"
            )
        row: dict[str, Any] = {
            "project": n.project,
            "lane": lane,
            "key": key,
            "task": name,
            "args": args,
            "priority": priority,
            "max_attempts": max_attempts,
            "scheduled_at": _scheduled_at(n),
            "idempotency_key": n.idempotency_key,
            "unique_key": None,
            "unique_states": None,
            "trace_context": None,
        }
        if unique is not None:
            row["unique_key"] = unique.key(row)
            row["unique_states"] = [str(state) for state in unique.states]
        return row

    def _warn_of_key_function(self, task: str, key_function: str) -> None:
        """Warn, once per task and process, that runs enqueued here by name get their
        project's key: the task's key function is code this process does not have."""
        if task in self._keys_warned:
            return
        self._keys_warned.add(task)
        log.warning(
            "task %r computes its runs' keys with %s, which this process does not have: "
            "runs enqueued here without key= get their project's key",
            task,
            key_function,
            extra={"task": task},
        )

    # -- reading and cancelling runs ---------------------------------------------

    def get_run(self, run_id: int) -> Run | None:
        """Return one run, or ``None``."""
        return self.execute(get_run(run_id))

    async def aget_run(self, run_id: int) -> Run | None:
        return await self.aexecute(get_run(run_id))

    def list_runs(
        self,
        *,
        project: str | None = None,
        lane: str | None = None,
        state: str | None = None,
        task: str | None = None,
        key: str | None = None,
        args: dict[str, Any] | None = None,
        limit: int = 50,
    ) -> list[Run]:
        """Return the newest runs matching every filter given; ``args``: runs whose args
        contain this object (``{"order": 7}`` matches ``{"order": 7, "total": 3}``)."""
        contained = None if args is None else args_filter(json.dumps(args))
        return self.execute(
            list_runs(
                project=project,
                lane=lane,
                state=state,
                task=task,
                key=key,
                args=contained,
                limit=limit,
            )
        )

    def cancel(self, run_id: int) -> Run | None:
        """Cancel a run that has not finished; return it, or ``None`` if it had."""
        return self.execute(cancel_run(run_id, completed_channel=self.completed_channel))

    def pause_lane(self, lane: str, *, reason: str | None = None) -> PausedLane:
        """Pause ``lane`` for every worker, and return the pause: once this returns, no
        claim that starts takes its runs; running runs go on to their end, new runs wait,
        its sync webhooks get 503 (``tidegate.lanes``). ``reason``: up to 255 characters,
        shown wherever the pause is listed."""
        return self.execute(pause_lane(lane, by=LIBRARY_PAUSE, reason=reason))

    def resume_lane(self, lane: str) -> bool:
        """Resume ``lane`` and wake its workers; return whether it was paused."""
        return self.execute(resume_lane(lane, channel=self.available_channel))

    def result(self, run_id: int, timeout: float | None = None) -> Any:
        """Wait until run ``run_id`` has finished, and return its result if it succeeded.

        Raises ``RunFailed`` if it ended ``discarded``, ``RunCancelled`` if ``cancelled``
        (each with ``.run`` and its ``.errors``), ``ResultTimeout`` (a ``TimeoutError``)
        if it has not finished after ``timeout`` seconds (``None``: no limit), and
        ``UnknownRunError`` if there is no such run. A run that has already finished
        answers at once.

        No polling: the waiter LISTENs on the completion channel and marks the run
        watched, so that its final transition NOTIFYs, and reads the run again when its
        id is notified (and every ``RESULT_POLL_SECONDS`` without one, a safety net).
        Each waiting call holds a connection of its own, for the LISTEN, until it returns.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._plain_errors(), self.database.connect() as conn:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.completed_channel)))
            while True:
                run = drive(conn, watched_run(run_id))
                if run is not None and run.state is RunState.SUCCEEDED:
                    return run.result
                left = None if deadline is None else deadline - time.monotonic()
                with contextlib.closing(conn.notifies(timeout=_wait(run_id, run, left))) as news:
                    for notify in news:
                        if notify.payload == str(run_id):
                            break

    async def aresult(self, run_id: int, timeout: float | None = None) -> Any:
        """Async form of ``result``."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        with self._plain_errors():
            async with await self.database.aconnect() as conn:
                await conn.execute(
                    sql.SQL("LISTEN {}").format(sql.Identifier(self.completed_channel))
                )
                while True:
                    run = await adrive(conn, watched_run(run_id))
                    if run is not None and run.state is RunState.SUCCEEDED:
                        return run.result
                    left = None if deadline is None else deadline - loop.time()
                    wait = _wait(run_id, run, left)
                    async with contextlib.aclosing(conn.notifies(timeout=wait)) as news:
                        async for notify in news:
                            if notify.payload == str(run_id):
                                break

    # -- key policies -------------------------------------------------------------

    def set_key_policy(self, lane: str, key: str = "*", **fields: Any) -> dict[str, Any]:
        """Set ``max_running``, ``weight``, ``rate``/``rate_burst``, ``ordered`` (the
        key's runs one at a time, in enqueue order) and the circuit breaker
        (``breaker_failures``, ...) of a key in a lane.

        ``key="*"`` sets the lane's default for keys without a policy of their own;
        ``None`` clears a limit. The next claim sees the change (``tidegate.policies``).
        """
        return self.execute(policies.set_key_policy(lane, key, **fields))

    async def aset_key_policy(self, lane: str, key: str = "*", **fields: Any) -> dict[str, Any]:
        return await self.aexecute(policies.set_key_policy(lane, key, **fields))

    def clear_key_policy(self, lane: str, key: str = "*") -> bool:
        """Remove a key's policy in a lane; tell whether there was one."""
        return self.execute(policies.clear_key_policy(lane, key))

    def key_policies(self, lane: str | None = None) -> list[dict[str, Any]]:
        return self.execute(policies.list_key_policies(lane))

    # -- schema and workers -------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply missing migrations (safe to call from several processes at once)."""
        with self._plain_errors(), self.database.connect() as conn:
            return migrate(conn, self.settings.schema)

    def run_worker(self, workloops: str | None = None, **options: Any) -> None:
        """Run a worker in this process until SIGTERM or SIGINT (see ``tidegate.worker``).

        With ``server_url`` and ``worker_token`` set, the worker is remote: it claims and
        completes through that API, and needs no database (docs/workers.md).

        It runs on uvloop where that is installed (with uvicorn's ``standard`` extra, on
        Linux and macOS): less CPU per run than asyncio's own loop.
        """
        from tidegate.worker.link import RemoteLink
        from tidegate.worker.runtime import Worker, event_loop_factory

        settings = self.settings.replace(workloops=workloops or self.settings.workloops, **options)
        link = None
        if settings.server_url and settings.worker_token:  # remote: through the API
            link = RemoteLink(settings.server_url, settings.worker_token, settings.poll_seconds)
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(Worker(self, settings, link).run_until_signalled())

    def close(self) -> None:
        """Close this process's connections (the async pool closes with its loop)."""
        self.database.close()

    def __enter__(self) -> Tidegate:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def aclose(self) -> None:
        await self.aclose_pool()
        self.database.close()

    async def aclose_pool(self) -> None:
        """Close the async pool (``aexecute``'s), if one is open; the next call opens one.

        A worker does when it stops: its handlers may have used the pool
        (``tidegate.forward`` does) on the loop that is about to end.
        """
        if self._async_pool is not None:
            loop, _, keeper = self._async_pool
            self._async_pool = None
            if loop is asyncio.get_running_loop():  # else that loop's end closes it
                keeper.cancel()
                await asyncio.wait({keeper})

    # -- drivers ------------------------------------------------------------------

    def execute(self, steps: Steps[T]) -> T:
        """Run an operation's steps on a pooled connection (see ``storage.sql.Steps``)."""
        with self._plain_errors(), self.database.pool().connection() as conn:
            return drive(conn, steps)

    async def aexecute(self, steps: Steps[T]) -> T:
        """Async form of ``execute``."""
        with self._plain_errors():
            async with (await self._pool_on(asyncio.get_running_loop())).connection() as conn:
                return await adrive(conn, steps)

    async def _pool_on(self, loop: asyncio.AbstractEventLoop) -> AsyncConnectionPool:
        """Return the running loop's async pool, opened on the loop's first call.

        The pool closes when the loop ends: a keeper task on the loop closes it when it
        is cancelled, as ``asyncio.run`` (and every runner) cancels a loop's tasks at its
        end. Left open, the pool's own tasks swallow that cancellation while they work
        (psycopg_pool's workers catch ``CancelledError`` around a maintenance task), and
        the loop's end waits on them for ever.
        """
        if self._async_pool is None or self._async_pool[0] is not loop:
            pool = self.database.async_pool()
            keeper = loop.create_task(_close_when_cancelled(pool), name="tidegate-async-pool")
            _KEEPERS.add(keeper)
            keeper.add_done_callback(_KEEPERS.discard)
            self._async_pool = (loop, pool, keeper)
        pool = self._async_pool[1]
        if pool.closed:  # not opened yet (open() is safe to call again)
            # One connection first, as ``Database.pool`` does: an unreachable server
            # fails at once, not after the pool's 30 s wait for a connection.
            await (await self.database.aconnect()).close()
            await pool.open()
        return pool

    @contextlib.contextmanager
    def _plain_errors(self) -> Iterator[None]:
        """Raise PostgreSQL's expected failures as the one line the CLI prints for them.

        A server that cannot be used (refused, silent, a wrong password, no such
        database: libpq's text runs over lines) raises ``UnavailableError`` with
        ``describe_failure``'s line; a statement that failed for want of a table, a
        function or the schema raises the ``SchemaError`` of ``check_schema`` (``run
        `tidegate migrate```) when the schema is not this code's. Neither carries the
        psycopg error's traceback (it stays in ``__context__``). Any other error of a
        statement is raised as it is: the API and the worker tell those apart.
        """
        try:
            yield
        except psycopg.Error as error:
            if error.sqlstate in MISSING_OBJECTS:
                try:
                    with self.database.connect() as conn:
                        check_schema(conn, self.settings.schema)
                except SchemaError as mismatch:
                    raise mismatch from None
            if error.sqlstate is None:  # the client's: no connection, or a lost one
                raise UnavailableError(describe_failure(error, self.settings)) from None
            raise

    def _execute_in(self, conn: psycopg.Connection[Any], steps: Steps[T]) -> T:
        """Run steps in the transaction of the application's connection ``conn``, in
        tidegate's schema (``in_schema``); never commit or roll back for it, but begin
        and commit a transaction where autocommit has none open."""
        if not isinstance(conn, psycopg.Connection):
            raise TypeError(_wrong_connection(conn, "psycopg.Connection", "aenqueue"))
        steps = in_schema(self.settings.schema, steps)
        if conn.autocommit and conn.info.transaction_status is TransactionStatus.IDLE:
            with conn.transaction():
                return drive(conn, steps)
        return drive(conn, steps)

    async def _aexecute_in(self, conn: psycopg.AsyncConnection[Any], steps: Steps[T]) -> T:
        """Async form of ``_execute_in``."""
        if not isinstance(conn, psycopg.AsyncConnection):
            raise TypeError(_wrong_connection(conn, "psycopg.AsyncConnection", "enqueue"))
        steps = in_schema(self.settings.schema, steps)
        if conn.autocommit and conn.info.transaction_status is TransactionStatus.IDLE:
            async with conn.transaction():
                return await adrive(conn, steps)
        return await adrive(conn, steps)


def task_name(fn: Callable[..., Any]) -> str:
    """Return a handler's default task name: ``module.qualname``, however it was loaded.

    A module run as a script (``python myapp.py``) is ``__main__`` to Python, but the
    worker imports it as ``myapp``: the name uses the module's import name in both cases
    (``python -m pkg.mod`` gives ``pkg.mod``, ``python path/myapp.py`` gives ``myapp``),
    so runs enqueued by the script are runs of the worker's tasks.
    """
    module = fn.__module__
    if module == "__main__":
        main = sys.modules["__main__"]
        spec = getattr(main, "__spec__", None)
        path = getattr(main, "__file__", None)
        if spec is not None and spec.name != "__main__":
            module = spec.name.removesuffix(".__main__")
        elif path:
            module = Path(path).stem
    return f"{module}.{fn.__qualname__}"


def _wrong_connection(conn: object, wanted: str, other: str) -> str:
    """Say that ``conn`` is not the connection this form of enqueue takes."""
    kind = type(conn).__name__
    return f"connection= must be a {wanted}, got {kind}" + (
        f" (use {other} or {other}_many for it)" if isinstance(conn, psycopg.BaseConnection) else ""
    )


def _wait(run_id: int, run: Run | None, left: float | None) -> float:
    """How long ``result`` waits for news of a run that has not succeeded: at most
    ``RESULT_POLL_SECONDS``, and ``left`` (``None``: no deadline). Raise when no news can
    bring a result: no such run, it ended without one, or no time is left."""
    if run is None:
        raise UnknownRunError(f"there is no run {run_id} (never made, or pruned)")
    if run.state is RunState.DISCARDED:
        raise RunFailed(
            f"run {run_id} ended discarded (attempt {run.attempt} of {run.max_attempts})", run
        )
    if run.state is RunState.CANCELLED:
        raise RunCancelled(f"run {run_id} was cancelled", run)
    if left is not None and left <= 0:
        raise ResultTimeout(f"run {run_id} has not finished: it is {run.state}", run)
    return RESULT_POLL_SECONDS if left is None else min(left, RESULT_POLL_SECONDS)


def _claims(row: dict[str, Any]) -> tuple[str, str | None, str | None] | None:
    """What a run to insert claims that another run may hold already: its idempotency
    key in its project, its unique key; ``None`` for a run that claims neither."""
    if row["idempotency_key"] is None and row["unique_key"] is None:
        return None
    return (row["project"], row["idempotency_key"], row["unique_key"])


def _duplicate(run: Run | None) -> Run | None:
    """The run an enqueue found holding its key, marked as found."""
    return None if run is None else dataclasses.replace(run, duplicate=True)


def _new_run(row: dict[str, Any], stored: dict[str, Any]) -> Run:
    """Build a just-inserted run from what was sent and what the database assigned: its
    id, its vtime, and the insert's time ``at`` (insert_runs.sql)."""
    at = stored["at"]
    due = row["scheduled_at"]
    return stored_run(
        {
            **row,
            "scheduled_at": at if due is None else due,
            "id": stored["id"],
            # What a declaration filled in the insert (insert_run.sql), where the row left it.
            "lane": stored["lane"],
            "priority": stored["priority"],
            "max_attempts": stored["max_attempts"],
            "state": RunState.SCHEDULED if due is not None and due > at else RunState.AVAILABLE,
            "inserted_at": at,
            "attempt": 0,
            "attempted_at": None,
            "completed_at": None,
            "worker_id": None,
            "lease_expires_at": None,
            "result": None,
            "errors": [],
            "workloop": None,
            "vtime": stored["vtime"],
            "rank": stored["vtime"] + 64 * stored["priority"],
            "probe": False,
            "watched": False,
            "unique_states": None
            if row["unique_states"] is None
            else tuple(map(RunState, row["unique_states"])),
        }
    )


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"args must be JSON: {type(value).__name__} is not")


def _scheduled_at(n: NewRun) -> datetime | None:
    """When the run is due: ``run_at``, or ``delay`` from now; ``None``: at once."""
    if n.delay is None:
        if n.run_at is not None and n.run_at.utcoffset() is None:
            # A naive time would be read in the database session's time zone.
            raise EnqueueError(f"run_at must be timezone-aware, got {n.run_at!r}")
        return n.run_at
    try:
        delay = n.delay if isinstance(n.delay, timedelta) else timedelta(seconds=n.delay)
    except (TypeError, ValueError, OverflowError):
        raise EnqueueError(f"delay must be seconds or a timedelta, got {n.delay!r}") from None
    if not timedelta(0) <= delay <= MAX_DELAY:
        raise EnqueueError(f"delay must be 0 to {MAX_DELAY.days} days, got {n.delay!r}")
    return datetime.now(UTC) + delay


def _enqueue_span(new: list[NewRun]) -> AbstractContextManager[Span]:
    """The span of one enqueue (tracing.py): how many runs, the first one's task and lane
    (the lane it was given, or its task's in this app; "" when the declaration decides)."""
    if not new:
        return span("enqueue", kind="producer", runs=0, task="", lane="")
    task = new[0].task
    name = task.name if isinstance(task, Task) else task
    known = task if isinstance(task, Task) else None
    lane = new[0].lane or (known.lane if known else "")
    return span("enqueue", kind="producer", runs=len(new), task=name, lane=lane)


_KEEPERS: set[asyncio.Task[None]] = set()
"""The keepers of open async pools: a task only its loop refers to may be collected."""


async def _close_when_cancelled(pool: AsyncConnectionPool) -> None:
    """Wait until cancelled (the loop's end, or ``aclose_pool``), then close ``pool``.

    At a loop's end the pool's own workers are cancelled with every other task, and
    ``close`` stops where it waits for them (it raises their ``CancelledError``), before
    it closes the connections it holds: ``drain`` closes those first, in this task.
    """
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        await pool.drain()
        with contextlib.suppress(asyncio.CancelledError):
            await pool.close()
