"""tidegate's benchmark: the same workloads on tidegate, the raw-SQL limit and the peers.

::

    python bench/run.py                       # embedded PostgreSQL 18 (or TIDEGATE_DATABASE_URL)
    python bench/run.py --database-url postgresql://postgres@127.0.0.1:5432/test
    python bench/run.py --smoke               # a few hundred jobs, tidegate and raw, once
    python bench/run.py --write-docs          # also rewrite the tables in docs/benchmarks.md

Every system is measured through its adapter (``bench/systems``) by the same driver
(``bench/driver.py``), in a process of its own started with the Python of its own
environment (``bench/envs.py`` makes the peers' environments first), on a database
created for that one measurement and dropped after it. Each workload is repeated
(``--repeat``, default 3), the systems' order turning at every repetition; every figure
is the median with min and max. A system that cannot be installed or whose measurement
fails is reported with the reason, and the run goes on.

The workloads (``bench.driver``): ``enqueue`` (batches), ``drain`` (one worker process,
concurrency 32), ``single`` (one job per transaction), ``wakeup`` (idle worker, jobs
paced from another process), ``starvation`` (a hot tenant's backlog, cold tenants'
jobs arriving after it); and ``webhook``, tidegate only, beside its raw floors: the
sync round trip and the admission decision of ``python -m bench.webhooks``.

The results go to ``bench/results/latest.json`` and, per server,
``bench/results/postgres<major>[-embedded].json``; ``--write-docs`` renders them into
``docs/benchmarks.md`` between its ``bench:results`` markers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

if __package__ in (None, ""):  # run as ``python bench/run.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql

from bench import envs
from bench.driver import Options
from bench.harness import (
    DOCS,
    EMBEDDED_DATA_DIR,
    RESULTS,
    ROOT,
    BenchError,
    child_env,
    close_record,
    new_record,
    redact,
    spread,
    start_run,
    write_between,
    write_results,
)
from bench.systems import SYSTEMS

WORKLOADS = ("enqueue", "drain", "single", "wakeup", "starvation", "webhook")
RATES = ("enqueue", "drain", "single")
"""Workloads whose figure is a rate (higher is better); the others are waits in ms."""
WAITS = {"wakeup": ("p50", "p95", "p99"), "starvation": ("p50", "p95", "p99")}
MEASURE_TIMEOUT = 1800.0
"""The most one measurement may take (procrastinate drains 20,000 jobs in ~100 s here)."""

WAL = ("enqueue", "single")
"""Workloads that also report the WAL written per job."""
AIMS = {"enqueue": 0.80, "single": 0.80, "drain": 0.60}
"""tidegate's rate as a share of the raw limit's that it aims for."""
AIM_WAKEUP_P99_TO_RAW = 1.2
"""tidegate's wake-up p99 at most this many times the raw limit's."""
AIM_WAL_TO_RAW = 1.5
"""tidegate's WAL bytes per job in the batch enqueue at most this many times raw's."""
AIM_INDEX_ENTRIES = 3
"""The index entries an enqueued run writes, at most."""


@dataclass(frozen=True)
class Plan:
    """What to run: the systems, the workloads, how often, and their sizes."""

    systems: tuple[str, ...] = tuple(SYSTEMS)
    workloads: tuple[str, ...] = WORKLOADS
    repeat: int = 3
    options: Options = dataclasses.field(default_factory=Options)
    smoke: bool = False


SMOKE = Plan(
    systems=("tidegate", "raw"),
    workloads=WORKLOADS[:-1],
    repeat=1,
    options=Options(
        jobs=300,
        batch=100,
        single_jobs=100,
        wakeup_jobs=30,
        wakeup_warmup=5,
        hot_jobs=600,
        cold_tenants=5,
        cold_per_tenant=4,
        cold_after=50,
    ),
    smoke=True,
)


# -- measuring -------------------------------------------------------------------------


def database_url(url: str, name: str) -> str:
    """Return ``url`` naming the database ``name`` (URLs and ``key=value`` strings)."""
    if "://" in url:
        parts = urlsplit(url)
        return urlunsplit(parts._replace(path=f"/{name}"))
    return psycopg.conninfo.make_conninfo(url, dbname=name)


def measure(python: str, system: str, workload: str, url: str, options: Options) -> dict[str, Any]:
    """Run one measurement in a fresh database; return its figures or ``{"error": ...}``."""
    name = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        argv = [python, "-m", "bench.driver", "measure", system, workload]
        argv += ["--database-url", database_url(url, name)]
        argv += ["--options", json.dumps(dataclasses.asdict(options))]
        try:
            done = subprocess.run(
                argv,
                env=child_env(),
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=MEASURE_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"no result within {MEASURE_TIMEOUT:.0f} s"}
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-6:]
            return {"error": f"exit {done.returncode}: " + " | ".join(tail)}
        found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return found
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def run_benchmark(
    url: str,
    plan: Plan,
    *,
    embedded: bool = False,
    command: str = "",
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Measure every workload of ``plan`` on every system against ``url``."""
    result = new_record(
        url, command, embedded, plan=dataclasses.asdict(plan), systems={}, workloads={}
    )
    started = time.monotonic()
    pythons: dict[str, str] = {}
    for name in plan.systems:
        env = envs.ensure(SYSTEMS[name])
        result["systems"][name] = {
            "title": SYSTEMS[name].title,
            "versions": dict(env.versions),
            "not_run": env.reason or None,
        }
        if env.python is None:
            progress(f"{name}: not run: {env.reason}")
        else:
            pythons[name] = env.python
    for workload in plan.workloads:
        if workload == "webhook":
            result["webhook"] = measure_webhook(url, plan, embedded, command, progress)
            continue
        samples: dict[str, list[dict[str, Any]]] = {name: [] for name in pythons}
        for repetition in range(plan.repeat):
            order = list(pythons)
            turn = repetition % len(order)  # a drift in the machine hits every system alike
            for name in order[turn:] + order[:turn]:
                sample = measure(pythons[name], name, workload, url, plan.options)
                samples[name].append(sample)
                progress(f"{workload:10} {name:13} #{repetition + 1}  {_describe(sample)}")
        result["workloads"][workload] = summarize(workload, samples)
    for name, system in result["systems"].items():
        said = (w.get(name, {}).get("fairness") for w in result["workloads"].values())
        system["fairness"] = next(filter(None, said), None)
    close_record(result, started, progress)
    return result


def measure_webhook(
    url: str, plan: Plan, embedded: bool, command: str, progress: Callable[[str], None]
) -> dict[str, Any]:
    """Workload 6, tidegate only: ``bench.webhooks`` (sync round trip, admission, cap, ingest)."""
    from bench.webhooks.common import SMOKE, Options
    from bench.webhooks.report import run_benchmark, server_label

    options = SMOKE if plan.smoke else Options(repeat=plan.repeat)
    found = run_benchmark(
        url,
        options,
        embedded=embedded,
        command=command,
        progress=progress,
    )
    if not plan.smoke:
        write_results(found, RESULTS / "http-latest.json")
        write_results(found, RESULTS / f"{server_label(found)}.json")
    return {"verified": found["verified"], "figures": found["summary"]["figures"]}


def _describe(sample: dict[str, Any]) -> str:
    if "error" in sample:
        return f"FAILED: {sample['error']}"
    if "rate" in sample:
        return f"{sample['rate']:,.0f} jobs/s ({sample['jobs']:,} verified)"
    ms = sample["wait_ms"]
    waits = " ".join(f"{p} {ms[p]:.2f}" for p in ("p50", "p95", "p99"))
    return f"{waits} ms ({sample['jobs']} verified)"


def summarize(workload: str, samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Median, min and max per system of every repetition that verified; errors kept."""
    systems: dict[str, Any] = {}
    for name, found in samples.items():
        good = [s for s in found if s.get("verified")]
        entry: dict[str, Any] = {
            "samples": found,
            "errors": [s["error"] for s in found if "error" in s],
            "fairness": next((s.get("fairness") for s in good), None),
        }
        for figure in ("wal_bytes_per_job", "index_entries_per_job"):
            if good and workload in WAL and all(figure in s for s in good):
                entry[figure] = spread([s[figure] for s in good])
        if good and workload in RATES:
            entry["rate"] = spread([s["rate"] for s in good])
        elif good:
            for p in WAITS[workload]:
                entry[p] = spread([s["wait_ms"][p] for s in good])
        systems[name] = entry
    return {"verified": all(not s["errors"] for s in systems.values()), **systems}


def headline(workload: str, entry: dict[str, Any]) -> float | None:
    """The figure a system is ranked by: its median rate, or its median p99 wait."""
    figure = entry.get("rate" if workload in RATES else "p99")
    return None if figure is None else float(figure["median"])


def aims(result: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """The issue's aims: (what, measured, met); ``None`` where a side is missing."""
    w = result["workloads"]
    found: list[tuple[str, str, bool | None]] = []

    def ratio(workload: str) -> float | None:
        if workload not in w:
            return None
        tg, raw = (headline(workload, w[workload].get(s, {})) for s in ("tidegate", "raw"))
        return None if tg is None or raw is None else tg / raw

    peers = [s for s in result["systems"] if s not in ("tidegate", "raw")]

    def best(workload: str, better: Callable[..., str]) -> str | None:
        figures = {s: headline(workload, w[workload].get(s, {})) for s in ["tidegate", *peers]}
        ran = {s: f for s, f in figures.items() if f is not None}
        return better(ran, key=lambda s: ran[s]) if ran else None

    for workload, share in AIMS.items():
        r = ratio(workload)
        measured = "?" if r is None else f"{r:.2f}"
        found.append(
            (
                f"{workload}: tidegate >= {share:.0%} of raw",
                measured,
                None if r is None else r >= share,
            )
        )
        if workload in w:
            first = best(workload, max)
            found.append(
                (
                    f"{workload}: fastest of all",
                    f"best: {first}",
                    None if first is None else first == "tidegate",
                )
            )
    if "starvation" in w:
        first = best("starvation", min)
        found.append(
            (
                "starvation: lowest cold p99",
                f"best: {first}",
                None if first is None else first == "tidegate",
            )
        )
    if "wakeup" in w:
        r = ratio("wakeup")
        found.append(
            (
                f"wake-up p99 <= {AIM_WAKEUP_P99_TO_RAW:g} x raw's",
                "?" if r is None else f"{r:.2f}",
                None if r is None else r <= AIM_WAKEUP_P99_TO_RAW,
            )
        )
    if "enqueue" in w:
        tg, raw = (w["enqueue"].get(s, {}).get("wal_bytes_per_job") for s in ("tidegate", "raw"))
        r = None if tg is None or raw is None else tg["median"] / raw["median"]
        found.append(
            (
                f"WAL per enqueued job <= {AIM_WAL_TO_RAW:g} x raw's",
                "?" if r is None else f"{r:.2f} ({tg['median']:,.0f} bytes)",
                None if r is None else r <= AIM_WAL_TO_RAW,
            )
        )
        entries = w["enqueue"].get("tidegate", {}).get("index_entries_per_job")
        if entries:
            found.append(
                (
                    f"index entries per enqueued run <= {AIM_INDEX_ENTRIES}",
                    f"{entries['median']:.2f}",
                    entries["median"] <= AIM_INDEX_ENTRIES,
                )
            )
    return found


# -- reporting -------------------------------------------------------------------------


def _spread(s: dict[str, Any], digits: int) -> str:
    return f"{s['median']:,.{digits}f} ({s['min']:,.{digits}f} - {s['max']:,.{digits}f})"


def _ratio(value: float | None, base: float | None) -> str:
    return "" if value is None or not base else f"{value / base:.2f}"


TITLES = {
    "enqueue": "Batch enqueue, jobs/s: {jobs:,} jobs in batches of {batch:,}, one connection",
    "drain": "Drain, jobs/s: {jobs:,} queued no-op jobs, one worker process, concurrency "
    "{concurrency}, first handler start to all recorded done",
    "single": "Single enqueue, jobs/s: {single_jobs:,} jobs, one per transaction, one client",
    "wakeup": "Wake-up, ms: an idle worker, {wakeup_jobs} jobs {wakeup_interval_ms:g} ms apart "
    "from another process, enqueue to handler start",
    "starvation": "Starvation, ms: a hot tenant's {hot_jobs:,}-job backlog being worked off; "
    "{cold_tenants} cold tenants' {cold} jobs arrive after it, one every {cold_interval_ms:g} ms; "
    "cold job's enqueue to handler start",
}


def render_workload(result: dict[str, Any], workload: str) -> list[str]:
    options = result["plan"]["options"]
    cold = options["cold_tenants"] * options["cold_per_tenant"]
    w = result["workloads"][workload]
    tg = headline(workload, w.get("tidegate", {}))
    raw = headline(workload, w.get("raw", {}))
    lines = [f"**{TITLES[workload].format(cold=cold, **options)}**", ""]
    wal = workload in WAL
    raw_wal = w.get("raw", {}).get("wal_bytes_per_job", {}).get("median")
    if workload in RATES:
        lines += [
            "| system | jobs/s | / raw | / tidegate |"
            + (" WAL bytes/job | / raw |" if wal else ""),
            "| --- | ---: | ---: | ---: |" + (" ---: | ---: |" if wal else ""),
        ]
    else:
        cols = WAITS[workload]
        lines += [
            "| system | " + " | ".join(cols) + " | p99 / raw | p99 / tidegate |",
            "| --- |" + " ---: |" * (len(cols) + 2),
        ]
    for name, system in result["systems"].items():
        entry = w.get(name)
        title = system["title"]
        if entry is None or headline(workload, entry) is None:
            why = system["not_run"] or "; ".join(entry["errors"] if entry else ["not run"])
            span = (5 if wal else 3) if workload in RATES else len(WAITS[workload]) + 2
            lines.append(f"| {title} | not run: {why}" + " |" * span)
            continue
        value = headline(workload, entry)
        if workload in RATES:
            cells = [_spread(entry["rate"], 0)]
        else:
            cells = [_spread(entry[p], 1) for p in WAITS[workload]]
        failed = f" ({len(entry['errors'])} failed)" if entry["errors"] else ""
        written = ""
        if wal:
            bytes_ = entry.get("wal_bytes_per_job")
            written = (
                f" {_spread(bytes_, 0)} | {_ratio(bytes_['median'], raw_wal)} |"
                if bytes_
                else " | |"
            )
        lines.append(
            f"| {title}{failed} | "
            + " | ".join(cells)
            + f" | {_ratio(value, raw)} | {_ratio(value, tg)} |"
            + written
        )
    lines.append("")
    return lines


WEBHOOK_ROWS = (
    (
        "sync webhook round trip at 100 req/s, p50 / p99, ms",
        ("sync.steady.wait_ms.p50", "sync.steady.wait_ms.p99"),
        ("sync.floor.wait_ms.p50", "sync.floor.wait_ms.p99"),
        "`GET /healthz` on the same server at the same rate",
    ),
    (
        "admission decision (fast lane), p50 / p99, ms",
        ("admission.ms.admit_fast_lane.p50", "admission.ms.admit_fast_lane.p99"),
        ("admission.ms.select_1.p50", "admission.ms.select_1.p99"),
        "`SELECT 1` on the same connection",
    ),
    (
        "async webhooks ingested (durable), per second",
        ("ingest.tidegate.rate",),
        ("ingest.raw.rate",),
        "the same rows inserted in raw SQL from as many connections",
    ),
)


def render_webhook(webhook: dict[str, Any]) -> list[str]:
    figures = webhook["figures"]

    def cell(paths: tuple[str, ...]) -> str:
        found = [figures.get(path) for path in paths]
        return " / ".join("?" if f is None else f"{f['median']:,.2f}" for f in found)

    def ratio(tidegate: tuple[str, ...], floor: tuple[str, ...]) -> str:
        a, b = figures.get(tidegate[-1]), figures.get(floor[-1])
        return "" if a is None or b is None else _ratio(a["median"], b["median"])

    lines = [
        "**Webhook path, tidegate only, beside its raw floors** "
        "(`python -m bench.webhooks`; its own section below has the details)",
        "",
        "| figure | tidegate | raw floor | tidegate / floor (last figure) | the floor |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for what, tidegate, floor, floor_is in WEBHOOK_ROWS:
        lines.append(
            f"| {what} | {cell(tidegate)} | {cell(floor)} | {ratio(tidegate, floor)} | {floor_is} |"
        )
    return [*lines, ""]


def _system(system: dict[str, Any], python: str) -> str:
    """``title (package version, ...; Python x.y.z)``, or why it did not run."""
    versions = dict(system["versions"])
    python = versions.pop("python", python)
    packages = ", ".join(f"{name} {version}" for name, version in versions.items())
    where = f"{packages}; Python {python}" if packages else f"Python {python}"
    not_run = f", **not run: {system['not_run']}**" if system["not_run"] else ""
    return f"{system['title']} ({where}){not_run}"


def render(result: dict[str, Any]) -> str:
    """Return one run's results as Markdown: where, how, the tables and the aims."""
    server, machine, plan = result["server"], result["machine"], result["plan"]
    code = result.get("code", {})
    where = "embedded, " if result.get("embedded") else ""
    settings = ", ".join(f"{k}={v}" for k, v in server["settings"].items())
    lines = [
        f"### PostgreSQL {server['version']} ({where}{server['connection']}), {result['date']}",
        "",
        f"- command: `{result['command']}`",
        f"- machine: {machine['cores']} cores, {machine['cpu_model']}, "
        f"{machine['memory_gib']} GiB memory, Linux {machine['kernel']}, 1-min load average "
        f"{machine['loadavg_at_start'][0]} at start, {machine.get('loadavg_at_end', ['?'])[0]} "
        "at end",
        f"- server settings: {settings}",
        f"- tidegate commit {code.get('commit', '?')}"
        + (" plus uncommitted changes" if code.get("src_modified") else "")
        + (", measured on a copy taken at start (--snapshot)" if code.get("snapshot") else "")
        + (" (**changed during the run**)" if code.get("changed_during_run") else ""),
        f"- {plan['repeat']} repetitions, each measurement on a fresh database; median "
        f"(min - max); the whole run took {result.get('seconds', 0):.0f} s",
        "- systems: "
        + "; ".join(_system(s, machine["python"]) for s in result["systems"].values()),
        "- fairness in the starvation workload: "
        + "; ".join(
            f"{s['title']}: {s.get('fairness') or '?'}" for s in result["systems"].values()
        ),
        "",
    ]
    for workload in result["workloads"]:
        lines += render_workload(result, workload)
    if "webhook" in result:
        lines += render_webhook(result["webhook"])
    lines += ["**Aims**", "", "| aim | measured | met |", "| --- | --- | --- |"]
    for what, measured, met in aims(result):
        lines.append(
            f"| {what} | {measured} | {'?' if met is None else 'yes' if met else '**no**'} |"
        )
    lines.append("")
    return "\n".join(lines)


def server_label(result: dict[str, Any]) -> str:
    major = result["server"]["major"]
    return f"postgres{major}" + ("-embedded" if result.get("embedded") else "")


def write_docs() -> None:
    """Render every ``postgres*.json`` of ``bench/results`` into ``docs/benchmarks.md``."""
    found = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("postgres*.json"))]
    found = [r for r in found if "systems" in r]
    found.sort(key=lambda r: (-r["server"]["major"], not r.get("embedded")))
    write_between(DOCS, "results", "\n".join(render(r) for r in found))


# -- the command -----------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/run.py",
        description="The same workloads on tidegate, the raw-SQL limit and the peers.",
    )
    parser.add_argument(
        "--database-url",
        help="PostgreSQL to measure on, a role that may create databases (default: "
        "TIDEGATE_DATABASE_URL, else an embedded PostgreSQL 18 under "
        f"{EMBEDDED_DATA_DIR.relative_to(ROOT)})",
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    parser.add_argument("--repeat", type=int, default=Plan.repeat)
    parser.add_argument("--jobs", type=int, default=Options.jobs, help="jobs per enqueue/drain")
    parser.add_argument(
        "--smoke", action="store_true", help="a few hundred jobs: checks, not figures"
    )
    parser.add_argument("--output", type=Path, help="where to write the JSON")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/benchmarks.md")
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="measure a copy of src/tidegate taken at start (edits made meanwhile don't count)",
    )
    args = parser.parse_args(argv)
    args.systems = tuple(s for s in args.systems.split(",") if s)
    args.workloads = tuple(w for w in args.workloads.split(",") if w)
    if set(args.systems) - set(SYSTEMS) or not args.systems:
        parser.error(f"--systems takes some of {', '.join(SYSTEMS)}")
    if set(args.workloads) - set(WORKLOADS) or not args.workloads:
        parser.error(f"--workloads takes some of {', '.join(WORKLOADS)}")
    if args.smoke and args.write_docs:
        parser.error("--smoke measures too little to publish; drop --write-docs")
    if args.repeat < 1 or args.jobs < 1:
        parser.error("--repeat and --jobs must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    url, embedded = start_run("bench.run", argv, args.database_url, args.snapshot)
    if args.smoke:
        plan = dataclasses.replace(SMOKE, workloads=args.workloads)
    else:
        options = dataclasses.replace(Options(), jobs=args.jobs, hot_jobs=args.jobs)
        plan = Plan(args.systems, args.workloads, args.repeat, options)
    command = shlex.join(["python", "bench/run.py", *(redact(a) for a in argv)])
    print(f"tidegate benchmark: {command}", file=sys.stderr)
    result = run_benchmark(
        url,
        plan,
        embedded=embedded,
        command=command,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(render(result))
    if args.output:
        write_results(result, args.output)
    elif not args.smoke:
        write_results(result, RESULTS / "latest.json")
        if plan.workloads == WORKLOADS and plan.systems == tuple(SYSTEMS):
            write_results(result, RESULTS / f"{server_label(result)}.json")
    if args.write_docs:
        write_docs()
        if "webhook" in plan.workloads:
            from bench.webhooks.report import write_docs as write_webhook_docs

            write_webhook_docs()
        print(f"wrote {DOCS.relative_to(ROOT)}", file=sys.stderr)
    ok = all(w["verified"] for w in result["workloads"].values())
    return 0 if ok and result.get("webhook", {}).get("verified", True) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as error:
        sys.exit(f"benchmark failed: {error}")
