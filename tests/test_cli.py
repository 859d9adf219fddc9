"""The ``tidegate`` command against a real database: options, environment, errors, help.

Expected failures are run as real processes, the way a person meets them: the exact
line on stderr, the exit status, and how long it took.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import pty
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
import psycopg
import pytest
from click.testing import CliRunner, Result

from tests.conftest import ROOT, running_worker, wait_until
from tests.http_fixtures import PrivatePostgres, wait_for_workers
from tidegate import NewRun, Settings, Tidegate, __version__
from tidegate.cli import main
from tidegate.lanes import parse_workloops
from tidegate.projects import hash_token
from tidegate.storage.migrate import latest_version, migrations

ERROR_SECONDS = 30.0
"""How long a command may take to say that it cannot work: a bound that tells a command
that gives up (its 3 s connect timeout, its imports, a loaded machine's slowness) from one
that waits forever, not a measure of speed."""
NO_DATABASE = (
    "tidegate: no tidegate database here or in any parent folder; start one with "
    "tidegate serve, or set TIDEGATE_DATABASE_URL"
)


@pytest.fixture
def env(settings: Settings) -> dict[str, str]:
    return {
        "TIDEGATE_DATABASE_URL": settings.database_url or "",
        "TIDEGATE_SCHEMA": settings.schema,
    }


def invoke(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def clean_environment(**variables: str) -> dict[str, str]:
    """This process's environment without a variable that names a database (TIDEGATE_*,
    DATABASE_URL, libpq's PG*), plus ``variables``."""
    kept = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TIDEGATE_", "PG")) and k != "DATABASE_URL"
    }
    return {**kept, "PYTHONPATH": str(ROOT), **variables}


def tidegate(
    *args: str, env: dict[str, str], cwd: Path = ROOT
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``python -m tidegate ARGS`` as a process; return it and the seconds it took."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tidegate", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, time.monotonic() - started


def assert_one_line_failure(
    done: subprocess.CompletedProcess[str], seconds: float, line: str
) -> None:
    assert (done.returncode, done.stderr, done.stdout) == (1, line + "\n", "")
    assert seconds < ERROR_SECONDS


def test_migrate_then_enqueue_then_list_and_show(env: dict[str, str]) -> None:
    result = invoke(env, "migrate")
    versions = ", ".join(str(m.version) for m in migrations())
    assert result.exit_code == 0
    assert f"at version {latest_version()} (applied {versions})" in result.stdout
    result = invoke(env, "migrate")
    assert result.exit_code == 0 and "up to date" in result.stdout
    result = invoke(
        env, "enqueue", "echo", "--args", '{"a": 1}', "--lane", "manual", "--priority", "3"
    )
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)
    assert (run["task"], run["lane"], run["priority"], run["args"]) == (
        "echo",
        "manual",
        3,
        {"a": 1},
    )
    result = invoke(env, "enqueue", "echo")
    assert result.exit_code == 0 and json.loads(result.stdout)["lane"] == "manual"
    result = invoke(env, "runs", "--state", "available")
    assert result.exit_code == 0 and "echo" in result.stdout and "manual" in result.stdout
    result = invoke(env, "runs", str(run["id"]))
    assert result.exit_code == 0 and json.loads(result.stdout)["id"] == run["id"]
    result = invoke(env, "runs", "999999")
    assert (result.exit_code, result.stderr) == (1, "tidegate: no run 999999\n")


async def test_runs_table_says_why_a_pending_run_waits(
    app: Tidegate, env: dict[str, str], sql: psycopg.Connection
) -> None:
    async with running_worker(app, "manual>*:2"):
        lost = app.enqueue("nosuch.task")
        done = app.enqueue("echo")
        await wait_until(
            lambda: (
                dict(sql.execute("SELECT id, state::text FROM runs").fetchall())
                == {lost.id: "pending", done.id: "succeeded"}
            ),
            10,
        )
    result = invoke(env, "runs")
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    columns = ["ID", "TASK", "LANE", "KEY", "STATE", "ATTEMPT", "INSERTED", "REASON"]
    assert header.split() == columns
    by_id = {int(row.split()[0]): row for row in rows}
    assert by_id[lost.id].endswith("  no live worker has task 'nosuch.task' for lane 'default'")
    assert re.search(r"succeeded  1 +\S+ \S+$", by_id[done.id])


async def test_runs_are_cancelled_and_retried_as_the_api_does(
    app: Tidegate, env: dict[str, str]
) -> None:
    waiting = app.enqueue("echo", {"n": 1}, lane="default")
    cancelled = invoke(env, "runs", "cancel", str(waiting.id))
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(cancelled.stdout)["state"] == "cancelled"
    again = invoke(env, "runs", "cancel", str(waiting.id))
    assert (again.exit_code, again.stderr) == (
        1,
        f"tidegate: run {waiting.id} has finished already (cancelled)\n",
    )
    retried = invoke(env, "runs", "retry", str(waiting.id))
    assert retried.exit_code == 0, retried.output
    run = json.loads(retried.stdout)
    assert (run["id"], run["state"], run["lane"]) == (waiting.id, "available", "manual")
    again = invoke(env, "runs", "retry", str(waiting.id))
    assert (again.exit_code, again.stderr) == (
        1,
        f"tidegate: run {waiting.id} has not finished (available)\n",
    )
    async with running_worker(app, "manual>*:1"):
        await wait_until(lambda: app.get_run(waiting.id).state == "succeeded", 10)  # type: ignore[union-attr]
    for verb in ("cancel", "retry", "show"):
        missing = invoke(env, "runs", verb, "999999")
        assert (missing.exit_code, missing.stderr) == (1, "tidegate: no run 999999\n"), verb
        bad = invoke(env, "runs", verb, "0")
        assert bad.exit_code == 2 and "0 is not in the range" in bad.output, verb


def test_runs_are_listed_by_key_and_an_empty_list_says_so(
    app: Tidegate, env: dict[str, str]
) -> None:
    app.enqueue_many([NewRun("echo", key=key) for key in ("acme", "globex", "acme")])
    listed = invoke(env, "runs", "--key", "acme", "--json")
    assert [run["key"] for run in json.loads(listed.stdout)] == ["acme", "acme"]
    table = invoke(env, "runs", "--key", "globex").stdout.splitlines()
    assert len(table) == 2 and table[1].split()[3] == "globex"
    none = invoke(env, "runs", "--key", "initech")
    assert (none.exit_code, none.stdout) == (0, "no runs\n")
    assert invoke(env, "runs", "--key", "initech", "--json").stdout == "[]\n"


def test_runs_are_searched_by_args_and_a_breaker_says_why_a_run_waits(
    app: Tidegate, env: dict[str, str], sql: psycopg.Connection
) -> None:
    made = app.enqueue_many(
        [NewRun("echo", {"order": n, "shop": "north"}, key="hot") for n in range(3)]
    )
    listed = invoke(env, "runs", "--args", '{"order": 1}', "--json")
    assert listed.exit_code == 0, listed.output
    assert [run["id"] for run in json.loads(listed.stdout)] == [made[1].id]
    both = invoke(env, "runs", "--args", '{"shop": "north"}', "--key", "hot", "--json")
    assert len(json.loads(both.stdout)) == 3
    for wrong in ("[1]", "{", '{"a": ' * 9 + "1" + "}" * 9, '{"a": "' + "x" * 1000 + '"}'):
        refused = invoke(env, "runs", "--args", wrong)
        assert refused.exit_code == 2 and "--args" in refused.stderr, (wrong, refused.output)

    sql.execute(
        "INSERT INTO key_breakers (lane, key, state, opened_at, open_until)"
        " VALUES ('default', 'hot', 'open', now(), now() + interval '10 minutes')"
    )
    _, *rows = invoke(env, "runs", "--key", "hot").stdout.splitlines()
    assert len(rows) == 3 and all(
        "key 'hot' has its circuit breaker open until" in row for row in rows
    ), rows
    shown = json.loads(invoke(env, "runs", "show", str(made[0].id)).stdout)
    assert shown["reason"].startswith("key 'hot' has its circuit breaker open until")
    assert "hold" not in shown


def test_runs_the_filters_match_are_cancelled_retried_and_deleted_in_bulk(
    app: Tidegate, env: dict[str, str], sql: psycopg.Connection
) -> None:
    made = app.enqueue_many([NewRun("echo", {"n": n}, key=f"k{n % 2}") for n in range(5)])
    cancelled = invoke(env, "runs", "--key", "k0", "cancel-matching")
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(cancelled.stdout) == {"cancelled": 3, "more": False}
    states = dict(sql.execute("SELECT id, state::text FROM runs").fetchall())
    assert [states[run.id] for run in made] == ["cancelled", "available"] * 2 + ["cancelled"]
    retried = invoke(env, "runs", "--state", "cancelled", "retry-matching", "--limit", "2")
    assert json.loads(retried.stdout) == {"retried": 2, "more": True}
    lanes = dict(sql.execute("SELECT id, lane FROM runs WHERE state = 'available'").fetchall())
    assert lanes[made[4].id] == lanes[made[2].id] == "default"  # the newest two
    assert made[0].id not in lanes
    refused = invoke(env, "runs", "retry-matching", "--limit", "100001")
    assert refused.exit_code == 2
    # Delete: only the finished run (made[0], still cancelled); the unfinished stay.
    deleted = invoke(env, "runs", "--task", "echo", "delete-matching")
    assert json.loads(deleted.stdout) == {"deleted": 1, "more": False}, deleted.output
    left = {row[0] for row in sql.execute("SELECT id FROM runs").fetchall()}
    assert left == {run.id for run in made[1:]}


def test_schedules_are_listed_as_a_table_or_as_json(app: Tidegate, env: dict[str, str]) -> None:
    none = invoke(env, "schedules", "list")
    assert (none.exit_code, none.stdout) == (0, "no schedules\n")
    for args in (
        ["nightly", "--cron", "30 2 * * *", "--timezone", "Europe/Berlin"],
        ["poll", "--every", "60", "--paused"],
    ):
        made = invoke(env, "schedules", "create", "default", *args, "--task", "echo")
        assert made.exit_code == 0, made.output
    header, *rows = invoke(env, "schedules", "list").stdout.splitlines()
    assert re.split(r" {2,}", header) == [
        "PROJECT",
        "NAME",
        "TASK",
        "WHEN",
        "NEXT TICK",
        "LAST RUN",
        "LAST ERROR",
    ]
    nightly, poll = rows
    assert re.match(r"default +nightly +echo +30 2 \* \* \* \(Europe/Berlin\) +\d{4}-", nightly)
    assert re.match(r"default +poll +echo +every 60s +paused$", poll)
    listed = json.loads(invoke(env, "schedules", "list", "--json").stdout)
    assert [(s["name"], s["paused"]) for s in listed] == [("nightly", False), ("poll", True)]


def test_enqueue_prints_the_run_as_it_stands_once_enqueued(
    app: Tidegate, env: dict[str, str], sql: psycopg.Connection
) -> None:
    """What happens to a run after its insert (here: a trigger that finishes it at once,
    as a fast worker would between the enqueue and the print) shows in what is printed."""
    sql.execute(
        """
        CREATE FUNCTION finish_at_once() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            UPDATE runs SET state = 'succeeded', attempt = 1, result = '"done"',
                            completed_at = clock_timestamp()
            WHERE id = NEW.id;
            RETURN NULL;
        END $$;
        CREATE TRIGGER finish_at_once AFTER INSERT ON runs
            FOR EACH ROW EXECUTE FUNCTION finish_at_once();
        """
    )
    result = invoke(env, "enqueue", "echo")
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)
    assert (run["state"], run["attempt"], run["result"]) == ("succeeded", 1, "done")


async def test_a_trigger_made_or_changed_for_a_task_no_live_worker_has_is_warned_of(
    app: Tidegate, env: dict[str, str]
) -> None:
    made = invoke(env, "projects", "create", "acme")
    assert made.exit_code == 0, made.output
    created = invoke(
        env, "triggers", "create", "acme", "orders", "--mode", "sync", "--task", "echo"
    )
    assert created.exit_code == 0, created.output
    trigger = json.loads(created.stdout)
    said = (
        "no live worker has task 'echo' for lane 'fast_lane': its webhooks are refused (503) "
        "until one starts"
    )
    assert trigger["warnings"] == [said]
    assert trigger["url"] == f"/hooks/{trigger['token']}"
    assert re.fullmatch(
        rf"\S+ \S+ WARNING tidegate: trigger {trigger['id']} \(orders\): " + re.escape(said) + "\n",
        created.stderr,
    )
    async with running_worker(app, "fast_lane:1 manual>*:1"):
        updated = invoke(env, "triggers", "update", str(trigger["id"]), "--mode", "async")
        assert updated.exit_code == 0, updated.output
        assert json.loads(updated.stdout)["warnings"] == []
        typo = invoke(env, "triggers", "update", str(trigger["id"]), "--task", "ecko")
        assert json.loads(typo.stdout)["warnings"] == [
            "no live worker has task 'ecko' for lane 'default': its webhooks wait until one starts"
        ]


def test_worker_tokens_are_created_listed_and_deleted(env: dict[str, str], app: Tidegate) -> None:
    created = invoke(env, "worker-tokens", "create", "fleet", "--lanes", "emails, default")
    assert created.exit_code == 0, created.output
    token = json.loads(created.stdout)
    assert token["token"].startswith("tgw_") and token["lanes"] == ["default", "emails"]
    with app.database.connect() as conn:  # kept hashed, never in clear
        stored = conn.execute("SELECT token_hash FROM worker_tokens").fetchone()
    assert stored == (hash_token(token["token"]),)
    for args, said in (
        (("fleet", "--lanes", "*"), "a worker token with this name exists already"),
        (("bad name", "--lanes", "*"), "worker token name must match"),
        (("other", "--lanes", "no lane!"), "lane name must match"),
    ):
        refused = invoke(env, "worker-tokens", "create", *args)
        assert refused.exit_code == 1 and said in refused.output, refused.output
    listed = json.loads(invoke(env, "worker-tokens", "list").stdout)
    assert [(t["name"], t["live_workers"]) for t in listed] == [("fleet", 0)]
    assert invoke(env, "worker-tokens", "delete", "fleet").exit_code == 0
    gone = invoke(env, "worker-tokens", "delete", "fleet")
    assert gone.exit_code == 1 and "no worker token 'fleet'" in gone.output


def test_command_options_also_read_their_environment_variable(env: dict[str, str]) -> None:
    invoke(env, "migrate")
    for i in range(3):
        assert invoke(env, "enqueue", "echo", "--args", json.dumps({"i": i})).exit_code == 0
    result = invoke({**env, "TIDEGATE_RUNS_LIMIT": "2", "TIDEGATE_RUNS_JSON": "1"}, "runs")
    assert result.exit_code == 0
    assert [run["args"] for run in json.loads(result.stdout)] == [{"i": 2}, {"i": 1}]
    result = invoke({**env, "TIDEGATE_ENQUEUE_ARGS": '{"i": 3}'}, "enqueue", "echo")
    assert result.exit_code == 0 and json.loads(result.stdout)["args"] == {"i": 3}
    every = {**env, "TIDEGATE_SCHEDULES_CREATE_EVERY": "60"}
    result = invoke(every, "schedules", "create", "default", "poll", "--task", "echo")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["interval_seconds"] == 60


def test_bad_input_is_a_usage_error_that_stores_nothing(
    env: dict[str, str], sql: psycopg.Connection
) -> None:
    invoke(env, "migrate")
    assert invoke(env, "enqueue", "echo", "--args", "{nope").exit_code == 2
    result = invoke(env, "enqueue", "echo", "--args", "[1, 2]")
    assert result.exit_code == 2 and "JSON object" in result.output
    result = invoke(env, "enqueue", "echo", "--lane", "bad lane")
    assert result.exit_code == 2 and "lane name" in result.output
    assert sql.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_bad_workloop_spec_fails_at_start_naming_the_bad_part(env: dict[str, str]) -> None:
    result = invoke(env, "worker", "--app", "tests.apps:app", "--workloops", "fast_lane:1 *>x:2")
    assert result.exit_code == 2 and "'*>x:2'" in result.output
    result = invoke({**env, "TIDEGATE_WORKLOOPS": "manual:0"}, "worker", "--app", "tests.apps:app")
    assert result.exit_code == 2 and "slots" in result.output
    # str.isdigit takes these; int refuses the first and reads the second as 12.
    for slots in ("\u00b2", "\u0661\u0662", "9" * 30):
        spec = f"emails:{slots}"
        result = invoke(env, "worker", "--app", "tests.apps:app", "--workloops", spec)
        assert result.exit_code == 2 and "slots must be a whole number" in result.output, spec


def test_worker_refuses_an_unmigrated_schema(env: dict[str, str]) -> None:
    result = invoke(env, "worker", "--app", "tests.apps:app")
    assert result.exit_code == 1 and "tidegate migrate" in result.stderr


def test_db_reports_server_and_schema_version_without_the_password(
    env: dict[str, str], settings: Settings
) -> None:
    invoke(env, "migrate")
    url = psycopg.conninfo.make_conninfo(settings.database_url or "", password="s3cret")
    result = invoke({**env, "TIDEGATE_DATABASE_URL": url}, "db")
    assert result.exit_code == 0
    info = json.loads(result.stdout)
    assert info["schema_version"] == info["code_version"] == latest_version()
    assert info["database"].startswith("PostgreSQL ")
    assert "s3cret" not in result.output


def test_database_url_and_libpq_variables_name_the_database_where_tidegates_is_unset(
    settings: Settings, tmp_path: Path
) -> None:
    assert settings.database_url
    params = psycopg.conninfo.conninfo_to_dict(settings.database_url)
    libpq = {
        variable: str(params[key])
        for variable, key in (
            ("PGHOST", "host"),
            ("PGPORT", "port"),
            ("PGDATABASE", "dbname"),
            ("PGUSER", "user"),
        )
        if key in params
    }
    refused = "postgresql://postgres@127.0.0.1:1/postgres"
    for variables in (
        {"DATABASE_URL": settings.database_url},
        libpq,
        {"TIDEGATE_DATABASE_URL": settings.database_url, "DATABASE_URL": refused},
        {"DATABASE_URL": settings.database_url, "PGHOST": "no-such-host.invalid"},
    ):
        env = clean_environment(TIDEGATE_SCHEMA=settings.schema, **variables)
        done, _ = tidegate("migrate", env=env, cwd=tmp_path)
        assert done.returncode == 0, (variables, done.stderr)
        done, _ = tidegate("db", env=env, cwd=tmp_path)
        assert json.loads(done.stdout)["schema_version"] == latest_version(), variables
    described = json.loads(tidegate("db", env=clean_environment(**libpq), cwd=tmp_path)[0].stdout)
    assert described["database"].endswith(f'database "{params["dbname"]}"')
    # A login alone (PGUSER, PGPASSWORD) names no server: still none found here.
    done, _ = tidegate("runs", env=clean_environment(PGUSER="app"), cwd=tmp_path)
    assert (done.returncode, done.stderr) == (1, NO_DATABASE + "\n")
    assert "DATABASE_URL, else libpq's PG*" in help_entries()["--database-url"]


def test_demo_works_off_every_run_and_shows_its_progress(env: dict[str, str]) -> None:
    result = invoke(env, "demo", "--runs", "40")
    assert result.exit_code == 0, result.output
    assert "runs done" in result.stdout
    assert "all 40 runs finished" in result.stdout
    assert "discarded" not in result.stdout


def on_a_terminal(*args: str, env: dict[str, str]) -> list[str]:
    """Run ``python -m tidegate ARGS`` with stdout and stderr on a pseudo-terminal, as a
    person runs it; return the lines the terminal shows (a carriage return goes back to
    the line's start, ``ESC [K`` erases to its end)."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "tidegate", *args],
        env={**env, "COLUMNS": "120"},
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    written = b""
    with contextlib.suppress(OSError):  # EIO once the process has closed the terminal
        while chunk := os.read(controller, 65536):
            written += chunk
    os.close(controller)
    assert process.wait(60) == 0, written.decode()
    shown = []
    text = re.sub(r"\x1b\[\?25[lh]", "", written.decode())  # the bar hides the cursor
    for line in text.replace("\r\n", "\n").split("\n"):
        screen = ""
        for part in line.split("\r"):
            if part.startswith("\x1b[K"):
                screen = ""
                part = part.removeprefix("\x1b[K")
            screen = part + screen[len(part) :]
        shown.append(screen)
    return shown


def test_demo_on_a_terminal_logs_above_its_progress_bar_and_not_of_its_own_tasks(
    settings: Settings,
) -> None:
    env = clean_environment(
        TIDEGATE_DATABASE_URL=settings.database_url or "", TIDEGATE_SCHEMA=settings.schema
    )
    shown = on_a_terminal("demo", "--runs", "80", env=env)
    assert any(line.startswith("runs done") for line in shown), shown
    assert any("all 80 runs finished" in line for line in shown), shown
    # flaky_sync's first attempts fail about half the time: WARNING lines while the bar
    # is drawn, each on a line of its own.
    assert any("WARNING tidegate.worker" in line for line in shown), shown
    assert not [line for line in shown if "runs done" in line and "tidegate" in line], shown
    assert not [line for line in shown if "no live worker" in line], shown


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_an_enqueue_of_a_task_no_worker_has_logs_a_warning(
    settings: Settings, log_format: str
) -> None:
    env = clean_environment(
        TIDEGATE_DATABASE_URL=settings.database_url or "", TIDEGATE_SCHEMA=settings.schema
    )
    assert tidegate("migrate", env=env)[0].returncode == 0
    done, _ = tidegate("--log-format", log_format, "enqueue", "nosuch.task", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["task"] == "nosuch.task"
    message = (
        "no live worker has task 'nosuch.task' for lane 'manual': its runs wait until one "
        "starts (tidegate worker --app <module>:<app>)"
    )
    [line] = done.stderr.splitlines()
    if log_format == "json":
        entry = json.loads(line)
        assert (entry["level"], entry["logger"], entry["message"]) == (
            "WARNING",
            "tidegate",
            message,
        )
    else:
        assert re.fullmatch(r"\S+ \S+ WARNING tidegate: " + re.escape(message), line)


def test_version_prints_the_installed_version_and_nothing_else() -> None:
    done, _ = tidegate("--version", env=clean_environment())
    assert (done.returncode, done.stdout, done.stderr) == (0, f"tidegate {__version__}\n", "")
    assert __version__ == importlib.metadata.version("tidegate")
    result = CliRunner().invoke(main, ["--version", "runs"])  # answered before any command
    assert (result.exit_code, result.stdout) == (0, f"tidegate {__version__}\n")


# -- expected failures: one line, status 1, within seconds ----------------------------


@pytest.mark.parametrize(
    ("url", "line"),
    [
        (
            "postgresql://postgres@127.0.0.1:1/postgres",
            "tidegate: cannot reach PostgreSQL at 127.0.0.1:1: connection refused",
        ),
        (
            "postgresql://postgres@no-such-host.invalid:5432/postgres",
            "tidegate: cannot reach PostgreSQL at no-such-host.invalid:5432: unknown host",
        ),
    ],
    ids=["refused", "unknown-host"],
)
@pytest.mark.parametrize(
    "command",
    [
        ["runs"],
        ["enqueue", "echo"],
        ["projects", "list"],
        ["serve"],
        ["worker", "--app", "tests.apps:app"],
    ],
    ids=lambda command: command[0],
)
def test_an_unreachable_database_is_one_line_within_seconds(
    url: str, line: str, command: list[str]
) -> None:
    done, seconds = tidegate(*command, env=clean_environment(TIDEGATE_DATABASE_URL=url))
    assert_one_line_failure(done, seconds, line)


def test_a_server_that_never_answers_is_one_line_within_seconds() -> None:
    """A port that takes connections and then says nothing, like a stuck server."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        done, seconds = tidegate("runs", env=clean_environment(TIDEGATE_DATABASE_URL=url))
    assert_one_line_failure(
        done,
        seconds,
        f"tidegate: cannot reach PostgreSQL at 127.0.0.1:{port}: no answer (timed out)",
    )


def test_verbose_adds_the_traceback_to_the_line() -> None:
    url = "postgresql://postgres@127.0.0.1:1/postgres"
    done, _ = tidegate("-v", "runs", env=clean_environment(TIDEGATE_DATABASE_URL=url))
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "psycopg.OperationalError" in done.stderr
    assert done.stderr.endswith(
        "tidegate: cannot reach PostgreSQL at 127.0.0.1:1: connection refused\n"
    )


def test_a_missing_role_or_database_is_one_line(settings: Settings) -> None:
    assert settings.database_url
    params = psycopg.conninfo.conninfo_to_dict(settings.database_url)
    host, port = str(params.get("host", "localhost")), params.get("port", 5432)
    server = (  # the embedded server of the tests listens on a Unix socket
        f"PostgreSQL on socket {host}/.s.PGSQL.{port}"
        if host.startswith("/")
        else f"PostgreSQL at {host}:{port}"
    )
    no_role = psycopg.conninfo.make_conninfo(settings.database_url, user="no_such_role")
    done, seconds = tidegate("runs", env=clean_environment(TIDEGATE_DATABASE_URL=no_role))
    assert_one_line_failure(
        done,
        seconds,
        f'tidegate: cannot log in to {server}: role "no_such_role" does not exist',
    )
    no_database = psycopg.conninfo.make_conninfo(settings.database_url, dbname="no_such_db")
    env = clean_environment(TIDEGATE_DATABASE_URL=no_database)
    done, seconds = tidegate("enqueue", "echo", env=env)
    assert_one_line_failure(
        done,
        seconds,
        f'tidegate: {server} has no database "no_such_db": create it, or name another in the URL',
    )


@pytest.fixture
def password_server(tmp_path: Path) -> Iterator[str]:
    """A private PostgreSQL that asks role ``app`` for its password (``right``)."""
    server = PrivatePostgres(tmp_path / "pg")
    url = server.start()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE ROLE app LOGIN PASSWORD 'right'")
        row = conn.execute("SHOW hba_file").fetchone()
        assert row is not None
        Path(row[0]).write_text("local all postgres trust\nlocal all all scram-sha-256\n")
        conn.execute("SELECT pg_reload_conf()")
    yield url
    server.stop()


def test_a_wrong_password_is_one_line(password_server: str) -> None:
    url = psycopg.conninfo.make_conninfo(password_server, user="app", password="n0t-th3-passw0rd")
    socket = psycopg.conninfo.conninfo_to_dict(url)["host"]
    done, seconds = tidegate("runs", env=clean_environment(TIDEGATE_DATABASE_URL=url))
    assert_one_line_failure(
        done,
        seconds,
        f"tidegate: cannot log in to PostgreSQL on socket {socket}/.s.PGSQL.5432: "
        'password authentication failed for user "app"',
    )
    assert "n0t-th3-passw0rd" not in done.stderr


def test_a_schema_missing_older_or_newer_than_the_code_is_one_line(
    settings: Settings, sql: psycopg.Connection
) -> None:
    env = clean_environment(
        TIDEGATE_DATABASE_URL=settings.database_url or "", TIDEGATE_SCHEMA=settings.schema
    )
    want = latest_version()
    done, seconds = tidegate("runs", env=env)
    assert_one_line_failure(
        done,
        seconds,
        f"tidegate: schema '{settings.schema}' is at version 0, this tidegate needs {want}: "
        "run `tidegate migrate`",
    )
    assert tidegate("migrate", env=env)[0].returncode == 0
    sql.execute("DELETE FROM migrations WHERE version = %s", [want])
    done, seconds = tidegate("enqueue", "echo", env=env)
    assert_one_line_failure(
        done,
        seconds,
        f"tidegate: schema '{settings.schema}' is at version {want - 1}, this tidegate needs "
        f"{want}: run `tidegate migrate`",
    )
    sql.execute(
        "INSERT INTO migrations (version, name) VALUES (%s, 'future'), (%s, 'later')",
        [want, want + 1],
    )
    done, seconds = tidegate("keys", "list", env=env)
    assert_one_line_failure(
        done,
        seconds,
        f"tidegate: schema '{settings.schema}' is at version {want + 1}, newer than this "
        f"tidegate ({want}): upgrade tidegate",
    )


def test_commands_find_no_database_outside_a_tidegate_folder(tmp_path: Path) -> None:
    for command in (["runs"], ["enqueue", "echo"], ["migrate"], ["db"], ["projects", "list"]):
        done, seconds = tidegate(*command, env=clean_environment(), cwd=tmp_path)
        assert_one_line_failure(done, seconds, NO_DATABASE)
    assert list(tmp_path.iterdir()) == []  # and nothing was created


# -- --help tells the defaults the commands use -----------------------------------------


def help_entries(*command: str) -> dict[str, str]:
    """Read ``tidegate COMMAND --help``: each option's entry, its wrapped lines joined."""
    # Wide, so that no environment variable's name is broken across lines.
    result = CliRunner().invoke(main, [*command, "--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    options = result.stdout.split("Options:\n", 1)[1]
    entries = re.split(r"\n(?=  -)", options.strip("\n"))
    found = {}
    for entry in entries:
        option = re.match(r"\s*(?:-\w, )?(--[\w-]+)", entry)
        assert option, entry
        found[option[1]] = " ".join(entry.split())
    del found["--help"]
    found.pop("--version", None)  # tidegate's own, like --help: no setting, no default
    return found


def help_defaults(*command: str) -> dict[str, tuple[str | None, str | None]]:
    """Each option of ``tidegate COMMAND --help``: its env var and its shown default."""
    found = {}
    for option, entry in help_entries(*command).items():
        envvar = re.search(r"env var: (\w+)", entry)
        default = re.search(r"default: ([^;\]]+)", entry)
        found[option] = (envvar[1] if envvar else None, default[1] if default else None)
    return found


def commands(
    command: click.Command = main, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command of ``tidegate``, groups included, with the words that name it."""
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from commands(sub, (*path, name))


@pytest.mark.parametrize(
    ("path", "command"),
    list(commands()),
    ids=lambda x: (" ".join(x) or "tidegate") if isinstance(x, tuple) else "",
)
def test_every_option_has_a_help_text_and_its_environment_variable(
    path: tuple[str, ...], command: click.Command
) -> None:
    """A setting reads TIDEGATE_<OPTION>, a command's own option TIDEGATE_<COMMAND>_<OPTION>,
    both named after the option as typed (--every: TIDEGATE_SCHEDULES_CREATE_EVERY)."""
    shown = help_entries(*path)
    for param in command.params:
        if not isinstance(param, click.Option) or param.name == "version":
            continue
        option = next(name for name in param.opts if name.startswith("--"))
        assert param.help, (path, option)
        words = option.removeprefix("--").upper().replace("-", "_")
        own = "_".join([*path, option.removeprefix("--")]).upper().replace("-", "_")
        envvar = re.search(r"env var: (\w+)", shown[option])
        assert envvar is not None, (path, option)
        assert envvar[1] in (f"TIDEGATE_{words}", f"TIDEGATE_{own}"), (path, option)


def test_help_shows_the_settings_defaults_each_command_uses() -> None:
    defaults = Settings()
    for command in ([], ["worker"], ["serve"]):
        for option, (envvar, shown) in help_defaults(*command).items():
            name = (envvar or "").removeprefix("TIDEGATE_").lower()
            if name == "workloops" or not hasattr(defaults, name):
                continue  # workloops: checked by running the commands, below
            value = getattr(defaults, name)
            if name == "data_dir":
                assert shown is not None and shown.startswith(f"./{value} for serve"), shown
            else:
                assert shown == (None if value is None else str(value)), (command, option)


def test_serve_and_worker_start_the_workloops_their_help_shows(
    app: Tidegate, settings: Settings, sql: psycopg.Connection
) -> None:
    """Start each with no option but where its database is, and read what registered."""
    assert settings.database_url
    env = clean_environment(
        TIDEGATE_DATABASE_URL=settings.database_url, TIDEGATE_SCHEMA=settings.schema
    )
    for command, worker in [
        ("serve", ["serve", "--role", "worker"]),
        ("worker", ["worker", "--app", "tests.apps:app"]),
    ]:
        process = subprocess.Popen([sys.executable, "-m", "tidegate", *worker], env=env, cwd=ROOT)
        try:
            wait_for_workers(settings.database_url, settings.schema, 1)
            row = sql.execute("SELECT workloops FROM workers").fetchone()
        finally:
            process.terminate()
            assert process.wait(30) == 0
        assert row is not None
        shown = help_defaults(command)["--workloops"][1]
        assert shown is not None
        registered = [(tuple(group["chain"]), group["slots"]) for group in row[0]]
        assert registered == [(spec.chain, spec.slots) for spec in parse_workloops(shown)]


@pytest.mark.parametrize("token", [" tga_x", "tga x", "caf\u00e9", "x" * 256, ""])
def test_an_admin_token_no_header_can_carry_is_refused_not_stored(
    env: dict[str, str], settings: Settings, token: str
) -> None:
    """A token with a space, a blank, an accent, or past 255 characters could never be
    sent back in ``Authorization: Bearer``: storing it locked the super admin out."""
    assert invoke(env, "migrate").exit_code == 0
    result = invoke(env, "admin-token", "rotate", "--token", "tga_good")
    assert result.exit_code == 0, result.output

    result = invoke(env, "admin-token", "rotate", "--token", token)

    assert result.exit_code == 2, result.output
    assert "visible ASCII" in result.output
    assert settings.database_url
    with psycopg.connect(
        settings.database_url, options=f"-c search_path={settings.schema}"
    ) as conn:
        stored = conn.execute("SELECT token_hash FROM admin_tokens").fetchall()
    assert stored == [(hash_token("tga_good"),)]
    # The same bound holds for TIDEGATE_ADMIN_TOKEN, which a server stores at start.
    result = invoke({**env, "TIDEGATE_ADMIN_TOKEN": token or " "}, "serve", "--role", "api")
    assert result.exit_code == 2, result.output
    assert "admin_token must be 1 to 255 visible ASCII" in result.output
