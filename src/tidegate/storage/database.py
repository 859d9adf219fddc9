"""Connections to tidegate's database.

``Database`` resolves where the database is (the URL from settings, or the embedded
server, started on first use) and hands out pools whose connections all have
``search_path`` set to tidegate's schema, so statements never format the schema in.

Behind PgBouncer in transaction mode, startup ``options`` and ``LISTEN`` do not work:
point workers (which LISTEN) at PostgreSQL directly, and give PgBouncer
``ignore_startup_parameters = options`` with a per-user ``search_path`` instead.
"""

from __future__ import annotations

import threading

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from tidegate.settings import Settings
from tidegate.storage.embedded import start_embedded
from tidegate.storage.migrate import migrate

RECONNECT_SECONDS = 5.0


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

    def conninfo(self, *, synchronous_commit: bool = True) -> str:
        """Return the connection string.

        Without a URL, start (or join) the embedded server and bring its schema up to
        date: tidegate owns that server. A named server is migrated by ``tidegate
        migrate``; workers check its version at start.
        """
        options = f"-c search_path={self.settings.schema}"
        if not synchronous_commit:
            options += " -c synchronous_commit=off"
        return make_conninfo(self.url(), options=options, application_name="tidegate")

    def url(self) -> str:
        """Return the server's URL, starting (and migrating) the embedded one if needed."""
        with self._lock:
            if self._url is None:
                url = start_embedded(self.settings.data_dir)
                with psycopg.connect(url, autocommit=True) as conn:
                    migrate(conn, self.settings.schema)  # tidegate owns this server
                self._url = url
            return self._url

    def connect(self, *, autocommit: bool = True) -> psycopg.Connection:
        return psycopg.connect(self.conninfo(), autocommit=autocommit)

    async def aconnect(self, *, autocommit: bool = True) -> psycopg.AsyncConnection:
        return await psycopg.AsyncConnection.connect(self.conninfo(), autocommit=autocommit)

    def pool(self) -> ConnectionPool:
        """Return the process's shared sync pool (opened on first use)."""
        with self._lock:
            if self._pool is None:
                self._pool = ConnectionPool(
                    self.conninfo(),
                    min_size=1,
                    max_size=self.settings.pool_size,
                    kwargs={"autocommit": True},
                    open=True,
                    name="tidegate",
                )
            return self._pool

    def async_pool(
        self, size: int | None = None, *, synchronous_commit: bool = True
    ) -> AsyncConnectionPool:
        """Return a new async pool; the caller opens and closes it.

        ``synchronous_commit=False`` is for the worker: its claims and completions need
        not wait for the WAL flush. A database crash can lose the last fraction of a
        second of them, which undoes nothing that is promised: a lost claim leaves the
        run available, a lost completion leaves it running until its lease is rescued,
        and either way it runs again (at-least-once). Enqueues and webhook admissions
        keep synchronous commit: nothing is acknowledged before it is durable.
        """
        return AsyncConnectionPool(
            self.conninfo(synchronous_commit=synchronous_commit),
            min_size=1,
            max_size=size or self.settings.pool_size,
            kwargs={"autocommit": True},
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
