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

A release rolls (docs/deployment.md, "Rolling a release"): its ``migrate`` runs while the
previous release's workers and API processes go on, so a process starts on any schema
that still serves its code, not only on its own. The ``releases`` table records each
release that migrated the schema: its version, the fingerprint of its function files and
``SERVES_FROM``, the oldest version whose code the schema it leaves still serves. Code at
version ``v`` runs on a schema at version ``V`` when ``V > v`` and the newest release's
floor is at most ``v`` (the newer tables and functions promise to serve it), or when
``V == v`` and its own functions' fingerprint is recorded at ``v`` (its functions, or a
later release's of the same version, which serve it as well).

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
from tidegate.storage.sql import query

SERVES_FROM = 36
"""The oldest schema version whose code runs on the schema this code's ``migrate`` leaves.

An expand release (migrations that only add, functions that keep their old calls
working) leaves it; a contract release (a migration that drops, renames or tightens
what the code of a version still uses, a function whose old call no longer works) raises
it past the versions it breaks. Never above this code's own version."""

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


def functions_fingerprint() -> str:
    """Return the sha256 of every shipped function file's name and text: which release's
    functions these are, as the ``releases`` table records them."""
    listing = "".join(f"{f.name} {f.checksum}\n" for f in functions())
    return hashlib.sha256(listing.encode()).hexdigest()


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
            conn.execute(
                "CREATE TABLE IF NOT EXISTS releases ("
                " position bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
                " version integer NOT NULL, functions text NOT NULL,"
                " serves_from integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(),"
                " UNIQUE (version, functions))"
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
        _record_release(conn, schema, shipped[-1].version)
    finally:
        if not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", lock)
    return applied_now


def _record_release(conn: psycopg.Connection, schema: str, version: int) -> None:
    """Record that this code's tables and functions are the schema's now.

    A release recorded after this one (the same version: a newer release that changed
    functions only) is forgotten: its functions were just replaced by these, so the
    schema no longer serves its code until its own ``migrate`` runs again.
    """
    release = {"version": version, "functions": functions_fingerprint()}
    with conn.transaction():
        _use(conn, schema)
        conn.execute(
            "DELETE FROM releases WHERE position >"
            " (SELECT position FROM releases"
            "  WHERE version = %(version)s AND functions = %(functions)s)",
            release,
        )
        conn.execute(
            "INSERT INTO releases (version, functions, serves_from)"
            " VALUES (%(version)s, %(functions)s, %(serves_from)s)"
            " ON CONFLICT (version, functions) DO UPDATE SET serves_from = excluded.serves_from",
            {**release, "serves_from": SERVES_FROM},
        )


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


def _newer(schema: str, have: int, want: int, serves_from: int | None = None) -> str:
    serves = "" if serves_from is None else f" and serves tidegate from version {serves_from} on"
    return (
        f"schema {schema!r} is at version {have}{serves}, newer than this tidegate ({want}): "
        "upgrade tidegate"
    )


@dataclass(frozen=True)
class SchemaRelease:
    """What a schema says of the code it serves (``queries/read_schema_release.sql``)."""

    version: int
    """Its applied version, 0 when it has none."""
    serves_from: int
    """The oldest version whose code it serves: its newest release's ``SERVES_FROM``, or
    ``version`` itself where that release recorded none (code older than the records)."""
    served: bool
    """Whether this code's release (its version and functions) is recorded."""

    def refusal(self, schema: str, want: int) -> str | None:
        """Return why code at version ``want`` must not run on this schema, or None.

        The one rule that ``check_schema`` (at a process's start) and ``/readyz`` apply.
        """
        have = self.version
        if have < want:
            return (
                f"schema {schema!r} is at version {have}, this tidegate needs {want}: "
                "run `tidegate migrate`"
            )
        if self.serves_from > want:  # never its own version: SERVES_FROM is at most it
            # A floor at the schema's own version is said as before: newer, and no more.
            floor = self.serves_from if self.serves_from < have else None
            return _newer(schema, have, want, floor)
        if have == want and not self.served:
            return f"schema {schema!r} lacks this tidegate's functions: run `tidegate migrate`"
        return None


def read_schema_release(conn: psycopg.Connection, schema: str) -> SchemaRelease:
    """Read what the schema serves, for this code's functions.

    A schema that no release recorded (unmigrated, or migrated by code older than the
    ``releases`` table) serves only its own version's code, and this code's functions
    are not known to be there.
    """
    have = schema_version(conn, schema)
    if not _has_table(conn, schema, "releases"):
        return SchemaRelease(have, have, False)
    with conn.transaction():
        _use(conn, schema)
        row = conn.execute(
            query("read_schema_release"),
            {"version": latest_version(), "functions": functions_fingerprint()},
        ).fetchone()
    assert row is not None  # aggregates: always one row
    return SchemaRelease(*row)


def check_schema(conn: psycopg.Connection, schema: str) -> None:
    """Raise ``SchemaError`` unless the schema serves this code (``SchemaRelease``).

    A release may change a function and no table: its functions' fingerprint is checked
    too, so that a process never starts on another release's functions, unless that
    release is a later one that serves it.
    """
    want = latest_version()
    release = read_schema_release(conn, schema)
    refusal = release.refusal(schema, want)
    if refusal is None:
        return
    if release.version == want and release.serves_from <= want:
        applied: dict[str, str] = {}
        if _has_table(conn, schema, "functions"):
            query_text = sql.SQL("SELECT name, checksum FROM {}.functions").format(
                sql.Identifier(schema)
            )
            applied = dict(conn.execute(query_text).fetchall())
        differ = [f.name for f in functions() if applied.get(f.name) != f.checksum]
        if differ:
            refusal = (
                f"schema {schema!r} lacks this tidegate's functions ({', '.join(differ)}): "
                "run `tidegate migrate`"
            )
    raise SchemaError(refusal)
