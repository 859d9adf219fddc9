"""tidegate's pytest plugin: the fixtures of ``tidegate.testing``, which pytest loads (a
``pytest11`` entry point) wherever tidegate is installed.

- ``tidegate_database_url`` (session): ``TIDEGATE_DATABASE_URL``, or else an embedded
  PostgreSQL started for the session in a temporary folder of its own;
- ``tidegate_schema``: a schema name of the test's own, dropped after it;
- ``tidegate_app``: the application's ``Tidegate`` bound to that schema, migrated: the
  object the ini option ``tidegate_app = myapp:app`` names (the code under test enqueues
  through it, as in production), or a new ``Tidegate()`` without it;
- ``tidegate_harness``: a ``tidegate.testing.Harness`` on that app.

It stands outside the ``tidegate`` package and imports tidegate only in its fixtures: a
test session that asks for none of them neither connects to anything nor pays for
importing tidegate (its app, worker, psycopg and FastAPI: 0.4 to 1.5 s, as loaded as
the machine is).
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tidegate import Tidegate
    from tidegate.testing import Harness


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "tidegate_app",
        "the application's Tidegate (module:attribute) that the tidegate_app fixture "
        "binds to each test's own schema; without it, a new Tidegate()",
    )


@pytest.fixture(scope="session")
def tidegate_database_url() -> str:
    """``TIDEGATE_DATABASE_URL``, or an embedded PostgreSQL started for the session.

    The embedded server's folder is a temporary one of its own, not pytest's: as root,
    the server runs as an unprivileged user, and every pytest session that starts (a
    second one beside this, or one a test runs) makes pytest's folders private to root
    again; the server, reaching a file by its full path (a checkpoint's), would then stop
    with "Permission denied". The folder is removed at exit, after the server stops
    (atexit runs the last registered first: the server's stop was registered later).
    """
    url = os.environ.get("TIDEGATE_DATABASE_URL")
    if url:
        return url
    from tidegate.storage.embedded import start_embedded

    folder = tempfile.mkdtemp(prefix="tidegate-pytest-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return start_embedded(Path(folder))


@pytest.fixture
def tidegate_schema(tidegate_database_url: str) -> Iterator[str]:
    """A schema of the test's own (not made here: migrating makes it), dropped after."""
    import psycopg
    from psycopg import sql

    name = f"test_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(tidegate_database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def tidegate_app(
    request: pytest.FixtureRequest, tidegate_database_url: str, tidegate_schema: str
) -> Iterator[Tidegate]:
    """The application's ``Tidegate`` (ini ``tidegate_app``) or a new one, bound to the
    test's schema and migrated; put back as it was after the test."""
    from tidegate import Tidegate
    from tidegate.testing import bound

    spec = request.config.getini("tidegate_app")
    app = _load(spec) if spec else Tidegate(tidegate_database_url, schema=tidegate_schema)
    with bound(app, database_url=tidegate_database_url, schema=tidegate_schema):
        app.migrate()
        yield app


@pytest.fixture
def tidegate_harness(tidegate_app: Tidegate) -> Harness:
    from tidegate.testing import Harness

    return Harness(tidegate_app)


def _load(spec: str) -> Tidegate:
    from tidegate import ConfigError, Tidegate

    module_name, _, attribute = spec.partition(":")
    try:
        app = getattr(importlib.import_module(module_name), attribute or "app")
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"ini tidegate_app = {spec!r}: {error}") from None
    if not isinstance(app, Tidegate):
        raise ConfigError(f"ini tidegate_app = {spec!r} is a {type(app).__name__}, not a Tidegate")
    return app
