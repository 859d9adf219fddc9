"""A worker claims only runs of tasks it has (docs/architecture.md, invariant 9).

A run of a task no live worker has waits in ``pending``, with its reason, and spends no
attempt; a worker that has the task makes it available and runs it. With workers of
different task sets on the same lanes, each run goes to a worker that has its task.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from tests.conftest import running_worker, spawn_worker, stop_worker, wait_until
from tests.http_fixtures import wait_for_workers
from tidegate import NewRun, Settings, Tidegate


def other_app(settings: Settings, *names: str) -> Tidegate:
    """Another app on the same database, whose only tasks are ``names``."""
    app = Tidegate(settings=settings)
    for name in names:

        @app.task(name=name)
        async def handler(**args: Any) -> dict[str, Any]:
            return {"ran": args}

    return app


def states(sql: psycopg.Connection, ids: list[int]) -> dict[int, str]:
    rows = sql.execute("SELECT id, state FROM runs WHERE id = ANY(%s)", [ids]).fetchall()
    return dict(rows)


@pytest.mark.parametrize("limits", [False, True], ids=["set-based", "with-key-limits"])
async def test_run_of_a_task_no_worker_has_waits_pending_until_a_worker_that_has_it_starts(
    app: Tidegate, sql: psycopg.Connection, limits: bool
) -> None:
    if limits:
        app.set_key_policy("default", "*", max_running=100)
    lost = app.enqueue("nobody.has_it", {"n": 1}, max_attempts=1)
    known = app.enqueue("echo", {"n": 2})
    async with running_worker(app, "manual>*:2"):
        await wait_until(lambda: states(sql, [known.id])[known.id] == "succeeded", 10)
        await wait_until(lambda: states(sql, [lost.id])[lost.id] == "pending", 10)
        waiting = app.get_run(lost.id)
        assert waiting is not None
        assert waiting.attempt == 0 and waiting.errors == []
        assert waiting.reason == "no live worker has task 'nobody.has_it' for lane 'default'"
        assert waiting.to_json()["reason"] == waiting.reason

        helper = other_app(app.settings, "nobody.has_it")
        try:
            async with running_worker(helper, "default:1"):
                await wait_until(lambda: states(sql, [lost.id])[lost.id] == "succeeded", 10)
        finally:
            helper.close()
    done = app.get_run(lost.id)
    assert done is not None
    assert (done.attempt, done.errors, done.result) == (1, [], {"ran": {"n": 1}})


async def test_a_worker_without_a_lane_for_the_run_does_not_count_as_having_its_task(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    # The helper has the task but takes only fast_lane: nobody can run a default run.
    helper = other_app(app.settings, "only.helper")
    try:
        async with running_worker(helper, "fast_lane:1"), running_worker(app, "manual>*:1"):
            run = app.enqueue("only.helper", {})
            await wait_until(lambda: states(sql, [run.id])[run.id] == "pending", 10)
    finally:
        helper.close()


async def test_workers_with_different_tasks_on_the_same_lanes_each_run_their_own(
    app: Tidegate, sql: psycopg.Connection, settings: Settings
) -> None:
    """Two worker processes of the tests' app and one of another app, one burst."""
    processes = [spawn_worker(settings, "manual>*:4") for _ in range(2)]
    assert settings.database_url
    helper = other_app(settings, "only.helper")
    try:
        wait_for_workers(settings.database_url, settings.schema, 2)
        async with running_worker(helper, "manual>*:2") as helper_worker:
            bursts = [
                [
                    NewRun(task, {"i": i, "burst": burst}, key=f"k{i % 5}")
                    for i in range(20)
                    for task in ("echo", "only.helper")
                ]
                for burst in range(10)
            ]
            runs = await asyncio.gather(*(app.aenqueue_many(batch) for batch in bursts))
            ids = [run.id for batch in runs for run in batch]
            await wait_until(
                lambda: set(states(sql, ids).values()) == {"succeeded"}, 60, interval=0.2
            )
        rows = sql.execute(
            "SELECT task, worker_id = %s, count(*), max(attempt), sum(jsonb_array_length(errors))"
            " FROM runs WHERE id = ANY(%s) GROUP BY 1, 2 ORDER BY 1, 2",
            [helper_worker.id, ids],
        ).fetchall()
        # Each run ran once, on a worker that has its task, and never failed.
        assert rows == [("echo", False, 200, 1, 0), ("only.helper", True, 200, 1, 0)]
    finally:
        helper.close()
        assert [stop_worker(p) for p in processes] == [0, 0]


async def test_enqueue_of_a_task_no_live_worker_has_warns_and_keeps_the_run(
    app: Tidegate, sql: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    warning = "no live worker has task 'nobody.has_it' for lane 'default'"
    first = app.enqueue("nobody.has_it", {})
    again = app.enqueue("nobody.has_it", {})
    assert caplog.text.count(warning) == 1  # looked up once a minute, not per enqueue
    assert len(states(sql, [first.id, again.id])) == 2
    async with running_worker(app, "manual>*:1"):
        caplog.clear()
        app.enqueue("echo", {})
        app.enqueue("echo", {}, lane="manual")
    # (The worker's parker says why the runs of nobody.has_it wait; the enqueues are quiet.)
    enqueues = [r.getMessage() for r in caplog.records if r.name == "tidegate"]
    assert not any("no live worker" in m for m in enqueues), enqueues


async def test_a_workloop_lane_nothing_puts_runs_in_is_warned_of_at_start(
    app: Tidegate, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_worker(app, "fast_lan:1 manual>*:1"):
        pass
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(m.startswith("workloop lane 'fast_lan': no task") for m in warned), warned
    assert not any("'manual'" in m for m in warned), warned
