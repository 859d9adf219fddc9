"""The tasks the tests run, in-process (``register``) or in worker processes (``app``).

Handlers that need to prove what ran write a row to ``executions`` (in the test's
schema) from inside the handler: one row per attempt, with the worker's pid. A remote
worker's process has no database of its own: its handlers reach the table through
``TESTS_EXECUTIONS_URL`` (``spawn_worker``).
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from tidegate import Cancel, Retry, Tidegate, current_run

EXECUTIONS = """
CREATE TABLE IF NOT EXISTS executions (
    run_id bigint NOT NULL,
    attempt int NOT NULL,
    pid int NOT NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def register(app: Tidegate) -> None:
    local = threading.local()

    def connection() -> psycopg.Connection:
        if getattr(local, "conn", None) is None:
            conninfo = os.environ.get("TESTS_EXECUTIONS_URL") or make_conninfo(
                # PostgreSQL itself, named apart from tidegate's own connections.
                app.database.listen_conninfo(),
                application_name="tidegate-tests",
            )
            local.conn = psycopg.connect(conninfo, autocommit=True)
        conn: psycopg.Connection = local.conn
        return conn

    def record(started: float) -> None:
        run = current_run()
        connection().execute(
            "INSERT INTO executions (run_id, attempt, pid, started_at)"
            " VALUES (%s, %s, %s, to_timestamp(%s))",
            [run.id, run.attempt, os.getpid(), started],
        )

    @app.task(name="append_line")
    def append_line(path: str, **_: Any) -> None:
        """Say outside the database that this attempt ran: a crash of the database
        cannot take the line back."""
        run = current_run()
        with open(path, "a") as file:
            file.write(f"{run.id} {run.attempt} {run.idempotency_key}\n")

    @app.task(name="noop")
    async def noop(**_: Any) -> None:
        return None

    @app.task(name="echo")
    async def echo(**args: Any) -> dict[str, Any]:
        return args

    @app.task(name="record")
    def record_run(**_: Any) -> None:
        record(time.time())

    @app.task(name="sleep")
    def sleep(seconds: float, **_: Any) -> None:
        started = time.time()
        time.sleep(seconds)
        record(started)

    @app.task(name="async_sleep")
    async def async_sleep(seconds: float, **_: Any) -> str:
        await asyncio.sleep(seconds)
        return "slept"

    @app.task(name="async_sleep_record")
    async def async_sleep_record(seconds: float, **_: Any) -> str:
        started = time.time()
        try:
            await asyncio.sleep(seconds)
        finally:  # also when cancelled: the row says when the handler stopped
            record(started)
        return "slept"

    @app.task(name="fail", max_attempts=3)
    async def fail(until_attempt: int = 99, **_: Any) -> str:
        run = current_run()
        if run.attempt < until_attempt:
            raise ValueError(f"boom on attempt {run.attempt}")
        return f"ok on attempt {run.attempt}"

    @app.task(name="fail_in_thread", max_attempts=2)
    def fail_in_thread(**_: Any) -> str:
        return int("not a number")  # type: ignore[return-value]

    @app.task(name="fail_while_flagged", max_attempts=1)
    async def fail_while_flagged(flag: str, **_: Any) -> str:
        """Fail while the file ``flag`` exists: a fault the test fixes before a retry."""
        if os.path.exists(flag):
            raise RuntimeError(f"{flag} says to fail")
        return "flag gone"

    @app.task(name="retry_once")
    async def retry_once(**_: Any) -> str:
        if current_run().attempt == 1:
            raise Retry(delay_seconds=0.1)
        return "second time"

    @app.task(name="cancel_me")
    async def cancel_me(**_: Any) -> None:
        raise Cancel("not needed any more")

    @app.task(name="slow", timeout=0.2, max_attempts=1)
    async def slow(**_: Any) -> None:
        await asyncio.sleep(5)

    # A shop's tasks, for the dashboard's screenshots (test_dashboard_browser.py).

    @app.task(name="shop.send_receipt", lane="emails")
    def send_receipt(**_: Any) -> dict[str, Any]:
        time.sleep(0.25)
        return {"sent": True}

    @app.task(name="shop.build_report", lane="reports")
    def build_report(**_: Any) -> dict[str, Any]:
        time.sleep(1.5)
        return {"rows": 1200}

    @app.task(name="shop.sync_invoice", max_attempts=2)
    async def sync_invoice(invoice: int = 0, body: Any = None, **_: Any) -> dict[str, Any]:
        if isinstance(body, dict):  # from a webhook
            invoice = int(body.get("invoice", 0))
        await asyncio.sleep(0.1)
        if invoice % 7 == 0:
            raise ValueError(f"ledger refused invoice {invoice}: currency mismatch (EUR, USD)")
        return {"synced": invoice}

    # Progress (test_progress.py): a webhook's body, or the args, say how many steps.

    @app.task(name="report_progress")
    async def report_progress(
        steps: int = 3, gate: str | None = None, gate_at: int = 1, body: Any = None, **_: Any
    ) -> dict[str, Any]:
        """Report ``steps`` progress events; after event ``gate_at``, wait until the file
        ``gate`` exists."""
        if isinstance(body, dict):
            steps, gate = int(body.get("steps", steps)), body.get("gate")
            gate_at = int(body.get("gate_at", gate_at))
        run = current_run()
        for step in range(1, steps + 1):
            run.progress({"step": step, "of": steps})
            while gate and step == gate_at and not os.path.exists(gate):
                await asyncio.sleep(0.02)
        return {"steps": steps}

    @app.task(name="report_progress_in_thread")
    def report_progress_in_thread(steps: int = 3, size: int = 0, **_: Any) -> dict[str, Any]:
        run = current_run()
        for step in range(1, steps + 1):
            run.progress({"step": step, "pad": "x" * size})
        return {"steps": steps}

    @app.task(name="report_bad_progress", max_attempts=1)
    async def report_bad_progress(kind: str = "set", **_: Any) -> None:
        data: Any = {1, 2} if kind == "set" else "x" * 70_000
        current_run().progress(data)

    # Strict order per key (test_ordering.py).

    @app.task(name="ordered_step", max_attempts=4)
    async def ordered_step(
        fail: float = 0.0,
        hold_seconds: float = 0.0,
        flag: str | None = None,
        retry_seconds: float = 1.0,
        **_: Any,
    ) -> None:
        """Say when this attempt started (the database's clock, as completed_at is), then:
        while the file ``flag`` exists, ask to run again in ``retry_seconds``; on the
        first attempt hold on ``hold_seconds`` (long enough to be killed in); fail with
        the probability ``fail``."""
        run = current_run()
        connection().execute(
            "INSERT INTO executions (run_id, attempt, pid, started_at)"
            " VALUES (%s, %s, %s, clock_timestamp())",
            [run.id, run.attempt, os.getpid()],
        )
        if flag and os.path.exists(flag):
            raise Retry(delay_seconds=retry_seconds)
        if run.attempt == 1 and hold_seconds:
            await asyncio.sleep(hold_seconds)
        await asyncio.sleep(random.uniform(0, 0.02))
        if random.random() < fail:
            raise RuntimeError(f"step {run.id} failed on attempt {run.attempt}")

    # Webhook-shaped handlers: a webhook run's args are {"body", "headers", "trigger"}.

    @app.task(name="hook_sleep")
    def hook_sleep(body: Any = None, **_: Any) -> dict[str, Any]:
        started = time.time()
        seconds = float(body.get("seconds", 0)) if isinstance(body, dict) else 0.0
        time.sleep(seconds)
        record(started)
        return {"slept": seconds}

    @app.task(name="hook_reply")
    async def hook_reply(body: Any = None, **_: Any) -> dict[str, Any]:
        return {"$reply": {"status": 201, "headers": {"x-a": "b"}, "body": {"got": body}}}

    @app.task(name="hook_reply_as_sent")
    async def hook_reply_as_sent(body: Any = None, **_: Any) -> dict[str, Any]:
        """Reply with whatever the webhook's body says: a handler echoing its input."""
        return {"$reply": body}


app = Tidegate()
if os.environ.get("TIDEGATE_SCHEMA"):  # only in the worker processes the tests spawn
    register(app)
