"""The README's library quick start, and its examples of enqueueing in a transaction,
waiting for a result and testing tasks, work copied verbatim.

The test takes the quick start's code blocks out of README.md and runs them as a reader
would, in an empty folder: it writes ``myapp.py`` from the Python block, then runs each
line of the shell block, the ``python`` and ``tidegate`` of this environment first on the
PATH (as in an activated virtualenv). A ``tidegate worker`` line keeps running, as it
would in a terminal, until every run has finished; then it gets SIGTERM (Ctrl+C).

The database is the test's, through ``TIDEGATE_DATABASE_URL`` and ``TIDEGATE_SCHEMA``,
migrated beforehand as the README tells users of their own PostgreSQL to do. The two
examples run in the test's process, with its app and its database.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.conftest import ROOT, wait_until
from tidegate import Settings, Tidegate
from tidegate.testing import Harness

pytest_plugins = ["pytester"]

README = ROOT / "README.md"


def section(title: str) -> str:
    """Return the README's section ``## title``, up to the next one."""
    return README.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def python_block(title: str, language: str = "python") -> str:
    """Return the one ``language`` block of the README's section ``title``."""
    [code] = re.findall(rf"```{language}\n(.*?)```", section(title), re.DOTALL)
    return code


def quick_start() -> tuple[str, list[list[str]]]:
    """Return the quick start's Python file and its shell commands, as the README has them."""
    blocks = re.findall(r"```(\w+)\n(.*?)```", section("Library quick start"), re.DOTALL)
    [python] = [code for language, code in blocks if language == "python"]
    [shell] = [code for language, code in blocks if language == "sh"]
    commands = [shlex.split(line, comments=True) for line in shell.splitlines()]
    return python, [command for command in commands if command]


def count(sql: psycopg.Connection, where: str = "true") -> int:
    row = sql.execute(f"SELECT count(*) FROM runs WHERE {where}").fetchone()
    assert row is not None
    return int(row[0])


async def test_the_library_quick_start_runs_as_written(
    app: Tidegate, settings: Settings, sql: psycopg.Connection, tmp_path: Path
) -> None:
    python, commands = quick_start()
    assert python.startswith("# myapp.py\n")
    (tmp_path / "myapp.py").write_text(python)
    assert [command[:2] for command in commands] == [
        ["python", "myapp.py"],
        ["tidegate", "worker"],
    ]
    assert settings.database_url
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "TIDEGATE_DATABASE_URL": settings.database_url,
        "TIDEGATE_SCHEMA": settings.schema,
    }

    script = subprocess.run(commands[0], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert script.returncode == 0, script.stderr
    enqueued = count(sql)
    assert enqueued > 0
    assert count(sql, "idempotency_key = 'order-42'") == 1

    worker = subprocess.Popen(commands[1], cwd=tmp_path, env=env)
    try:
        # The delayed run is due a few seconds after the script ran.
        await wait_until(lambda: count(sql, "state <> 'succeeded'") == 0, 60, interval=0.2)
    finally:
        worker.send_signal(signal.SIGINT)
        assert worker.wait(30) == 0

    # Importing myapp in the worker enqueued nothing more, and no attempt failed.
    assert count(sql) == enqueued
    assert count(sql, "attempt = 1 AND errors = '[]'") == enqueued
    assert {row[0] for row in sql.execute("SELECT DISTINCT task FROM runs")} == {
        "myapp.send_email",
        "myapp.rebuild_index",
    }


def test_the_transaction_and_result_examples_run_as_written(
    app: Tidegate,
    sql: psycopg.Connection,
    database_url: str,
    start_worker_process: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The examples of "Enqueue in your own transaction" and "Wait for a result", with
    the test's database for the shop's and the test app's ``echo`` for ``send_email``."""
    sql.execute("CREATE TABLE orders (id int PRIMARY KEY, total int)")
    shop = make_conninfo(database_url, options=f"-c search_path={app.settings.schema}")
    transaction = python_block("Enqueue in your own transaction")
    assert '"postgresql://localhost/shop"' in transaction
    exec(
        transaction.replace('"postgresql://localhost/shop"', repr(shop)),
        {"app": app, "send_email": "echo"},
    )
    assert sql.execute("SELECT id, total FROM orders").fetchall() == [(42, 99)]
    Harness(app).assert_enqueued("echo", args={"subject": "order 42"})

    start_worker_process("manual>*:2")
    exec(python_block("Wait for a result"), {"app": app, "send_email": "echo"})
    assert capsys.readouterr().out == "{'to': 'a@example.com', 'subject': 'hi'}\n"


def test_the_testing_example_passes_on_the_quick_starts_app(
    pytester: pytest.Pytester, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "Test your tasks": its pytest.ini and test file, in a project holding the quick
    start's ``myapp.py``, run by pytest (a process of its own) on the test's server."""
    monkeypatch.setenv("TIDEGATE_DATABASE_URL", database_url)
    python, _ = quick_start()
    pytester.makepyfile(myapp=python)
    ini = python_block("Test your tasks", "ini")
    tests = python_block("Test your tasks")
    assert ini.startswith("# pytest.ini\n") and tests.startswith("# test_myapp.py\n")
    pytester.makefile(".ini", pytest=ini)
    pytester.makepyfile(test_myapp=tests)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_the_unique_runs_example_runs_as_written(app: Tidegate, sql: psycopg.Connection) -> None:
    exec(python_block("Unique runs"), {"app": app, "sync_account": "echo"})
    assert count(sql) == 1


def test_the_pause_example_runs_as_written(app: Tidegate, sql: psycopg.Connection) -> None:
    exec(python_block("Pause a lane"), {"app": app, "send_email": "echo"})
    assert sql.execute("SELECT lane, state::text FROM runs").fetchall() == [("emails", "available")]
    assert sql.execute("SELECT count(*) FROM paused_lanes").fetchone() == (0,)
