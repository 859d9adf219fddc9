"""The schema's three sources agree: ``schema.sql``, the migration chain, the function files.

A fresh schema (``schema.sql``) and one migrated from 0001 must be the same, catalog for
catalog; a function file is applied when its text changes and only then, and whatever
no file defines is dropped; the version is checked before work starts.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from importlib import resources
from typing import Any

import psycopg
import pytest
from psycopg import sql as sql_text

from tidegate import SchemaError, Settings, Tidegate
from tidegate.storage import migrate as migrate_module
from tidegate.storage.migrate import (
    Function,
    check_schema,
    functions,
    latest_version,
    migrate,
    migrations,
)
from tidegate.worker.runtime import Worker


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


@pytest.fixture
def other_schema(database_url: str) -> Iterator[str]:
    """A second schema for the test, dropped after it."""
    name = f"test_other_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


CATALOG = {
    "types": """
        SELECT t.typname, t.typtype,
               ARRAY(SELECT e.enumlabel FROM pg_enum e
                     WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder)::text
        FROM pg_type t WHERE t.typnamespace = %(schema)s::regnamespace ORDER BY 1""",
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions::text
        FROM pg_class c WHERE c.relnamespace = %(schema)s::regnamespace ORDER BY 1""",
    # Position, not attnum: a column a migration dropped leaves a gap in attnum.
    "columns": """
        SELECT c.relname, row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
               a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attgenerated, a.attidentity,
               a.attstattarget::integer,
               -- The settings PostgreSQL keeps per column (ALTER COLUMN ... SET).
               ARRAY(SELECT o.option_name || '=' || o.option_value
                     FROM pg_options_to_table(a.attoptions) AS o
                     WHERE o.option_name IN ('n_distinct', 'n_distinct_inherited')
                     ORDER BY 1)::text
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind IN ('r', 'p')
          AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY 1, 2""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %(schema)s ORDER BY 1""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = %(schema)s::regnamespace ORDER BY 1, 2""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger
        WHERE NOT tgisinternal
          AND tgrelid IN (SELECT oid FROM pg_class
                          WHERE relnamespace = %(schema)s::regnamespace)
        ORDER BY 1, 2""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid),
               pg_get_function_result(p.oid), p.prokind,
               CASE WHEN p.prokind = 'a'
                    THEN concat_ws(' ', a.aggtransfn::regproc, a.aggtranstype::regtype,
                                   a.agginitval, a.aggfinalfn::regproc)
                    ELSE pg_get_functiondef(p.oid) END
        FROM pg_proc p LEFT JOIN pg_aggregate a ON a.aggfnoid = p.oid
        WHERE p.pronamespace = %(schema)s::regnamespace ORDER BY 1, 2""",
    "statistics": """
        SELECT stxname, pg_get_statisticsobjdef(oid) FROM pg_statistic_ext
        WHERE stxnamespace = %(schema)s::regnamespace ORDER BY 1""",
}
"""What a schema is, read from the catalogs: each query's rows, in a stable order."""


def catalog(conn: psycopg.Connection, schema: str) -> dict[str, list[Any]]:
    """Describe what a schema holds, with its own name taken out of every definition."""
    with conn.transaction():
        conn.execute(
            sql_text.SQL("SET LOCAL search_path TO {}").format(sql_text.Identifier(schema))
        )
        found = {
            name: conn.execute(query, {"schema": schema}).fetchall()
            for name, query in CATALOG.items()
        }
    own_name = re.compile(rf'(?<![\w"]){re.escape(schema)}\.')
    return {
        name: [
            tuple(own_name.sub("", value) if isinstance(value, str) else value for value in row)
            for row in rows
        ]
        for name, rows in found.items()
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


DEFINITION = re.compile(
    r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|AGGREGATE|PROCEDURE)\s+(\w+)",
    re.IGNORECASE | re.MULTILINE,
)


def test_each_function_is_defined_in_its_own_file_and_nowhere_else() -> None:
    storage = resources.files("tidegate.storage")
    files = sorted(entry.name for entry in storage.joinpath("functions").iterdir())
    assert files == [f"{f.name}.sql" for f in functions()]
    for function in functions():
        assert DEFINITION.findall(function.text) == [function.name], function.name
    elsewhere = [
        storage.joinpath("schema.sql"),
        *storage.joinpath("migrations").iterdir(),
        *storage.joinpath("queries").iterdir(),
    ]
    for entry in elsewhere:
        assert DEFINITION.findall(entry.read_text()) == [], entry.name


def test_a_fresh_schema_is_the_schema_every_migration_makes(
    conn: psycopg.Connection, schema: str, other_schema: str
) -> None:
    versions = [m.version for m in migrations()]
    assert migrate(conn, schema) == versions  # fresh: schema.sql, every version recorded
    fresh = catalog(conn, schema)
    # An empty migrations table: the same schema, made by running every migration.
    conn.execute(
        sql_text.SQL(
            "CREATE SCHEMA {}; CREATE TABLE {}.migrations (LIKE {}.migrations INCLUDING ALL)"
        ).format(
            sql_text.Identifier(other_schema),
            sql_text.Identifier(other_schema),
            sql_text.Identifier(schema),
        )
    )
    assert migrate(conn, other_schema) == versions
    migrated = catalog(conn, other_schema)

    # No triggers: a schema migrated from 0001 must have lost the one it once had.
    assert fresh["indexes"] and fresh["functions"] and fresh["triggers"] == []
    # Each part that differs, with the rows only one of the two schemas has.
    differences = {
        part: sorted(set(rows) ^ set(migrated[part]), key=str)
        for part, rows in fresh.items()
        if rows != migrated[part]
    }
    assert differences == {}


def routines(conn: psycopg.Connection, schema: str) -> dict[str, str]:
    """The schema's functions and aggregates as ``name(arguments)``, each with the
    transaction that last wrote it (its catalog row's xmin)."""
    rows = conn.execute(
        "SELECT proname || '(' || pg_get_function_identity_arguments(oid) || ')', xmin::text"
        " FROM pg_proc WHERE pronamespace = %s::regnamespace",
        [schema],
    )
    return dict(rows.fetchall())


def edited(name: str, old: str, new: str) -> list[Function]:
    """The shipped function files, with ``old`` replaced by ``new`` in ``name``'s."""
    found = []
    for function in functions():
        if function.name == name:
            assert old in function.text
            function = Function(name, function.text.replace(old, new))
        found.append(function)
    return found


def test_a_function_file_is_applied_again_when_its_text_changes_and_only_then(
    conn: psycopg.Connection, schema: str, sql: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate(conn, schema)
    before = routines(conn, schema)
    assert migrate(conn, schema) == []
    assert routines(conn, schema) == before  # nothing changed: nothing applied

    # The default weight of a key with no policy, 1.0 -> 2.0.
    monkeypatch.setattr(migrate_module, "functions", lambda: edited("key_weight", "1.0\n", "2.0\n"))
    with pytest.raises(SchemaError, match=r"lacks this tidegate's functions \(key_weight\)"):
        check_schema(conn, schema)
    assert migrate(conn, schema) == []
    after = routines(conn, schema)
    assert [name for name in before if after[name] != before[name]] == [
        "key_weight(p_lane text, p_key text)"
    ]
    assert sql.execute("SELECT key_weight('default', 'k')").fetchone() == (2.0,)
    check_schema(conn, schema)  # the edited files are the applied ones


def test_a_function_whose_result_type_changes_is_made_anew(
    conn: psycopg.Connection, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate(conn, schema)
    # CREATE OR REPLACE refuses another result type: migrate drops the function first.
    monkeypatch.setattr(
        migrate_module,
        "functions",
        lambda: edited("key_weight", "RETURNS float8", "RETURNS numeric"),
    )
    migrate(conn, schema)
    result = conn.execute(
        "SELECT pg_get_function_result(oid) FROM pg_proc"
        " WHERE pronamespace = %s::regnamespace AND proname = 'key_weight'",
        [schema],
    )
    assert result.fetchall() == [("numeric",)]


def test_migrate_drops_every_function_no_file_defines(
    conn: psycopg.Connection, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate(conn, schema)
    shipped = set(routines(conn, schema))
    conn.execute(
        sql_text.SQL(
            "SET search_path TO {};"
            # an old overload of a function that has a file
            " CREATE FUNCTION key_clock(p_lane text) RETURNS float8"
            "  LANGUAGE sql AS 'SELECT 0::float8';"
            # a function and an aggregate that no file defines
            " CREATE FUNCTION leftover() RETURNS integer LANGUAGE sql AS 'SELECT 1';"
            " CREATE AGGREGATE leftover_sum(bigint[]) (SFUNC = add_buckets, STYPE = bigint[]);"
            # a file's function dropped behind migrate's back
            " DROP FUNCTION lane_frontier(text);"
            " RESET search_path"
        ).format(sql_text.Identifier(schema))
    )
    migrate(conn, schema)
    assert set(routines(conn, schema)) == shipped

    # A file that changes its function's arguments leaves no old overload behind.
    monkeypatch.setattr(
        migrate_module,
        "functions",
        lambda: edited(
            "task_has_worker", "p_live_seconds float8)", "p_live_seconds float8, p_x int = 0)"
        ),
    )
    migrate(conn, schema)
    assert set(routines(conn, schema)) ^ shipped == {
        "task_has_worker(p_lane text, p_task text, p_live_seconds double precision)",
        "task_has_worker(p_lane text, p_task text, p_live_seconds double precision, p_x integer)",
    }


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
