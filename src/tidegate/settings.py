"""One settings object for the library, the worker and the CLI.

Every option has a ``DEFAULT_*`` value, can be set from a ``TIDEGATE_<NAME>`` environment
variable (``TIDEGATE_LEASE_SECONDS=10``), and from the CLI, which overrides both. The
database also comes from ``DATABASE_URL`` or libpq's ``PG*`` variables where
``TIDEGATE_DATABASE_URL`` is unset (``conventional_database_url``).
Durations carry their unit in the name. Every number has its range in
``tidegate.limits.SETTING_BOUNDS``, which the CLI's options take too.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict

from tidegate.errors import ConfigError, InputError
from tidegate.lanes import WorkloopSpec, parse_workloops
from tidegate.limits import SETTING_BOUNDS, check_token

DEFAULT_SCHEMA = "tidegate"
DEFAULT_DATA_DIR = Path(".tidegate")
DEFAULT_WORKLOOPS = "manual>*:10"
DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_HEARTBEAT_SECONDS = 2.0
DEFAULT_POLL_SECONDS = 1.0
DEFAULT_STAGE_SECONDS = 0.5
DEFAULT_RESCUE_SECONDS = 5.0
DEFAULT_SCHEDULE_SECONDS = 1.0
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600.0
DEFAULT_PRUNE_SECONDS = 60.0
DEFAULT_PRUNE_BATCH = 1000
DEFAULT_SHUTDOWN_GRACE_SECONDS = 25.0
DEFAULT_MAX_ATTEMPTS = 20
DEFAULT_BACKOFF_BASE_SECONDS = 1.0
DEFAULT_BACKOFF_MAX_SECONDS = 3600.0
DEFAULT_POOL_SIZE = 8
DEFAULT_FAST_LANE_CAP = 10
DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_API_PROCESSES = 1
DEFAULT_MAX_JSON_DEPTH = 64
DEFAULT_MAX_API_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_HEAD_BYTES = 32 * 1024
DEFAULT_MAX_HEADERS = 100
DEFAULT_READ_TIMEOUT_SECONDS = 30.0
DEFAULT_BODY_TIMEOUT_SECONDS = 60.0
DEFAULT_LOG_FORMAT = "text"
DEFAULT_METRICS_MAX_LANES = 100
DEFAULT_METRICS_MAX_PROJECTS = 100
DEFAULT_METRICS_MAX_KEYS = 100
DEFAULT_WEBHOOK_LOG_SIZE = 1000
DEFAULT_WEBHOOK_LOG_BODY_BYTES = 64 * 1024
DEFAULT_UI_SESSION_SECONDS = 12 * 3600.0
DEFAULT_MAX_CLAIMS_PER_TOKEN = 1000
DEFAULT_MAX_STREAMS = 500
DEFAULT_MAX_STREAMS_PER_CALLER = 100
LOG_FORMATS = ("text", "json")
DEFAULT_DATABASE_POOLER = "none"
DATABASE_POOLERS = ("none", "pgbouncer")
"""What ``database_url`` leads to: PostgreSQL itself (``none``), or a pooler in
transaction mode (``pgbouncer``: PgBouncer, or another that keeps no session between
transactions), for which tidegate keeps no state in a session (docs/deployment.md)."""

ENV_PREFIX = "TIDEGATE_"
LIBPQ_SERVER_VARIABLES = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGSERVICE")
"""libpq's variables that name a server; the others (``PGUSER``, ``PGPASSWORD``,
``PGSSLMODE``, ...) only say how to connect to one, and do not ask for it alone."""
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_SERVER_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")


@dataclass(frozen=True)
class Settings:
    """Validated configuration; build it with ``Settings.from_env(**overrides)``."""

    database_url: str | None = None
    """PostgreSQL URL (or conninfo string; ``""``: libpq's defaults, from the ``PG*``
    variables); ``None`` starts the embedded server under ``data_dir``."""
    listen_database_url: str | None = None
    """The URL of the one connection per process that LISTENs (wake-ups, completions),
    and of the few other sessions (``migrate``, the CLI, a result's waiter): PostgreSQL
    itself, where ``database_url`` leads to a pooler in transaction mode, which keeps no
    session; ``None``: ``database_url``."""
    database_pooler: str = DEFAULT_DATABASE_POOLER
    """``pgbouncer`` when ``database_url`` leads to a pooler in transaction mode: every
    statement then names tidegate's schema in its own transaction, and none is prepared
    on the server (PgBouncer before 1.21 cannot carry them). Needs
    ``listen_database_url``."""
    require_database_url: bool = False
    """Make a missing ``database_url`` an error (``ConfigError``, at construction) rather
    than the embedded server: for deployments, where a forgotten variable must not
    enqueue into a throwaway local database (``TIDEGATE_REQUIRE_DATABASE_URL=1``)."""
    schema: str = DEFAULT_SCHEMA
    data_dir: Path = DEFAULT_DATA_DIR
    workloops: str = DEFAULT_WORKLOOPS
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS
    poll_seconds: float = DEFAULT_POLL_SECONDS
    stage_seconds: float = DEFAULT_STAGE_SECONDS
    rescue_seconds: float = DEFAULT_RESCUE_SECONDS
    schedule_seconds: float = DEFAULT_SCHEDULE_SECONDS
    """How often a worker looks for schedules whose tick has come (a tick runs at most
    this late)."""
    retention_seconds: float = DEFAULT_RETENTION_SECONDS
    prune_seconds: float = DEFAULT_PRUNE_SECONDS
    prune_batch: int = DEFAULT_PRUNE_BATCH
    shutdown_grace_seconds: float = DEFAULT_SHUTDOWN_GRACE_SECONDS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_base_seconds: float = DEFAULT_BACKOFF_BASE_SECONDS
    backoff_max_seconds: float = DEFAULT_BACKOFF_MAX_SECONDS
    pool_size: int = DEFAULT_POOL_SIZE
    admin_token: str | None = None
    """The super admin's token; ``None``: generated on first start, printed once."""
    server_url: str | None = None
    """A worker's API (``http://host:8000``): set, the worker is remote, and claims and
    completes through the API with ``worker_token`` (docs/workers.md), never touching
    the database."""
    worker_token: str | None = None
    """The worker token (``tgw_...``) a remote worker shows the API."""
    fast_lane_cap: int = DEFAULT_FAST_LANE_CAP
    """In-flight fast-lane runs per project, for projects that set no cap of their own."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """The server's limit on a webhook body, whatever a trigger allows."""
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_processes: int = DEFAULT_API_PROCESSES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    """How deep JSON may nest: webhook bodies (400 past it), enqueued args, results."""
    max_api_body_bytes: int = DEFAULT_MAX_API_BODY_BYTES
    """The limit on the body of an admin or runs API request (413 past it)."""
    max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES
    """The limit on a request's line and headers together (431 past it)."""
    max_headers: int = DEFAULT_MAX_HEADERS
    """The most header fields a request may have (431 past it)."""
    read_timeout_seconds: float = DEFAULT_READ_TIMEOUT_SECONDS
    """How long a client may take to send its request head, and to send each part of
    its body: a slow client is cut off (408) instead of holding a connection."""
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    """How long a client may take to send a whole body (408 after): a client that sends
    a byte now and then, each within ``read_timeout_seconds``, is cut off too."""
    log_format: str = DEFAULT_LOG_FORMAT
    """``text`` for people, ``json`` (one object per line) for log collectors."""
    metrics_max_lanes: int = DEFAULT_METRICS_MAX_LANES
    """The most lanes ``/metrics`` reports (in name order): a lane is a label value."""
    metrics_max_projects: int = DEFAULT_METRICS_MAX_PROJECTS
    """The most projects ``/metrics`` reports (the busiest): a project is a label value."""
    metrics_max_keys: int = DEFAULT_METRICS_MAX_KEYS
    """The most keys ``/metrics`` reports (the busiest; 0: none): a key is a label value."""
    webhook_log_size: int = DEFAULT_WEBHOOK_LOG_SIZE
    """The most refused (or replayed) requests the webhook log keeps per trigger; admitted
    ones are kept with their runs, for ``retention_seconds``."""
    webhook_log_body_bytes: int = DEFAULT_WEBHOOK_LOG_BODY_BYTES
    """How much of a refused request's body the webhook log keeps."""
    ui_session_seconds: float = DEFAULT_UI_SESSION_SECONDS
    """How long a dashboard session lasts after signing in (``/ui``); then sign in again."""
    max_claims_per_token: int = DEFAULT_MAX_CLAIMS_PER_TOKEN
    """The most long-polling claims the remote workers of one worker token may have open
    at once on an API process (429 past it; docs/workers.md)."""
    max_streams: int = DEFAULT_MAX_STREAMS
    """The most event streams an API process serves at once (503 past it; docs/progress.md)."""
    max_streams_per_caller: int = DEFAULT_MAX_STREAMS_PER_CALLER
    """The most event streams one caller (a token; a project's sync webhooks) may have open
    at once on an API process (429 past it)."""
    parsed_workloops: tuple[WorkloopSpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _SCHEMA_NAME.fullmatch(self.schema):
            raise ConfigError(f"schema {self.schema!r} must match [a-z_][a-z0-9_]*")
        if self.database_url is None and self.require_database_url:
            raise ConfigError(
                "no database URL: set TIDEGATE_DATABASE_URL (require_database_url is on, "
                "so the embedded PostgreSQL is not started)"
            )
        for name in ("database_url", "listen_database_url"):
            url = getattr(self, name)
            try:
                if url is not None:
                    conninfo_to_dict(url)
            except ProgrammingError as error:
                raise ConfigError(
                    f"{name} is neither a postgresql:// URL nor a conninfo string: {error}"
                ) from None
        if self.database_pooler not in DATABASE_POOLERS:
            raise ConfigError(
                f"database_pooler must be one of {DATABASE_POOLERS}, got {self.database_pooler!r}"
            )
        if self.database_url is None and (
            self.listen_database_url is not None or self.database_pooler != "none"
        ):
            raise ConfigError(
                "listen_database_url and database_pooler need a database_url: the embedded "
                "PostgreSQL has neither a pooler nor another address"
            )
        if self.database_pooler != "none" and self.listen_database_url is None:
            raise ConfigError(
                f"database_pooler={self.database_pooler} needs listen_database_url, a URL of "
                "PostgreSQL itself: LISTEN needs a session, which a pooler in transaction "
                "mode does not keep"
            )
        for name, bound in SETTING_BOUNDS.items():
            try:
                object.__setattr__(self, name, bound.check(getattr(self, name), name))
            except InputError as error:
                raise ConfigError(str(error)) from None
        if self.admin_token is not None:
            try:
                check_token(self.admin_token, "admin_token")
            except InputError as error:
                raise ConfigError(str(error)) from None
        if (self.server_url is None) != (self.worker_token is None):
            raise ConfigError("a remote worker needs both server_url and worker_token")
        if self.server_url is not None:
            if not _SERVER_URL.fullmatch(self.server_url):
                raise ConfigError(
                    f"server_url must be an http(s) URL such as http://host:8000, "
                    f"got {self.server_url[:100]!r}"
                )
            try:
                check_token(self.worker_token, "worker_token")
            except InputError as error:
                raise ConfigError(str(error)) from None
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format must be one of {LOG_FORMATS}, got {self.log_format!r}")
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ConfigError(
                f"heartbeat_seconds ({self.heartbeat_seconds}) must be shorter than "
                f"lease_seconds ({self.lease_seconds}), or leases lapse between beats"
            )
        object.__setattr__(self, "parsed_workloops", parse_workloops(self.workloops))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from defaults < ``TIDEGATE_*`` variables < ``overrides``.

        Overrides whose value is ``None`` are ignored, so CLI options that were not given
        leave the environment's value in place.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            if not f.init:
                continue
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = _convert(f, raw)
        if "database_url" not in values:
            values["database_url"] = conventional_database_url(environ)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        """Return a copy with some options changed (validated again)."""
        return dataclasses.replace(self, **changes)


def conventional_database_url(environ: Mapping[str, str]) -> str | None:
    """Return the database the ecosystem's variables name, for where
    ``TIDEGATE_DATABASE_URL`` is unset: ``DATABASE_URL`` (as Heroku, Render, Django and
    Rails read it); else, if a libpq variable names a server (``LIBPQ_SERVER_VARIABLES``),
    ``""``, the empty connection string, which libpq completes from every ``PG*``
    variable as ``psql`` does; else ``None``: the embedded server.
    """
    if environ.get("DATABASE_URL"):
        return environ["DATABASE_URL"]
    if any(environ.get(name) for name in LIBPQ_SERVER_VARIABLES):
        return ""
    return None


def _convert(f: dataclasses.Field[Any], raw: str) -> Any:
    default = f.default
    try:
        if isinstance(default, bool):
            return raw.lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, Path):
            return Path(raw)
    except ValueError:
        raise ConfigError(
            f"{ENV_PREFIX}{f.name.upper()}={raw!r} is not a valid {type(default).__name__}"
        ) from None
    return raw
