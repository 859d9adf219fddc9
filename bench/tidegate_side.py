"""The benchmark's workloads, driven through tidegate's public API.

Enqueue uses the sync API on one connection (``Tidegate.enqueue_many``); the drain and
the wake-up use one ``tidegate worker`` process started as a user would, with
tidegate's default settings (``--workloops "manual>*:32"``, runs in the ``default``
lane), loading ``bench.apps:app``.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from bench.harness import (
    BenchError,
    WorkerProcess,
    child_env,
    fresh_schema,
    paced,
    python_module,
    schema_conninfo,
    settle,
    wait_for,
    wakeup_figures,
)
from tidegate import NewRun, Settings, Tidegate

READY = " started: "
"""What the worker logs once it listens and its workloops claim."""
LOAD_BATCH = 5000

CHECK_RUNS = """
SELECT count(*),
       count(*) FILTER (WHERE state = 'succeeded'),
       coalesce(max(attempt), 0),
       min(attempted_at),
       max(completed_at)
FROM runs
"""

COUNT_SUCCEEDED = "SELECT count(*) FROM runs WHERE state = 'succeeded'"

# Per wake-up run: the client's send time (in its args), the insert's and the claim's
# transaction start, the handler's start (its result); all Unix seconds.
WAKEUP_SAMPLES = """
SELECT (args->>'enqueued_at')::float8,
       extract(epoch FROM inserted_at)::float8,
       extract(epoch FROM attempted_at)::float8,
       (result->>'started_at')::float8
FROM runs
WHERE args ? 'enqueued_at'
"""


def open_app(url: str, schema: str) -> Tidegate:
    """Return an app on ``schema`` with tidegate's defaults, migrated."""
    app = Tidegate(settings=Settings(database_url=url, schema=schema))
    app.migrate()
    return app


def worker_synchronous_commit(url: str) -> str:
    """Return how tidegate's worker commits its claims and completions: ``on`` or ``off``.

    Read from the connection string of the pool a worker would open (nothing connects),
    so that the raw queue's worker can commit the same way: the comparison is then of
    the two queues, not of two durability settings.
    """
    from tidegate.worker.runtime import Worker

    app = Tidegate(settings=Settings(database_url=url, schema="bench_probe"))
    worker = Worker(app, app.settings.replace(workloops=workloops(1)))
    try:
        conninfo = str(getattr(worker.pool, "conninfo", ""))
    finally:
        worker.executor.shutdown(wait=False)
        app.close()
    return "off" if "synchronous_commit=off" in conninfo.replace(" ", "") else "on"


def workloops(slots: int) -> str:
    return f"manual>*:{slots}"


def worker_argv(slots: int) -> list[str]:
    return python_module(
        "tidegate", "worker", "--app", "bench.apps:app", "--workloops", workloops(slots)
    )


def start_worker(url: str, schema: str, slots: int) -> WorkerProcess:
    env = child_env(TIDEGATE_DATABASE_URL=url, TIDEGATE_SCHEMA=schema)
    return WorkerProcess(worker_argv(slots), env, READY)


def succeeded(conn: psycopg.Connection) -> int:
    row = conn.execute(COUNT_SUCCEEDED).fetchone()
    return int(row[0]) if row else 0


def check(conn: psycopg.Connection, runs: int) -> dict[str, Any]:
    """Read back what the worker did; raise unless every run succeeded exactly once."""
    row = conn.execute(CHECK_RUNS).fetchone()
    assert row is not None
    total, finished, max_attempt, first_attempted, last_completed = row
    found = {"total": total, "finished": finished, "max_attempt": max_attempt}
    if not (total == finished == runs and max_attempt == 1):
        raise BenchError(f"tidegate: expected {runs} runs succeeded once each, found {found}")
    return {**found, "first_attempted": first_attempted, "last_completed": last_completed}


# -- the three workloads ---------------------------------------------------------------


def measure_enqueue(url: str, runs: int, batch: int) -> dict[str, Any]:
    """``enqueue_many`` in batches on the sync API; return runs/s."""
    with fresh_schema(url, "tidegate") as schema:
        app = open_app(url, schema)
        try:
            app.list_runs(limit=1)  # opens the pool: connecting is not enqueueing
            started = time.perf_counter()
            for first in range(0, runs, batch):
                app.enqueue_many(
                    [NewRun("noop", {"i": i}) for i in range(first, min(first + batch, runs))]
                )
            seconds = time.perf_counter() - started
        finally:
            app.close()
        with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*), count(DISTINCT args->>'i') FROM runs WHERE state = 'available'"
            ).fetchone()
        if row != (runs, runs):
            raise BenchError(f"tidegate enqueue: expected {runs} distinct runs, found {row}")
        return {"runs": runs, "seconds": seconds, "rate": runs / seconds, "verified": True}


def measure_drain(url: str, runs: int, slots: int) -> dict[str, Any]:
    """Fill the queue, start one worker, time first claim to last completion."""
    with fresh_schema(url, "tidegate") as schema:
        app = open_app(url, schema)
        try:
            for first in range(0, runs, LOAD_BATCH):
                size = min(LOAD_BATCH, runs - first)
                app.enqueue_many([NewRun("noop", {"i": i}) for i in range(first, first + size)])
        finally:
            app.close()
        settle(url, schema, "runs")
        with (
            psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn,
            start_worker(url, schema, slots) as worker,
        ):
            done = wait_for(
                lambda: succeeded(conn) >= runs,
                timeout=max(60.0, runs / 100),
                what="tidegate drain",
                worker=worker,
                interval=0.25,
            )
            worker.stop()
            found = check(conn, runs)
        seconds = (found.pop("last_completed") - found.pop("first_attempted")).total_seconds()
        return {
            "runs": runs,
            "seconds": seconds,
            "rate": runs / seconds,
            "wall_seconds": done - worker.started_at,
            "verified": True,
            **found,
        }


def measure_wakeup(url: str, runs: int, interval: float, warmup: int, slots: int) -> dict[str, Any]:
    """Enqueue one run every ``interval`` seconds to an idle worker; time each wake-up."""
    with fresh_schema(url, "tidegate") as schema:
        app = open_app(url, schema)
        try:
            with (
                psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn,
                start_worker(url, schema, slots) as worker,
            ):
                worker.wait_ready()
                for _ in paced(warmup, interval):
                    app.enqueue("wakeup", {"warmup": True})
                wait_for(lambda: succeeded(conn) >= warmup, timeout=30, what="tidegate warm-up")
                for k in paced(runs, interval):
                    app.enqueue("wakeup", {"k": k, "enqueued_at": time.time()})
                wait_for(
                    lambda: succeeded(conn) >= warmup + runs,
                    timeout=30,
                    what="tidegate wake-up",
                    worker=worker,
                )
                worker.stop()
                check(conn, warmup + runs)
                rows = conn.execute(WAKEUP_SAMPLES).fetchall()
        finally:
            app.close()
        return {**wakeup_figures(rows), "runs": runs, "verified": len(rows) == runs}
