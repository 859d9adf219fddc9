"""A run of every part: repetitions, their summary, and the report."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from typing import Any

import httpx

from bench.harness import (
    DOCS,
    RESULTS,
    close_record,
    new_record,
    spread,
    write_between,
)
from bench.webhooks.common import (
    AIM_ADMISSION_P99_MS,
    AIM_SYNC_P50_MS,
    AIM_SYNC_P99_MS,
    STAGES,
    WORKER_APP,
    WORKLOOPS,
    Options,
)
from bench.webhooks.ingest import measure_ingest
from bench.webhooks.sync import measure_cap, measure_sync

# -- a run: repetitions, summary ------------------------------------------------------------


def run_benchmark(
    url: str,
    options: Options,
    *,
    embedded: bool = False,
    command: str = "",
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Measure every part ``options.repeat`` times against ``url``; return the results."""
    result = new_record(
        url,
        command,
        embedded,
        options=dataclasses.asdict(options),
        processes={"api": "python -m tidegate serve --role api", "worker": WORKER_APP},
        workloops=WORKLOOPS,
        repetitions=[],
    )
    started = time.monotonic()
    for repetition in range(options.repeat):
        load = [round(x, 2) for x in os.getloadavg()]
        sync, admission = measure_sync(url, options)
        progress(f"#{repetition + 1} sync       {_describe_sync(sync)}")
        progress(f"#{repetition + 1} admission  {_describe_admission(admission)}")
        cap = measure_cap(url, options)
        progress(f"#{repetition + 1} cap        {_describe_cap(cap)}")
        ingest = measure_ingest(url, options, raw_first=repetition % 2 == 1)
        progress(f"#{repetition + 1} ingest     {_describe_ingest(ingest)}")
        result["repetitions"].append(
            {
                "loadavg_at_start": load,
                "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
                "sync": sync,
                "admission": admission,
                "cap": cap,
                "ingest": ingest,
            }
        )
    close_record(result, started, progress)
    result["summary"] = summarize(result["repetitions"])
    result["verified"] = all(
        rep[part]["verified"]
        for rep in result["repetitions"]
        for part in ("sync", "admission", "cap", "ingest")
    )
    return result


def _describe_sync(s: dict[str, Any]) -> str:
    w, b = s["steady"]["wait_ms"], s["burst"]
    return (
        f"{s['steady']['rate']:g} req/s: p50 {w['p50']:.2f} ms, p99 {w['p99']:.2f} ms, "
        f"late {s['steady']['late_replies']}; burst {b['requests']}: {b['statuses']}"
        f"{'' if s['verified'] else ' NOT VERIFIED ' + str(s['problems'])}"
    )


def _describe_admission(a: dict[str, Any]) -> str:
    f, d = a["ms"]["admit_fast_lane"], a["ms"]["admit_default"]
    return (
        f"fast_lane p50 {f['p50']:.2f} p99 {f['p99']:.2f} ms, default p50 {d['p50']:.2f} "
        f"p99 {d['p99']:.2f} ms {a['decisions']}{'' if a['verified'] else ' NOT VERIFIED'}"
    )


def _describe_cap(c: dict[str, Any]) -> str:
    return (
        f"cap {c['cap']}: {c['admitted']} admitted of {c['requests']} ({c['statuses']}), "
        f"max running {c['max_running']}, max in flight sampled {c['max_inflight_sampled']}"
        f"{'' if c['verified'] else ' NOT VERIFIED ' + str(c['problems'])}"
    )


def _describe_ingest(i: dict[str, Any]) -> str:
    return (
        f"tidegate {i['tidegate']['rate']:,.0f}/s ({i['tidegate']['accepted']} verified; "
        f"plain client {i['tidegate']['plain_client']['rate']:,.0f}/s), "
        f"raw {i['raw']['rate']:,.0f}/s, ratio {i['ratio']:.2f}"
        f"{'' if i['verified'] else ' NOT VERIFIED'}"
    )


def _get(sample: dict[str, Any], path: str) -> Any:
    value: Any = sample
    for part in path.split("."):
        value = value[part]
    return value


SUMMARY_FIGURES = (
    "sync.steady.wait_ms.p50",
    "sync.steady.wait_ms.p95",
    "sync.steady.wait_ms.p99",
    "sync.steady.wait_ms.max",
    "sync.steady.from_schedule_ms.p99",
    "sync.steady.late_replies",
    "sync.steady.late_sends",
    "sync.steady.sent_rate",
    "sync.steady.stage_ms.send.p50",
    "sync.steady.stage_ms.admit.p50",
    "sync.steady.stage_ms.run.p50",
    "sync.steady.stage_ms.reply.p50",
    "sync.steady.stage_ms.send.p99",
    "sync.steady.stage_ms.admit.p99",
    "sync.steady.stage_ms.run.p99",
    "sync.steady.stage_ms.reply.p99",
    "sync.floor.wait_ms.p50",
    "sync.floor.wait_ms.p99",
    "sync.steady_plain.wait_ms.p50",
    "sync.steady_plain.wait_ms.p95",
    "sync.steady_plain.wait_ms.p99",
    "sync.steady_plain.late_replies",
    "sync.steady_plain.stage_ms.send.p50",
    "sync.steady_plain.stage_ms.admit.p50",
    "sync.steady_plain.stage_ms.run.p50",
    "sync.steady_plain.stage_ms.reply.p50",
    "sync.floor_plain.wait_ms.p50",
    "sync.floor_plain.wait_ms.p99",
    "sync.burst.admitted",
    "sync.burst.wait_ms_admitted.p50",
    "sync.burst.wait_ms_admitted.p99",
    "sync.burst.wait_ms_all.p50",
    "sync.burst.wait_ms_all.p99",
    "sync.burst.seconds",
    "admission.ms.admit_fast_lane.p50",
    "admission.ms.admit_fast_lane.p99",
    "admission.ms.admit_default.p50",
    "admission.ms.admit_default.p99",
    "admission.ms.admit_fast_lane_rolled_back.p50",
    "admission.ms.admit_fast_lane_rolled_back.p99",
    "admission.ms.admit_default_rolled_back.p50",
    "admission.ms.admit_default_rolled_back.p99",
    "admission.ms.select_1.p50",
    "admission.ms.select_1.p99",
    "admission.ms.find_trigger.p50",
    "admission.ms.find_trigger.p99",
    "cap.admitted",
    "cap.requests",
    "cap.max_running",
    "cap.max_inflight_sampled",
    "cap.over_admission",
    "ingest.tidegate.rate",
    "ingest.raw.rate",
    "ingest.ratio",
    "ingest.tidegate.plain_client.rate",
    "ingest.ratio_plain_client",
    "ingest.tidegate.wait_ms.p50",
    "ingest.tidegate.wait_ms.p99",
)


def summarize(repetitions: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max over the repetitions of every headline figure, and the aims."""
    figures = {}
    for path in SUMMARY_FIGURES:
        values = [_get(rep, path) for rep in repetitions]
        if all(isinstance(v, int | float) for v in values):
            figures[path] = spread(values)
    p50 = figures["sync.steady.wait_ms.p50"]["median"]
    p99 = figures["sync.steady.wait_ms.p99"]["median"]
    admit_p99 = max(
        figures["admission.ms.admit_fast_lane.p99"]["median"],
        figures["admission.ms.admit_default.p99"]["median"],
    )
    over = max(rep["cap"]["over_admission"] for rep in repetitions)
    return {
        "figures": figures,
        "aims": {
            "sync_p50": {"aim": f"<= {AIM_SYNC_P50_MS:g} ms", "met": p50 <= AIM_SYNC_P50_MS},
            "sync_p99": {"aim": f"<= {AIM_SYNC_P99_MS:g} ms", "met": p99 <= AIM_SYNC_P99_MS},
            "admission_p99": {
                "aim": f"<= {AIM_ADMISSION_P99_MS:g} ms",
                "met": admit_p99 <= AIM_ADMISSION_P99_MS,
            },
            "over_admission": {"aim": "0", "met": over == 0, "measured": over},
        },
    }


# -- reporting -------------------------------------------------------------------------------


def _stages(summary: dict[str, Any], prefix: str, percentile: str) -> str:
    found = [summary["figures"].get(f"{prefix}.{stage}.{percentile}") for stage in STAGES]
    return " / ".join("?" if f is None else f"{f['median']:.2f}" for f in found)


def _fig(summary: dict[str, Any], path: str, digits: int = 2) -> str:
    s = summary["figures"].get(path)
    if s is None:
        return "?"
    if s["min"] == s["max"]:
        return f"{s['median']:,.{digits}f}"
    return f"{s['median']:,.{digits}f} ({s['min']:,.{digits}f} - {s['max']:,.{digits}f})"


def _met(summary: dict[str, Any], aim: str) -> str:
    return "yes" if summary["aims"][aim]["met"] else "**no**"


def _joined_statuses(repetitions: list[dict[str, Any]], path: str) -> str:
    parts = []
    for rep in repetitions:
        found = _get(rep, path)
        parts.append(", ".join(f"{n} x {status}" for status, n in found.items()))
    return "; ".join(f"#{i + 1}: {p}" for i, p in enumerate(parts))


def render(result: dict[str, Any]) -> str:
    """Return one run's results as Markdown: where, how, and the tables."""
    server, machine, options = result["server"], result["machine"], result["options"]
    code, summary, reps = result.get("code", {}), result["summary"], result["repetitions"]
    where = "embedded, " if result.get("embedded") else ""
    loads = ", ".join(
        f"{rep['loadavg_at_start'][0]} / {rep['loadavg_at_end'][0]}"
        for rep in result["repetitions"]
    )
    software = (
        f"Python {machine['python']}, psycopg {machine['psycopg']}, httpx {httpx.__version__}, "
        f"tidegate commit {code.get('commit', '?')}"
        + (
            f" plus uncommitted changes in src/tidegate (sha256 {code.get('src_sha256')})"
            if code.get("src_modified")
            else ""
        )
        + (", measured on a copy taken at start (--snapshot)" if code.get("snapshot") else "")
        + (" (**changed during the run**)" if code.get("changed_during_run") else "")
    )
    n_steady = round(options["rate"] * options["steady_seconds"])
    lines = [
        f"#### PostgreSQL {server['version']} ({where}{server['connection']}), {result['date']}",
        "",
        f"- command: `{result['command']}`",
        f"- machine: {machine['cores']} cores, {machine['cpu_model']}, "
        f"{machine['memory_gib']} GiB memory, Linux {machine['kernel']}; 1-min load average "
        f"at start / end of each repetition: {loads}",
        f"- software: {software}",
        f"- server: synchronous_commit={server['settings']['synchronous_commit']}, "
        f"fsync={server['settings']['fsync']}, "
        f"shared_buffers={server['settings']['shared_buffers']}",
        f"- {options['repeat']} repetitions, each part on a fresh schema; median (min - max) "
        f"of the repetitions; every figure verified against the tables: "
        f"{'yes' if result.get('verified') else '**no**'}; the run took "
        f"{result.get('seconds', 0):.0f} s",
        "",
        "| measure | result | aim | met |",
        "| --- | ---: | --- | --- |",
        f"| sync, {options['rate']:g} req/s open loop ({n_steady:,} requests): p50 wait, ms "
        f"| {_fig(summary, 'sync.steady.wait_ms.p50')} | <= {AIM_SYNC_P50_MS:g} ms "
        f"| {_met(summary, 'sync_p50')} |",
        f"| sync, same: p95 wait, ms | {_fig(summary, 'sync.steady.wait_ms.p95')} | | |",
        f"| sync, same: p99 wait, ms | {_fig(summary, 'sync.steady.wait_ms.p99')} "
        f"| <= {AIM_SYNC_P99_MS:g} ms | {_met(summary, 'sync_p99')} |",
        f"| sync, same: max wait, ms | {_fig(summary, 'sync.steady.wait_ms.max')} | | |",
        f"| sync, same: replies slower than the send interval "
        f"({1000 / options['rate']:g} ms) | {_fig(summary, 'sync.steady.late_replies', 0)} "
        "| | |",
        "| sync, same: p50 by stage (send / admit / run / reply), ms | "
        + _stages(summary, "sync.steady.stage_ms", "p50")
        + " | | |",
        "| sync, same: p99 by stage (send / admit / run / reply), ms | "
        + _stages(summary, "sync.steady.stage_ms", "p99")
        + " | | |",
        f"| HTTP floor, GET /healthz at {options['rate']:g} req/s: p50 / p99 wait, ms "
        f"| {_fig(summary, 'sync.floor.wait_ms.p50')} / {_fig(summary, 'sync.floor.wait_ms.p99')}"
        " | | |",
        f"| control, a minimal HTTP/1.1 client instead of httpx, same rate: sync p50 / p95 / "
        f"p99 wait, ms | {_fig(summary, 'sync.steady_plain.wait_ms.p50')} / "
        f"{_fig(summary, 'sync.steady_plain.wait_ms.p95')} / "
        f"{_fig(summary, 'sync.steady_plain.wait_ms.p99')} | | |",
        "| control: p50 by stage (send / admit / run / reply), ms | "
        + _stages(summary, "sync.steady_plain.stage_ms", "p50")
        + " | | |",
        f"| control: GET /healthz p50 / p99 wait, ms "
        f"| {_fig(summary, 'sync.floor_plain.wait_ms.p50')} / "
        f"{_fig(summary, 'sync.floor_plain.wait_ms.p99')} | | |",
        f"| sync burst, {options['burst']} at once (cap {options['burst']}): admitted "
        f"| {_fig(summary, 'sync.burst.admitted', 0)} | | |",
        f"| sync burst: p50 / p99 wait of the admitted, ms "
        f"| {_fig(summary, 'sync.burst.wait_ms_admitted.p50')} / "
        f"{_fig(summary, 'sync.burst.wait_ms_admitted.p99')} | | |",
        f"| sync burst: p50 / p99 wait of every reply, ms "
        f"| {_fig(summary, 'sync.burst.wait_ms_all.p50')} / "
        f"{_fig(summary, 'sync.burst.wait_ms_all.p99')} | | |",
        f"| admit_webhook, fast lane (cap {options['admission_cap']}), "
        f"{options['admission_calls']} calls {options['admission_interval_ms']:g} ms apart: "
        f"p50 / p99, ms | {_fig(summary, 'admission.ms.admit_fast_lane.p50')} / "
        f"{_fig(summary, 'admission.ms.admit_fast_lane.p99')} "
        f"| p99 <= {AIM_ADMISSION_P99_MS:g} ms | {_met(summary, 'admission_p99')} |",
        f"| admit_webhook, default lane (async): p50 / p99, ms "
        f"| {_fig(summary, 'admission.ms.admit_default.p50')} / "
        f"{_fig(summary, 'admission.ms.admit_default.p99')} | | |",
        f"| the decision alone (same calls, rolled back: no commit, no NOTIFY), fast lane: "
        f"p50 / p99, ms | {_fig(summary, 'admission.ms.admit_fast_lane_rolled_back.p50')} / "
        f"{_fig(summary, 'admission.ms.admit_fast_lane_rolled_back.p99')} | | |",
        f"| the decision alone, default lane: p50 / p99, ms "
        f"| {_fig(summary, 'admission.ms.admit_default_rolled_back.p50')} / "
        f"{_fig(summary, 'admission.ms.admit_default_rolled_back.p99')} | | |",
        f"| for scale, same connection: SELECT 1 / find_trigger p50, ms "
        f"| {_fig(summary, 'admission.ms.select_1.p50', 3)} / "
        f"{_fig(summary, 'admission.ms.find_trigger.p50', 3)} | | |",
        f"| cap {options['cap']}, {options['cap_clients']} clients retrying for "
        f"{options['cap_seconds']:g} s, {options['cap_api_processes']} API processes, "
        f"handler sleeps {options['cap_sleep_seconds']:g} s: admitted / requests "
        f"| {_fig(summary, 'cap.admitted', 0)} / {_fig(summary, 'cap.requests', 0)} | | |",
        f"| same: most fast-lane runs running at once (attempted_at..completed_at) / most "
        f"in flight in a 5 ms sampler | {_fig(summary, 'cap.max_running', 0)} / "
        f"{_fig(summary, 'cap.max_inflight_sampled', 0)} | <= {options['cap']} "
        f"| {'yes' if summary['aims']['over_admission']['met'] else '**no**'} "
        f"(over-admission: {summary['aims']['over_admission']['measured']}) |",
        f"| async ingest, {options['ingest_requests']:,} webhooks, "
        f"{options['ingest_clients']} clients, {options['ingest_api_processes']} API "
        f"processes: accepted (202) per s | {_fig(summary, 'ingest.tidegate.rate', 0)} | | |",
        f"| raw SQL, same rows, {options['ingest_clients']} connections: per s "
        f"| {_fig(summary, 'ingest.raw.rate', 0)} | | |",
        f"| tidegate / raw | {_fig(summary, 'ingest.ratio')} | | |",
        f"| control: the same ingest driven by a minimal HTTP/1.1 client instead of httpx: "
        f"accepted (202) per s | {_fig(summary, 'ingest.tidegate.plain_client.rate', 0)} | | |",
        f"| tidegate (minimal client) / raw | {_fig(summary, 'ingest.ratio_plain_client')} | | |",
        "",
        "Statuses, sync at a steady rate: "
        + _joined_statuses(reps, "sync.steady.statuses")
        + ". Statuses, sync burst: "
        + _joined_statuses(reps, "sync.burst.statuses")
        + ".",
        "",
        "Statuses, cap burst: " + _joined_statuses(reps, "cap.statuses") + ".",
        "",
    ]
    return "\n".join(lines)


def write_docs() -> None:
    """Render every ``http-postgres*.json`` between the ``bench:http`` markers of the docs."""
    found = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("http-postgres*.json"))]
    found.sort(key=lambda r: (-r["server"]["major"], not r.get("embedded")))
    write_between(DOCS, "http", "\n".join(render(r) for r in found))


def server_label(result: dict[str, Any]) -> str:
    major = result["server"]["major"]
    return f"http-postgres{major}" + ("-embedded" if result.get("embedded") else "")
