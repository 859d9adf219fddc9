"""``tidegate serve``: the HTTP API and workers, on one database, in one command.

``--role all`` (the default) runs ``--api-processes`` uvicorn processes and one worker
process; ``api`` and ``worker`` run one half, for scaling each on its own machines. With
no database URL, this process starts the embedded server, migrates it, and hands its URL
to the processes it starts; the server stops when this process exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import fields

import uvicorn

from tidegate.settings import ENV_PREFIX, Settings
from tidegate.storage.database import Database
from tidegate.storage.migrate import check_schema

ROLES = ("all", "api", "worker")


def serve(settings: Settings, role: str, app_spec: str) -> int:
    """Run the role's processes until SIGTERM/SIGINT; return the exit status."""
    database = Database(settings)
    with database.connect() as conn:  # starts and migrates the embedded server if it is one
        check_schema(conn, settings.schema)
    env = _environment(settings, database)
    worker: subprocess.Popen[bytes] | None = None
    if role in ("all", "worker"):
        worker = subprocess.Popen(
            [sys.executable, "-m", "tidegate", "worker", "--app", app_spec], env=env
        )
    if role == "worker":
        assert worker is not None
        signal.signal(signal.SIGTERM, lambda *_: worker.send_signal(signal.SIGTERM))
        signal.signal(signal.SIGINT, lambda *_: worker.send_signal(signal.SIGTERM))
        return worker.wait()
    os.environ.update(env)  # the API processes build their settings from it
    # uvicorn re-raises the signal that stopped it once it has shut down; with these
    # handlers in place the re-raise returns here, and the worker is stopped too.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    try:
        uvicorn.run(
            "tidegate.ingress.server:create_server",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.api_processes,
            log_level="warning",
            timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
        )
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            worker.wait()
    return 0


def _environment(settings: Settings, database: Database) -> dict[str, str]:
    """The environment of child processes: every setting, and a database they can reach."""
    env = dict(os.environ)
    for f in fields(settings):
        value = getattr(settings, f.name)
        if f.init and value is not None:
            env[ENV_PREFIX + f.name.upper()] = str(value)
    env[ENV_PREFIX + "DATABASE_URL"] = database.url()
    return env
