"""Schedules: the timing (cron across DST, intervals, catch-up), exactly one run per tick
across worker processes, declared schedules, and the admin API and CLI."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tests.conftest import FAST, running_worker, spawn_worker, wait_until
from tests.http_fixtures import ADMIN, ApiServer, PrivatePostgres, assert_problem
from tidegate import ConfigError, Settings, Tidegate
from tidegate.cli import main
from tidegate.schedules import ScheduleError, Timing, create_schedule, get_schedule

BERLIN = "Europe/Berlin"


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


# -- timing -------------------------------------------------------------------------


def test_a_0230_schedule_runs_once_on_the_spring_forward_and_the_fall_back_day() -> None:
    daily = Timing(cron="30 2 * * *", timezone=BERLIN)
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 never shows: it runs at the jump.
    spring = daily.plan(utc(2026, 3, 27, 12), utc(2026, 3, 30, 12), "all", 100)
    assert spring.ticks == [
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1, 0),
        utc(2026, 3, 30, 0, 30),
    ]
    # 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 shows twice: it runs once.
    autumn = daily.plan(utc(2026, 10, 23, 12), utc(2026, 10, 26, 12), "all", 100)
    assert autumn.ticks == [
        utc(2026, 10, 24, 0, 30),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 30),
    ]
    assert (spring.missed, autumn.missed) == (0, 0)
    assert autumn.next_tick == utc(2026, 10, 27, 1, 30)


def test_a_half_hourly_schedule_keeps_its_real_time_pace_through_both_dst_changes() -> None:
    half_hourly = Timing(cron="*/30 * * * *", timezone=BERLIN)
    for day, hours in [((2026, 3, 29), 23), ((2026, 10, 25), 25)]:
        start = datetime(*day, tzinfo=half_hourly.zone).astimezone(UTC)
        end = start + timedelta(hours=hours) - timedelta(microseconds=1)
        ticks = half_hourly.plan(start, end, "all", 1000).ticks
        assert len(ticks) == 2 * hours
        assert {b - a for a, b in itertools.pairwise(ticks)} == {timedelta(minutes=30)}


def test_ticks_due_across_a_half_hour_change_of_offset_are_all_found() -> None:
    """Lord Howe turns its clocks back half an hour on 2029-04-01 at 02:00 (+11 to
    +10:30). cronsim, walking backwards from just after the change, leaps to 2026: the
    ticks due since 00:30 are found walking forwards instead."""
    timing = Timing(cron="30 */2 */7 1-4 0", timezone="Australia/Lord_Howe")
    start = timing.first_tick(utc(2026, 11, 28))
    assert start == utc(2029, 3, 31, 13, 30)  # 00:30 local, +11
    plan = timing.plan(start, utc(2029, 3, 31, 15, 30), "all", 50)
    assert (plan.ticks, plan.missed, plan.next_tick) == ([start], 0, utc(2029, 3, 31, 16))
    later = timing.plan(start, utc(2029, 3, 31, 20, 30), "all", 2)
    assert (later.ticks, later.missed) == ([utc(2029, 3, 31, 18), utc(2029, 3, 31, 20)], 2)


def test_after_downtime_the_catch_up_policy_says_which_missed_ticks_run() -> None:
    every_minute = Timing(interval_seconds=60)
    now = utc(2026, 5, 1, 12, 0, 30)
    start = now - timedelta(minutes=10, seconds=30)  # 11 ticks due: 11:50:00 ... 12:00:00
    newest = utc(2026, 5, 1, 12)
    every = every_minute.plan(start, now, "all", 100)
    assert (len(every.ticks), every.ticks[0], every.ticks[-1], every.missed) == (
        11,
        start,
        newest,
        0,
    )
    assert every.next_tick == newest + timedelta(minutes=1)
    bounded = every_minute.plan(start, now, "all", 4)
    assert (bounded.ticks, bounded.missed) == (every.ticks[-4:], 7)
    once = every_minute.plan(start, now, "once", 100)
    assert (once.ticks, once.missed) == ([newest], 10)
    skip = every_minute.plan(start, now, "skip", 100)  # only ticks at most a minute late
    assert (skip.ticks, skip.missed) == ([newest], 10)
    assert every_minute.plan(start, start + timedelta(minutes=5), "skip", 100).ticks == [
        start + timedelta(minutes=4),
        start + timedelta(minutes=5),
    ]
    cron = Timing(cron="* * * * *").plan(start, now, "once", 100)
    assert (cron.ticks, cron.missed, cron.next_tick) == (
        [newest],
        10,
        newest + timedelta(minutes=1),
    )


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "@sometimes"}, "cron"),
        ({"cron": "* * * * *", "interval_seconds": 5}, "either cron or interval_seconds"),
        ({}, "either cron or interval_seconds"),
        ({"interval_seconds": 0.5}, "interval_seconds"),
        ({"interval_seconds": float("nan")}, "interval_seconds"),
        ({"cron": "0 * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"cron": "0 * * * *", "timezone": "../../etc/passwd"}, "timezone"),
        ({"cron": "0 * * * *", "timezone": "Europe"}, "timezone"),  # a folder of tzdata
        ({"cron": "7 */1000 LW 7 */60"}, "never comes"),
        ({"cron": "0 * * * *", "catch_up": "sometimes"}, "catch_up"),
        ({"cron": "0 * * * *", "catch_up_limit": 0}, "catch_up_limit"),
        ({"cron": "0 * * * *", "args": [1]}, "args"),
        ({"cron": "0 * * * *", "lane": "no lane"}, "lane"),
        ({"cron": "0 * * * *", "priority": 10}, "priority"),
    ],
)
def test_a_malformed_schedule_is_refused_naming_the_field(
    fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(ScheduleError, match=named):
        next(create_schedule("default", "bad", "noop", **fields))
    app = Tidegate(database_url="postgresql://nowhere.invalid/none")
    with pytest.raises(ConfigError, match=named):
        spec = {"every": fields.pop("interval_seconds", None), **fields}
        app.periodic(spec.pop("cron", None), name="bad", **spec)(lambda: None)


# -- firing ---------------------------------------------------------------------------


def runs_by_tick(sql: psycopg.Connection, name: str = "tick") -> Counter[datetime]:
    rows = sql.execute(
        "SELECT r.scheduled_at FROM runs r JOIN schedules s"
        " ON r.idempotency_key LIKE 'schedule:' || s.id || ':%%' WHERE s.name = %s",
        [name],
    )
    return Counter(row[0] for row in rows)


async def test_four_worker_processes_make_exactly_one_run_per_tick_through_crashes_and_downtime(
    app: Tidegate, settings: Settings, sql: psycopg.Connection
) -> None:
    app.execute(create_schedule("default", "tick", "record", interval_seconds=1, catch_up="all"))
    options = ("--schedule-seconds", "0.05")
    processes = [spawn_worker(settings, "manual>*:4", *options) for _ in range(4)]
    try:
        await wait_until(lambda: len(runs_by_tick(sql)) >= 4, 30)
        processes[0].send_signal(signal.SIGKILL)  # dies holding whatever it held
        processes[1].send_signal(signal.SIGTERM)
        await wait_until(lambda: len(runs_by_tick(sql)) >= 7, 30)
        # Downtime: no scheduler for 5 s; catch_up 'all' makes each missed tick's run
        # once the next workers start, all at once and racing each other for them.
        for process in processes[2:]:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(30)
        await asyncio.sleep(5)
        processes += [spawn_worker(settings, "manual>*:4", *options) for _ in range(3)]
        await wait_until(lambda: len(runs_by_tick(sql)) >= 22, 30)
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(30)

    ticks = runs_by_tick(sql)
    assert set(ticks.values()) == {1}, [t for t, n in ticks.items() if n > 1]
    first, last = min(ticks), max(ticks)
    # Every tick between the first and the last: none lost, none twice.
    assert len(ticks) == (last - first).total_seconds() + 1 >= 22
    assert sorted(ticks) == [first + timedelta(seconds=k) for k in range(len(ticks))]
    schedule = app.execute(get_schedule("default", "tick"))
    assert schedule["last_tick"] == last and schedule["missed_ticks"] == 0
    ran = sql.execute(
        "SELECT count(*), count(DISTINCT pid) FROM executions e JOIN runs r ON r.id = e.run_id"
    ).fetchone()
    assert ran is not None and ran[1] > 1


async def test_a_tick_is_one_run_whatever_a_database_crash_takes_back(tmp_path: Path) -> None:
    """The database crashes (an immediate shutdown) right after a tick's run has
    executed, three times: the firing and the claim were on disk before the handler
    started (docs/guarantees.md), so the tick does not fire again as a second run,
    and no attempt runs twice. What a crash may take back is an outcome: that run runs
    again, as its next attempt."""
    database = PrivatePostgres(tmp_path / "pg")
    settings = Settings(database_url=database.start(), **FAST)  # type: ignore[arg-type]
    lines = tmp_path / "ran"
    lines.touch()
    with Tidegate(settings=settings) as app:
        app.migrate()
        app.execute(
            create_schedule(
                "default",
                "tick",
                "append_line",
                interval_seconds=1,
                catch_up="all",
                args={"path": str(lines)},
            )
        )
    worker = spawn_worker(settings, "manual>*:2", "--schedule-seconds", "0.05")

    def ran() -> list[tuple[int, int, str]]:
        return [
            (int(run_id), int(attempt), key)
            for run_id, attempt, key in (line.split() for line in lines.read_text().splitlines())
        ]

    try:
        for _ in range(3):
            seen = len(ran())
            await wait_until(lambda: len(ran()) > seen, 30, interval=0.005)  # noqa: B023
            database.crash()
            database.start()
        # The worker comes back by itself, and the schedule goes on.
        ticks = len({key for _, _, key in ran()})
        await wait_until(lambda: len({key for _, _, key in ran()}) >= ticks + 2, 60)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
        try:
            with psycopg.connect(database.url, autocommit=True) as conn:
                stored = dict(
                    conn.execute("SELECT id, idempotency_key FROM tidegate.runs").fetchall()
                )
        finally:
            database.stop()

    executed = ran()
    attempts = [(run_id, attempt) for run_id, attempt, _ in executed]
    assert len(attempts) == len(set(attempts)), executed  # no attempt ran twice
    runs_of_tick: dict[str, set[int]] = {}
    for run_id, _, key in executed:
        runs_of_tick.setdefault(key, set()).add(run_id)
    assert all(len(ids) == 1 for ids in runs_of_tick.values()), runs_of_tick
    assert all(stored.get(run_id) == key for run_id, _, key in executed), (executed, stored)


async def test_a_declared_schedule_is_written_fired_kept_through_restarts_and_removed_with_the_code(
    settings: Settings, sql: psycopg.Connection
) -> None:
    def declaring(every: float | None) -> Tidegate:
        app = Tidegate(settings=settings)

        @app.task(name="report", lane="reports", key=lambda args: f"tenant-{args['tenant']}")
        async def report(tenant: int) -> int:
            return tenant

        if every is not None:
            app.periodic(every=every, args={"tenant": 7}, name="nightly")(report)
        return app

    first = declaring(every=1)
    first.migrate()
    async with running_worker(first, "reports:2", schedule_seconds=0.05):
        await wait_until(lambda: len(runs_by_tick(sql, "nightly")) >= 2, 15)
        run = first.list_runs(task="report", limit=1)[0]
        # Its run was enqueued as the worker's app enqueues: the task's lane and key.
        assert (run.lane, run.key, run.args) == ("reports", "tenant-7", {"tenant": 7})
        await wait_until(lambda: first.get_run(run.id).state == "succeeded", 10)  # type: ignore[union-attr]
    row = first.execute(get_schedule("default", "nightly"))
    assert row["declared"] and row["interval_seconds"] == 1 and row["last_run_id"]
    assert row["last_run_state"] in ("available", "running", "succeeded")

    # Paused, then a worker with the same code starts: it stays paused, its tick kept.
    CliRunner().invoke(main, ["schedules", "pause", "default", "nightly"], env=_env(settings))
    again = declaring(every=1)
    async with running_worker(again, "reports:2", schedule_seconds=0.05):
        await asyncio.sleep(1.5)
    kept = again.execute(get_schedule("default", "nightly"))
    assert kept["paused"] and kept["next_tick"] == row["next_tick"]

    changed = declaring(every=3600)  # new timing: written, and ticks from now
    async with running_worker(changed, "reports:2", schedule_seconds=0.05):
        pass
    retimed = changed.execute(get_schedule("default", "nightly"))
    assert retimed["interval_seconds"] == 3600 and retimed["paused"]
    assert retimed["next_tick"] > datetime.now(UTC) + timedelta(minutes=59)

    gone = declaring(every=None)  # the code no longer declares it
    async with running_worker(gone, "reports:2"):
        pass
    assert sql.execute("SELECT count(*) FROM schedules").fetchone() == (0,)


async def test_a_tick_whose_run_cannot_be_made_is_logged_kept_in_last_error_and_the_worker_goes_on(
    settings: Settings, sql: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    app = Tidegate(settings=settings)

    @app.task(name="keyed", key=lambda args: args["tenant"])  # KeyError without "tenant"
    async def keyed(**_: Any) -> None:
        return None

    @app.task(name="quick", lane="fast_lane")  # a schedule naming no lane takes this one
    async def quick() -> None:
        return None

    app.migrate()
    app.execute(create_schedule("default", "broken", "keyed", interval_seconds=1))
    app.execute(create_schedule("default", "fast", "quick", interval_seconds=1))
    app.execute(
        create_schedule("default", "fine", "keyed", interval_seconds=1, args={"tenant": "a"})
    )
    sql.execute("UPDATE schedules SET next_tick = now()")
    with caplog.at_level(logging.ERROR, logger="tidegate.worker"):
        async with running_worker(app, "manual>*:2", schedule_seconds=0.05) as worker:
            await wait_until(lambda: len(runs_by_tick(sql, "fine")) >= 3, 15)
            assert all(not s.task.done() for s in worker.services if s.task)  # type: ignore[attr-defined]
    broken = app.execute(get_schedule("default", "broken"))
    assert broken["last_error"].startswith("KeyError") and broken["last_run_id"] is None
    fast = app.execute(get_schedule("default", "fast"))
    assert "'fast_lane'" in fast["last_error"] and fast["last_run_id"] is None
    assert sql.execute("SELECT count(*) FROM runs WHERE task = 'quick'").fetchone() == (0,)
    assert app.execute(get_schedule("default", "fine"))["last_error"] is None
    assert any(
        "'broken'" in r.getMessage() and "made no run" in r.getMessage() for r in caplog.records
    )


async def test_scheduled_runs_obey_their_keys_policy_like_any_run(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    app.set_key_policy("default", "held", max_running=0)
    for key in ("held", "free"):
        app.execute(create_schedule("default", key, "echo", interval_seconds=1, key=key))
    sql.execute("UPDATE schedules SET next_tick = now()")
    async with running_worker(app, "manual>*:4", schedule_seconds=0.05):
        await wait_until(lambda: len(app.list_runs(task="echo", state="succeeded")) >= 3, 15)

    by_key = Counter(
        (run.key, run.state.value, run.attempt) for run in app.list_runs(task="echo", limit=100)
    )
    assert {key for key, *_ in by_key} == {"held", "free"}
    # The held key's runs wait unclaimed (no attempt spent); the free key's ran.
    assert {(state, attempt) for key, state, attempt in by_key if key == "held"} == {
        ("available", 0)
    }
    assert ("free", "succeeded", 1) in by_key


def overlapping(sql: psycopg.Connection, name: str) -> int:
    """How many pairs of the schedule's runs executed at the same time."""
    row = sql.execute(
        "WITH ran AS (SELECT e.run_id, e.started_at, e.finished_at FROM executions e"
        " JOIN runs r ON r.id = e.run_id JOIN schedules s"
        " ON r.idempotency_key LIKE 'schedule:' || s.id || ':%%' WHERE s.name = %s)"
        " SELECT count(*) FROM ran a JOIN ran b ON a.run_id < b.run_id"
        " AND a.started_at < b.finished_at AND b.started_at < a.finished_at",
        [name],
    ).fetchone()
    assert row is not None
    return int(row[0])


async def test_overlap_skip_passes_over_ticks_while_the_last_run_has_yet_to_finish(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    for name, overlap in (("skipping", "skip"), ("allowing", "allow")):
        steps = create_schedule(
            "default", name, "sleep", interval_seconds=1, args={"seconds": 2.5}, overlap=overlap
        )
        app.execute(steps)
    sql.execute("UPDATE schedules SET next_tick = now()")
    async with running_worker(app, "manual>*:8", schedule_seconds=0.05):
        await wait_until(lambda: len(runs_by_tick(sql, "skipping")) >= 3, 20)
    skipping = app.execute(get_schedule("default", "skipping"))
    assert skipping["overlap"] == "skip" and skipping["missed_ticks"] >= 4
    assert overlapping(sql, "skipping") == 0
    # The same task and timing, overlap allowed: its runs do run at the same time.
    assert overlapping(sql, "allowing") > 0


# -- admin API and CLI --------------------------------------------------------------


def _env(settings: Settings) -> dict[str, str]:
    return {
        "TIDEGATE_DATABASE_URL": settings.database_url or "",
        "TIDEGATE_SCHEMA": settings.schema,
    }


async def test_schedules_are_managed_through_the_admin_api(
    app: Tidegate, api: ApiServer, sql: psycopg.Connection
) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=ADMIN) as client:
        created = await client.post(
            "/admin/projects/default/schedules",
            json={
                "name": "reports/eu",
                "task": "echo",
                "cron": "*/1 * * * * *",
                "args": {"region": "eu"},
                "timezone": BERLIN,
                "key": "eu",
            },
        )
        assert created.status_code == 201, created.text
        shown = created.json()
        assert (shown["cron"], shown["timezone"], shown["paused"]) == (
            "*/1 * * * * *",
            BERLIN,
            False,
        )
        assert shown["next_tick"] and shown["last_run_id"] is None
        path = "/admin/projects/default/schedules/reports%2Feu"
        assert_problem(
            await client.post(
                "/admin/projects/default/schedules",
                json={"name": "reports/eu", "task": "echo", "interval_seconds": 60},
            ),
            409,
        )
        for bad in (
            {"cron": "every day"},
            {"timezone": "Nowhere/City"},
            {"interval_seconds": 0},
            {"catch_up": "maybe"},
            {"catch_up_limit": None},
            {"timezone": None},
            {"task": None},
            {"args": "x"},
            {"nope": 1},
        ):
            assert_problem(await client.patch(path, json=bad), 422)
        assert_problem(await client.get("/admin/projects/default/schedules/missing"), 404)

        async with running_worker(app, "manual>*:2", schedule_seconds=0.05):
            await wait_until(lambda: len(runs_by_tick(sql, "reports/eu")) >= 2, 15)
            paused = (await client.patch(path, json={"paused": True})).json()
            assert paused["paused"]
            made = len(runs_by_tick(sql, "reports/eu"))
            await asyncio.sleep(1.5)
            assert len(runs_by_tick(sql, "reports/eu")) == made
            resumed = (await client.patch(path, json={"paused": False})).json()
            assert not resumed["paused"] and resumed["missed_ticks"] == 0
            await wait_until(lambda: len(runs_by_tick(sql, "reports/eu")) > made, 15)
        listed = (await client.get("/admin/schedules", params={"project": "default"})).json()
        assert [s["name"] for s in listed] == ["reports/eu"]
        assert listed[0]["last_run_id"] and listed[0]["last_run_state"]
        run = app.get_run(listed[0]["last_run_id"])
        assert run is not None and (run.key, run.args, run.task) == ("eu", {"region": "eu"}, "echo")
        assert (await client.delete(path)).status_code == 204
        assert_problem(await client.delete(path), 404)
        assert (await client.get("/admin/schedules")).json() == []


async def test_a_schedule_s_args_nested_as_deep_as_allowed_are_shown(
    app: Tidegate, start_api: Any
) -> None:
    """``max_json_depth`` goes up to 512; FastAPI's own serializer stops at about 255
    levels (it was a 500): every answer that carries the args shows them whole."""
    api: ApiServer = start_api(max_json_depth=512)
    nested: Any = "bottom"
    for _ in range(500):
        nested = [nested]
    async with httpx.AsyncClient(base_url=api.url, headers=ADMIN, timeout=30) as client:
        body = {"name": "deep", "task": "echo", "cron": "0 3 * * *", "args": {"d": nested}}
        created = await client.post("/admin/projects/default/schedules", json=body)
        assert created.status_code == 201, created.text
        path = "/admin/projects/default/schedules/deep"
        patched = await client.patch(path, json={"args": {"d": nested, "again": True}})
        assert patched.status_code == 200, patched.text
        shown = (await client.get(path)).json()
        listed = (await client.get("/admin/schedules")).json()
    assert created.json()["args"] == {"d": nested}
    assert shown["args"] == listed[0]["args"] == {"d": nested, "again": True}
    assert datetime.fromisoformat(shown["next_tick"]) > datetime.now(UTC)


def test_schedules_are_managed_with_the_cli(app: Tidegate, settings: Settings) -> None:
    env = _env(settings)

    def run(*args: str) -> Any:
        result = CliRunner().invoke(main, ["schedules", *args], env=env)
        assert result.exit_code == 0, result.output
        return json.loads(result.output) if result.output.strip() else None

    created = run(
        "create",
        "default",
        "digest",
        "--task",
        "echo",
        "--cron",
        "0 8 * * MON",
        "--timezone",
        BERLIN,
        "--args",
        '{"to": "team"}',
        "--catch-up",
        "skip",
    )
    assert created["catch_up"] == "skip" and created["args"] == {"to": "team"}
    tick = datetime.fromisoformat(created["next_tick"]).astimezone(
        Timing(timezone=BERLIN, cron="0 8 * * *").zone
    )
    assert (tick.weekday(), tick.hour, tick.minute) == (0, 8, 0)
    assert run("pause", "default", "digest")["paused"] is True
    assert run("resume", "default", "digest")["paused"] is False
    assert [s["name"] for s in run("list", "--json")] == ["digest"]
    run("delete", "default", "digest")
    assert run("list", "default", "--json") == []
    for args, message in [
        (["create", "default", "x", "--task", "echo", "--cron", "bad"], "cron must be"),
        (
            ["create", "default", "x", "--task", "echo", "--every", "5", "--args", "[1]"],
            "args must be",
        ),
        (["delete", "default", "digest"], "no schedule 'digest'"),
    ]:
        result = CliRunner().invoke(main, ["schedules", *args], env=env)
        assert result.exit_code != 0 and message in result.output, result.output


async def test_a_schedule_is_refused_the_fast_lane_and_a_project_that_does_not_exist(
    app: Tidegate, api: ApiServer, sql: psycopg.Connection, settings: Settings
) -> None:
    """A fast-lane schedule firing every second would bypass the fast lane's admission
    (its cap, its capacity check): refused in the admin API, the CLI and
    ``@app.periodic``. So is a schedule of a project that does not exist."""
    every_second = {"task": "echo", "interval_seconds": 1}
    async with httpx.AsyncClient(base_url=api.url, headers=ADMIN) as client:
        missing = await client.post(
            "/admin/projects/nope/schedules", json={"name": "tick", **every_second}
        )
        assert_problem(missing, 404)
        assert (await client.post("/admin/projects", json={"id": "acme"})).status_code == 201
        fast = await client.post(
            "/admin/projects/acme/schedules",
            json={"name": "tick", "lane": "fast_lane", **every_second},
        )
        assert "'fast_lane'" in assert_problem(fast, 422)["detail"]
        created = await client.post(
            "/admin/projects/acme/schedules", json={"name": "tick", **every_second}
        )
        assert created.status_code == 201, created.text
        moved = await client.patch(
            "/admin/projects/acme/schedules/tick", json={"lane": "fast_lane"}
        )
        assert "'fast_lane'" in assert_problem(moved, 422)["detail"]
        library = await client.post(
            "/admin/projects/default/schedules", json={"name": "tick", **every_second}
        )
        assert library.status_code == 201, library.text  # the library's own project

    env = _env(settings)
    for args, message in [
        (["create", "nope", "x", "--task", "echo", "--every", "1"], "no project 'nope'"),
        (
            ["create", "acme", "x", "--task", "echo", "--every", "1", "--lane", "fast_lane"],
            "fast_lane",
        ),
    ]:
        result = CliRunner().invoke(main, ["schedules", *args], env=env)
        assert result.exit_code == 1 and message in result.output, result.output

    with pytest.raises(ConfigError, match="'fast_lane'"):
        app.periodic(every=1, name="fast", lane="fast_lane")(lambda: None)

    @app.task(name="quick", lane="fast_lane")
    def quick() -> None: ...

    with pytest.raises(ConfigError, match="'fast_lane'"):
        app.periodic(every=1)(quick)
    assert sql.execute("SELECT project, name, lane FROM schedules ORDER BY project").fetchall() == [
        ("acme", "tick", None),
        ("default", "tick", None),
    ]


FIELD = st.sampled_from(
    ["*", "0", "5", "7", "59", "*/7", "*/1000", "1-5", "1,3", "L", "LW", "MON#2", "31", "2", "FEB"]
)


@given(
    cron=st.one_of(st.text(max_size=40), st.lists(FIELD, min_size=4, max_size=7).map(" ".join)),
    timezone=st.sampled_from(["UTC", BERLIN, "America/St_Johns", "Australia/Lord_Howe", "x"]),
    hours=st.floats(0, 24 * 800),
)
@hypothesis_settings(max_examples=300, deadline=None)
def test_any_cron_text_is_refused_clearly_or_ticks(cron: str, timezone: str, hours: float) -> None:
    """A cron the boundary accepts never fails when its schedule fires."""
    try:
        timing = Timing(cron=cron, timezone=timezone)
    except ScheduleError:
        return
    start = timing.first_tick(datetime.now(UTC))
    plan = timing.plan(start, start + timedelta(hours=hours), "all", 50)
    assert plan.ticks and plan.ticks[0] >= start and plan.next_tick > plan.ticks[-1]
