"""Parts 1 and 2: the sync round trip, the admission decision, the fast-lane cap."""

from __future__ import annotations

import asyncio
import collections
import json
import random
import threading
import time
from collections.abc import Iterable
from typing import Any

import httpx
import psycopg

from bench.harness import (
    fresh_schema,
    paced,
    schema_conninfo,
)
from bench.webhooks.client import (
    Expect,
    PlainPool,
    Reply,
    RunRow,
    check_replies,
    create_trigger,
    echoes,
    httpx_health,
    httpx_webhooks,
    ms,
    new_client,
    open_connections,
    open_loop,
    post,
    run_async,
    runs_of,
    statuses,
)
from bench.webhooks.common import (
    DEFAULT_FAST_LANE_CAP,
    DEFAULT_MAX_ATTEMPTS,
    LIVE_SECONDS,
    SAMPLER_INTERVAL_SECONDS,
    STAGES,
    Options,
)
from bench.webhooks.processes import (
    ApiServer,
    CpuMeter,
    client_group,
    migrate,
    server_pids,
    start_worker,
)
from tidegate.admission import MAX_PLACES, PLACE_GRACE_SECONDS
from tidegate.storage.sql import query

# -- part 1 and 2: sync round trip, admission decision ------------------------------------


def measure_sync(url: str, options: Options) -> tuple[dict[str, Any], dict[str, Any]]:
    """One API process and one worker: steady sync load, burst, then admission calls."""
    with fresh_schema(url, "http") as schema:
        migrate(url, schema)
        with start_worker(url, schema) as worker, ApiServer(url, schema, 1) as api:
            meter = CpuMeter(
                {
                    "client": client_group(),
                    "api": api.pids,
                    "worker": lambda: [worker.process.pid],
                    "postgres": server_pids(url),
                }
            )
            http = run_async(_sync_over_http(api.base, options, meter))
            worker.check_alive()
            admission = _admission_calls(url, schema, http.pop("triggers"), options)
            worker.check_alive()
            api.stop()
            worker.stop()
        with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
            sync = _check_sync(conn, http, options)
            admission["verified"] = _check_admission(conn, admission)
    return sync, admission


async def _sync_over_http(base: str, options: Options, meter: CpuMeter) -> dict[str, Any]:
    async with new_client(base) as client:
        made = {
            "warm": await create_trigger(client, "warm", "echo", "sync", "tidegate.echo"),
            "steady": await create_trigger(client, "steady", "echo", "sync", "tidegate.echo"),
            "steady_plain": await create_trigger(
                client, "steady_plain", "echo", "sync", "tidegate.echo"
            ),
            "burst": await create_trigger(
                client, "burst", "echo", "sync", "tidegate.echo", fast_lane_cap=options.burst
            ),
            "admit_sync": await create_trigger(
                client,
                "admit",
                "sync",
                "sync",
                "tidegate.echo",
                fast_lane_cap=options.admission_cap,
            ),
            "admit_async": await create_trigger(client, "admit", "async", "async", "tidegate.echo"),
        }

        def payload(k: int) -> dict[str, Any]:
            return {"k": k, "event": "bench.sync"}

        count = max(1, round(options.rate * options.steady_seconds))
        # httpx: warm-up (connections, prepared statements, the worker's first claims),
        # the HTTP floor, then the measured steady load.
        warm = await open_loop(
            httpx_webhooks(client, made["warm"]["url"], payload),
            options.warmup_requests,
            options.rate,
        )
        await open_loop(httpx_health(client), options.warmup_requests, options.rate)
        floor = await open_loop(httpx_health(client), options.floor_requests, options.rate)
        meter.start()
        steady = await open_loop(
            httpx_webhooks(client, made["steady"]["url"], payload), count, options.rate
        )
        cpu = meter.stop()
        # The control: the same with a minimal client (its own warm-up, on the warm project).
        pool = PlainPool(base)
        try:
            await pool.fill(8)
            warm += await open_loop(
                pool.sender("POST", made["warm"]["url"], payload),
                options.warmup_requests,
                options.rate,
            )
            floor_plain = await open_loop(
                pool.sender("GET", "/healthz"), options.floor_requests, options.rate
            )
            meter.start()
            steady_plain = await open_loop(
                pool.sender("POST", made["steady_plain"]["url"], payload), count, options.rate
            )
            cpu_plain = meter.stop()
        finally:
            pool.close()
        await asyncio.sleep(0.5)  # the burst starts from an idle worker
        await open_connections(client, options.burst)
        started = time.perf_counter()
        burst = await asyncio.gather(
            *(
                post(client, made["burst"]["url"], k, payload(k), expect=echoes(payload(k)))
                for k in range(options.burst)
            )
        )
        burst_seconds = time.perf_counter() - started
    return {
        "triggers": made,
        "warm": warm,
        "floor": floor,
        "steady": steady,
        "steady_cpu": cpu,
        "floor_plain": floor_plain,
        "steady_plain": steady_plain,
        "steady_plain_cpu": cpu_plain,
        "burst": list(burst),
        "burst_seconds": burst_seconds,
    }


def _check_sync(conn: psycopg.Connection, http: dict[str, Any], options: Options) -> dict[str, Any]:
    names = ("warm", "steady", "steady_plain", "burst")
    checks = {name: check_replies(conn, name, http[name], sync=True) for name in names}
    burst: list[Reply] = http["burst"]
    # A rejection (429/503) is an answer, not a failure: it is counted, and it must have
    # stored nothing (check_replies). So is a request that got no HTTP answer (status -1,
    # counted under its error): it must have stored nothing either, or the run count
    # of its project does not match and the check fails.
    problems = [p for c in checks.values() for p in c["problems"]]
    for name in ("steady", "steady_plain"):
        if not any(r.status == 200 for r in http[name]):
            problems.append(f"{name}: no request was answered 200")
    if any(r.status != 200 for name in ("floor", "floor_plain") for r in http[name]):
        problems.append("GET /healthz failed")
    return {
        "verified": all(c["verified"] for c in checks.values()) and not problems,
        "problems": problems[:10],
        "steady": _steady_figures(http["steady"], checks["steady"], http["steady_cpu"], options),
        "floor": {
            "requests": len(http["floor"]),
            "path": "GET /healthz",
            "wait_ms": ms(r.wait_ms for r in http["floor"]),
        },
        "steady_plain": _steady_figures(
            http["steady_plain"], checks["steady_plain"], http["steady_plain_cpu"], options
        ),
        "floor_plain": {
            "requests": len(http["floor_plain"]),
            "path": "GET /healthz",
            "wait_ms": ms(r.wait_ms for r in http["floor_plain"]),
        },
        "burst": {
            "requests": len(burst),
            "fast_lane_cap": options.burst,
            "statuses": statuses(burst),
            "admitted": checks["burst"]["admitted"],
            "wait_ms_admitted": ms(r.wait_ms for r in burst if r.status == 200),
            "wait_ms_all": ms(r.wait_ms for r in burst),
            "seconds": round(http["burst_seconds"], 3),
        },
    }


def _steady_figures(
    replies: list[Reply], check: dict[str, Any], cpu: dict[str, Any], options: Options
) -> dict[str, Any]:
    """The caller's wait at a steady rate, and where it went (from the run's timestamps)."""
    interval_ms = 1000 / options.rate
    ok = [r for r in replies if r.status == 200]
    runs: dict[int, RunRow] = check["runs"]
    stages: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for reply in ok:
        run = runs.get(reply.run_id or -1)
        if run is None or run.attempted_at is None or run.completed_at is None:
            continue
        stages["send"].append((run.inserted_at - reply.sent_at) * 1000)
        stages["admit"].append((run.attempted_at - run.inserted_at) * 1000)
        stages["run"].append((run.completed_at - run.attempted_at) * 1000)
        stages["reply"].append((reply.replied_at - run.completed_at) * 1000)
    lags = [(r.sent - r.scheduled) * 1000 for r in replies]
    sent_span = max(r.sent for r in replies) - min(r.sent for r in replies)
    return {
        "requests": len(replies),
        "rate": options.rate,
        "sent_rate": round((len(replies) - 1) / sent_span, 2) if sent_span else None,
        "statuses": statuses(replies),
        "wait_ms": ms(r.wait_ms for r in ok),
        "from_schedule_ms": ms((r.done - r.scheduled) * 1000 for r in ok),
        "late_replies": sum(1 for r in ok if r.wait_ms > interval_ms),
        "late_reply_threshold_ms": interval_ms,
        "send_lag_ms": ms(lags),
        "late_sends": sum(1 for lag in lags if lag > 2.0),
        "stage_ms": {stage: ms(values) for stage, values in stages.items()},
        "cpu": cpu,
        "verified_runs": check["admitted"],
    }


def _admit_params(
    schema: str, trigger: dict[str, Any], lane: str, k: int, headers: dict[str, str]
) -> dict[str, Any]:
    """The parameters the API passes to ``admit_webhook`` for one webhook (hooks._admit)."""
    payload = {"k": k, "event": "bench.admission"}
    body = json.dumps(payload).encode()
    kept = {**headers, "content-length": str(len(body))}
    return {
        "trigger_id": trigger["id"],
        "project": trigger["project"],
        "lane": lane,
        "task": trigger["task"],
        "key": trigger["project"],
        "args": json.dumps({"body": payload, "headers": kept, "trigger": trigger["name"]}),
        "max_attempts": 1 if lane == "fast_lane" else DEFAULT_MAX_ATTEMPTS,
        "idempotency_key": None,
        "content_type": "application/json",
        "headers": json.dumps(kept),
        "body": body,
        "default_fast_lane_cap": DEFAULT_FAST_LANE_CAP,
        "live_seconds": LIVE_SECONDS,
        "channel": f"{schema}.available",
        "ticket": None,
        "place_grace": PLACE_GRACE_SECONDS,
        "max_places": MAX_PLACES,
        "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
        "unique_key": None,
        "unique_states": None,
    }


def request_headers(host: str) -> dict[str, str]:
    """The headers httpx sends and the API keeps (its ``requests.headers``)."""
    return {
        "host": host,
        "accept": "*/*",
        "accept-encoding": "gzip, deflate",
        "connection": "keep-alive",
        "user-agent": f"python-httpx/{httpx.__version__}",
        "content-length": "0",
        "content-type": "application/json",
    }


def _admission_calls(
    url: str, schema: str, triggers: dict[str, Any], options: Options
) -> dict[str, Any]:
    """Time ``admit_webhook`` (and, for scale, ``SELECT 1`` and the trigger lookup)."""
    admit, find = query("admit_webhook"), query("find_trigger")
    headers = request_headers("127.0.0.1:8000")
    interval = options.admission_interval_ms / 1000
    calls = options.admission_calls
    timings: dict[str, list[float]] = {}
    decisions: dict[str, collections.Counter[str]] = {}
    with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:

        def timed(name: str, statement: str, params: Any) -> Any:
            started = time.perf_counter()
            rows = conn.execute(statement, params).fetchall()
            timings.setdefault(name, []).append((time.perf_counter() - started) * 1000)
            return rows

        lanes = {"fast_lane": triggers["admit_sync"], "default": triggers["admit_async"]}
        for lane, trigger in lanes.items():  # warm-up: prepared statements, caches
            for k in paced(20, interval):
                conn.execute(admit, _admit_params(schema, trigger, lane, -1 - k, headers))
        timings.clear()
        token = triggers["admit_sync"]["token"]
        for _ in paced(calls, interval):
            timed("select_1", "SELECT 1", None)
            timed("find_trigger", find, {"token": token})
        for lane, trigger in lanes.items():
            decisions[lane] = collections.Counter()
            for k in paced(calls, interval):
                rows = timed(
                    f"admit_{lane}", admit, _admit_params(schema, trigger, lane, k, headers)
                )
                decisions[lane][rows[0][0]] += 1
        # The decision alone: the same call inside a transaction that is rolled back, so
        # no commit (WAL flush) and no NOTIFY (nobody is woken); it stores nothing.
        for lane, trigger in lanes.items():
            for k in paced(calls, interval):
                with conn.transaction(force_rollback=True):
                    params = _admit_params(schema, trigger, lane, calls + k, headers)
                    timed(f"admit_{lane}_rolled_back", admit, params)
    return {
        "calls": calls,
        "interval_ms": options.admission_interval_ms,
        "fast_lane_cap": options.admission_cap,
        "ms": {name: ms(values) for name, values in timings.items()},
        "decisions": {lane: dict(counted) for lane, counted in decisions.items()},
        "warmup_calls": 20 * len(lanes),
    }


def _check_admission(conn: psycopg.Connection, admission: dict[str, Any]) -> bool:
    """Every admitted call left one run and one request row, and nothing else did; what
    differs goes to the part's ``problems``."""
    runs = runs_of(conn, "admit")
    admitted = admission["warmup_calls"] + sum(
        counted.get("admitted", 0) for counted in admission["decisions"].values()
    )
    problems = [f"{len(runs)} runs for {admitted} admitted calls"] if len(runs) != admitted else []
    problems += [f"run {i} has {r.requests} requests" for i, r in runs.items() if r.requests != 1]
    admission["problems"] = problems
    return not problems


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The most intervals open at once (one ending when another starts: not both)."""
    events = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda event: (event[0], event[1]),
    )
    open_now = most = 0
    for _, change in events:
        open_now += change
        most = max(most, open_now)
    return most


def measure_cap(url: str, options: Options) -> dict[str, Any]:
    """A burst of retrying clients against a capped project on several API processes."""
    with fresh_schema(url, "http") as schema:
        migrate(url, schema)
        with (
            start_worker(url, schema) as worker,
            ApiServer(url, schema, options.cap_api_processes) as api,
        ):
            sampler = InflightSampler(schema_conninfo(url, schema), "capped")
            http = run_async(_cap_over_http(api.base, options, sampler))
            worker.check_alive()
            api.stop()
            worker.stop()
        with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
            replies: list[Reply] = http["replies"]
            check = check_replies(conn, "capped", replies, sync=True)
    runs: dict[int, RunRow] = check["runs"]
    running = [
        (r.attempted_at, r.completed_at)
        for r in runs.values()
        if r.attempted_at is not None and r.completed_at is not None
    ]
    most_running = max_overlap(running)
    most_sampled = max(sampler.counts, default=0)
    admitted = [r for r in replies if r.status in (200, 202)]
    return {
        "verified": check["verified"] and len(running) == len(runs),
        "problems": check["problems"],
        "cap": options.cap,
        "clients": options.cap_clients,
        "api_processes": options.cap_api_processes,
        "handler_sleep_seconds": options.cap_sleep_seconds,
        "seconds": options.cap_seconds,
        "requests": len(replies),
        "statuses": statuses(replies),
        "admitted": len(admitted),
        "clients_admitted": len({r.k for r in admitted}),
        "max_running": most_running,
        "max_inflight_sampled": most_sampled,
        "samples": len(sampler.counts),
        "over_admission": max(0, most_running - options.cap, most_sampled - options.cap),
        "wait_ms_admitted": ms(r.wait_ms for r in admitted),
        "wait_ms_rejected": ms(r.wait_ms for r in replies if r.status in (429, 503)),
    }


class InflightSampler:
    """Poll a project's in-flight fast-lane runs (one consistent snapshot per poll)."""

    def __init__(self, conninfo: str, project: str) -> None:
        self.conninfo = conninfo
        self.project = project
        self.counts: list[int] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            statement = (
                "SELECT count(*) FROM runs WHERE project = %s AND lane = 'fast_lane'"
                " AND state IN ('scheduled', 'available', 'running')"
            )
            while not self.stopping.wait(SAMPLER_INTERVAL_SECONDS):
                row = conn.execute(statement, [self.project]).fetchone()
                self.counts.append(int(row[0]) if row else 0)

    def __enter__(self) -> InflightSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(10)


async def _cap_over_http(base: str, options: Options, sampler: InflightSampler) -> dict[str, Any]:
    async with new_client(base) as client:
        trigger = await create_trigger(
            client, "capped", "sleep", "sync", "tidegate.sleep", fast_lane_cap=options.cap
        )
        await open_connections(client, options.cap_clients)
        replies: list[Reply] = []
        deadline = time.perf_counter() + options.cap_seconds

        async def one_client(k: int) -> None:
            payload = {"seconds": options.cap_sleep_seconds, "client": k}
            while time.perf_counter() < deadline:
                reply = await post(client, trigger["url"], k, payload, expect=slept(payload))
                replies.append(reply)
                if reply.status not in (429, 503):
                    return
                await asyncio.sleep(random.uniform(0.05, 0.15))

        with sampler:
            await asyncio.gather(*(one_client(k) for k in range(options.cap_clients)))
    return {"replies": replies}


def slept(payload: dict[str, Any]) -> Expect:
    return lambda status, body: status == 200 and body == {"slept": payload["seconds"]}
