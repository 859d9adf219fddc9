"""Forward-only schema migrations.

Migrations are the numbered files ``migrations/NNNN_name.sql``. ``migrate`` applies the
missing ones in order, each in its own transaction, under a session-level advisory lock
on the schema's name, so two processes migrating at once apply each file exactly once:
the second waits, then finds nothing left to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg import sql

from tidegate.errors import SchemaError

_FILE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str


def migrations() -> list[Migration]:
    """Return every shipped migration, in version order."""
    found = []
    for entry in resources.files("tidegate.storage").joinpath("migrations").iterdir():
        match = _FILE.fullmatch(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    return sorted(found, key=lambda m: m.version)


def latest_version() -> int:
    return migrations()[-1].version


def migrate(conn: psycopg.Connection, schema: str) -> list[int]:
    """Apply the migrations this schema lacks; return the versions applied.

    ``conn`` must be in autocommit mode: each migration commits on its own, so a later
    one can use what an earlier one added (a value added to an enum type cannot be used
    in the transaction that added it). A session-level advisory lock on the schema's
    name is held throughout, so two processes migrating at once apply each file exactly
    once: the second waits, then finds nothing left to do.
    """
    applied_now = []
    lock = [f"tidegate.migrate.{schema}"]
    conn.execute("SELECT pg_advisory_lock(hashtext(%s))", lock)
    try:
        with conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {}.migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                ).format(sql.Identifier(schema))
            )
        done = set(_applied(conn, schema))
        for migration in migrations():
            if migration.version in done:
                continue
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
                conn.execute(migration.text.encode())
                conn.execute(
                    "INSERT INTO migrations (version, name) VALUES (%s, %s)",
                    [migration.version, migration.name],
                )
            applied_now.append(migration.version)
    finally:
        if not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", lock)
    return applied_now


def _applied(conn: psycopg.Connection, schema: str) -> list[int]:
    query = sql.SQL("SELECT version FROM {}.migrations").format(sql.Identifier(schema))
    return [row[0] for row in conn.execute(query)]


def schema_version(conn: psycopg.Connection, schema: str) -> int:
    """Return the schema's applied version, 0 when it has none."""
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [f"{schema}.migrations"]).fetchone()
    if not exists or not exists[0]:
        return 0
    row = conn.execute(
        sql.SQL("SELECT coalesce(max(version), 0) FROM {}.migrations").format(
            sql.Identifier(schema)
        )
    ).fetchone()
    return int(row[0]) if row else 0


def check_schema(conn: psycopg.Connection, schema: str) -> None:
    """Raise ``SchemaError`` unless the schema is at this code's version."""
    have, want = schema_version(conn, schema), latest_version()
    if have < want:
        raise SchemaError(
            f"schema {schema!r} is at version {have}, this tidegate needs {want}: "
            "run `tidegate migrate`"
        )
    if have > want:
        raise SchemaError(
            f"schema {schema!r} is at version {have}, newer than this tidegate ({want}): "
            "upgrade tidegate"
        )
