"""Where the database is, said plainly: a process on the embedded server says so in one
line, a deployment can make a missing URL an error, and the library's errors for a
database that cannot be reached or is not migrated are the CLI's one-liners.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import clean_environment, tidegate
from tidegate import ConfigError, SchemaError, Settings, Tidegate
from tidegate.errors import UnavailableError
from tidegate.storage.migrate import latest_version

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/postgres"
REFUSED = "cannot reach PostgreSQL at 127.0.0.1:1: connection refused"

SCRIPT = """
from tidegate import Tidegate

app = Tidegate()
app.enqueue("send_email", {"to": "a@example.com"})
app.enqueue("send_email", {"to": "b@example.com"})
print(len(app.list_runs()))
"""
"""``python myapp.py``: two enqueues, then a read."""


def python(script: str, cwd: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` as ``python myapp.py`` in ``cwd``. Its output goes to files, not
    pipes: an embedded server it starts inherits them, and a pipe it held open would keep
    the test waiting after the script had ended."""
    (cwd / "myapp.py").write_text(script)
    with (cwd / "out").open("w+") as out, (cwd / "err").open("w+") as err:
        done = subprocess.run(
            [sys.executable, "myapp.py"],
            cwd=cwd,
            env=clean_environment(**variables),
            stdout=out,
            stderr=err,
            timeout=120,
        )
    output, errors = (cwd / "out").read_text(), (cwd / "err").read_text()
    return subprocess.CompletedProcess(done.args, done.returncode, output, errors)


def test_a_process_on_the_embedded_server_says_so_once_with_its_folder(tmp_path: Path) -> None:
    done = python(SCRIPT, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "2\n"
    folder = (tmp_path / ".tidegate").resolve()
    said = [line for line in done.stderr.splitlines() if "embedded" in line]
    assert said == [
        f"using the embedded PostgreSQL in {folder}, as no database URL is set: for a "
        "deployment, set TIDEGATE_DATABASE_URL, and TIDEGATE_REQUIRE_DATABASE_URL=1 to make "
        "its absence an error"
    ]


def test_require_database_url_makes_a_missing_url_an_error(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = (
        "no database URL: set TIDEGATE_DATABASE_URL (require_database_url is on, so the "
        "embedded PostgreSQL is not started)"
    )
    with pytest.raises(ConfigError) as refused:
        Settings(require_database_url=True)
    assert str(refused.value) == message
    assert Settings(database_url=database_url, require_database_url=True).database_url

    done = python(SCRIPT, tmp_path, TIDEGATE_REQUIRE_DATABASE_URL="1")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == f"tidegate.errors.ConfigError: {message}"
    assert not (tmp_path / ".tidegate").exists()  # no server was made

    for option, env in [
        ((), {"TIDEGATE_REQUIRE_DATABASE_URL": "1"}),
        (("--require-database-url", "true"), {}),
    ]:
        command, _ = tidegate(*option, "worker", "--app", "myapp:app", env=clean_environment(**env))
        assert command.returncode == 2
        assert command.stderr.splitlines()[-1] == f"Error: {message}"


def test_python_myapp_on_an_unreachable_database_fails_in_one_line(tmp_path: Path) -> None:
    done = python(SCRIPT, tmp_path, TIDEGATE_DATABASE_URL=UNREACHABLE)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == f"tidegate.errors.UnavailableError: {REFUSED}"
    assert "psycopg" not in done.stderr  # no chained traceback of the driver's


def test_every_front_door_call_on_an_unreachable_database_is_the_one_line() -> None:
    app = Tidegate(UNREACHABLE)
    calls = {
        "enqueue": lambda: app.enqueue("x"),
        "get_run": lambda: app.get_run(1),
        "result": lambda: app.result(1, timeout=0),
        "migrate": app.migrate,
        "aenqueue": lambda: asyncio.run(app.aenqueue("x")),
        "aresult": lambda: asyncio.run(app.aresult(1, timeout=0)),
    }
    for name, call in calls.items():
        with pytest.raises(UnavailableError) as failed:
            call()
        assert (name, str(failed.value)) == (name, REFUSED)
        assert failed.value.__suppress_context__ and failed.value.__cause__ is None


def test_every_front_door_call_on_an_unmigrated_schema_says_to_migrate(
    database_url: str, schema: str
) -> None:
    app = Tidegate(database_url, schema=schema)  # never migrated
    calls = {
        "enqueue": lambda: app.enqueue("x"),
        "get_run": lambda: app.get_run(1),
        "result": lambda: app.result(1, timeout=0),
        "aenqueue": lambda: asyncio.run(app.aenqueue("x")),
        "aresult": lambda: asyncio.run(app.aresult(1, timeout=0)),
    }
    line = (
        f"schema '{schema}' is at version 0, this tidegate needs {latest_version()}: "
        "run `tidegate migrate`"
    )
    try:
        for name, call in calls.items():
            with pytest.raises(SchemaError) as failed:
                call()
            assert (name, str(failed.value)) == (name, line)
            assert failed.value.__suppress_context__ and failed.value.__cause__ is None
    finally:
        app.close()
