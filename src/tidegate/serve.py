"""``tidegate serve``: the HTTP API and workers, on one database, in one command.

``--role all`` (the default) serves the API from this process (``--api-processes`` above
1: that many uvicorn processes) and keeps one worker process beside it; ``api`` and
``worker`` run one half, for scaling each on its own machines. With no database URL, this
process starts the embedded server, migrates it, and hands its URL to the processes it
starts; the server stops when this process exits.

The worker is supervised: when it dies (a crash, the OOM killer, ``kill -9``), its exit is
logged at ERROR and a new one starts after a backoff, 1 s doubling to 30 s and back to
1 s once a worker has stayed up for a minute. Otherwise the API would go on accepting
webhooks that nothing runs. A worker that exits with status 2 could not even load its
app (a usage error, printed above it): restarting would fail the same way, so serve
stops and exits 1.

SIGTERM, SIGINT or SIGHUP (the terminal closed) stops the API first (its sync callers get
their replies from the still-running worker), then the worker, which finishes or hands
back its runs; serve then exits 0. A second signal tells the worker to exit at once.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from types import FrameType

import uvicorn
from uvicorn.supervisors import Multiprocess

from tidegate.errors import UnavailableError
from tidegate.logs import logging_config
from tidegate.settings import ENV_PREFIX, Settings
from tidegate.storage.database import Database, describe_database
from tidegate.storage.migrate import check_schema

ROLES = ("all", "api", "worker")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
RESTART_FIRST_SECONDS = 1.0
RESTART_MAX_SECONDS = 30.0
STABLE_SECONDS = 60.0
"""A worker that stayed up this long died of something new: restart it after 1 s again."""
BACKLOG = 2048
"""Connections waiting to be accepted (uvicorn's default)."""
USAGE_ERROR = 2
"""The exit status of a worker whose command line or app is wrong (click's usage error)."""

log = logging.getLogger("tidegate.serve")


def serve(
    settings: Settings, role: str, app_spec: str, *, verbose: bool = False, access_log: bool = False
) -> int:
    """Run the role's processes until a signal to stop; return the exit status."""
    database = Database(settings)
    with database.connect() as conn:  # starts and migrates the embedded server if it is one
        check_schema(conn, settings.schema)
    log.info('database: %s, schema "%s"', describe_database(settings, name=True), settings.schema)
    sock = None if role == "worker" else _listen(settings.host, settings.port)
    env = _environment(settings, database, verbose)
    stopping = Stopping()
    supervisor = Supervisor(
        [sys.executable, "-m", "tidegate", "worker", "--app", app_spec],
        env,
        on_give_up=lambda: os.kill(os.getpid(), signal.SIGTERM),
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stopping.is_set():
            supervisor.signal()  # a second signal: the worker stops at once
        stopping.set()

    for signum in STOP_SIGNALS:
        signal.signal(signum, on_signal)
    if role != "api":
        log.info("worker: app %s, workloops %s", app_spec, settings.workloops)
        supervisor.start()
    try:
        if sock is None:
            stopping.wait()
        else:
            _serve_api(sock, settings, env, verbose, access_log, stopping)
    finally:
        # uvicorn's multiprocess manager leaves handlers of its own behind.
        for signum in STOP_SIGNALS:
            signal.signal(signum, on_signal)
        status = supervisor.stop()
        log.info(
            "tidegate serve stopped%s",
            "" if status is None else f" (the worker exited with status {status})",
        )
    return 1 if supervisor.gave_up or status not in (0, None) else 0


class Stopping:
    """Set once serve is to stop; tells whoever asked (the API server) at once."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        self._event.set()
        for callback in self._callbacks:
            callback()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self) -> None:
        self._event.wait()

    def when(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when serve is to stop (now, if it already is)."""
        self._callbacks.append(callback)
        if self._event.is_set():
            callback()


def _serve_api(
    sock: socket.socket,
    settings: Settings,
    env: dict[str, str],
    verbose: bool,
    access_log: bool,
    stopping: Stopping,
) -> None:
    """Serve the HTTP API on ``sock`` until serve is to stop.

    uvicorn handles SIGTERM and SIGINT while it runs, then restores serve's handler and
    raises the signal again, which lands there. A signal that came before uvicorn's
    handlers were in place reaches it through ``stopping``.
    """
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    log.info(
        "API: %s, docs at %s/docs (%d process%s)",
        url,
        url,
        settings.api_processes,
        "" if settings.api_processes == 1 else "es",
    )
    os.environ.update(env)  # the API processes build their settings from it
    config = uvicorn.Config(
        "tidegate.api.server:create_server",
        factory=True,
        host=host,
        port=port,
        workers=settings.api_processes,
        http="tidegate.api.protocol:GuardedHttpToolsProtocol",
        # No route speaks WebSocket: an Upgrade request is an HTTP request like any
        # other, under the same limits, not a handshake that holds its connection.
        ws="none",
        log_config=logging_config(settings.log_format, verbose, access_log),
        log_level=None,
        access_log=access_log,
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
    )
    if config.workers > 1:
        processes = Multiprocess(config, sockets=[sock])
        stopping.when(processes.should_exit.set)
        processes.run()
    else:
        server = uvicorn.Server(config)
        stopping.when(lambda: setattr(server, "should_exit", True))
        server.run(sockets=[sock])


def _listen(host: str, port: int) -> socket.socket:
    """Bind and listen on the API's socket before uvicorn starts, as uvicorn would.

    So that a port in use is one line (``cannot listen on 127.0.0.1:8000: address already
    in use``), the address logged is the one bound (``--port 0`` takes a free one), and a
    client that connects as soon as it is logged waits in the backlog for uvicorn.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as error:
        sock.close()
        reason = (error.strerror or str(error)).lower()
        raise UnavailableError(f"cannot listen on {host}:{port}: {reason}") from None
    sock.set_inheritable(True)
    return sock


class Supervisor:
    """Keep one worker process running until ``stop()``; restart it when it dies.

    The worker runs in a process group of its own, so that a Ctrl+C in the terminal
    reaches serve alone, which then stops the API before the worker rather than both
    at once (a worker that stopped first would look dead, and be restarted).
    """

    def __init__(
        self, command: list[str], env: dict[str, str], on_give_up: Callable[[], None]
    ) -> None:
        self.command = command
        self.env = env
        self.on_give_up = on_give_up
        self.gave_up = False
        self.process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="tidegate.supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def signal(self, signum: int = signal.SIGTERM) -> None:
        """Send ``signum`` to the worker, if one is running."""
        with self._lock:
            if self.process is not None and self.process.poll() is None:
                self.process.send_signal(signum)

    def stop(self) -> int | None:
        """Stop the worker (SIGTERM, then wait); return its exit status, if one ran."""
        with self._lock:
            self._stopping.set()
            process = self.process
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        if self._thread.is_alive():
            self._thread.join()
        return None if process is None else process.wait()

    def _run(self) -> None:
        delay = RESTART_FIRST_SECONDS
        while True:
            with self._lock:
                if self._stopping.is_set():
                    return
                process = self.process = subprocess.Popen(
                    self.command, env=self.env, process_group=0
                )
            started = time.monotonic()
            status = process.wait()
            if self._stopping.is_set():
                return
            if time.monotonic() - started >= STABLE_SECONDS:
                delay = RESTART_FIRST_SECONDS
            context = {"pid": process.pid, "exit_status": status}
            if status == USAGE_ERROR:
                log.error(
                    "the worker (pid %d) cannot start: %s; stopping",
                    process.pid,
                    _exit(status),
                    extra=context,
                )
                self.gave_up = True
                self.on_give_up()
                return
            log.error(
                "the worker (pid %d) %s; starting a new one in %g s",
                process.pid,
                _exit(status),
                delay,
                extra=context,
            )
            if self._stopping.wait(delay):
                return
            delay = min(delay * 2, RESTART_MAX_SECONDS)


def _exit(status: int) -> str:
    """Say how a process ended, from its ``returncode``."""
    if status < 0:
        return f"was killed by {signal.Signals(-status).name}"
    return f"exited with status {status}"


def _environment(settings: Settings, database: Database, verbose: bool) -> dict[str, str]:
    """The environment of child processes: every setting, and a database they can reach."""
    env = dict(os.environ)
    for f in fields(settings):
        value = getattr(settings, f.name)
        if f.init and value is not None:
            env[ENV_PREFIX + f.name.upper()] = str(value)
    env[ENV_PREFIX + "DATABASE_URL"] = database.url()
    env[ENV_PREFIX + "VERBOSE"] = "1" if verbose else ""
    return env
