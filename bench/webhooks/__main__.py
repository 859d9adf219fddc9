"""``python -m bench.webhooks``: the command."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from bench.harness import (
    DOCS,
    EMBEDDED_DATA_DIR,
    RESULTS,
    ROOT,
    redact,
    start_run,
    write_results,
)
from bench.webhooks.common import SMOKE, Options
from bench.webhooks.report import render, run_benchmark, server_label, write_docs

# -- the command ----------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.webhooks",
        description="tidegate's webhook path over HTTP: sync round trip, admission, ingest.",
    )
    parser.add_argument(
        "--database-url",
        help="PostgreSQL to measure on (default: TIDEGATE_DATABASE_URL, else an embedded "
        f"PostgreSQL 18 under {EMBEDDED_DATA_DIR.relative_to(ROOT)})",
    )
    default = Options()
    parser.add_argument("--repeat", type=int, default=default.repeat, help="repetitions (3)")
    parser.add_argument("--rate", type=float, default=default.rate, help="sync req/s (100)")
    parser.add_argument("--steady-seconds", type=float, default=default.steady_seconds)
    parser.add_argument("--burst", type=int, default=default.burst, help="sync burst size")
    parser.add_argument("--ingest-requests", type=int, default=default.ingest_requests)
    parser.add_argument("--ingest-clients", type=int, default=default.ingest_clients)
    parser.add_argument(
        "--api-processes",
        type=int,
        default=default.ingest_api_processes,
        help="API processes for the async ingest (2)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a few requests of each part, once: checks only"
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="where to write the JSON (default: bench/results/http-latest.json and "
        "bench/results/http-postgres<major>[-embedded].json; nothing for --smoke)",
    )
    parser.add_argument(
        "--write-docs", action="store_true", help="rewrite the figures in docs/benchmarks.md"
    )
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="measure a copy of src/tidegate taken at start (in this process and every "
        "process it starts), so that edits to the tree during the run cannot mix versions",
    )
    args = parser.parse_args(argv)
    if args.smoke and args.write_docs:
        parser.error("--smoke measures too little to publish; drop --write-docs")
    if min(args.repeat, args.burst, args.ingest_requests, args.ingest_clients) < 1:
        parser.error("--repeat, --burst, --ingest-requests and --ingest-clients must be >= 1")
    if args.api_processes < 1 or args.rate <= 0 or args.steady_seconds <= 0:
        parser.error("--api-processes, --rate and --steady-seconds must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    url, embedded = start_run("bench.webhooks", argv, args.database_url, args.snapshot)
    if args.smoke:
        options = SMOKE
    else:
        options = Options(
            repeat=args.repeat,
            rate=args.rate,
            steady_seconds=args.steady_seconds,
            burst=args.burst,
            ingest_requests=args.ingest_requests,
            ingest_clients=args.ingest_clients,
            ingest_api_processes=args.api_processes,
        )
    command = shlex.join(["python", "-m", "bench.webhooks", *(redact(a) for a in argv)])
    print(f"tidegate webhook benchmark: {command}", file=sys.stderr)
    result = run_benchmark(
        url,
        options,
        embedded=embedded,
        command=command,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(render(result))
    if args.output:
        write_results(result, args.output)
    elif not args.smoke:
        write_results(result, RESULTS / "http-latest.json")
        write_results(result, RESULTS / f"{server_label(result)}.json")
    if args.write_docs:
        write_docs()
        print(f"wrote {DOCS.relative_to(ROOT)}", file=sys.stderr)
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
