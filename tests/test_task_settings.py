"""Task settings known to every process: a worker declares its tasks' settings when it
starts, and a run enqueued by the task's name anywhere (the CLI, POST /runs, a webhook
trigger, an app without the task's code) takes them, unless the enqueue says otherwise.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner

from tests.conftest import WorkerOf, running_worker
from tests.http_fixtures import ADMIN, ApiServer
from tidegate import NewRun, Settings, Tidegate
from tidegate.cli import main

TASK = "reports.build"


def declaring_app(settings: Settings, **declared: Any) -> Tidegate:
    """An app whose one task, ``reports.build``, says its own settings: lane ``reports``,
    max_attempts 1, priority 3, a 30 s timeout, unless ``declared`` says others."""
    app = Tidegate(settings=settings)
    options: dict[str, Any] = {"lane": "reports", "max_attempts": 1, "priority": 3, "timeout": 30}

    @app.task(name=TASK, **(options | declared))
    def build(**_: Any) -> None:
        return None

    return app


def stored(sql: psycopg.Connection, run_id: int) -> tuple[str, int, int]:
    row = sql.execute(
        "SELECT lane, priority, max_attempts FROM runs WHERE id = %s", [run_id]
    ).fetchone()
    assert row is not None
    return row


def invoke(settings: Settings, *args: str) -> str:
    env = {"TIDEGATE_DATABASE_URL": settings.database_url or "", "TIDEGATE_SCHEMA": settings.schema}
    result = CliRunner().invoke(main, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.stdout


def cli(settings: Settings, *args: str) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(invoke(settings, *args))
    return answer


async def test_a_worker_declares_its_tasks_and_a_run_enqueued_by_name_takes_them(
    app: Tidegate, settings: Settings, sql: psycopg.Connection, worker_of: WorkerOf
) -> None:
    with declaring_app(settings) as worker_app:
        async with worker_of(worker_app, "fast_lane:1"):  # declares; takes no run of it
            pass
    row = sql.execute(
        "SELECT lane, max_attempts, timeout_seconds, priority FROM tasks WHERE name = %s", [TASK]
    ).fetchone()
    assert row == ("reports", 1, 30.0, 3)

    by_cli = cli(settings, "enqueue", TASK)
    assert (by_cli["lane"], by_cli["priority"], by_cli["max_attempts"]) == ("reports", 3, 1)
    assert stored(sql, by_cli["id"]) == ("reports", 3, 1)
    overridden = cli(
        settings, "enqueue", TASK, "--lane", "manual", "--priority", "0", "--max-attempts", "4"
    )
    assert stored(sql, overridden["id"]) == ("manual", 0, 4)

    with Tidegate(settings=settings) as elsewhere:  # another service: no code of the task
        run = elsewhere.enqueue(TASK, {"n": 1})
        assert (run.lane, run.priority, run.max_attempts) == ("reports", 3, 1)
        assert stored(sql, run.id) == ("reports", 3, 1)
        [mine] = elsewhere.enqueue_many([NewRun(TASK, {}, max_attempts=7, priority=1)])
        assert stored(sql, mine.id) == ("reports", 1, 7)
        # A batch: the insert fills each run's open settings from its task's declaration,
        # and the runs it returns say what it stored.
        batch = elsewhere.enqueue_many(
            [NewRun(TASK, {}, priority=2), NewRun("nosuch.task", {}), NewRun(TASK, {})]
        )
        expected = [("reports", 2, 1), ("default", 0, settings.max_attempts), ("reports", 3, 1)]
        assert [(r.lane, r.priority, r.max_attempts) for r in batch] == expected
        assert [stored(sql, r.id) for r in batch] == expected


async def test_a_task_no_worker_declared_keeps_the_defaults(
    app: Tidegate, settings: Settings, sql: psycopg.Connection
) -> None:
    by_cli = cli(settings, "enqueue", "nosuch.task")
    assert stored(sql, by_cli["id"]) == ("manual", 0, settings.max_attempts)
    with Tidegate(settings=settings) as elsewhere:
        run = elsewhere.enqueue("nosuch.task")
    assert stored(sql, run.id) == ("default", 0, settings.max_attempts)


async def test_post_runs_and_an_async_trigger_take_the_declared_settings(
    app: Tidegate, settings: Settings, sql: psycopg.Connection, api: ApiServer
) -> None:
    with declaring_app(settings) as worker_app:
        async with running_worker(worker_app, "fast_lane:1"):
            pass
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
        made = await client.post("/runs", json={"task": TASK, "args": {"n": 1}}, headers=ADMIN)
        assert made.status_code == 201, made.text
        assert (made.json()["lane"], made.json()["priority"]) == ("reports", 3)
        assert stored(sql, made.json()["id"]) == ("reports", 3, 1)
        body = {"task": TASK, "lane": "bulk", "priority": 9, "max_attempts": 5}
        explicit = await client.post("/runs", json=body, headers=ADMIN)
        assert explicit.status_code == 201, explicit.text
        assert stored(sql, explicit.json()["id"]) == ("bulk", 9, 5)
        unknown = await client.post("/runs", json={"task": "nosuch.task"}, headers=ADMIN)
        assert stored(sql, unknown.json()["id"]) == ("default", 0, settings.max_attempts)
        keyed = {"task": TASK, "idempotency_key": "k1"}
        first = await client.post("/runs", json=keyed, headers=ADMIN)
        again = await client.post("/runs", json=keyed, headers=ADMIN)
        assert (first.status_code, again.status_code) == (201, 200)
        assert again.json()["id"] == first.json()["id"]

        project = await client.post("/admin/projects", json={"id": "acme"}, headers=ADMIN)
        assert project.status_code == 201, project.text
        token = {"Authorization": f"Bearer {project.json()['token']}"}
        own = await client.post("/runs", json={"task": TASK}, headers=token)
        assert own.status_code == 201 and own.json()["project"] == "acme"
        foreign = {"task": TASK, "project": "default"}
        assert (await client.post("/runs", json=foreign, headers=token)).status_code == 403

        trigger = await client.post(
            "/admin/projects/acme/triggers",
            json={"name": "orders", "mode": "async", "task": TASK},
            headers=ADMIN,
        )
        assert trigger.status_code == 201, trigger.text
        hooked = await client.post(trigger.json()["url"], json={"order": 1})
        assert hooked.status_code == 202, hooked.text
        run_id = int(hooked.headers["location"].rsplit("/", 1)[1])
        assert stored(sql, run_id) == ("reports", 3, 1)
        plain = await client.post(
            "/admin/projects/acme/triggers",
            json={"name": "plain", "mode": "async", "task": "nosuch.task"},
            headers=ADMIN,
        )
        hooked = await client.post(plain.json()["url"], json={"order": 2})
        run_id = int(hooked.headers["location"].rsplit("/", 1)[1])
        assert stored(sql, run_id) == ("default", 0, settings.max_attempts)

        listed = await client.get("/admin/tasks", headers=ADMIN)
        assert listed.status_code == 200, listed.text
        [declared] = [t for t in listed.json() if t["name"] == TASK]
        assert (declared["lane"], declared["max_attempts"], declared["timeout_seconds"]) == (
            "reports",
            1,
            30.0,
        )


async def test_conflicting_declarations_last_start_wins_and_a_warning_names_both(
    app: Tidegate, settings: Settings, sql: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    with declaring_app(settings) as old, declaring_app(settings, max_attempts=5) as new:
        async with running_worker(old, "fast_lane:1") as first:
            pass
        with caplog.at_level(logging.WARNING, logger="tidegate"):
            async with running_worker(old, "fast_lane:1"):  # the same settings: no word
                pass
            assert not [r for r in caplog.records if "declares" in r.getMessage()]
            async with running_worker(new, "fast_lane:1") as second:
                pass
    [warning] = [r for r in caplog.records if "declares" in r.getMessage()]
    said = warning.getMessage()
    assert TASK in said and second.id in said and "max_attempts=5" in said
    assert "max_attempts=1" in said
    row = sql.execute("SELECT max_attempts, declared_by FROM tasks WHERE name = %s", [TASK])
    assert row.fetchone() == (5, second.id)
    assert first.id != second.id
    header, *rows = invoke(settings, "tasks").splitlines()
    assert header.split()[:5] == ["TASK", "LANE", "PRIORITY", "ATTEMPTS", "TIMEOUT"]
    [line] = [r for r in rows if r.startswith(TASK)]
    assert line.split()[:5] == [TASK, "reports", "3", "5", "30s"]


def test_a_task_declared_out_of_bounds_is_refused_where_it_is_declared(settings: Settings) -> None:
    from tidegate.errors import ConfigError

    for bad in ({"priority": 10}, {"max_attempts": 0}, {"timeout": 0}, {"lane": "no lane"}):
        with pytest.raises(ConfigError, match=TASK):
            declaring_app(settings, **bad)
