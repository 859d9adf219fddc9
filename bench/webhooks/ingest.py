"""Part 3: async ingest over HTTP, against the raw-SQL floor."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import httpx
import psycopg

from bench.harness import (
    fresh_schema,
    schema_conninfo,
)
from bench.webhooks.client import (
    PlainClient,
    Reply,
    Send,
    accepted,
    check_replies,
    create_trigger,
    ms,
    new_client,
    post,
    run_async,
    statuses,
)
from bench.webhooks.common import DEFAULT_MAX_ATTEMPTS, Options
from bench.webhooks.processes import ApiServer, CpuMeter, client_group, migrate, server_pids
from bench.webhooks.sync import request_headers

# -- part 3: async ingest, against the raw-SQL floor ------------------------------------------


def measure_ingest(url: str, options: Options, raw_first: bool) -> dict[str, Any]:
    """Both sides of the ingest comparison, in the order given."""
    sides = ("raw", "tidegate") if raw_first else ("tidegate", "raw")
    found = {side: (_ingest_raw if side == "raw" else _ingest_http)(url, options) for side in sides}
    found["ratio"] = found["tidegate"]["rate"] / found["raw"]["rate"]
    found["ratio_plain_client"] = found["tidegate"]["plain_client"]["rate"] / found["raw"]["rate"]
    found["verified"] = found["tidegate"]["verified"] and found["raw"]["verified"]
    found["order"] = list(sides)
    return found


def _ingest_http(url: str, options: Options) -> dict[str, Any]:
    """Async webhooks on ``ingest_api_processes``: httpx clients, then plain ones."""
    with fresh_schema(url, "http") as schema:
        migrate(url, schema)
        with ApiServer(url, schema, options.ingest_api_processes) as api:
            meter = CpuMeter(
                {"client": client_group(), "api": api.pids, "postgres": server_pids(url)}
            )
            http = run_async(_ingest_over_http(api.base, options, meter))
            api.stop()
        with psycopg.connect(schema_conninfo(url, schema), autocommit=True) as conn:
            found = {
                client: _ingest_figures(conn, http[client], options)
                for client in ("httpx", "plain")
            }
    return {
        **found["httpx"],
        "verified": found["httpx"]["verified"] and found["plain"]["verified"],
        "plain_client": found["plain"],
    }


def _ingest_figures(
    conn: psycopg.Connection, http: dict[str, Any], options: Options
) -> dict[str, Any]:
    check = check_replies(conn, http["project"], http["warm"] + http["timed"], sync=False)
    timed: list[Reply] = http["timed"]
    ok = [r for r in timed if r.status == 202]
    return {
        "verified": check["verified"],
        "problems": check["problems"],
        "requests": len(timed),
        "accepted": len(ok),
        "statuses": statuses(timed),
        "seconds": round(http["seconds"], 3),
        "rate": len(ok) / http["seconds"],
        "wait_ms": ms(r.wait_ms for r in ok),
        "clients": options.ingest_clients,
        "api_processes": options.ingest_api_processes,
        "cpu": http["cpu"],
    }


async def _ingest_over_http(base: str, options: Options, meter: CpuMeter) -> dict[str, Any]:
    async with new_client(base) as admin:
        triggers = {
            client: await create_trigger(admin, project, "echo", "async", "tidegate.echo")
            for client, project in (("httpx", "ingest"), ("plain", "ingest_plain"))
        }
    found: dict[str, Any] = {}
    httpx_clients = [new_client(base) for _ in range(options.ingest_clients)]
    try:
        senders = [_ingest_httpx(c, triggers["httpx"]["url"]) for c in httpx_clients]
        found["httpx"] = await _drive_ingest(triggers["httpx"], senders, options, meter)
    finally:
        for client in httpx_clients:
            await client.aclose()
    plain = [await PlainClient.open(base) for _ in range(options.ingest_clients)]
    try:
        senders = [_ingest_plain(c, triggers["plain"]["url"]) for c in plain]
        found["plain"] = await _drive_ingest(triggers["plain"], senders, options, meter)
    finally:
        for client in plain:
            client.close()
    return found


def _ingest_httpx(client: httpx.AsyncClient, path: str) -> Send:
    return lambda k, _: post(client, path, k, ingest_payload(k), expect=accepted)


def _ingest_plain(client: PlainClient, path: str) -> Send:
    return lambda k, _: client.request("POST", path, k, ingest_payload(k), expect=accepted)


async def _drive_ingest(
    trigger: dict[str, Any], senders: Sequence[Send], options: Options, meter: CpuMeter
) -> dict[str, Any]:
    """Warm each client's connection, then send ``ingest_requests`` from all at once."""
    warm: list[Reply] = []
    for j, send in enumerate(senders):  # one connection each, statements prepared
        for i in range(5):
            warm.append(await send(-1 - 5 * j - i, None))
    timed: list[Reply] = []
    numbers = iter(range(options.ingest_requests))

    async def drive(send: Send) -> None:
        for k in numbers:
            timed.append(await send(k, None))

    meter.start()
    started = time.perf_counter()
    await asyncio.gather(*(drive(send) for send in senders))
    seconds = time.perf_counter() - started
    cpu = meter.stop()
    return {
        "project": trigger["project"],
        "warm": warm,
        "timed": timed,
        "seconds": seconds,
        "cpu": cpu,
    }


def ingest_payload(i: int) -> dict[str, Any]:
    return {"i": i, "event": "bench.ingest", "data": {"id": f"evt_{i:08d}", "amount": 1234}}


INSERT_RUN = """
INSERT INTO runs (project, lane, key, task, args, max_attempts)
VALUES (%(project)s, 'default', %(project)s, %(task)s, %(args)s::jsonb, %(max_attempts)s)
RETURNING id
"""
INSERT_REQUEST = """
INSERT INTO requests (project, trigger_id, run_id, idempotency_key, content_type, headers, body)
VALUES (%(project)s, %(trigger_id)s, %(run_id)s, NULL, 'application/json', %(headers)s::jsonb,
        %(body)s)
"""


def _ingest_raw(url: str, options: Options) -> dict[str, Any]:
    """The same two rows per webhook, two single-row INSERTs in one transaction each."""
    with fresh_schema(url, "http") as schema:
        migrate(url, schema)
        conninfo = schema_conninfo(url, schema)
        meter = CpuMeter({"client": client_group(), "postgres": server_pids(url)})
        seconds, cpu = run_async(_ingest_raw_async(conninfo, options, meter))
        with psycopg.connect(conninfo, autocommit=True) as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM runs),"
                " (SELECT count(*) FROM requests q JOIN runs r ON r.id = q.run_id),"
                " (SELECT count(DISTINCT args->'body'->>'i') FROM runs)"
            ).fetchone()
    n = options.ingest_requests
    return {
        "verified": row == (n, n, n),
        "problems": [] if row == (n, n, n) else [f"expected {n} runs and requests, found {row}"],
        "requests": n,
        "accepted": n,
        "seconds": round(seconds, 3),
        "rate": n / seconds,
        "clients": options.ingest_clients,
        "cpu": cpu,
    }


async def _ingest_raw_async(
    conninfo: str, options: Options, meter: CpuMeter
) -> tuple[float, dict[str, Any]]:
    headers = request_headers("127.0.0.1:8000")
    connections = [
        await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        for _ in range(options.ingest_clients)
    ]
    numbers = iter(range(options.ingest_requests))

    async def drive(conn: psycopg.AsyncConnection) -> None:
        for i in numbers:
            payload = ingest_payload(i)
            body = json.dumps(payload).encode()
            kept = {**headers, "content-length": str(len(body))}
            args = {"body": payload, "headers": kept, "trigger": "echo"}
            params = {
                "project": "ingest",
                "task": "tidegate.echo",
                "args": json.dumps(args),
                "max_attempts": DEFAULT_MAX_ATTEMPTS,
                "trigger_id": 1,
                "headers": json.dumps(kept),
                "body": body,
            }
            async with conn.transaction():
                cursor = await conn.execute(INSERT_RUN, params)
                row = await cursor.fetchone()
                assert row is not None
                await conn.execute(INSERT_REQUEST, {**params, "run_id": row[0]})

    try:
        meter.start()
        started = time.perf_counter()
        await asyncio.gather(*(drive(conn) for conn in connections))
        seconds = time.perf_counter() - started
        cpu = meter.stop()
    finally:
        for conn in connections:
            await conn.close()
    return seconds, cpu
