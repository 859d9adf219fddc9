"""The framework examples in examples/ work: each runs its own tests, as their users
would (pytest in the example's folder, tidegate's fixtures from the installed plugin),
on the test's server, the example's tables in a schema of their own.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import psycopg
import pytest
import uvicorn
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlalchemy import URL

from tests.conftest import ROOT, running_worker, wait_until
from tests.http_fixtures import ADMIN_TOKEN, ApiServer, free_port
from tidegate import Settings
from tidegate.testing import bound

EXAMPLES = ROOT / "examples"


@pytest.fixture
def shop(database_url: str) -> Iterator[str]:
    """A libpq URL of the test's server whose ``search_path`` is a schema of the test's
    own, for an example's tables; dropped after."""
    name = f"shop_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    yield make_conninfo(database_url, options=f"-c search_path={name}")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.mark.parametrize(
    "path",
    [
        "sqlalchemy_orders/orders.py",
        "django_shop/orders/tasks.py",
        "fastapi_reports/reports.py",
    ],
)
def test_the_readmes_framework_section_quotes_the_examples_as_they_are(path: str) -> None:
    """Each block of "With SQLAlchemy, Django, FastAPI" is an excerpt of the example it
    names, which the tests below run."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## With SQLAlchemy, Django, FastAPI\n", 1)[1].split("\n## ", 1)[0]
    [block] = [
        code
        for name, code in re.findall(r"\(`examples/(\w+)/`.*?```python\n(.*?)```", section, re.S)
        if path.startswith(name + "/")
    ]
    assert block in (EXAMPLES / path).read_text()


def run_tests(example: Path, database_url: str, **env: str) -> str:
    """Run pytest in ``example`` (its pytest.ini) and return its report; fail on a failure."""
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")},
        "TIDEGATE_DATABASE_URL": database_url,
        "PYTHONDONTWRITEBYTECODE": "1",
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"],
        cwd=example,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_sqlalchemy_example_enqueues_in_the_sessions_transaction(
    database_url: str, shop: str
) -> None:
    url = URL.create("postgresql+psycopg", query=conninfo_to_dict(shop))
    report = run_tests(
        EXAMPLES / "sqlalchemy_orders",
        database_url,
        SHOP_DATABASE_URL=url.render_as_string(hide_password=False),
    )
    assert "2 passed" in report


def test_the_django_example_enqueues_in_its_atomic_block(database_url: str, shop: str) -> None:
    report = run_tests(EXAMPLES / "django_shop", database_url, SHOP_DATABASE_URL=shop)
    assert "2 passed" in report


def load(path: Path) -> ModuleType:
    """Import an example's module from its file, afresh."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def server_sent_events(lines: list[str]) -> list[tuple[str, object]]:
    """The (event, data) pairs of an event stream's lines, comments left out."""
    found, event = [], ""
    for line in lines:
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            found.append((event, json.loads(line.removeprefix("data: "))))
    return found


async def test_the_fastapi_example_enqueues_in_a_request_and_streams_the_runs_progress(
    api: ApiServer, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEGATE_API_URL", api.url)
    monkeypatch.setenv("TIDEGATE_API_TOKEN", ADMIN_TOKEN)
    reports = load(EXAMPLES / "fastapi_reports" / "reports.py")
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(reports.api, port=port, lifespan="off", log_level="warning")
    )
    with bound(reports.tidegate_app, database_url=settings.database_url, schema=settings.schema):
        serving = asyncio.create_task(server.serve())
        try:
            await wait_until(lambda: server.started, 30)
            async with (
                running_worker(reports.tidegate_app, "*:1"),
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client,
            ):
                created = await client.post("/reports", params={"pages": 3})
                assert created.status_code == 202, created.text
                async with client.stream("GET", created.json()["progress"]) as stream:
                    assert stream.status_code == 200
                    assert stream.headers["content-type"].startswith("text/event-stream")
                    events = server_sent_events([line async for line in stream.aiter_lines()])
                missing = await client.get("/reports/999999/progress")
        finally:
            server.should_exit = True
            await serving

    progress = [data["data"] for event, data in events if event == "progress"]  # type: ignore[index]
    assert progress == [{"page": n, "of": 3} for n in (1, 2, 3)]
    [(last, result)] = events[-1:]
    assert last == "result"
    assert result["state"] == "succeeded" and result["result"] == {"pages": 3}  # type: ignore[index]
    assert missing.status_code == 404
