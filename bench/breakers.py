"""What one dead downstream costs the other keys, with circuit breakers on and off.

::

    python -m bench.breakers          # embedded PostgreSQL (or TIDEGATE_DATABASE_URL)
    python -m bench.breakers --database-url postgresql://postgres@127.0.0.1:5432/test

Twenty keys share one lane, each with ``--runs`` runs of a task that calls its key's
downstream: nineteen answer in ``--call-ms`` milliseconds; one, the dead key's, never
answers, and the task's 2 s timeout ends each of its attempts (which are retried, with
a short backoff, as long as the run lasts). One worker with ``--slots`` slots drains
the lane. The figure is the nineteen healthy keys' throughput, runs per second from
their first claim to their last completion (the database's clock), in five scenarios,
each on a schema of its own, in turn, ``--repeat`` times:

  no dead key                 the twentieth key is healthy too (only the 19 count)
  no dead key, breakers on    the same, with the breaker policy below set: what the
                              claim that enforces key policies costs by itself
  breakers off                the dead key has no breaker: each attempt holds a slot 2 s
  breakers on                 the lane's default policy opens a breaker after 3 failures
                              in 60 s, for 30 s: the dead key's runs then wait unclaimed
  breakers on, max_running 2  and each key at most 2 runs in flight, which bounds the
                              slots the dead key holds before its first failures are known

Each is reported over the whole drain and past its first ``SETTLED_SECONDS``: until the
first attempt times out (2 s), nothing can know the key is dead.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import uuid
from typing import Any

from psycopg import sql

from tidegate import NewRun, Settings, Tidegate
from tidegate.policies import set_key_policy
from tidegate.worker.runtime import Worker

KEYS = 20
DEAD = f"k{KEYS - 1:02d}"
TIMEOUT_SECONDS = 2.0
SCENARIOS = (
    "no dead key",
    "no dead key, breakers on",
    "breakers off",
    "breakers on",
    "breakers on, max_running 2",
)
SETTLED_SECONDS = 5.0
BREAKER = {"breaker_failures": 3, "breaker_window_seconds": 60, "breaker_cooldown_seconds": 30}


async def healthy_throughput(
    database_url: str | None, scenario: str, runs: int, call_ms: float, slots: int
) -> tuple[float, float]:
    """Run one scenario on a fresh schema; return the healthy keys' runs per second,
    whole and settled (``_throughput``)."""
    settings = Settings(
        database_url=database_url,
        schema=f"bench_breakers_{uuid.uuid4().hex[:8]}",
        workloops=f"manual>*:{slots}",
        backoff_base_seconds=0.1,
        backoff_max_seconds=1.0,
        shutdown_grace_seconds=0.5,
    )
    app = Tidegate(settings=settings)
    app.migrate()

    @app.task(name="bench.call", timeout=TIMEOUT_SECONDS, max_attempts=1000)
    async def call(dead: bool) -> None:
        await asyncio.sleep(3600 if dead else call_ms / 1000)

    try:
        if "breakers on" in scenario:
            limit = {"max_running": 2} if "max_running" in scenario else {}
            app.execute(set_key_policy("default", "*", **BREAKER, **limit))
        dead = not scenario.startswith("no dead key")
        app.enqueue_many(
            NewRun("bench.call", {"dead": dead and key == DEAD}, key=key)
            for _ in range(runs)
            for key in (f"k{n:02d}" for n in range(KEYS))
        )
        worker = Worker(app, settings)
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        healthy = runs * (KEYS - 1)
        while _succeeded(app) < healthy:
            await asyncio.sleep(0.05)
        stop.set()
        await running
        return _throughput(app)
    finally:
        with app.database.connect() as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(settings.schema)))
        app.close()


def _succeeded(app: Tidegate) -> int:
    with app.database.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM runs WHERE state = 'succeeded' AND key <> %s", [DEAD]
        ).fetchone()
    return int(row[0]) if row else 0


def _throughput(app: Tidegate) -> tuple[float, float]:
    """The healthy keys' runs per second over the whole drain, and past its first
    ``SETTLED_SECONDS`` (once the breaker has had the time to learn the key is dead)."""
    with app.database.connect() as conn:
        row = conn.execute(
            "WITH healthy AS (SELECT attempted_at, completed_at FROM runs"
            "                 WHERE state = 'succeeded' AND key <> %(dead)s),"
            " span AS (SELECT min(attempted_at) AS first, max(completed_at) AS last"
            "          FROM healthy)"
            " SELECT count(*) / extract(epoch FROM last - first),"
            "        count(*) FILTER (WHERE completed_at >= first + %(settled)s * interval '1 s')"
            "        / extract(epoch FROM last - first - %(settled)s * interval '1 s')"
            " FROM healthy, span GROUP BY first, last",
            {"dead": DEAD, "settled": SETTLED_SECONDS},
        ).fetchone()
    assert row is not None
    return float(row[0]), float(row[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("TIDEGATE_DATABASE_URL"))
    parser.add_argument("--runs", type=int, default=300, help="runs per key")
    parser.add_argument("--call-ms", type=float, default=20.0, help="a healthy call's time")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the dead key's timeouts are expected
    figures: dict[str, list[tuple[float, float]]] = {scenario: [] for scenario in SCENARIOS}
    for round_ in range(options.repeat):
        for scenario in SCENARIOS:
            whole, settled = asyncio.run(
                healthy_throughput(
                    options.database_url, scenario, options.runs, options.call_ms, options.slots
                )
            )
            figures[scenario].append((whole, settled))
            print(
                f"round {round_ + 1}: {scenario:<13} {whole:7.1f} runs/s, settled {settled:7.1f}",
                flush=True,
            )
    report(figures, options)


def report(figures: dict[str, list[tuple[float, float]]], options: Any) -> None:
    medians = {
        scenario: [statistics.median(rate[i] for rate in rates) for i in (0, 1)]
        for scenario, rates in figures.items()
    }
    whole_base, settled_base = medians["no dead key"]
    print(
        f"\n19 healthy keys x {options.runs} runs, {options.call_ms:g} ms calls, "
        f"{options.slots} slots; medians of {options.repeat}, runs/s (ratio to no dead key):"
    )
    print(f"| scenario | whole drain | after the first {SETTLED_SECONDS:g} s |")
    print("| --- | --- | --- |")
    for scenario, (whole, settled) in medians.items():
        print(
            f"| {scenario} | {whole:.0f} ({whole / whole_base:.2f}) "
            f"| {settled:.0f} ({settled / settled_base:.2f}) |"
        )


if __name__ == "__main__":
    main()
