"""Run tidegate's benchmark: tidegate against a minimal raw-SQL queue, one database.

::

    python bench/run.py                       # embedded PostgreSQL 18 (or TIDEGATE_DATABASE_URL)
    python bench/run.py --database-url postgresql://postgres@127.0.0.1:5432/test
    python bench/run.py --smoke               # a few hundred runs, once: does it all work?
    python bench/run.py --write-docs          # also rewrite the figures in docs/benchmarks.md

Three workloads, each on a fresh schema, each repeated (``--repeat``, default 3) with
the two sides alternating who goes first; every figure is the median with min and max:

1. batch enqueue: ``--runs`` runs in batches of ``--batch`` on one connection, runs/s;
2. drain: ``--runs`` queued no-op runs worked off by one worker process with
   ``--slots`` slots, runs/s from the first claim to the last completion (both read
   from the table) after checking that every run completed exactly once;
3. wake-up: an idle worker; ``--wakeup-runs`` runs enqueued ``--wakeup-interval-ms``
   apart from this process; p50/p95/p99 of enqueue-to-handler-start, in ms.

The results go to ``bench/results/latest.json`` and, per server,
``bench/results/postgres<major>[-embedded].json``, which ``--write-docs`` renders into
``docs/benchmarks.md`` (between its ``bench:results`` markers).
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import os
import re
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as ``python bench/run.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import raw, tidegate_side
from bench.harness import (
    ROOT,
    BenchError,
    code_info,
    machine_info,
    server_info,
    source_digest,
    spread,
    tidegate_dir,
)

SNAPSHOT_ENV = "BENCH_TIDEGATE_SNAPSHOT"
"""Set in a run that re-executed itself on a copy of ``src/tidegate`` (``--snapshot``)."""
CODE_ENV = "BENCH_TIDEGATE_CODE"
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"
EMBEDDED_DATA_DIR = ROOT / ".tidegate" / "bench"
BEGIN, END = "<!-- bench:results:begin -->", "<!-- bench:results:end -->"

SIDES = {"tidegate": tidegate_side, "raw": raw}
WORKLOADS = ("enqueue", "drain", "wakeup")
PERCENTILES = ("p50", "p95", "p99")
STAGES = ("send", "wake", "start")
"""Wake-up stages: enqueue to insert start, insert start to claim start, claim to handler."""

AIMS = {"enqueue": 0.80, "drain": 0.60}
"""tidegate's throughput as a share of the raw queue's that it aims for."""
AIM_WAKEUP_P99_MS = 5.0


@dataclass(frozen=True)
class Options:
    """What to measure; the defaults are the published benchmark."""

    runs: int = 20_000
    batch: int = 1_000
    repeat: int = 3
    slots: int = 32
    wakeup_runs: int = 200
    wakeup_interval_ms: float = 20.0
    wakeup_warmup: int = 20
    workloads: tuple[str, ...] = WORKLOADS
    smoke: bool = False


SMOKE = Options(runs=300, batch=100, repeat=1, wakeup_runs=30, wakeup_warmup=5, smoke=True)


# -- measuring -------------------------------------------------------------------------


def measure(
    workload: str, side: str, url: str, options: Options, worker_commit: str
) -> dict[str, Any]:
    module: Any = SIDES[side]  # two modules with the same three measure_* functions
    # The raw worker commits the way tidegate's worker does (see ``worker_commit``).
    commit: dict[str, Any] = {"synchronous_commit": worker_commit} if side == "raw" else {}
    sample: dict[str, Any]
    if workload == "enqueue":
        sample = module.measure_enqueue(url, options.runs, options.batch)
    elif workload == "drain":
        sample = module.measure_drain(url, options.runs, options.slots, **commit)
    else:
        sample = module.measure_wakeup(
            url,
            options.wakeup_runs,
            options.wakeup_interval_ms / 1000,
            options.wakeup_warmup,
            options.slots,
            **commit,
        )
    return sample


def run_benchmark(
    url: str,
    options: Options,
    *,
    embedded: bool = False,
    command: str = "",
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Measure every workload on both sides against ``url``; return the results."""
    worker_commit = tidegate_side.worker_synchronous_commit(url)
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "options": dataclasses.asdict(options),
        "embedded": embedded,
        "machine": machine_info(),
        "server": server_info(url),
        "code": json.loads(os.environ[CODE_ENV]) if CODE_ENV in os.environ else code_info(),
        "durability": {
            "enqueue_synchronous_commit": "server setting, both sides",
            "worker_synchronous_commit": worker_commit,
        },
        "workloads": {},
    }
    started = time.monotonic()
    for workload in options.workloads:
        samples: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        for repetition in range(options.repeat):
            # Alternate who goes first, so a drift in the machine hits both sides alike.
            order = list(SIDES) if repetition % 2 == 0 else list(reversed(SIDES))
            for side in order:
                sample = measure(workload, side, url, options, worker_commit)
                samples[side].append(sample)
                progress(f"{workload:8} {side:9} #{repetition + 1}  {_describe(sample)}")
        result["workloads"][workload] = summarize(workload, samples)
    result["seconds"] = round(time.monotonic() - started, 1)
    result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if source_digest(tidegate_dir()) != result["code"].get("src_sha256"):
        # Worker processes started late in the run loaded different code than early ones.
        result["code"]["changed_during_run"] = True
        progress("warning: src/tidegate changed while the benchmark ran")
    return result


def _describe(sample: dict[str, Any]) -> str:
    if "rate" in sample:
        return f"{sample['rate']:,.0f} runs/s ({sample['runs']:,} verified)"
    ms = sample["handler_ms"]
    return (
        f"p50 {ms['p50']:.2f} ms, p95 {ms['p95']:.2f} ms, p99 {ms['p99']:.2f} ms"
        f" ({sample['samples']} verified)"
    )


def summarize(workload: str, samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Reduce repeated samples to median/min/max per side, the ratio, and the aim."""
    verified = all(s["verified"] for side in samples.values() for s in side)
    if workload in AIMS:
        sides: dict[str, dict[str, Any]] = {
            side: {"rate": spread([s["rate"] for s in found]), "samples": found}
            for side, found in samples.items()
        }
        ratio = sides["tidegate"]["rate"]["median"] / sides["raw"]["rate"]["median"]
        return {
            "unit": "runs/s",
            "verified": verified,
            **sides,
            "ratio": ratio,
            "aim": f"tidegate >= {AIMS[workload]:.0%} of raw",
            "met": ratio >= AIMS[workload],
        }
    sides = {}
    for side, found in samples.items():
        figures: dict[str, Any] = {"samples": found}
        for p in PERCENTILES:
            figures[p] = spread([s["handler_ms"][p] for s in found])
            figures[f"db_{p}"] = spread([s["db_ms"][p] for s in found])
        sides[side] = figures
    tidegate_p99 = sides["tidegate"]["p99"]["median"]
    return {
        "unit": "ms",
        "verified": verified,
        **sides,
        "ratio": {
            p: sides["tidegate"][p]["median"] / sides["raw"][p]["median"] for p in PERCENTILES
        },
        "aim": f"tidegate p99 <= {AIM_WAKEUP_P99_MS:g} ms",
        "met": tidegate_p99 <= AIM_WAKEUP_P99_MS,
    }


# -- reporting -------------------------------------------------------------------------


def _figure(s: dict[str, Any], digits: int) -> str:
    return f"{s['median']:,.{digits}f} ({s['min']:,.{digits}f} - {s['max']:,.{digits}f})"


def render(result: dict[str, Any]) -> str:
    """Return one run's results as Markdown: where, how, and the table."""
    server, machine, options = result["server"], result["machine"], result["options"]
    code = result.get("code", {})
    where = "embedded, " if result.get("embedded") else ""
    settings = ", ".join(f"{k}={v}" for k, v in server["settings"].items())
    modified = code.get("src_modified")
    lines = [
        f"### PostgreSQL {server['version']} ({where}{server['connection']}), {result['date']}",
        "",
        f"- command: `{result['command']}`",
        f"- machine: {machine['cores']} cores, {machine['cpu_model']}, "
        f"{machine['memory_gib']} GiB memory, Linux {machine['kernel']}, "
        f"1-min load average {machine['loadavg_at_start'][0]} at start, "
        f"{machine.get('loadavg_at_end', ['?'])[0]} at end",
        f"- software: Python {machine['python']}, psycopg {machine['psycopg']}, "
        f"tidegate commit {code.get('commit', '?')}"
        + (
            f" plus uncommitted changes in src/tidegate (sha256 {code.get('src_sha256')})"
            if modified
            else ""
        )
        + (", measured on a copy taken at start (--snapshot)" if code.get("snapshot") else "")
        + (" (**changed during the run**)" if code.get("changed_during_run") else ""),
        f"- server settings: {settings}",
        "- durability: enqueues commit with the server's synchronous_commit on both sides; "
        "worker claims and completions commit with synchronous_commit="
        f"{result.get('durability', {}).get('worker_synchronous_commit', '?')} on both sides "
        "(tidegate's worker's choice, mirrored by the raw worker)",
        f"- {options['repeat']} repetitions, each on a fresh schema; "
        "median (min - max); the whole run took "
        f"{result.get('seconds', 0):.0f} s",
        "",
        "| workload | tidegate | raw SQL | tidegate / raw | aim | met |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    w = result["workloads"]
    runs, batch, slots = options["runs"], options["batch"], options["slots"]
    names = {
        "enqueue": f"batch enqueue, runs/s ({runs:,} in batches of {batch:,})",
        "drain": f"drain, runs/s ({runs:,} no-op runs, 1 worker, {slots} slots)",
    }
    for workload in ("enqueue", "drain"):
        if workload not in w:
            continue
        f = w[workload]
        lines.append(
            f"| {names[workload]} | {_figure(f['tidegate']['rate'], 0)} "
            f"| {_figure(f['raw']['rate'], 0)} | {f['ratio']:.2f} "
            f"| >= {AIMS[workload]:.2f} | {'yes' if f['met'] else '**no**'} |"
        )
    if "wakeup" in w:
        f = w["wakeup"]
        runs_note = f"{options['wakeup_runs']} runs {options['wakeup_interval_ms']:g} ms apart"
        for p in PERCENTILES:
            aim = f"<= {AIM_WAKEUP_P99_MS:g} ms" if p == "p99" else ""
            met = ("yes" if f["met"] else "**no**") if p == "p99" else ""
            lines.append(
                f"| wake-up {p}, ms, enqueue to handler start ({runs_note}) "
                f"| {_figure(f['tidegate'][p], 2)} | {_figure(f['raw'][p], 2)} "
                f"| {f['ratio'][p]:.2f} | {aim} | {met} |"
            )
        stages = {
            side: " / ".join(
                f"{statistics.median(s['stage_ms'][stage]['p50'] for s in f[side]['samples']):.2f}"
                for stage in STAGES
            )
            for side in SIDES
        }
        lines.append(
            f"| wake-up p50 by stage ({' / '.join(STAGES)}), ms "
            f"| {stages['tidegate']} | {stages['raw']} | | | |"
        )
        for p in ("p50", "p99"):
            tg, rw = f["tidegate"][f"db_{p}"], f["raw"][f"db_{p}"]
            lines.append(
                f"| wake-up {p}, ms, in the database (attempted_at - inserted_at) "
                f"| {_figure(tg, 2)} | {_figure(rw, 2)} "
                f"| {tg['median'] / rw['median']:.2f} | | |"
            )
    lines.append("")
    return "\n".join(lines)


def write_results(result: dict[str, Any], path: Path) -> None:
    """Write JSON through a temporary file, so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    tmp.replace(path)


def server_label(result: dict[str, Any]) -> str:
    major = result["server"]["major"]
    return f"postgres{major}" + ("-embedded" if result.get("embedded") else "")


def write_docs(results_dir: Path = RESULTS, docs: Path = DOCS) -> None:
    """Render every ``postgres*.json`` in ``results_dir`` between the markers of ``docs``."""
    found = [json.loads(p.read_text()) for p in sorted(results_dir.glob("postgres*.json"))]
    found.sort(key=lambda r: (-r["server"]["major"], not r.get("embedded")))
    text = docs.read_text()
    if BEGIN not in text or END not in text:
        raise BenchError(f"{docs} lacks the markers {BEGIN} ... {END}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    body = "\n".join(render(r) for r in found)
    docs.write_text(f"{head}{BEGIN}\n\n{body}\n{END}{tail}")


# -- the command -----------------------------------------------------------------------


def redact(url: str) -> str:
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", url)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/run.py",
        description="tidegate against a minimal raw-SQL queue, on the same database.",
    )
    parser.add_argument(
        "--database-url",
        help="PostgreSQL to measure on (default: TIDEGATE_DATABASE_URL, else an embedded "
        f"PostgreSQL 18 under {EMBEDDED_DATA_DIR.relative_to(ROOT)})",
    )
    default = Options()
    parser.add_argument("--runs", type=int, default=default.runs, help="runs per enqueue/drain")
    parser.add_argument("--batch", type=int, default=default.batch, help="runs per enqueue")
    parser.add_argument("--repeat", type=int, default=default.repeat, help="repetitions")
    parser.add_argument("--slots", type=int, default=default.slots, help="worker slots")
    parser.add_argument("--wakeup-runs", type=int, default=default.wakeup_runs)
    parser.add_argument("--wakeup-interval-ms", type=float, default=default.wakeup_interval_ms)
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help="which workloads, comma-separated (default: all)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE.runs} runs, {SMOKE.wakeup_runs} wake-ups, once: checks, not figures",
    )
    parser.add_argument(
        "--output",
        type=Path,
        help="where to write the JSON (default: bench/results/latest.json and "
        "bench/results/postgres<major>[-embedded].json for a run of every workload; "
        "nothing for --smoke)",
    )
    parser.add_argument(
        "--write-docs", action="store_true", help="rewrite the figures in docs/benchmarks.md"
    )
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="measure a copy of src/tidegate taken at start, so that edits made while the "
        "benchmark runs cannot mix two versions of the code in one run",
    )
    options = parser.parse_args(argv)
    if options.smoke and options.write_docs:
        parser.error("--smoke measures too little to publish; drop --write-docs")
    options.workloads = tuple(w.strip() for w in options.workloads.split(",") if w.strip())
    unknown = set(options.workloads) - set(WORKLOADS)
    if unknown or not options.workloads:
        parser.error(f"--workloads takes some of {', '.join(WORKLOADS)}")
    if options.write_docs and options.workloads != WORKLOADS:
        parser.error("--write-docs publishes full runs only; drop --workloads")
    if min(options.runs, options.batch, options.repeat, options.slots, options.wakeup_runs) < 1:
        parser.error("--runs, --batch, --repeat, --slots and --wakeup-runs must be >= 1")
    return options


def reexec_on_snapshot(argv: list[str]) -> None:
    """Copy ``src/tidegate`` aside and run this command again on the copy (never returns).

    The copy goes first on ``PYTHONPATH``, so this process and every worker it starts
    import it rather than the working tree; the copy is removed when the run ends.
    """
    code = code_info()
    snapshot = Path(tempfile.mkdtemp(prefix="tidegate-bench-src-"))
    shutil.copytree(
        ROOT / "src" / "tidegate",
        snapshot / "tidegate",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    code["src_sha256"] = source_digest(snapshot / "tidegate")
    code["snapshot"] = True
    path = [str(snapshot), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, path)),
        SNAPSHOT_ENV: str(snapshot),
        CODE_ENV: json.dumps(code),
    }
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.snapshot and SNAPSHOT_ENV not in os.environ:
        reexec_on_snapshot(argv)
    if SNAPSHOT_ENV in os.environ:
        atexit.register(shutil.rmtree, os.environ[SNAPSHOT_ENV], ignore_errors=True)
    url = args.database_url or os.environ.get("TIDEGATE_DATABASE_URL")
    embedded = not url
    if not url:
        from tidegate.storage.embedded import start_embedded

        url = start_embedded(EMBEDDED_DATA_DIR)
    if args.smoke:
        options = dataclasses.replace(SMOKE, workloads=args.workloads)
    else:
        options = Options(
            runs=args.runs,
            batch=args.batch,
            repeat=args.repeat,
            slots=args.slots,
            wakeup_runs=args.wakeup_runs,
            wakeup_interval_ms=args.wakeup_interval_ms,
            workloads=args.workloads,
        )
    command = shlex.join(["python", "bench/run.py", *(redact(a) for a in argv)])
    print(f"tidegate benchmark: {command}", file=sys.stderr)
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
        write_results(result, RESULTS / "latest.json")
        if options.workloads == WORKLOADS:  # only complete runs are published
            write_results(result, RESULTS / f"{server_label(result)}.json")
    if args.write_docs:
        write_docs()
        print(f"wrote {DOCS.relative_to(ROOT)}", file=sys.stderr)
    verified = all(w["verified"] for w in result["workloads"].values())
    return 0 if verified else 1


if __name__ == "__main__":
    sys.exit(main())
