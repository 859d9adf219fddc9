"""Load the SQL statements shipped as package data (one statement per ``.sql`` file).

Statements name their parameters (``%(demand)s``) and cast them; the schema is never
formatted into them: every connection sets ``search_path`` to tidegate's schema.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, TypeVar

import psycopg
from psycopg.rows import RowFactory, tuple_row

T = TypeVar("T")


@cache
def query(name: str) -> str:
    """Return the text of ``queries/<name>.sql``."""
    return resources.files("tidegate.storage").joinpath("queries", f"{name}.sql").read_text()


@dataclass(frozen=True)
class Statement:
    """One named statement to run, with its parameters and how to build its rows."""

    name: str
    params: Mapping[str, Any]
    rows: RowFactory[Any] = tuple_row


Steps = Generator[Statement, list[Any], T]
"""An operation written once, as the statements it needs and what it makes of their rows.

A driver runs it on a sync or an async connection, so the library needs no second copy
of any operation for asyncio.
"""


def in_schema(schema: str, steps: Steps[T]) -> Steps[T]:
    """``steps`` on a connection that is not tidegate's (the application's own, in its
    transaction): tidegate's schema is the transaction's ``search_path`` while they run,
    and the connection's own is put back after, for the statements that follow them."""
    [(search_path, _)] = yield Statement("enter_schema", {"schema": schema})
    result = yield from steps
    yield Statement("restore_search_path", {"search_path": search_path})
    return result


def drive(conn: psycopg.Connection, steps: Steps[T]) -> T:
    """Run ``steps`` on a sync connection."""
    try:
        statement = next(steps)
        while True:
            cursor = conn.cursor(row_factory=statement.rows)
            statement = steps.send(
                cursor.execute(query(statement.name), statement.params).fetchall()
            )
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def adrive(conn: psycopg.AsyncConnection, steps: Steps[T]) -> T:
    """Run ``steps`` on an async connection."""
    try:
        statement = next(steps)
        while True:
            cursor = conn.cursor(row_factory=statement.rows)
            await cursor.execute(query(statement.name), statement.params)
            statement = steps.send(await cursor.fetchall())
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
