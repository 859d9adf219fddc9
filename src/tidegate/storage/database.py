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

Behind PgBouncer in transaction mode, startup ``options`` and ``LISTEN`` do not work:
point workers (which LISTEN) at PostgreSQL directly, and give PgBouncer
``ignore_startup_parameters = options`` with a per-user ``search_path`` instead.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import threading
from typing import Any

import psycopg
from psycopg.adapt import AdaptersMap
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from tidegate.errors import UnavailableError
from tidegate.settings import Settings
from tidegate.storage.embedded import start_embedded
from tidegate.storage.migrate import migrate

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
CONNECTION = {"autocommit": True, "context": ADAPTERS}
"""How every connection of a pool is made."""


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

    def conninfo(self) -> str:
        """Return the connection string.

        Without a URL, start (or join) the embedded server and bring its schema up to
        date: tidegate owns that server. A named server is migrated by ``tidegate
        migrate``; workers check its version at start.
        """
        options = f"-c search_path={self.settings.schema} -c timezone=UTC"
        url = self.url()
        timeout = {}
        if "connect_timeout" not in conninfo_to_dict(url) and "PGCONNECT_TIMEOUT" not in os.environ:
            timeout["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
        return make_conninfo(url, options=options, application_name="tidegate", **timeout)

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
        return psycopg.connect(self.conninfo(), autocommit=autocommit, context=ADAPTERS)

    async def aconnect(self, *, autocommit: bool = True) -> psycopg.AsyncConnection:
        return await psycopg.AsyncConnection.connect(
            self.conninfo(), autocommit=autocommit, context=ADAPTERS
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
                    kwargs=CONNECTION,
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
            kwargs=CONNECTION,
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
