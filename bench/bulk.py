"""The claim rate of a busy lane while a bulk retry of 100,000 runs proceeds.

::

    python -m bench.bulk                    # embedded PostgreSQL (or TIDEGATE_DATABASE_URL)
    python -m bench.bulk --database-url postgresql://postgres@127.0.0.1:5432/test --write-docs

Each repetition, on a schema of its own, behind one ``tidegate serve --role api``:

1. ``--finished`` runs of ``bench.report`` in lane ``default`` (a task no worker has),
   enqueued and then cancelled by ``POST /runs/cancel-matching``: finished runs, as a
   failed import leaves them.
2. A ready backlog of no-op runs in lane ``drain``, kept between 5,000 and 10,000 by a
   feeder thread (one ``enqueue_many`` of 5,000 whenever it falls below), drained by one
   ``tidegate worker --app bench.bulk:app --workloops drain:16`` process.
3. ``--seconds`` of the drain alone (``before``), then ``POST /runs/retry-matching``
   ``{"task": "bench.report", "state": "cancelled", "limit": 100000}`` (``during``: the
   request's whole length), then ``--seconds`` more (``after``).

The drain's claim rate in each phase is the ``drain`` runs whose ``attempted_at`` (the
claim's time, by the database's clock) falls in it, per second; ``worst second`` is the
fewest claims in one whole second of the phase. The bulk retry's own rate is the runs it
retried over the request's length. Each repetition checks that every ``bench.report``
run is ``available`` again, in ``default``.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import statistics
import sys
import threading
import time
from typing import Any

import httpx
import psycopg

from bench.harness import (
    BenchError,
    WorkerProcess,
    child_env,
    close_record,
    fresh_schema,
    new_record,
    progress,
    publish,
    python_module,
    redact,
    schema_conninfo,
    start_run,
)
from bench.webhooks.common import ADMIN, WORKER_READY
from bench.webhooks.processes import ApiServer
from tidegate import NewRun, Settings, Tidegate

DESCRIPTION = "The claim rate of a busy lane while a bulk retry of 100,000 runs proceeds."
app = Tidegate()


@app.task(name="bench.drain")
async def drain(**args: Any) -> None:
    """The drain's handler: nothing, so what is measured is the claim."""


LANE = "drain"
WORKLOOPS = f"{LANE}:16"
TASK = "bench.report"
LOW, TOP_UP = 5_000, 5_000
"""The feeder enqueues TOP_UP drain runs whenever fewer than LOW are ready."""
FEED_SECONDS = 0.2
ENQUEUE_CHUNK = 10_000
HTTP_SECONDS = 600.0
PHASES = ("before", "during", "after")
SMOKE = {"finished": 2_000, "seconds": 2.0, "repeat": 1}

READY_DRAIN = (
    "SELECT count(*) FROM (SELECT 1 FROM runs WHERE lane = %(lane)s AND state = 'available'"
    " LIMIT %(low)s) AS ready"
)
NOW = "SELECT extract(epoch FROM clock_timestamp())"
CLAIMS = (
    "SELECT extract(epoch FROM attempted_at) FROM runs"
    " WHERE lane = %(lane)s AND attempted_at >= to_timestamp(%(since)s)"
    " AND attempted_at < to_timestamp(%(until)s)"
)
RETRIED = (
    "SELECT count(*) FILTER (WHERE state = 'available' AND lane = 'default'), count(*)"
    " FROM runs WHERE task = %(task)s"
)


class Feeder:
    """Keep the drain lane's ready backlog between LOW and LOW + TOP_UP, in a thread."""

    def __init__(self, tidegate: Tidegate, conninfo: str) -> None:
        self.tidegate = tidegate
        self.conninfo = conninfo
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._feed, name="bench-feeder")

    def _feed(self) -> None:
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                while not self.stopping.is_set():
                    row = conn.execute(READY_DRAIN, {"lane": LANE, "low": LOW}).fetchone()
                    if row is not None and row[0] < LOW:
                        self.tidegate.enqueue_many(
                            NewRun("bench.drain", lane=LANE) for _ in range(TOP_UP)
                        )
                    else:
                        self.stopping.wait(FEED_SECONDS)
        except BaseException as error:  # reported by check(): the measurement is void
            self.error = error

    def __enter__(self) -> Feeder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()

    def check(self) -> None:
        if self.error is not None:
            raise BenchError(f"the feeder failed: {self.error!r}")


def finished_runs(tidegate: Tidegate, base: str, count: int) -> None:
    """Make ``count`` cancelled runs of TASK: enqueued, then cancelled in bulk."""
    for start in range(0, count, ENQUEUE_CHUNK):
        size = min(ENQUEUE_CHUNK, count - start)
        tidegate.enqueue_many(NewRun(TASK, {"row": start + i}) for i in range(size))
    answer = httpx.post(
        base + "/runs/cancel-matching",
        json={"task": TASK, "limit": count},
        headers=ADMIN,
        timeout=HTTP_SECONDS,
    )
    answer.raise_for_status()
    if answer.json()["cancelled"] != count:
        raise BenchError(f"cancelled {answer.json()} of {count} runs")


def claim_rates(
    conn: psycopg.Connection, windows: dict[str, tuple[float, float]]
) -> dict[str, Any]:
    """The drain's claims per second in each window, and its worst whole second."""
    found: dict[str, Any] = {}
    for phase, (since, until) in windows.items():
        rows = conn.execute(CLAIMS, {"lane": LANE, "since": since, "until": until}).fetchall()
        seconds = int(until - since)
        per_second = [0] * max(seconds, 1)
        for (at,) in rows:
            second = int(float(at) - since)
            if second < len(per_second):
                per_second[second] += 1
        found[phase] = {
            "claims": len(rows),
            "seconds": round(until - since, 3),
            "rate": round(len(rows) / (until - since), 1) if until > since else 0.0,
            "worst_second": min(per_second) if seconds >= 1 else None,
        }
    return found


def measure(url: str, finished: int, seconds: float) -> dict[str, Any]:
    """One repetition on a fresh schema: the three phases' claim rates and the bulk's."""
    with fresh_schema(url, "bulk") as schema:
        conninfo = schema_conninfo(url, schema)
        with Tidegate(settings=Settings(database_url=url, schema=schema)) as tidegate:
            tidegate.migrate()
            with ApiServer(url, schema, 1) as api:
                finished_runs(tidegate, api.base, finished)
                env = child_env(TIDEGATE_DATABASE_URL=url, TIDEGATE_SCHEMA=schema)
                argv = python_module(
                    "tidegate", "worker", "--app", "bench.bulk:app", "--workloops", WORKLOOPS
                )
                with (
                    psycopg.connect(conninfo, autocommit=True) as conn,
                    Feeder(tidegate, conninfo) as feeder,
                    WorkerProcess(argv, env, WORKER_READY) as worker,
                ):
                    worker.wait_ready()
                    time.sleep(1.0)  # the worker's first claims and the feeder settle
                    windows, bulk = phases(conn, api.base, finished, seconds)
                    feeder.check()
                    worker.check_alive()
                    worker.stop()
                api.stop()
            with psycopg.connect(conninfo, autocommit=True) as conn:
                rates = claim_rates(conn, windows)
                row = conn.execute(RETRIED, {"task": TASK}).fetchone()
    if row is None or row[0] != finished or row[1] != finished:
        raise BenchError(f"of {finished} runs, {row} are available again in 'default'")
    if bulk["retried"] != finished:
        raise BenchError(f"the bulk retry retried {bulk['retried']} of {finished} runs")
    return {**rates, "bulk": bulk}


def phases(
    conn: psycopg.Connection, base: str, finished: int, seconds: float
) -> tuple[dict[str, tuple[float, float]], dict[str, Any]]:
    """Run the three phases; return their windows (database clock) and the bulk's figures."""

    def now() -> float:
        row = conn.execute(NOW).fetchone()
        assert row is not None
        return float(row[0])

    start = now()
    time.sleep(seconds)
    bulk_start = now()
    answer = httpx.post(
        base + "/runs/retry-matching",
        json={"task": TASK, "state": "cancelled", "limit": finished},
        headers=ADMIN,
        timeout=HTTP_SECONDS,
    )
    bulk_end = now()
    answer.raise_for_status()
    time.sleep(seconds)
    end = now()
    took = bulk_end - bulk_start
    retried = int(answer.json()["retried"])
    bulk = {"retried": retried, "seconds": round(took, 3), "rate": round(retried / took, 1)}
    windows = {
        "before": (start, bulk_start),
        "during": (bulk_start, bulk_end),
        "after": (bulk_end, end),
    }
    return windows, bulk


def run_benchmark(
    url: str, finished: int, seconds: float, repeat: int, progress: Any = progress
) -> list[dict[str, Any]]:
    samples = []
    for repetition in range(repeat):
        found = measure(url, finished, seconds)
        samples.append(found)
        progress(
            f"#{repetition + 1}: "
            + ", ".join(f"{p} {found[p]['rate']:,.0f} claims/s" for p in PHASES)
            + f"; bulk {found['bulk']['retried']:,} in {found['bulk']['seconds']:.1f} s"
        )
    return samples


def render(result: dict[str, Any]) -> str:
    samples = result["samples"]

    def median(pick: Any) -> float:
        return statistics.median(pick(sample) for sample in samples)

    lines = [
        f"One worker (`{WORKLOOPS}`) draining no-op runs while `POST /runs/retry-matching`"
        f" retries {result['finished']:,} cancelled runs of another task (batches of 500);"
        f" medians of {len(samples)}, each phase's claims from the runs' `attempted_at`.",
        "",
        "| phase | drain claims/s | worst second | length (s) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for phase in PHASES:
        worst = [s[phase]["worst_second"] for s in samples if s[phase]["worst_second"] is not None]
        lines.append(
            f"| {phase} | {median(lambda s, p=phase: s[p]['rate']):,.0f}"
            f" | {f'{statistics.median(worst):,.0f}' if worst else '-'}"
            f" | {median(lambda s, p=phase: s[p]['seconds']):.1f} |"
        )
    lines += [
        "",
        f"The bulk retry: {median(lambda s: s['bulk']['rate']):,.0f} runs/s,"
        f" {median(lambda s: s['bulk']['seconds']):.1f} s for {result['finished']:,} runs.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bulk", description=DESCRIPTION)
    parser.add_argument("--database-url", help="PostgreSQL to measure on (default: embedded)")
    parser.add_argument("--finished", type=int, default=100_000, help="runs retried (100,000)")
    parser.add_argument("--seconds", type=float, default=15.0, help="before and after (15)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (3)")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/benchmarks.md")
    parser.add_argument("--snapshot", action="store_true", help="measure a copy of the code")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, nothing written")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # no worker has bench.report: expected
    if args.smoke:
        args.finished, args.seconds, args.repeat = SMOKE.values()
    url, embedded = start_run("bench.bulk", sys.argv[1:], args.database_url, args.snapshot)
    started = time.monotonic()
    command = "python -m bench.bulk " + shlex.join(sys.argv[1:] if argv is None else argv)
    result = new_record(redact(url), command, embedded, finished=args.finished)
    result["samples"] = run_benchmark(url, args.finished, args.seconds, args.repeat)
    close_record(result, started, progress)
    publish(result, render(result), "bulk", smoke=args.smoke, write_docs=args.write_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
