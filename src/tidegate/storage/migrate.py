"""Bring a schema up to date: its tables by migrations, its functions from their files.

Three kinds of file, all package data:

- ``schema.sql``: today's types, tables, indexes and statistics, with why each exists:
  what a fresh schema is made of, and what to read to learn the tables.
- ``migrations/NNNN_name.sql``: forward-only changes to tables (and the data moves they
  need), numbered. A change to a table is a new migration and the same change in
  ``schema.sql``; ``test_migrations`` checks that a fresh schema and a migrated one agree.
- ``functions/<name>.sql``: one stored function each, as ``CREATE OR REPLACE``: the live
  definition, edited in place (an aggregate, or a trigger function with its trigger).

``migrate`` holds a session-level advisory lock on the schema's name throughout, so two
processes migrating at once do the work once: the second waits, then finds it done.

1. Tables. A schema without a ``migrations`` table is fresh: ``schema.sql`` runs and every
   shipped migration is recorded as applied, in one transaction. Otherwise the missing
   migrations run in order, each in its own transaction, so a later one can use what an
   earlier one added (a value added to an enum cannot be used in the transaction that
   added it). Migrations run before the functions are applied (a schema migrated from
   nothing has none yet), so a migration never calls one: a data move is plain SQL.
2. Functions. Each file whose text differs from the one last applied (its sha256, kept in
   the ``functions`` table with the routines it made), or whose routines are missing, is
   applied in its own transaction, in name order: an aggregate's file must sort after its
   state function's (``add_buckets``, ``sum_buckets``).
3. Stale routines. Every function or aggregate of the schema that no file made is
   dropped: one whose file is gone, and the old overload a file leaves when it changes
   its arguments (``CREATE OR REPLACE`` with other arguments makes a second function).
   The schema ends with exactly the files' functions.

A change ``CREATE OR REPLACE`` refuses (another result type, a renamed parameter): the
file's functions of that name are dropped and the file applied again, in one transaction.
A drop that something else depends on still fails (the state function under an aggregate,
a table's row type a function takes): such a change needs a migration that drops the
dependent (``DROP ... IF EXISTS``: a schema migrated from nothing never had it); its
file, if it has one, is applied again because its routine is missing.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg import sql

from tidegate.errors import SchemaError

_FILE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
_FUNCTION_FILE = re.compile(r"([a-z0-9_]+)\.sql")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str


@dataclass(frozen=True)
class Function:
    """A file of ``functions/``: one stored function (or aggregate), named as the file."""

    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def migrations() -> list[Migration]:
    """Return every shipped migration, in version order."""
    found = []
    for entry in resources.files("tidegate.storage").joinpath("migrations").iterdir():
        match = _FILE.fullmatch(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    return sorted(found, key=lambda m: m.version)


def functions() -> list[Function]:
    """Return every shipped function file, in name order (the order they are applied)."""
    found = []
    for entry in resources.files("tidegate.storage").joinpath("functions").iterdir():
        match = _FUNCTION_FILE.fullmatch(entry.name)
        if match:
            found.append(Function(match[1], entry.read_text()))
    return sorted(found, key=lambda f: f.name)


def schema_text() -> str:
    """Return ``schema.sql``: today's tables, for a fresh schema."""
    return resources.files("tidegate.storage").joinpath("schema.sql").read_text()


def latest_version() -> int:
    return migrations()[-1].version


def migrate(conn: psycopg.Connection, schema: str) -> list[int]:
    """Bring the schema's tables and functions up to date; return the versions applied.

    A fresh schema gets ``schema.sql``, and every version counts as applied. ``conn``
    must be in autocommit mode: each step commits on its own. Raise ``SchemaError`` for a
    schema newer than this code, whose functions it must not put back to older ones.
    """
    shipped = migrations()
    applied_now = []
    lock = [f"tidegate.migrate.{schema}"]
    conn.execute("SELECT pg_advisory_lock(hashtext(%s))", lock)
    try:
        fresh = not _has_table(conn, schema, "migrations")
        with conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            _use(conn, schema)
            conn.execute(
                "CREATE TABLE IF NOT EXISTS migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS functions ("
                " name text PRIMARY KEY, checksum text NOT NULL, routines text[] NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            if fresh:
                conn.execute(schema_text().encode())
                for migration in shipped:
                    _record_migration(conn, migration)
                applied_now = [migration.version for migration in shipped]
        have = schema_version(conn, schema)
        if have > shipped[-1].version:
            raise SchemaError(_newer(schema, have, shipped[-1].version))
        done = set(_applied(conn, schema))
        for migration in shipped:
            if migration.version in done:
                continue
            with conn.transaction():
                _use(conn, schema)
                conn.execute(migration.text.encode())
                _record_migration(conn, migration)
            applied_now.append(migration.version)
        _apply_functions(conn, schema)
    finally:
        if not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", lock)
    return applied_now


def _use(conn: psycopg.Connection, schema: str) -> None:
    """Point this transaction's unqualified names at the schema."""
    conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))


def _has_table(conn: psycopg.Connection, schema: str, table: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [f"{schema}.{table}"]).fetchone()
    return bool(row and row[0])


def _record_migration(conn: psycopg.Connection, migration: Migration) -> None:
    conn.execute(
        "INSERT INTO migrations (version, name) VALUES (%s, %s)",
        [migration.version, migration.name],
    )


def _applied(conn: psycopg.Connection, schema: str) -> list[int]:
    query = sql.SQL("SELECT version FROM {}.migrations").format(sql.Identifier(schema))
    return [row[0] for row in conn.execute(query)]


_ROUTINES = """
SELECT p.oid::regprocedure::text AS routine, p.proname, p.prokind = 'a' AS aggregate
FROM pg_proc p
WHERE p.pronamespace = current_schema()::regnamespace
  AND NOT EXISTS (  -- an extension's functions are the extension's
      SELECT 1 FROM pg_depend d
      WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
"""
"""The schema's routines (functions, aggregates, procedures), each as ``name(argument
types)``: read with ``search_path`` set to the schema, the names are unqualified."""


def _routines(conn: psycopg.Connection) -> list[tuple[str, str, bool]]:
    return conn.execute(_ROUTINES).fetchall()


def _drop(conn: psycopg.Connection, routine: str) -> None:
    # ``routine`` is PostgreSQL's own text of a regprocedure: quoted where it needs to be.
    conn.execute(sql.SQL("DROP ROUTINE {}").format(sql.SQL(routine)))


def _apply_functions(conn: psycopg.Connection, schema: str) -> None:
    """Apply the function files that changed or whose routines are gone; drop the rest."""
    shipped = functions()
    with conn.transaction():
        _use(conn, schema)
        present = {routine for routine, _, _ in _routines(conn)}
        recorded = {
            name: (checksum, set(routines))
            for name, checksum, routines in conn.execute(
                "SELECT name, checksum, routines FROM functions"
            )
        }
    for function in shipped:
        checksum, routines = recorded.get(function.name, ("", set()))
        if checksum != function.checksum or not routines <= present:
            _apply_function(conn, schema, function)
    with conn.transaction():
        _use(conn, schema)
        conn.execute("DELETE FROM functions WHERE name <> ALL(%s)", [[f.name for f in shipped]])
        made = conn.execute("SELECT routines FROM functions")
        kept = {routine for (routines,) in made for routine in routines}
        # Aggregates first: they depend on their state functions.
        for routine, _, _ in sorted(_routines(conn), key=lambda r: (not r[2], r[0])):
            if routine not in kept:
                _drop(conn, routine)


def _apply_function(conn: psycopg.Connection, schema: str, function: Function) -> None:
    """Run a function's file and record what it made, in one transaction."""
    try:
        with conn.transaction():
            _use(conn, schema)
            conn.execute(function.text.encode())
            _record_function(conn, function)
    except psycopg.errors.InvalidFunctionDefinition:
        # CREATE OR REPLACE cannot change a function's result type or its parameters'
        # names: the name now means the file's function, whatever it was before.
        with conn.transaction():
            _use(conn, schema)
            for routine, name, _ in _routines(conn):
                if name == function.name:
                    _drop(conn, routine)
            conn.execute(function.text.encode())
            _record_function(conn, function)


def _record_function(conn: psycopg.Connection, function: Function) -> None:
    """Record the file's text and the routines this transaction created or replaced."""
    conn.execute(
        "INSERT INTO functions (name, checksum, routines)"
        " SELECT %(name)s, %(checksum)s, ARRAY("
        "   SELECT oid::regprocedure::text FROM pg_proc"
        "   WHERE pronamespace = current_schema()::regnamespace"
        "     AND xmin = pg_current_xact_id()::xid ORDER BY 1)"
        " ON CONFLICT (name) DO UPDATE"
        " SET checksum = excluded.checksum, routines = excluded.routines, applied_at = now()",
        {"name": function.name, "checksum": function.checksum},
    )


def schema_version(conn: psycopg.Connection, schema: str) -> int:
    """Return the schema's applied version, 0 when it has none."""
    if not _has_table(conn, schema, "migrations"):
        return 0
    row = conn.execute(
        sql.SQL("SELECT coalesce(max(version), 0) FROM {}.migrations").format(
            sql.Identifier(schema)
        )
    ).fetchone()
    return int(row[0]) if row else 0


def _newer(schema: str, have: int, want: int) -> str:
    return (
        f"schema {schema!r} is at version {have}, newer than this tidegate ({want}): "
        "upgrade tidegate"
    )


def check_schema(conn: psycopg.Connection, schema: str) -> None:
    """Raise ``SchemaError`` unless the schema is at this code's version with its functions.

    A release may change a function and no table: its files' text is checked too, so that
    a process never starts on the functions of another release.
    """
    have, want = schema_version(conn, schema), latest_version()
    if have < want:
        raise SchemaError(
            f"schema {schema!r} is at version {have}, this tidegate needs {want}: "
            "run `tidegate migrate`"
        )
    if have > want:
        raise SchemaError(_newer(schema, have, want))
    applied: dict[str, str] = {}
    if _has_table(conn, schema, "functions"):
        query = sql.SQL("SELECT name, checksum FROM {}.functions").format(sql.Identifier(schema))
        applied = dict(conn.execute(query).fetchall())
    differ = [f.name for f in functions() if applied.get(f.name) != f.checksum]
    if differ:
        raise SchemaError(
            f"schema {schema!r} lacks this tidegate's functions ({', '.join(differ)}): "
            "run `tidegate migrate`"
        )
