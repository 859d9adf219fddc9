"""Strict order per key: an ordered key's runs start one at a time, in the order of their
ids, each only once every earlier run of the key has ended for good.

The first test runs worker processes on keys whose handlers fail at random and retry,
and kills one worker mid-run; the others hold one key's line on a run that backs off,
read why its runs wait, and cancel it. What ran, and when, is read from the handlers'
own rows (``executions``: each attempt's start, on the database's clock) and the runs'
``completed_at``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from tests.conftest import running_worker, spawn_worker, wait_until
from tests.http_fixtures import ADMIN, ApiServer
from tests.test_claim_plan import claim_plans, rows_scanned, stale_statistics_under_a_backlog
from tidegate import NewRun, RunState, Settings, Tidegate
from tidegate.api.admin import KeyPolicy
from tidegate.cli import main
from tidegate.figures import read_keys
from tidegate.policies import PolicyError, set_key_policy
from tidegate.runs import with_holds

ORDERED = [f"line{n}" for n in range(5)]


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; any still alive when it ends are killed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def finished(sql: psycopg.Connection, ids: list[int]) -> bool:
    row = sql.execute(
        "SELECT count(*) FROM runs WHERE id = ANY(%s)"
        " AND state IN ('succeeded', 'discarded', 'cancelled')",
        [ids],
    ).fetchone()
    return row is not None and row[0] == len(ids)


def starts(sql: psycopg.Connection) -> dict[int, list[datetime]]:
    """Each run's attempts' starts, as its handler wrote them."""
    found: dict[int, list[datetime]] = defaultdict(list)
    for run_id, started_at in sql.execute("SELECT run_id, started_at FROM executions"):
        found[run_id].append(started_at)
    return found


def assert_in_line(sql: psycopg.Connection, key: str) -> int:
    """Assert that no run of ``key`` started before every earlier one of the key (by id)
    had ended for good; return how many attempts its runs made."""
    rows = sql.execute(
        "SELECT id, state, completed_at FROM runs WHERE key = %s ORDER BY id", [key]
    ).fetchall()
    began = starts(sql)
    attempts = 0
    for (before, state, ended), (after, _, _) in itertools.pairwise(rows):
        assert state in ("succeeded", "discarded", "cancelled") and ended is not None
        assert began[after], f"run {after} of {key} never started"
        first = min(began[after])
        assert first > ended, f"run {after} of {key} started {first}, before {before} ended {ended}"
    for run_id, *_ in rows:
        attempts += len(began[run_id])
    return attempts


async def test_each_run_of_an_ordered_key_starts_after_every_earlier_one_ended_despite_failures_and_kill(  # noqa: E501
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    for key in ORDERED:
        app.set_key_policy("default", key, ordered=True)
    runs: list[NewRun] = []
    for step in range(20):
        runs += [NewRun("ordered_step", {"fail": 0.3}, key=key) for key in ORDERED]
        if step == 3:  # held by its worker until that worker is killed
            runs.append(NewRun("ordered_step", {"hold_seconds": 60}, key=ORDERED[0]))
        runs += [NewRun("ordered_step", {"fail": 0.3}, key=f"free{step % 4}")]
    made = app.enqueue_many(runs)
    victim = next(run.id for run in made if run.args.get("hold_seconds"))
    ids = [run.id for run in made]

    processes += [spawn_worker(settings, "manual>*:4") for _ in range(3)]

    def victim_pid() -> int | None:
        row = sql.execute(
            "SELECT pid FROM executions WHERE run_id = %s AND attempt = 1", [victim]
        ).fetchone()
        return row[0] if row else None

    await wait_until(lambda: victim_pid() is not None, 60, interval=0.1)
    killed = next(process for process in processes if process.pid == victim_pid())
    killed.kill()
    killed.wait(10)
    processes.append(spawn_worker(settings, "manual>*:4"))

    await wait_until(lambda: finished(sql, ids), 180, interval=0.2)

    attempts = [assert_in_line(sql, key) for key in ORDERED]
    retried = sql.execute(
        "SELECT count(*) FROM runs WHERE key = ANY(%s) AND errors <> '[]'", [ORDERED]
    ).fetchone()
    assert retried is not None and retried[0] >= 5, (retried, attempts)  # retried, in line
    row = sql.execute("SELECT state, attempt, errors FROM runs WHERE id = %s", [victim]).fetchone()
    assert row is not None and row[1] >= 2, row  # rescued, and run again in its place
    assert "lease" in json.dumps(row[2][0]), row


async def test_other_keys_flow_while_an_ordered_keys_head_backs_off_until_it_is_cancelled(
    app: Tidegate,
    sql: psycopg.Connection,
    tmp_path: Path,
    start_api: Callable[..., ApiServer],
) -> None:
    api = start_api()
    put = httpx.put(
        f"{api.url}/admin/lanes/default/keys/held",
        headers=ADMIN,
        json={"ordered": True},
        timeout=10,
    )
    assert put.status_code == 200 and put.json()["ordered"] is True, put.text
    flag = tmp_path / "failing"
    flag.touch()
    head, *behind = app.enqueue_many(
        [NewRun("ordered_step", {"flag": str(flag), "retry_seconds": 60}, key="held")]
        + [NewRun("ordered_step", key="held") for _ in range(2)]
    )
    free = app.enqueue_many([NewRun("ordered_step", key=f"free{n % 3}") for n in range(30)])

    async with running_worker(app, "manual>*:4"):
        await wait_until(lambda: finished(sql, [run.id for run in free]), 60)
        assert [app.get_run(run.id).attempt for run in behind] == [0, 0]  # type: ignore[union-attr]

        def backing_off() -> bool:
            keys = app.execute(read_keys(None, 100))
            found = [k for k in keys if k.key == "held"]
            return bool(found) and found[0].blocked

        await wait_until(backing_off, 30)
        (held,) = [k for k in app.execute(read_keys(None, 100)) if k.key == "held"]
        assert (held.ordered, held.head, held.held_by) == (True, head.id, "order")
        shown = app.execute(with_holds([app.get_run(run.id) for run in behind]))  # type: ignore[misc]
        for run in shown:
            assert f"waits behind run {head.id} (due at " in (run.reason or ""), run.reason
        samples = httpx.get(f"{api.url}/metrics", headers=ADMIN, timeout=10).text
        assert 'tidegate_ordered_keys_blocked{lane="default"} 1.0' in samples
        held_lines = [line for line in samples.splitlines() if 'key="held"' in line]
        assert any('by="order"' in line and line.endswith(" 1.0") for line in held_lines), (
            held_lines
        )

        app.cancel(head.id)
        await wait_until(lambda: finished(sql, [run.id for run in behind]), 30)
    assert [app.get_run(run.id).state for run in behind] == [RunState.SUCCEEDED] * 2  # type: ignore[union-attr]
    assert_in_line(sql, "held")


def test_ordered_is_set_from_the_library_and_the_cli_and_only_as_a_bool(
    app: Tidegate, settings: Settings
) -> None:
    assert app.set_key_policy("default", "a", ordered=True)["ordered"] is True
    assert app.set_key_policy("default", "a", max_running=3)["ordered"] is True  # kept
    assert app.set_key_policy("default", "a", ordered=None)["ordered"] is None
    for wrong in (1, "yes", 0.0):
        with pytest.raises(PolicyError, match="ordered must be true, false or null"):
            next(set_key_policy("default", "a", ordered=wrong))
        with pytest.raises(ValidationError):
            KeyPolicy(ordered=wrong)
    env = {"TIDEGATE_DATABASE_URL": settings.database_url or "", "TIDEGATE_SCHEMA": settings.schema}
    result = CliRunner().invoke(main, ["keys", "set", "default", "b", "--ordered"], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ordered"] is True
    result = CliRunner().invoke(main, ["keys", "set", "default", "b", "--unordered"], env=env)
    assert json.loads(result.stdout)["ordered"] is False


def test_a_head_that_came_due_again_behind_its_keys_backlog_is_taken_first(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """A retry comes due stamped on its key's clock behind the key's newer runs, far past
    any bounded scan: the key's turn still goes to it, at the turn's place on the clock,
    and the lane's frontier moves no further than that turn."""
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, vtime)"
        " SELECT 'p', 'default', 'k', 'noop', i FROM generate_series(1, 2000) AS i"
    )
    head = sql.execute("SELECT min(id) FROM runs").fetchone()[0]  # type: ignore[index]
    sql.execute("UPDATE runs SET vtime = 1000000, attempt = 1 WHERE id = %s", [head])
    app.set_key_policy("default", "k", ordered=True)
    _, claimed = claim_plans(sql, ["default"], False, keep=True)
    assert [row[0] for row in claimed] == [head]
    frontier = sql.execute("SELECT frontier FROM lane_clocks WHERE lane = 'default'").fetchone()
    assert frontier == (2.0,)  # the turn of run 2, the first of the key in the scan
    _, again = claim_plans(sql, ["default"], False)
    assert again == []  # one at a time: the head is in flight


def test_an_ordered_claim_reads_no_backlog_when_the_statistics_predate_it(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """Each ordered key's line is two index probes (its run in flight, its front by id),
    whatever its backlog, also on a plan made from statistics that saw no ready run."""
    stale_statistics_under_a_backlog(sql)  # 50,000 ready runs over 20 keys
    app.set_key_policy("default", "*", ordered=True)
    for _ in range(7):  # past the five custom plans after which a generic one may stay
        plans, claimed = claim_plans(sql, ["default"], False)
        assert len(claimed) == 8
        assert rows_scanned(plans) <= 500 + 4 * 20, rows_scanned(plans)


def test_only_an_ordered_keys_runs_are_in_its_line_and_its_earlier_runs_join_it(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """The line's index (runs_key_line) holds the runs of ordered keys alone: a run of any
    other key pays no fourth index entry. Runs enqueued before the policy join the line
    when it is set; runs enqueued after are stamped by their insert, batch or single."""
    before = app.enqueue_many([NewRun("noop", key="late") for _ in range(3)])
    other = app.enqueue("noop", key="free")
    app.set_key_policy("default", "late", ordered=True)
    after = [app.enqueue("noop", key="late"), *app.enqueue_many([NewRun("noop", key="late")] * 2)]
    lined = dict(sql.execute("SELECT id, in_line FROM runs").fetchall())
    assert [lined[run.id] for run in [*before, *after]] == [True] * 6
    assert lined[other.id] is None
    app.set_key_policy("default", "*", ordered=True)  # the lane's default lines up the rest
    assert sql.execute("SELECT in_line FROM runs WHERE id = %s", [other.id]).fetchone() == (True,)
