"""Whether a caller that obeys Retry-After is admitted when it comes back, in its turn.

::

    python -m bench.retry_after       # embedded PostgreSQL (or TIDEGATE_DATABASE_URL)
    python -m bench.retry_after --database-url postgresql://postgres@127.0.0.1:5432/test

Two API processes and one worker (``fast_lane:4 manual>*:4``) on a fresh schema; in
turn, ``--seconds`` each, twenty clients send webhooks to a project with one limit, and
each obeys every refusal exactly: it sleeps ``Retry-After`` seconds and sends the same
webhook again, with the ``Tidegate-Place`` it was given (when it was given one), until
it is admitted; then it sends a new one. The workloads:

  fast_lane   a sync trigger, fast-lane cap 2, handlers sleeping 0.2-2 s (uniform)
  ingest      an async trigger, ingest rate 2/s, burst 2
  backlog     an async trigger, backlog cap 5, handlers sleeping 0.2-2 s on 4 slots

For each: how often a caller that waited exactly Retry-After was refused again; the
error of the first Retry-After a webhook got against its actual wait (from that first
refusal to the sending of the attempt that was admitted), |predicted - actual| / actual;
and the order: the share of refused webhooks that a webhook first refused more than
1 s after them overtook. Then a tiny rate (0.001/s, burst 1): the Retry-After of the
second webhook against the true wait. And the admitted path's cost: ``admit_webhook``
called directly, ``ADMISSION_CALLS`` times a lane, p50/p99 in ms. Figures are medians
over ``--repeat`` rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg

from bench.harness import fresh_schema, paced, schema_conninfo
from bench.webhooks.client import create_trigger, new_client, run_async
from bench.webhooks.processes import ApiServer, migrate, start_worker
from bench.webhooks.sync import _admit_params, request_headers
from tidegate.storage.sql import query

PLACE = "Tidegate-Place"
CLIENTS = 20
WORKLOADS: dict[str, dict[str, Any]] = {
    "fast_lane": {"mode": "sync", "task": "tidegate.sleep", "fast_lane_cap": 2},
    "ingest": {"mode": "async", "task": "tidegate.echo", "ingest_rate": 2.0, "ingest_burst": 2},
    "backlog": {"mode": "async", "task": "tidegate.sleep", "backlog_cap": 5},
}
TINY_RATE = 0.001
ORDER_SLACK_SECONDS = 1.0
"""An overtaking counts only by a caller first refused more than this after: the
granularity of Retry-After."""
DRAIN_SECONDS = 60.0
"""How long webhooks refused before the end may go on to be admitted."""
ADMISSION_CALLS = 300
SMOKE = {"seconds": 3.0, "repeat": 1}


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p90, p99 (inclusive method), or nothing of no values."""
    if not values:
        return {}
    if len(values) == 1:
        return {"p50": values[0], "p90": values[0], "p99": values[0]}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": cuts[49], "p90": cuts[89], "p99": cuts[98]}


@dataclass
class Delivery:
    """One webhook from its first sending to its admission."""

    first_refused: float | None = None
    predicted: float | None = None
    admitted: float | None = None
    refusals: int = 0


@dataclass
class Tally:
    deliveries: list[Delivery]
    returns: int = 0
    refused_again: int = 0


async def _client(
    http: httpx.AsyncClient, path: str, sync: bool, deadline: float, tally: Tally
) -> None:
    """Send webhooks until ``deadline``, each until admitted, obeying every refusal."""
    while time.monotonic() < deadline:
        delivery = Delivery()
        tally.deliveries.append(delivery)
        body = {"seconds": round(random.uniform(0.2, 2.0), 3)}
        headers: dict[str, str] = {}
        returning = False
        while time.monotonic() < deadline + DRAIN_SECONDS:
            sent = time.monotonic()
            answer = await http.post(path, json=body, headers=headers)
            if returning:
                tally.returns += 1
            if answer.status_code in (200, 202):
                delivery.admitted = sent
                break
            if answer.status_code not in (429, 503) or "retry-after" not in answer.headers:
                raise RuntimeError(f"unexpected answer {answer.status_code}: {answer.text}")
            wait = float(answer.headers["retry-after"])
            if returning:
                tally.refused_again += 1
            if delivery.first_refused is None:
                delivery.first_refused, delivery.predicted = time.monotonic(), wait
            delivery.refusals += 1
            headers = {PLACE: answer.headers[PLACE]} if PLACE in answer.headers else {}
            returning = True
            await asyncio.sleep(wait)
        if sync and delivery.admitted is None:
            return


def _figures(tally: Tally) -> dict[str, Any]:
    refused = [d for d in tally.deliveries if d.first_refused is not None and d.admitted]
    errors = []
    for d in refused:
        assert d.first_refused is not None and d.admitted is not None and d.predicted
        actual = max(d.admitted - d.first_refused, 0.001)
        errors.append(abs(d.predicted - actual) / actual)
    overtaken = sum(
        1
        for a in refused
        if any(
            b.first_refused > a.first_refused + ORDER_SLACK_SECONDS and b.admitted < a.admitted  # type: ignore[operator]
            for b in refused
        )
    )
    waits = [d.admitted - d.first_refused for d in refused]  # type: ignore[operator]
    return {
        "admitted": sum(1 for d in tally.deliveries if d.admitted),
        "refused_webhooks": len(refused),
        "unfinished": sum(1 for d in tally.deliveries if d.admitted is None),
        "returns": tally.returns,
        "refused_again": tally.refused_again / tally.returns if tally.returns else 0.0,
        "retry_after": percentiles([d.predicted for d in refused if d.predicted is not None]),
        "actual_wait": percentiles(waits),
        "error": percentiles(errors),
        "overtaken": overtaken / len(refused) if refused else 0.0,
    }


async def _workload(base: str, name: str, seconds: float) -> dict[str, Any]:
    limits = dict(WORKLOADS[name])
    mode, task = limits.pop("mode"), limits.pop("task")
    async with new_client(base) as http:
        trigger = await create_trigger(http, name, name, mode, task, **limits)
        tally = Tally([])
        deadline = time.monotonic() + seconds
        path = f"/hooks/{trigger['token']}"
        await asyncio.gather(
            *(_client(http, path, mode == "sync", deadline, tally) for _ in range(CLIENTS))
        )
    return _figures(tally)


async def _tiny_rate(base: str) -> dict[str, float]:
    """The Retry-After of a webhook refused by a rate of ``TINY_RATE``, and the true wait."""
    async with new_client(base) as http:
        trigger = await create_trigger(
            http, "tiny", "tiny", "async", "tidegate.echo", ingest_rate=TINY_RATE, ingest_burst=1
        )
        path = f"/hooks/{trigger['token']}"
        first = await http.post(path, json={})
        admitted = time.monotonic()
        second = await http.post(path, json={})
        if first.status_code != 202 or second.status_code != 429:
            raise RuntimeError(f"tiny rate: {first.status_code}, {second.status_code}")
        true_wait = 1 / TINY_RATE - (time.monotonic() - admitted)
        return {"retry_after": float(second.headers["retry-after"]), "true_wait": true_wait}


def _admission_ms(url: str, schema: str, base: str) -> dict[str, dict[str, float]]:
    """``admit_webhook``'s time on the admitted path, each lane with its limits set
    (a fast-lane cap, an ingest rate, a backlog cap) but never reached."""

    async def triggers() -> dict[str, dict[str, Any]]:
        limits = {"fast_lane_cap": 1000, "ingest_rate": 1000.0, "ingest_burst": 1000}
        async with new_client(base) as http:
            return {
                "fast_lane": await create_trigger(
                    http, "admit", "admit_sync", "sync", "tidegate.echo", **limits
                ),
                "default": await create_trigger(
                    http, "admit", "admit_async", "async", "tidegate.echo", backlog_cap=100_000
                ),
            }

    found = run_async(triggers())
    admit, headers, timings = query("admit_webhook"), request_headers("127.0.0.1"), {}
    with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
        for lane, trigger in found.items():
            spent = []
            for k in paced(ADMISSION_CALLS + 20, 0.005):
                started = time.perf_counter()
                row = conn.execute(
                    admit, _admit_params(schema, trigger, lane, k, headers)
                ).fetchone()
                if k >= 20:  # the first warm the caches and prepare the statement
                    spent.append((time.perf_counter() - started) * 1000)
                # no_capacity: the fast lane's 4 slots were busy; it comes after every
                # limit and the waiting room, so its time is the admitted path's too.
                if row is None or row[0] not in ("admitted", "no_capacity"):
                    raise RuntimeError(f"admission call refused: {row}")
            timings[lane] = percentiles(spent)
    return timings


def one_round(url: str, seconds: float, progress: Callable[[str], None]) -> dict[str, Any]:
    """Every workload once, on a fresh schema with its own servers."""
    with fresh_schema(url, "retry_after") as schema:
        migrate(url, schema)
        with ApiServer(url, schema, 2) as api, start_worker(url, schema) as worker:
            found: dict[str, Any] = {}
            for name in WORKLOADS:
                found[name] = run_async(_workload(api.base, name, seconds))
                progress(f"  {name}: {_line(found[name])}")
            found["tiny_rate"] = run_async(_tiny_rate(api.base))
            found["admission_ms"] = _admission_ms(url, schema, api.base)
            worker.stop()
            api.stop()
    return found


def _line(figures: dict[str, Any]) -> str:
    error, wait = figures["error"], figures["actual_wait"]
    return (
        f"refused again {figures['refused_again']:.0%} of {figures['returns']} returns, "
        f"error p50 {error.get('p50', 0):.2f} p90 {error.get('p90', 0):.2f}, "
        f"overtaken {figures['overtaken']:.0%}, wait p50 {wait.get('p50', 0):.1f} s"
    )


def run_benchmark(
    url: str, seconds: float, repeat: int, progress: Callable[[str], None]
) -> list[dict[str, Any]]:
    rounds = []
    for n in range(repeat):
        progress(f"round {n + 1} of {repeat}")
        rounds.append(one_round(url, seconds, progress))
    return rounds


def _median(rounds: list[dict[str, Any]], *path: str) -> float:
    values = []
    for found in rounds:
        value: Any = found
        for step in path:
            value = value.get(step, {}) if isinstance(value, dict) else {}
        if isinstance(value, int | float):
            values.append(float(value))
    return statistics.median(values) if values else float("nan")


def render(rounds: list[dict[str, Any]]) -> str:
    """The table of medians over rounds."""
    lines = [
        "| workload | refused again after waiting Retry-After | error p50 | error p90 "
        "| overtaken | Retry-After p50 | actual wait p50 | admitted |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in WORKLOADS:
        m = lambda *path, name=name: _median(rounds, name, *path)  # noqa: E731
        lines.append(
            f"| {name} | {m('refused_again'):.0%} | {m('error', 'p50'):.2f} "
            f"| {m('error', 'p90'):.2f} | {m('overtaken'):.0%} | {m('retry_after', 'p50'):.1f} s "
            f"| {m('actual_wait', 'p50'):.1f} s | {m('admitted'):.0f} |"
        )
    lines.append(
        f"\nA rate of {TINY_RATE}/s: "
        f"Retry-After {_median(rounds, 'tiny_rate', 'retry_after'):.0f} s, "
        f"true wait {_median(rounds, 'tiny_rate', 'true_wait'):.0f} s. Admission "
        f"(admit_webhook, admitted path) p50/p99: fast lane "
        f"{_median(rounds, 'admission_ms', 'fast_lane', 'p50'):.2f}/"
        f"{_median(rounds, 'admission_ms', 'fast_lane', 'p99'):.2f} ms, async "
        f"{_median(rounds, 'admission_ms', 'default', 'p50'):.2f}/"
        f"{_median(rounds, 'admission_ms', 'default', 'p99'):.2f} ms."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="PostgreSQL to measure on (default: embedded)")
    parser.add_argument("--seconds", type=float, default=15.0, help="each workload's length (15)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (3)")
    parser.add_argument("--json", help="also write every round's figures to this file")
    options = parser.parse_args()
    from bench.harness import start_run

    url, _ = start_run("bench.retry_after", [], options.database_url, snapshot=False)
    rounds = run_benchmark(url, options.seconds, options.repeat, lambda s: print(s, flush=True))
    if options.json:
        import json

        with open(options.json, "w") as out:
            json.dump(rounds, out, indent=2)
    print(render(rounds))


if __name__ == "__main__":
    main()
