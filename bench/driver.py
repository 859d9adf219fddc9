"""The workloads, measured the same way on every system through its adapter.

Run by ``bench/run.py`` with the Python of the system's own environment, once per
measurement, on a database of the measurement's own; the figures go to stdout as one
line of JSON::

    python -m bench.driver measure SYSTEM WORKLOAD --database-url URL --options JSON
    python -m bench.driver worker SYSTEM --database-url URL --concurrency 32 --samples FILE

``worker`` is the system's worker process, started by ``measure``: it runs the
adapter's worker until SIGTERM and then writes what its handlers saw (each job's start
time, and the enqueue time that timed jobs carry in their args) to ``--samples``.

Nothing counts unless it checks out: after every workload the database must hold every
job (enqueue) or record every job completed (the others), and the worker's handlers must
have started each job exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.harness import BenchError, WorkerProcess, child_env, paced, percentiles
from bench.systems.base import Adapter, Job

READY = "bench worker ready"
POLL = 0.025
"""How often the driver reads the done count while it waits (seconds)."""
LOAD_BATCH = 5_000
"""Jobs per batch when a backlog is loaded before it is worked off (not measured)."""


@dataclass(frozen=True)
class Options:
    """What the workloads do; the defaults are the published benchmark."""

    jobs: int = 20_000
    batch: int = 1_000
    single_jobs: int = 2_000
    concurrency: int = 32
    wakeup_jobs: int = 200
    wakeup_interval_ms: float = 20.0
    wakeup_warmup: int = 20
    hot_jobs: int = 20_000
    cold_tenants: int = 20
    cold_per_tenant: int = 5
    cold_interval_ms: float = 5.0
    cold_after: int = 1_000


def load(system: str, url: str) -> Adapter:
    module = importlib.import_module(f"bench.systems.{system}")
    adapter: Adapter = module.ADAPTER(url)
    return adapter


# -- the worker process ----------------------------------------------------------------


class Samples:
    """What the handlers saw: how many jobs started, when, and the timed jobs' waits."""

    def __init__(self) -> None:
        self.starts = 0
        self.first_start: float | None = None
        self.seen: set[Any] = set()
        self.duplicates = 0
        self.timed: list[tuple[float, float, str]] = []

    def on_start(self, args: dict[str, Any]) -> None:
        now = time.time()
        self.starts += 1
        if self.first_start is None:
            self.first_start = now
        ident = (args.get("i"), args.get("k"), args.get("w"))
        if ident in self.seen:
            self.duplicates += 1
        self.seen.add(ident)
        if "t" in args:
            self.timed.append((float(args["t"]), now, str(args.get("tenant", ""))))

    def as_dict(self) -> dict[str, Any]:
        return {
            "starts": self.starts,
            "first_start": self.first_start,
            "duplicates": self.duplicates,
            "timed": self.timed,
        }


async def serve_worker(adapter: Adapter, concurrency: int, samples_path: Path) -> None:
    samples = Samples()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    work = asyncio.create_task(adapter.work(concurrency, samples.on_start, stop))
    print(READY, file=sys.stderr, flush=True)
    await work
    samples_path.write_text(json.dumps(samples.as_dict()))


class Worker:
    """The system's worker process, as the driver starts, stops and reads it."""

    def __init__(self, python: str, system: str, url: str, concurrency: int) -> None:
        self.samples_path = Path(tempfile.mkstemp(prefix="bench-samples-", suffix=".json")[1])
        argv = [python, "-m", "bench.driver", "worker", system, "--database-url", url]
        argv += ["--concurrency", str(concurrency), "--samples", str(self.samples_path)]
        self.process = WorkerProcess(argv, child_env(), READY)

    def stop(self) -> dict[str, Any]:
        """Stop the worker (SIGTERM, clean exit required) and return its samples."""
        self.process.stop()
        found: dict[str, Any] = json.loads(self.samples_path.read_text())
        return found

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.samples_path.unlink(missing_ok=True)


# -- measuring -------------------------------------------------------------------------


class Measurement:
    """One workload on one system, on a database of its own."""

    def __init__(self, system: str, url: str, options: Options) -> None:
        self.system = system
        self.url = url
        self.options = options
        self.adapter = load(system, url)
        self.conn = psycopg.connect(url, autocommit=True)

    def run(self, workload: str) -> dict[str, Any]:
        measure = getattr(self, f"measure_{workload}")
        asyncio.run(self.adapter.install())
        try:
            found: dict[str, Any] = measure()
        finally:
            self.conn.close()
        return {**found, "fairness": self.adapter.fairness}

    # -- shared steps

    def load_backlog(self, jobs: list[Job]) -> None:
        async def load() -> None:
            await self.adapter.open()
            try:
                for first in range(0, len(jobs), LOAD_BATCH):
                    await self.adapter.enqueue_many(jobs[first : first + LOAD_BATCH])
            finally:
                await self.adapter.close()

        asyncio.run(load())
        queued = self.adapter.count_queued(self.conn)
        if queued != len(jobs):
            raise BenchError(f"{self.system}: loaded {len(jobs)} jobs, {queued} queued")
        for table in self.adapter.tables:
            self.conn.execute(
                sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(*table.split(".")))
            )
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            self.conn.execute("CHECKPOINT")

    def worker(self) -> Worker:
        return Worker(sys.executable, self.system, self.url, self.options.concurrency)

    def wait_done(self, count: int, worker: Worker, timeout: float) -> float:
        """Poll the done count until it reaches ``count``; return when (wall time)."""
        deadline = time.monotonic() + timeout
        while self.adapter.count_done(self.conn) < count:
            worker.process.check_alive()
            if time.monotonic() > deadline:
                done = self.adapter.count_done(self.conn)
                raise BenchError(f"{self.system}: {done} of {count} jobs done in {timeout:.0f}s")
            time.sleep(POLL)
        return time.time()

    def check_worked(self, samples: dict[str, Any], count: int) -> dict[str, Any]:
        """Every job done in the database, and started exactly once by a handler."""
        done = self.adapter.count_done(self.conn)
        problems = []
        if done != count:
            problems.append(f"{done} of {count} jobs recorded done")
        if samples["starts"] != count or samples["duplicates"]:
            problems.append(
                f"handlers started {samples['starts']} times for {count} jobs "
                f"({samples['duplicates']} repeats)"
            )
        if problems:
            raise BenchError(f"{self.system}: " + "; ".join(problems))
        return {"done": done, "starts": samples["starts"], "verified": True}

    # -- the workloads

    def _enqueue(self, count: int, batch: int | None) -> dict[str, Any]:
        jobs = [Job("t0", {"i": i}) for i in range(count)]

        async def enqueue() -> float:
            await self.adapter.open()
            try:
                started = time.perf_counter()
                if batch is None:
                    for job in jobs:
                        await self.adapter.enqueue_one(job)
                else:
                    for first in range(0, count, batch):
                        await self.adapter.enqueue_many(jobs[first : first + batch])
                return time.perf_counter() - started
            finally:
                await self.adapter.close()

        start = self.conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        seconds = asyncio.run(enqueue())
        # The server's WAL written meanwhile: this enqueue's, and whatever else wrote
        # (the benchmark's measurements take turns; a busy server shows here).
        wal = self.conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", start
        ).fetchone()
        assert wal is not None
        queued = self.adapter.count_queued(self.conn)
        if queued != count:
            raise BenchError(f"{self.system}: enqueued {count} jobs, {queued} found queued")
        return {
            "jobs": count,
            "seconds": seconds,
            "rate": count / seconds,
            "wal_bytes_per_job": float(wal[0]) / count,
            "index_entries_per_job": self.index_entries() / count,
            "verified": True,
        }

    def index_entries(self) -> int:
        """The entries the indexes of the system's tables hold: for each index, its
        table's rows that meet its predicate (on a fresh database after an enqueue, the
        entries the enqueue wrote)."""
        total = 0
        for table in self.adapter.tables:
            name = sql.Identifier(*table.split("."))
            predicates = self.conn.execute(
                "SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indrelid = %s::regclass",
                [name.as_string(self.conn)],
            ).fetchall()
            for (predicate,) in predicates:
                where = sql.SQL(predicate or "true")  # the catalog's own text
                row = self.conn.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE {}").format(name, where)
                ).fetchone()
                total += row[0] if row else 0
        return total

    def measure_enqueue(self) -> dict[str, Any]:
        return self._enqueue(self.options.jobs, self.options.batch)

    def measure_single(self) -> dict[str, Any]:
        return self._enqueue(self.options.single_jobs, None)

    def measure_drain(self) -> dict[str, Any]:
        count = self.options.jobs
        self.load_backlog([Job("t0", {"i": i}) for i in range(count)])
        with self.worker() as worker:
            done_at = self.wait_done(count, worker, timeout=max(120.0, count / 50))
            samples = worker.stop()
        seconds = done_at - samples["first_start"]
        checked = self.check_worked(samples, count)
        return {"jobs": count, "seconds": seconds, "rate": count / seconds, **checked}

    def measure_wakeup(self) -> dict[str, Any]:
        o = self.options
        interval = o.wakeup_interval_ms / 1000

        async def send(count: int, timed: bool) -> None:
            await self.adapter.open()
            try:
                for k in paced(count, interval):
                    args = {"k": k, "t": time.time()} if timed else {"w": k}
                    await self.adapter.enqueue_one(Job("t0", args))
            finally:
                await self.adapter.close()

        with self.worker() as worker:
            worker.process.wait_ready()
            asyncio.run(send(o.wakeup_warmup, timed=False))
            self.wait_done(o.wakeup_warmup, worker, timeout=60)
            asyncio.run(send(o.wakeup_jobs, timed=True))
            self.wait_done(o.wakeup_warmup + o.wakeup_jobs, worker, timeout=60)
            samples = worker.stop()
        checked = self.check_worked(samples, o.wakeup_warmup + o.wakeup_jobs)
        waits = [(started - sent) * 1000 for sent, started, _ in samples["timed"]]
        return {"jobs": o.wakeup_jobs, "wait_ms": percentiles(waits), **checked}

    def measure_starvation(self) -> dict[str, Any]:
        o = self.options
        cold = o.cold_tenants * o.cold_per_tenant
        self.load_backlog([Job("hot", {"i": i}) for i in range(o.hot_jobs)])

        async def send() -> None:
            await self.adapter.open()
            try:
                for k in paced(cold, o.cold_interval_ms / 1000):
                    tenant = f"cold-{k % o.cold_tenants}"
                    await self.adapter.enqueue_one(
                        Job(tenant, {"k": k, "t": time.time(), "tenant": tenant})
                    )
            finally:
                await self.adapter.close()

        with self.worker() as worker:
            self.wait_done(o.cold_after, worker, timeout=120)
            hot_queued = self.adapter.count_queued(self.conn)
            asyncio.run(send())
            self.wait_done(o.hot_jobs + cold, worker, timeout=max(120.0, o.hot_jobs / 50))
            samples = worker.stop()
        checked = self.check_worked(samples, o.hot_jobs + cold)
        waits = [(started - sent) * 1000 for sent, started, _ in samples["timed"]]
        return {
            "jobs": cold,
            "hot_queued_when_cold_arrived": hot_queued,
            "wait_ms": percentiles(waits),
            **checked,
        }


# -- the command -----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.driver")
    commands = parser.add_subparsers(dest="command", required=True)
    measure = commands.add_parser("measure", help="measure one workload on one system")
    measure.add_argument("system")
    measure.add_argument("workload")
    measure.add_argument("--database-url", required=True)
    measure.add_argument("--options", default="{}", help="Options as JSON")
    worker = commands.add_parser("worker", help="run the system's worker until SIGTERM")
    worker.add_argument("system")
    worker.add_argument("--database-url", required=True)
    worker.add_argument("--concurrency", type=int, required=True)
    worker.add_argument("--samples", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "worker":
        adapter = load(args.system, args.database_url)
        loop_factory = None
        if adapter.uvloop:
            import uvloop

            loop_factory = uvloop.new_event_loop
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(serve_worker(adapter, args.concurrency, args.samples))
        return
    options = Options(**json.loads(args.options))
    result = Measurement(args.system, args.database_url, options).run(args.workload)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
