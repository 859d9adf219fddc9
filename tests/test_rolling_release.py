"""A release rolls: the previous release's processes go on against the schema the new
release's ``migrate`` left (docs/deployment.md, "Rolling a release").

The previous release is the code as it was before the last commit that changed
``src/tidegate/storage`` (``git log --first-parent``), extracted with ``git archive``
and run from its own ``src`` in this virtualenv. Its ``migrate`` makes the schema, as a
deployment's was; this code migrates it; then its worker does the runs this code
enqueues, and its API admits a webhook into the runs this code's schema holds. A later
release is played by hand: it adds a column to every table and a table, and changes a
function's arguments by adding one with a default, as the expand rules allow; this
code's worker and API must serve on it. What the schema records of the releases that
migrated it decides who may start (``SchemaRelease.refusal``).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import sql as sql_text

from tests import http_fixtures
from tests.conftest import FAST, ROOT, spawn_worker, stop_worker, wait_until
from tests.http_fixtures import API_SETTINGS, database_env, free_port
from tidegate import NewRun, SchemaError, Settings, Tidegate
from tidegate.projects import create_project, create_trigger
from tidegate.storage.migrate import SERVES_FROM, check_schema, latest_version, migrate

STORAGE = "src/tidegate/storage"
TIDEGATE = (sys.executable, "-m", "tidegate")
START_SECONDS = 60.0
DONE_SECONDS = 90.0

ROLLING_APP = '''
"""The tasks of the previous release's worker, in its own tidegate."""
import tidegate
from tidegate import Tidegate

app = Tidegate()


@app.task(name="where")
def where(**_):
    """Say which tidegate ran the run: the previous release's files, not this one's."""
    return {"tidegate": tidegate.__file__}
'''


def git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=False)


def previous_release() -> str:
    """Return the newest commit (on the first-parent line) whose storage differs from
    the checkout's: the release before the last change to the schema or its statements."""
    if git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("no git history in this checkout: no previous release to roll from")
    listed = git("rev-list", "--first-parent", "HEAD", "--", STORAGE)
    for commit in listed.stdout.decode().split():
        if git("diff", "--quiet", commit, "--", STORAGE).returncode == 1:
            return commit
    pytest.skip("the git history holds no earlier version of src/tidegate/storage")


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The previous release's commit and a folder holding its ``src`` and the app its
    worker loads (``rolling_app:app``)."""
    commit = previous_release()
    folder = tmp_path_factory.mktemp("previous")
    archive = git("archive", "--format=tar", commit, "src")
    assert archive.returncode == 0, archive.stderr.decode()
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    (folder / "rolling_app.py").write_text(ROLLING_APP)
    yield commit, folder


def previous_env(folder: Path, settings: Settings) -> dict[str, str]:
    """The environment of a process of the previous release: its ``src`` first on the
    path (ahead of this checkout's, which the virtualenv's .pth file adds after)."""
    env = {**os.environ, **database_env(settings), "PYTHONPATH": f"{folder / 'src'}:{folder}"}
    for name, value in {**FAST, **API_SETTINGS}.items():
        env[f"TIDEGATE_{name.upper()}"] = str(value)
    return env


def predates_rolling(folder: Path) -> bool:
    """Whether the previous release is older than the rules: it starts only on a schema
    of exactly its own version and functions."""
    return "SERVES_FROM" not in (folder / STORAGE / "migrate.py").read_text()


def states(sql: psycopg.Connection, task: str) -> dict[str, int]:
    rows = sql.execute("SELECT state::text, count(*) FROM runs WHERE task = %s GROUP BY 1", [task])
    return dict(rows.fetchall())


@pytest.fixture
def current(settings: Settings) -> Iterator[Tidegate]:
    """This code's app on the test's schema, not migrated yet."""
    app = Tidegate(settings=settings)
    yield app
    app.close()


async def test_the_previous_release_serves_on_the_schema_this_release_migrated(
    current: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    previous: tuple[str, Path],
    tmp_path: Path,
) -> None:
    """The previous release's migrate makes the schema, as it was before the release;
    this code migrates it; the previous release's worker does the runs this code
    enqueues, and its API admits a webhook this code's trigger takes."""
    commit, folder = previous
    env = previous_env(folder, settings)
    which = subprocess.run(
        [sys.executable, "-c", "import tidegate; print(tidegate.__file__)"],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    )
    assert which.stdout.strip().startswith(str(folder)), which.stdout
    made = subprocess.run(
        [*TIDEGATE, "migrate"], env=env, cwd=folder, capture_output=True, text=True, check=False
    )
    assert made.returncode == 0, made.stdout + made.stderr
    current.migrate()
    app = current
    runs = app.enqueue_many([NewRun("where", {}) for _ in range(20)])
    log = tmp_path / "worker.log"
    with log.open("wb") as output:
        worker = subprocess.Popen(
            [
                *TIDEGATE,
                "worker",
                "--app",
                "rolling_app:app",
                "--workloops",
                "fast_lane:1 manual>*:2",
            ],
            env=env,
            cwd=folder,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    api = None
    try:
        await wait_until(
            lambda: worker.poll() is not None or states(sql, "where").get("succeeded") == 20,
            DONE_SECONDS,
        )
        if worker.poll() is not None:
            said = log.read_text()
            if predates_rolling(folder) and "upgrade tidegate" in said:
                pytest.skip(f"the previous release ({commit[:10]}) predates rolling releases")
            raise AssertionError(f"the previous release's worker exited:\n{said}")
        ran_by = {str(app.result(run.id, timeout=5)["tidegate"]) for run in runs}
        assert ran_by == {str(folder / "src/tidegate/__init__.py")}

        app.execute(create_project("rollers"))
        trigger = app.execute(create_trigger("rollers", "orders", mode="async", task="where"))
        api = start_previous_api(env, folder, tmp_path / "api.log")
        answer = httpx.post(f"{api[1]}/hooks/{trigger['token']}", json={"n": 1}, timeout=30)
        assert answer.status_code == 202, answer.text
        await wait_until(lambda: states(sql, "where").get("succeeded") == 21, DONE_SECONDS)
    finally:
        if api is not None:
            api[0].terminate()
            api[0].wait(30)
        if worker.poll() is None:
            assert stop_worker(worker) == 0, log.read_text()


def start_previous_api(
    env: dict[str, str], folder: Path, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the previous release's ``tidegate serve --role api``; return it and its URL
    once its ``/readyz`` says ready."""
    port = free_port()
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*TIDEGATE, "serve", "--role", "api", "--port", str(port)],
            env=env,
            cwd=folder,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_SECONDS
    while True:
        if process.poll() is not None:
            raise AssertionError(f"the previous release's API exited:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the previous release's API not ready:\n{log.read_text()}")
        time.sleep(0.1)


EXPAND = """
ALTER TABLE {table} ADD COLUMN later_release_note text
"""


def play_a_later_release(conn: psycopg.Connection, schema: str, serves_from: int) -> int:
    """Do to the schema what a later expand release's ``migrate`` may do, record it as
    that release (``serves_from``); return its version.

    Every table gets a column (nullable: this code's inserts leave it out), the schema a
    table, and ``task_has_worker`` a parameter with a default, its old call made by
    this code's statements resolving to the new function.
    """
    later = latest_version() + 1
    with conn.transaction():
        conn.execute(
            sql_text.SQL("SET LOCAL search_path TO {}").format(sql_text.Identifier(schema))
        )
        tables = conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace"
            " AND relkind IN ('r', 'p') AND NOT relispartition"
        ).fetchall()
        for (table,) in tables:
            conn.execute(sql_text.SQL(EXPAND.strip()).format(table=sql_text.Identifier(table)))
        conn.execute("CREATE TABLE later_release_things (id bigint PRIMARY KEY)")
        [(definition,)] = conn.execute(
            "SELECT pg_get_functiondef('task_has_worker'::regproc)"
        ).fetchall()
        assert "p_live_seconds double precision)" in definition
        conn.execute("DROP FUNCTION task_has_worker")
        conn.execute(
            definition.replace(
                "p_live_seconds double precision)",
                "p_live_seconds double precision, p_later integer DEFAULT 0)",
            )
        )
        conn.execute("INSERT INTO migrations (version, name) VALUES (%s, 'later_release')", [later])
        conn.execute(
            "INSERT INTO releases (version, functions, serves_from)"
            " VALUES (%s, 'later release', %s)",
            [later, serves_from],
        )
    return later


async def test_this_release_serves_on_a_schema_a_later_expand_release_migrated(
    app: Tidegate,
    settings: Settings,
    sql: psycopg.Connection,
    start_api,  # type: ignore[no-untyped-def]
) -> None:
    """A worker and an API process of this code start on the later schema, take an
    enqueue, an async and a sync webhook, and say ready."""
    with psycopg.connect(settings.database_url or "", autocommit=True) as conn:
        play_a_later_release(conn, settings.schema, serves_from=latest_version())
        check_schema(conn, settings.schema)
    worker = spawn_worker(settings, "fast_lane:1 manual>*:2")
    try:
        api = start_api()
        async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
            assert (await client.get("/readyz")).status_code == 200
            await http_fixtures.create_project(client, "acme")
            triggers = {
                mode: (
                    await http_fixtures.create_trigger(client, "acme", mode, mode=mode, task="echo")
                )["url"]
                for mode in ("async", "sync")
            }
            # The worker's slots are known to admission once it heartbeats.
            await wait_until(
                lambda: sql.execute("SELECT count(*) FROM workers").fetchone() == (1,), 30
            )
            accepted = await client.post(triggers["async"], json={"n": 1})
            assert accepted.status_code == 202, accepted.text
            answered = await client.post(triggers["sync"], json={"n": 2})
            assert (answered.status_code, answered.json()["body"]) == (200, {"n": 2})
        app.enqueue_many([NewRun("echo", {"n": n}) for n in range(10)])
        await wait_until(lambda: states(sql, "echo") == {"succeeded": 12}, DONE_SECONDS)
    finally:
        assert stop_worker(worker) == 0


def test_a_schema_serves_code_from_its_newest_release_floor_on(
    settings: Settings, sql: psycopg.Connection
) -> None:
    """Older code starts on a newer schema whose floor is at most its version, and not
    on one that contracted past it; a later release of the same version (new functions
    only) serves it too, until this code's migrate puts its own functions back."""
    with psycopg.connect(settings.database_url or "", autocommit=True) as conn:
        migrate(conn, settings.schema)
        assert latest_version() >= SERVES_FROM
        check_schema(conn, settings.schema)
        sql.execute(
            "INSERT INTO releases (version, functions, serves_from) VALUES (%s, 'same, later', %s)",
            [latest_version(), SERVES_FROM],
        )
        check_schema(conn, settings.schema)  # its own release is recorded: served
        sql.execute("DELETE FROM releases WHERE functions <> 'same, later'")
        with pytest.raises(SchemaError, match="lacks this tidegate's functions"):
            check_schema(conn, settings.schema)
        migrate(conn, settings.schema)
        check_schema(conn, settings.schema)
        later = play_a_later_release(conn, settings.schema, serves_from=latest_version())
        check_schema(conn, settings.schema)
        sql.execute("UPDATE releases SET serves_from = %s WHERE version = %s", [later, later])
        with pytest.raises(SchemaError, match=rf"at version {later}, newer than this tidegate"):
            check_schema(conn, settings.schema)
        with pytest.raises(SchemaError, match="upgrade tidegate"):
            migrate(conn, settings.schema)


def test_migrate_forgets_a_later_release_whose_functions_it_replaced(
    settings: Settings, sql: psycopg.Connection
) -> None:
    """The previous release's migrate run after a later one of the same version puts its
    functions back: the later release's code is told to migrate, not served old ones."""
    with psycopg.connect(settings.database_url or "", autocommit=True) as conn:
        migrate(conn, settings.schema)
        sql.execute(
            "INSERT INTO releases (version, functions, serves_from) VALUES (%s, 'later', %s)",
            [latest_version(), SERVES_FROM],
        )
        migrate(conn, settings.schema)
    rows = sql.execute("SELECT functions FROM releases").fetchall()
    assert ("later",) not in rows and len(rows) == 1
