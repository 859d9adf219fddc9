"""Connections to tidegate's database.

``Database`` resolves where the database is (the URL from settings, or the embedded
server, started on first use) and hands out pools whose connections all have
``search_path`` set to tidegate's schema, so statements never format the schema in, and
the time zone set to UTC: timestamps read back as UTC whatever the server's ``TimeZone``
(psycopg reads them several times faster with ``timezone.utc`` than with a ``ZoneInfo``,
``Etc/UTC`` included: 0.9 µs per value, four per claimed run).

A connection attempt gives up after ``CONNECT_TIMEOUT_SECONDS`` unless the URL's
``connect_timeout`` or ``PGCONNECT_TIMEOUT`` says otherwise, and ``describe_failure``
turns what psycopg raises into the one line a person needs (``cannot reach PostgreSQL
at 127.0.0.1:1: connection refused``): where the server is (never its password) and why.

Every connection reads json and jsonb with ``_loads`` (``ADAPTERS``); the application's
own psycopg connections keep psycopg's defaults.

Two kinds of connection, each from its own URL:

- pooled ones (``pool``, ``async_pool``, the API's pool), which run statements, from
  ``database_url``: PostgreSQL itself, or a pooler in transaction mode (PgBouncer) when
  ``database_pooler`` says so. Through a pooler, consecutive transactions of one client
  connection may run on different server connections, and a server connection serves
  other clients between them: nothing may live in the session. So a pooled connection
  there sends no startup ``options`` (PgBouncer refuses the parameter), prepares nothing
  on the server (psycopg's automatic prepared statements are named per session, and
  PgBouncer carries them only from 1.21), and its cursors (``PooledCursor``) send
  ``enter_transaction.sql`` ahead of every statement, in the same query: the schema and
  the time zone hold for that statement's transaction alone.
- sessions (``connect``, ``aconnect``), from ``listen_database_url``: the one LISTEN
  connection of each process, ``migrate``, the CLI's commands and a result's waiter.
  They keep the startup ``options``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import subprocess
import threading
from typing import Any, Self

import psycopg
from psycopg import sql
from psycopg.adapt import AdaptersMap
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import Row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from tidegate.errors import UnavailableError
from tidegate.settings import Settings
from tidegate.storage.embedded import start_embedded
from tidegate.storage.migrate import migrate
from tidegate.storage.sql import query as named

log = logging.getLogger("tidegate")

RECONNECT_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 3
"""How long one connection attempt waits for the server (libpq's ``connect_timeout``,
whole seconds, at least 2): long enough for a remote server's TLS handshake, short
enough that a command against a server that does not answer fails within seconds."""
TRANSIENT_CLASSES = ("08", "53", "57", "40")
"""SQLSTATE classes worth the same statement again later: connection exceptions,
insufficient resources, operator intervention (shutdown, restart), rollbacks
(serialization failures, deadlocks)."""


def _loads(data: str | bytes) -> Any:
    """``json.loads`` of what PostgreSQL sends, UTF-8 always. Given bytes, ``json.loads``
    first detects their encoding: a small value took 4.3 µs instead of 1.7, and a claimed
    run carries two (args, errors)."""
    return json.loads(data.decode() if isinstance(data, bytes) else data)


ADAPTERS = AdaptersMap(psycopg.adapters)
"""psycopg's adapters, json and jsonb read with ``_loads``."""
set_json_loads(_loads, ADAPTERS)


class PooledCursor(psycopg.ClientCursor[Row]):
    """A cursor whose every statement names tidegate's schema for its own transaction:
    ``enter_transaction.sql`` and the statement go as one query, so both run in one
    transaction even in autocommit, at the cost of no round trip. For connections through
    a pooler in transaction mode, where no session state can be relied on.

    Parameters are bound on the client (the simple query protocol carries two statements
    in one message; the extended one, one only). A pipeline of the two, with parameters
    bound on the server, cost 150-200 µs more per statement on this machine; the query of
    two, 60 µs more than the statement alone (docs/deployment.md).
    """

    entering = ""
    """``enter_transaction.sql`` with the schema bound (set by ``pooled_cursors``)."""

    def execute(self, query: Any, params: Any = None, **options: Any) -> Self:
        super().execute(f"{self.entering};\n{self.mogrify(query, params)}", **options)
        self.nextset()  # past set_config's row, to the statement's result
        return self


class AsyncPooledCursor(psycopg.AsyncClientCursor[Row]):
    """``PooledCursor`` for asyncio."""

    entering = ""

    async def execute(self, query: Any, params: Any = None, **options: Any) -> Self:
        await super().execute(f"{self.entering};\n{self.mogrify(query, params)}", **options)
        self.nextset()
        return self


@functools.cache
def pooled_cursors(schema: str) -> tuple[type[PooledCursor[Any]], type[AsyncPooledCursor[Any]]]:
    """The pooled cursor classes of ``schema`` (made once per schema): the schema is
    bound into ``enter_transaction.sql`` as a literal, by psycopg's own quoting."""
    entering = sql.SQL(named("enter_transaction").replace("%(schema)s", "{}").strip()).format(
        sql.Literal(schema)
    )
    attributes = {"entering": entering.as_string(None)}
    return (
        type("PooledCursor", (PooledCursor,), attributes),
        type("AsyncPooledCursor", (AsyncPooledCursor,), attributes),
    )


def transient(error: BaseException) -> bool:
    """Tell whether a database error passes by itself (an outage, a restart, a deadlock).

    Anything else (a refused value, a missing permission, a violated constraint) is the
    statement's or the data's: retrying it unchanged gives the same error.
    """
    if not isinstance(error, psycopg.Error):
        return False
    sqlstate = error.sqlstate
    # No SQLSTATE: the failure was the client's (connection refused, server gone,
    # pool timeout), not the server's answer.
    return sqlstate is None or sqlstate.startswith(TRANSIENT_CLASSES) or sqlstate == "25006"


class Database:
    """Where tidegate's data lives, and pools of connections to it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._url: str | None = settings.database_url
        self._lock = threading.RLock()
        self._pool: ConnectionPool | None = None

    @property
    def embedded(self) -> bool:
        """Tell whether tidegate runs its own server (no URL was configured)."""
        return self.settings.database_url is None

    @property
    def pooler(self) -> bool:
        """Tell whether ``database_url`` leads to a pooler in transaction mode."""
        return self.settings.database_pooler != "none"

    def conninfo(self) -> str:
        """Return the connection string of pooled connections (``database_url``).

        Without a URL, start (or join) the embedded server and bring its schema up to
        date: tidegate owns that server. A named server is migrated by ``tidegate
        migrate``; workers check its version at start.
        """
        return self._conninfo(self.url(), session=not self.pooler)

    def listen_conninfo(self) -> str:
        """Return the connection string of sessions (``listen_database_url``)."""
        return self._conninfo(self.settings.listen_database_url or self.url(), session=True)

    def _conninfo(self, url: str, *, session: bool) -> str:
        """``url`` with a connect timeout and the application's name where it has none
        (a URL's ``application_name`` names its processes in ``pg_stat_activity``) and,
        for a session, the schema and UTC as startup options."""
        extra: dict[str, Any] = {"fallback_application_name": "tidegate"}
        if session:
            extra["options"] = f"-c search_path={self.settings.schema} -c timezone=UTC"
        if "connect_timeout" not in conninfo_to_dict(url) and "PGCONNECT_TIMEOUT" not in os.environ:
            extra["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
        return make_conninfo(url, **extra)

    def connection_kwargs(self, *, asynchronous: bool) -> dict[str, Any]:
        """How every pooled connection is made: autocommit, json read with ``_loads``,
        and, through a pooler, pooled cursors and no prepared statements."""
        kwargs: dict[str, Any] = {"autocommit": True, "context": ADAPTERS}
        if self.pooler:
            cursors = pooled_cursors(self.settings.schema)
            kwargs["cursor_factory"] = cursors[1] if asynchronous else cursors[0]
            kwargs["prepare_threshold"] = None
        return kwargs

    def url(self) -> str:
        """Return the server's URL, starting (and migrating) the embedded one if needed:
        then the process says so in one log line, with the server's folder, so that a
        deployment that forgot its URL does not go on silently on a local database."""
        with self._lock:
            if self._url is None:
                try:
                    url = start_embedded(self.settings.data_dir)
                except (OSError, subprocess.SubprocessError) as error:
                    # A folder that cannot be written, or initdb or pg_ctl failing (the
                    # wrapper has logged the server's own log at ERROR by then).
                    raise UnavailableError(
                        f"cannot start {describe_database(self.settings)}: {error}"
                    ) from error
                with psycopg.connect(url, autocommit=True) as conn:
                    migrate(conn, self.settings.schema)  # tidegate owns this server
                log.warning(
                    "using %s, as no database URL is set: for a deployment, set "
                    "TIDEGATE_DATABASE_URL, and TIDEGATE_REQUIRE_DATABASE_URL=1 to make "
                    "its absence an error",
                    describe_database(self.settings),
                )
                self._url = url
            return self._url

    def connect(self, *, autocommit: bool = True) -> psycopg.Connection:
        """Open a session (``listen_database_url``): for LISTEN, ``migrate`` and the
        few connections that hold a session's state."""
        return psycopg.connect(self.listen_conninfo(), autocommit=autocommit, context=ADAPTERS)

    async def aconnect(self, *, autocommit: bool = True) -> psycopg.AsyncConnection:
        """Async form of ``connect``."""
        return await psycopg.AsyncConnection.connect(
            self.listen_conninfo(), autocommit=autocommit, context=ADAPTERS
        )

    def pool(self) -> ConnectionPool:
        """Return the process's shared sync pool (opened on first use)."""
        with self._lock:
            if self._pool is None:
                # One connection first, outside the pool: an unreachable server fails
                # here at once with libpq's reason, not after the pool's 30 s wait for
                # a connection that never comes.
                psycopg.connect(self.conninfo()).close()
                self._pool = ConnectionPool(
                    self.conninfo(),
                    min_size=1,
                    max_size=self.settings.pool_size,
                    kwargs=self.connection_kwargs(asynchronous=False),
                    open=True,
                    name="tidegate",
                )
            return self._pool

    def async_pool(self, size: int | None = None) -> AsyncConnectionPool:
        """Return a new async pool; the caller opens and closes it.

        Its connections commit through the WAL flush, as every tidegate connection does:
        whatever makes a run or decides who executes it (an enqueue, an admission, a
        schedule's firing, a claim, a hand-back) is on disk before anything acts on it.
        The few statements whose loss a crash makes harmless say so themselves
        (``complete_runs``, ``beat_worker``: docs/guarantees.md).
        """
        return AsyncConnectionPool(
            self.conninfo(),
            min_size=1,
            max_size=size or self.settings.pool_size,
            kwargs=self.connection_kwargs(asynchronous=True),
            # Give up a reconnection sequence after a few seconds: the next request for a
            # connection starts a fresh one, so service resumes soon after an outage.
            reconnect_timeout=RECONNECT_SECONDS,
            open=False,
            name="tidegate-async",
        )

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


def describe_database(settings: Settings, *, name: bool = False) -> str:
    """Say where the database is, for people: never its password.

    ``PostgreSQL at db.example.com:5432`` (with ``name``: ``..., database "app"``),
    ``PostgreSQL on socket /run/postgresql/.s.PGSQL.5432``, or ``the embedded PostgreSQL
    in /srv/app/.tidegate``.
    """
    if settings.database_url is None:
        return f"the embedded PostgreSQL in {settings.data_dir.expanduser().resolve()}"
    params = conninfo_to_dict(settings.database_url)
    host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
    port = str(params.get("port") or os.environ.get("PGPORT") or 5432)
    where = (
        f"PostgreSQL on socket {host}/.s.PGSQL.{port}"
        if host.startswith("/")
        else f"PostgreSQL at {host}:{port}"
    )
    dbname = params.get("dbname") or os.environ.get("PGDATABASE")
    if name and dbname:
        where += f', database "{dbname}"'
    return where


def describe_failure(error: psycopg.Error, settings: Settings) -> str:
    """Say in one line why the database could not be used, and where it is.

    libpq's text runs over several lines and says what went wrong in its last clause
    (``connection to server at "127.0.0.1", port 1 failed: Connection refused``, then a
    hint); a person needs that clause and where the server is. An error the server
    answered to a statement keeps its SQLSTATE.
    """
    where = describe_database(settings)
    text = str(error).strip()
    first = text.splitlines()[0].strip() if text else type(error).__name__
    if isinstance(error, PoolTimeout):
        return f"no connection to {where} in time: {first}"
    if error.sqlstate is not None:
        return f"{where} refused a statement: [{error.sqlstate}] {first}"
    reason = first.rsplit(" failed: ", 1)[-1].removeprefix("FATAL:").strip()
    lowered = reason.lower()
    if "connection refused" in lowered:
        return f"cannot reach {where}: connection refused"
    if "timeout expired" in lowered:
        return f"cannot reach {where}: no answer (timed out)"
    if "no such file or directory" in lowered:
        return f"cannot reach {where}: no server is listening there"
    if "resolve host" in lowered or "translate host name" in lowered:
        return f"cannot reach {where}: unknown host"
    if missing := re.fullmatch(r'database (".*") does not exist', reason):
        return f"{where} has no database {missing[1]}: create it, or name another in the URL"
    if "authentication" in lowered or re.fullmatch(r'role ".*" does not exist', reason):
        return f"cannot log in to {where}: {reason}"
    if first.startswith("connection failed"):
        return f"cannot reach {where}: {reason}"
    return f"lost the connection to {where}: {reason}"
