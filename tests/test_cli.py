"""The ``tidegate`` command against a real database: options, environment, errors."""

from __future__ import annotations

import json

import psycopg
import pytest
from click.testing import CliRunner

from tidegate import Settings
from tidegate.cli import main
from tidegate.storage.migrate import latest_version, migrations


@pytest.fixture
def env(settings: Settings) -> dict[str, str]:
    return {
        "TIDEGATE_DATABASE_URL": settings.database_url or "",
        "TIDEGATE_SCHEMA": settings.schema,
    }


def invoke(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.output


def test_migrate_then_enqueue_then_list_and_show(env: dict[str, str]) -> None:
    code, out = invoke(env, "migrate")
    versions = ", ".join(str(m.version) for m in migrations())
    assert code == 0 and f"at version {latest_version()} (applied {versions})" in out
    code, out = invoke(env, "migrate")
    assert code == 0 and "up to date" in out
    code, out = invoke(
        env, "enqueue", "echo", "--args", '{"a": 1}', "--lane", "manual", "--priority", "3"
    )
    assert code == 0, out
    run = json.loads(out)
    assert (run["task"], run["lane"], run["priority"], run["args"]) == (
        "echo",
        "manual",
        3,
        {"a": 1},
    )
    code, out = invoke(env, "enqueue", "echo")
    assert code == 0 and json.loads(out)["lane"] == "manual"  # a run started by hand
    code, out = invoke(env, "runs", "--state", "available")
    assert code == 0 and "echo" in out and "manual" in out
    code, out = invoke(env, "runs", str(run["id"]))
    assert code == 0 and json.loads(out)["id"] == run["id"]
    code, out = invoke(env, "runs", "999999")
    assert code == 1 and "no run 999999" in out


def test_bad_input_is_a_usage_error_that_stores_nothing(
    env: dict[str, str], sql: psycopg.Connection
) -> None:
    invoke(env, "migrate")
    assert invoke(env, "enqueue", "echo", "--args", "{nope")[0] == 2
    code, out = invoke(env, "enqueue", "echo", "--args", "[1, 2]")
    assert code == 2 and "JSON object" in out
    code, out = invoke(env, "enqueue", "echo", "--lane", "bad lane")
    assert code == 2 and "lane name" in out
    assert sql.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_bad_workloop_spec_fails_at_start_naming_the_bad_part(env: dict[str, str]) -> None:
    code, out = invoke(env, "worker", "--app", "tests.apps:app", "--workloops", "fast_lane:1 *>x:2")
    assert code == 2 and "'*>x:2'" in out
    code, out = invoke(
        {**env, "TIDEGATE_WORKLOOPS": "manual:0"}, "worker", "--app", "tests.apps:app"
    )
    assert code == 2 and "slots" in out


def test_worker_refuses_an_unmigrated_schema(env: dict[str, str]) -> None:
    code, out = invoke(env, "worker", "--app", "tests.apps:app")
    assert code == 1 and "tidegate migrate" in out


def test_db_reports_server_and_schema_version(env: dict[str, str]) -> None:
    invoke(env, "migrate")
    code, out = invoke(env, "db")
    assert code == 0
    info = json.loads(out)
    assert info["schema_version"] == info["code_version"] == latest_version()


def test_demo_works_off_every_run(env: dict[str, str]) -> None:
    code, out = invoke(env, "demo", "--runs", "40")
    assert code == 0, out
    assert "all 40 runs finished" in out
    assert "discarded" not in out
