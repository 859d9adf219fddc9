"""The migration chain: numbered without gaps, idempotent, and checked before work starts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from importlib import resources
from typing import Any

import psycopg
import pytest

from tidegate import SchemaError, Settings, Tidegate
from tidegate.storage.migrate import check_schema, latest_version, migrate, migrations
from tidegate.worker.runtime import Worker


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


def catalog(conn: psycopg.Connection, schema: str) -> dict[str, list[Any]]:
    """Describe what a schema holds: tables and columns, indexes, constraints, types."""
    queries = {
        "columns": "SELECT table_name, column_name, data_type, is_nullable, column_default"
        " FROM information_schema.columns WHERE table_schema = %(schema)s ORDER BY 1, 2",
        "indexes": "SELECT indexname, indexdef FROM pg_indexes"
        " WHERE schemaname = %(schema)s ORDER BY 1",
        "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)"
        " FROM pg_constraint WHERE connamespace = %(schema)s::regnamespace ORDER BY 1, 2",
        "types": "SELECT typname FROM pg_type"
        " WHERE typnamespace = %(schema)s::regnamespace ORDER BY 1",
        "functions": "SELECT proname, pg_get_function_identity_arguments(oid) FROM pg_proc"
        " WHERE pronamespace = %(schema)s::regnamespace ORDER BY 1, 2",
    }
    return {
        name: conn.execute(text, {"schema": schema}).fetchall() for name, text in queries.items()
    }


def test_migration_files_are_numbered_from_0001_without_gaps() -> None:
    directory = resources.files("tidegate.storage").joinpath("migrations")
    files = sorted(entry.name for entry in directory.iterdir() if entry.name.endswith(".sql"))
    found = migrations()
    # Every .sql file is a migration: a misnamed one would be skipped without a word.
    assert [f"{m.version:04d}_{m.name}.sql" for m in found] == files
    assert [m.version for m in found] == list(range(1, len(found) + 1))
    assert latest_version() == len(found)
    assert all(m.text.strip() for m in found)


def test_applying_migrations_twice_changes_nothing_the_second_time(
    conn: psycopg.Connection, schema: str
) -> None:
    versions = [m.version for m in migrations()]
    assert migrate(conn, schema) == versions
    first = catalog(conn, schema)
    assert first["columns"] and first["indexes"]

    assert migrate(conn, schema) == []
    assert catalog(conn, schema) == first
    rows = conn.execute(
        f'SELECT version, count(*) FROM "{schema}".migrations GROUP BY version ORDER BY 1'
    ).fetchall()
    assert rows == [(version, 1) for version in versions]
    check_schema(conn, schema)  # up to date: no complaint


def test_unmigrated_schema_is_refused_with_a_hint_to_migrate(
    conn: psycopg.Connection, schema: str
) -> None:
    with pytest.raises(SchemaError, match=r"at version 0.*run `tidegate migrate`"):
        check_schema(conn, schema)


def test_schema_missing_its_last_migration_is_refused_with_a_hint_to_migrate(
    conn: psycopg.Connection, schema: str
) -> None:
    migrate(conn, schema)
    last = latest_version()
    conn.execute(f'DELETE FROM "{schema}".migrations WHERE version = %s', [last])
    with pytest.raises(SchemaError, match=rf"at version {last - 1}.*run `tidegate migrate`"):
        check_schema(conn, schema)


def test_schema_newer_than_the_code_is_refused_with_a_hint_to_upgrade(
    conn: psycopg.Connection, schema: str
) -> None:
    migrate(conn, schema)
    ahead = latest_version() + 1
    conn.execute(
        f"INSERT INTO \"{schema}\".migrations (version, name) VALUES (%s, 'from_the_future')",
        [ahead],
    )
    with pytest.raises(SchemaError, match=rf"at version {ahead}.*upgrade tidegate"):
        check_schema(conn, schema)


async def test_worker_refuses_to_start_on_an_unmigrated_schema(settings: Settings) -> None:
    app = Tidegate(settings=settings)
    try:
        worker = Worker(app, settings)
        with pytest.raises(SchemaError, match="run `tidegate migrate`"):
            await worker.run(asyncio.Event())
    finally:
        app.close()
