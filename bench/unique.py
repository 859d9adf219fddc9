"""What the unique option costs a single enqueue.

::

    python -m bench.unique          # embedded PostgreSQL (or TIDEGATE_DATABASE_URL)
    python -m bench.unique --database-url postgresql://postgres@127.0.0.1:5432/test

One client enqueues ``--runs`` runs one call at a time (each its own transaction), in
three variants, interleaved in each of ``--repeat`` rounds so that the machine's drift
falls on all three alike:

  plain             no option: the path every ordinary run takes
  unique, new       ``unique=Unique(period=3600)``, args differ: each call inserts
  unique, repeat    the same args each call: each finds the run that holds the key
                    (the insert that conflicts, then the read of the holder)

The figures are the medians over the rounds of each variant's calls per second, with
the ratio to ``plain``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
import uuid

from tidegate import Settings, Tidegate, Unique

VARIANTS = ("plain", "unique, new", "unique, repeat")


def measure(app: Tidegate, variant: str, runs: int, round_: int) -> float:
    """Enqueue ``runs`` runs one by one; return calls per second."""
    unique = None if variant == "plain" else Unique(period=3600)
    start = time.perf_counter()
    for i in range(runs):
        args = {"round": round_} if variant == "unique, repeat" else {"round": round_, "i": i}
        app.enqueue("bench.noop", args, unique=unique)
    return runs / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("TIDEGATE_DATABASE_URL"))
    parser.add_argument("--runs", type=int, default=1_000, help="calls per variant and round")
    parser.add_argument("--repeat", type=int, default=7)
    options = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # no worker has the task: expected
    schema = f"bench_unique_{uuid.uuid4().hex[:8]}"
    app = Tidegate(settings=Settings(database_url=options.database_url, schema=schema))
    app.migrate()
    rates: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    try:
        measure(app, "plain", 200, -1)  # warm the pool and the statements' plans
        for round_ in range(options.repeat):
            order = VARIANTS[round_ % 3 :] + VARIANTS[: round_ % 3]
            for variant in order:
                rates[variant].append(measure(app, variant, options.runs, round_))
        with app.database.connect() as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    finally:
        app.close()
    plain = statistics.median(rates["plain"])
    print(f"single enqueue, {options.runs} calls per variant, medians of {options.repeat} rounds")
    print("| variant | calls/s | µs per call | / plain |")
    print("| --- | ---: | ---: | ---: |")
    for variant in VARIANTS:
        rate = statistics.median(rates[variant])
        print(f"| {variant} | {rate:,.0f} | {1e6 / rate:,.0f} | {rate / plain:.2f} |")


if __name__ == "__main__":
    main()
