"""Admission control at the webhook endpoint, through real servers and worker processes.

The fast-lane cap is checked where it matters: several API processes taking one burst
at once, while workers run what was admitted. What ran, and when, is read back from
PostgreSQL (the runs' claim and completion times, and the handler's own records).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import wait_until
from tests.http_fixtures import (
    ADMIN,
    ApiServer,
    assert_problem,
    counts,
    create_project,
    create_trigger,
)
from tidegate.admission import PLACE_FIELD

FAST_LANE_POLICY = '"fast_lane";q={cap};qu="concurrent-requests"'


@pytest.fixture
async def client(api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        yield client


def most_at_once(intervals: Iterable[tuple[datetime, datetime]]) -> int:
    """Return the largest number of ``[start, end)`` intervals that overlap at an instant."""
    events = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda event: (event[0], event[1]),  # an end before a start at the same instant
    )
    current = highest = 0
    for _, step in events:
        current += step
        highest = max(highest, current)
    return highest


def check_fast_lane_fields(response: httpx.Response, cap: int) -> int:
    """Check the rate-limit fields of a fast-lane answer; return the remaining count."""
    headers = response.headers
    assert headers["ratelimit-policy"] == FAST_LANE_POLICY.format(cap=cap)
    assert headers["ratelimit-limit"] == str(cap)
    remaining = int(headers["ratelimit-remaining"])
    reset = int(headers["ratelimit-reset"])
    assert 0 <= remaining <= max(cap - 1, 0)
    # A refusal adds the due time that t rounds up (due=, to the millisecond).
    due = r"(;due=\d+\.\d{3})?"
    assert re.fullmatch(rf'"fast_lane";r={remaining};t={reset}{due}', headers["ratelimit"])
    return remaining


def check_over_cap(response: httpx.Response, cap: int) -> None:
    """A 429 for the fast-lane cap: Retry-After, and the draft's fields with r=0."""
    problem = assert_problem(response, 429)
    assert problem["cap"] == cap
    retry_after = response.headers["retry-after"]
    assert retry_after.isdigit() and int(retry_after) >= 1
    assert check_fast_lane_fields(response, cap) == 0
    reset = int(response.headers["ratelimit-reset"])
    assert 1 <= reset <= int(retry_after)  # Retry-After is not earlier than t
    assert ";due=" in response.headers["ratelimit"]


async def test_fast_lane_cap_holds_across_api_processes_under_a_burst(
    start_api: Callable[..., ApiServer],
    start_worker_process: Callable[..., Any],
    sql: psycopg.Connection,
) -> None:
    """200 sync webhooks at once on 3 API processes: never more than the cap in flight."""
    cap = 3
    api = start_api(processes=3)
    start_worker_process("fast_lane:4")
    start_worker_process("fast_lane:4")  # 8 fast-lane slots: only the cap can say no
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=api.url, timeout=30, limits=limits) as client:
        await create_project(client, "acme", fast_lane_cap=cap)
        trigger = await create_trigger(client, "acme", "quote", mode="sync", task="hook_sleep")

        responses = await asyncio.wait_for(
            asyncio.gather(
                *(client.post(trigger["url"], json={"seconds": 0.3}) for _ in range(200))
            ),
            timeout=60,
        )

    statuses = [r.status_code for r in responses]
    admitted = [r for r in responses if r.status_code == 200]
    rejected = [r for r in responses if r.status_code == 429]
    assert len(admitted) + len(rejected) == 200, sorted(set(statuses))
    assert len(admitted) >= cap and rejected
    remaining = [check_fast_lane_fields(response, cap) for response in admitted]
    assert max(remaining) == cap - 1  # the first admitted found nothing in flight
    assert all(response.json() == {"slept": 0.3} for response in admitted)
    for response in rejected:
        check_over_cap(response, cap)
    # A rejection left nothing behind; every admitted webhook left one run and one request.
    assert counts(sql) == (len(admitted), len(admitted))
    runs = sql.execute(
        "SELECT attempted_at, completed_at FROM runs"
        " WHERE lane = 'fast_lane' AND state = 'succeeded' AND attempt = 1"
    ).fetchall()
    assert len(runs) == len(admitted)
    assert most_at_once(runs) <= cap
    executions = sql.execute("SELECT started_at, finished_at FROM executions").fetchall()
    assert len(executions) == len(admitted)
    assert most_at_once(executions) <= cap


async def test_changing_the_fast_lane_cap_holds_for_the_next_request(
    client: httpx.AsyncClient,
    start_worker_process: Callable[..., Any],
    sql: psycopg.Connection,
) -> None:
    start_worker_process("fast_lane:3")
    project = await create_project(client, "acme", fast_lane_cap=1)
    assert project["fast_lane_cap"] == 1
    trigger = await create_trigger(client, "acme", "quote", mode="sync", task="hook_sleep")
    url = trigger["url"]

    long = asyncio.create_task(client.post(url, json={"seconds": 3}))
    await wait_until(
        lambda: sql.execute("SELECT count(*) FROM runs WHERE state = 'running'").fetchone() == (1,),
        timeout=10,
    )
    check_over_cap(await client.post(url, json={"seconds": 0}), cap=1)
    assert counts(sql) == (1, 1)

    patched = await client.patch("/admin/projects/acme", json={"fast_lane_cap": 3}, headers=ADMIN)
    assert patched.status_code == 200, patched.text
    assert patched.json()["fast_lane_cap"] == 3
    admitted = await client.post(url, json={"seconds": 0})
    assert admitted.status_code == 200, admitted.text
    # One run in flight besides this one, out of 3: one place left after it.
    assert check_fast_lane_fields(admitted, cap=3) == 1

    patched = await client.patch("/admin/projects/acme", json={"fast_lane_cap": 0}, headers=ADMIN)
    assert patched.status_code == 200, patched.text
    check_over_cap(await client.post(url, json={"seconds": 0}), cap=0)

    first = await long
    assert first.status_code == 200, first.text
    assert check_fast_lane_fields(first, cap=1) == 0
    assert counts(sql) == (2, 2)


async def test_sync_webhook_without_a_fast_lane_slot_gets_503_until_a_worker_starts(
    client: httpx.AsyncClient,
    start_worker_process: Callable[..., Any],
    sql: psycopg.Connection,
) -> None:
    await create_project(client, "acme")
    sync = await create_trigger(client, "acme", "quote", mode="sync", task="echo")
    no_worker = await client.post(sync["url"], json={"n": 0})
    start_worker_process("manual:2")  # a live worker, but none of its slots takes fast_lane

    response = await client.post(sync["url"], json={"n": 1})

    for refused in (no_worker, response):
        problem = assert_problem(refused, 503)
        assert problem["detail"].startswith("no live worker has task 'echo'")
        assert int(refused.headers["retry-after"]) >= 1
    assert counts(sql) == (0, 0)

    # A fast-lane slot of a worker that lacks the task takes nothing either.
    start_worker_process("fast_lane:1", "--app", "tidegate.builtin:app")
    response = await client.post(sync["url"], json={"n": 1})
    assert assert_problem(response, 503)["detail"].startswith("no live worker has task 'echo'")
    assert counts(sql) == (0, 0)

    start_worker_process("fast_lane:1")
    response = await client.post(sync["url"], json={"n": 2})
    assert response.status_code == 200, response.text
    assert response.json()["body"] == {"n": 2}
    assert counts(sql) == (1, 1)


async def test_sync_webhook_when_every_fast_lane_slot_is_busy_gets_503(
    client: httpx.AsyncClient,
    start_worker_process: Callable[..., Any],
    sql: psycopg.Connection,
) -> None:
    """Capacity is the cluster's: another project's run in the only slot means 503, not 429."""
    start_worker_process("fast_lane:1")
    await create_project(client, "busy")
    await create_project(client, "acme")
    busy = await create_trigger(client, "busy", "quote", mode="sync", task="hook_sleep")
    mine = await create_trigger(client, "acme", "quote", mode="sync", task="hook_sleep")
    holding = asyncio.create_task(client.post(busy["url"], json={"seconds": 2}))
    await wait_until(
        lambda: sql.execute("SELECT count(*) FROM runs WHERE state = 'running'").fetchone() == (1,),
        timeout=10,
    )

    response = await client.post(mine["url"], json={"seconds": 0})

    assert_problem(response, 503)
    assert int(response.headers["retry-after"]) >= 1
    assert counts(sql) == (1, 1)
    assert (await holding).status_code == 200
    # The slot is free again once the run has finished.
    admitted = await client.post(mine["url"], json={"seconds": 0})
    assert admitted.status_code == 200, admitted.text
    assert counts(sql) == (2, 2)


async def test_an_overfull_workloop_does_not_hide_another_ones_free_fast_lane_slot(
    client: httpx.AsyncClient,
    start_worker_process: Callable[..., Any],
    sql: psycopg.Connection,
) -> None:
    """A workloop frees a slot when a handler returns, before its outcome is written:
    meanwhile the database shows it running more runs than it has slots. That excess
    must not be taken off another workloop's free fast-lane slot."""
    start_worker_process("fast_lane:1")
    await create_project(client, "acme")
    sync = await create_trigger(client, "acme", "quote", mode="sync", task="echo")
    # A live worker whose mixed workloop (2 slots) shows 3 runs running: 2 new ones and
    # one whose outcome is on its way.
    sql.execute(
        "INSERT INTO workers (id, host, pid, workloops, tasks) VALUES ('busy', 'h', 1, "
        """'[{"chain": ["fast_lane", "*"], "slots": 2, "busy": 2}]', '{echo}')"""
    )
    sql.execute(
        "INSERT INTO runs (project, lane, key, task, state, worker_id, workloop, attempt, "
        "lease_expires_at) SELECT 'acme', 'default', 'acme', 'echo', 'running', 'busy', 0, "
        "1, now() + interval '1 minute' FROM generate_series(1, 3)"
    )

    response = await client.post(sync["url"], json={"n": 1})

    assert response.status_code == 200, response.text
    assert response.json()["body"] == {"n": 1}


async def test_ingest_rate_admits_the_burst_then_asks_to_wait(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    await create_project(client, "acme", ingest_rate=2, ingest_burst=2)
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")

    started = time.monotonic()
    responses = await asyncio.gather(
        *(
            client.post(trigger["url"], json={}, headers={"Idempotency-Key": f"k{n}"})
            for n in range(10)
        )
    )
    elapsed = time.monotonic() - started

    admitted = [r for r in responses if r.status_code == 202]
    rejected = [r for r in responses if r.status_code == 429]
    assert len(admitted) + len(rejected) == 10, [r.status_code for r in responses]
    # 2 at once, then one every 0.5 s: more only if the burst itself took that long.
    assert 2 <= len(admitted) <= 2 + int(elapsed * 2), (elapsed, [r.status_code for r in responses])
    for response in admitted:
        assert response.headers["ratelimit-policy"] == '"ingest";q=2;qu="requests"'
        assert response.headers["ratelimit-limit"] == "2"
        assert int(response.headers["ratelimit-remaining"]) in (0, 1)
    remaining = sorted(int(r.headers["ratelimit-remaining"]) for r in admitted)
    assert (remaining[0], remaining[-1]) == (0, 1)  # the first found one more place
    waits = []
    for response in rejected:
        assert_problem(response, 429)
        wait = response.headers["retry-after"]
        assert wait.isdigit() and 1 <= int(wait) <= 60
        assert response.headers["ratelimit-policy"] == '"ingest";q=2;qu="requests"'
        assert re.fullmatch(
            rf'"ingest";r=0;t={wait};due=\d+\.\d{{3}}', response.headers["ratelimit"]
        )
        assert (response.headers["ratelimit-limit"], response.headers["ratelimit-remaining"]) == (
            "2",
            "0",
        )
        waits.append(int(wait))
    assert counts(sql) == (len(admitted), len(admitted))
    # A repeat of an admitted webhook gets its answer before the rate is looked at.
    repeat = await client.post(
        trigger["url"],
        json={},
        headers={"Idempotency-Key": admitted[0].request.headers["idempotency-key"]},
    )
    assert repeat.status_code == 202, repeat.text
    assert repeat.headers["idempotent-replayed"] == "true"
    assert repeat.json()["run_id"] == admitted[0].json()["run_id"]

    # The first in the waiting room, sent again at its time with its place, is admitted;
    # a rejected webhook was not remembered: sent again, it is new.
    first = min(rejected, key=lambda r: float(r.headers[PLACE_FIELD].split("due=")[1]))
    await asyncio.sleep(int(first.headers["retry-after"]))
    again = await client.post(
        trigger["url"],
        json={},
        headers={
            "Idempotency-Key": first.request.headers["idempotency-key"],
            PLACE_FIELD: first.headers[PLACE_FIELD],
        },
    )
    assert again.status_code == 202, again.text
    assert "idempotent-replayed" not in again.headers
    assert counts(sql) == (len(admitted) + 1, len(admitted) + 1)


async def test_backlog_cap_gets_503_when_the_lane_is_full(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    await create_project(client, "acme", backlog_cap=3)
    trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")

    for n in range(3):
        response = await client.post(trigger["url"], json={"n": n})
        assert response.status_code == 202, response.text

    full = await client.post(trigger["url"], json={"n": 3})

    assert_problem(full, 503)
    assert int(full.headers["retry-after"]) >= 1
    assert counts(sql) == (3, 3)
    # Raising the cap makes room at once, for the caller first in line.
    patched = await client.patch("/admin/projects/acme", json={"backlog_cap": 4}, headers=ADMIN)
    assert patched.status_code == 200, patched.text
    place = {PLACE_FIELD: full.headers[PLACE_FIELD]}
    assert (await client.post(trigger["url"], json={"n": 3}, headers=place)).status_code == 202
    assert counts(sql) == (4, 4)


async def test_backlog_cap_holds_across_api_processes_under_a_burst(
    start_api: Callable[..., ApiServer], sql: psycopg.Connection
) -> None:
    """100 async webhooks at once on 3 API processes, no worker: exactly the cap admitted."""
    cap = 5
    api = start_api(processes=3)
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=api.url, timeout=30, limits=limits) as client:
        await create_project(client, "acme", backlog_cap=cap)
        trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")
        responses = await asyncio.wait_for(
            asyncio.gather(*(client.post(trigger["url"], json={"n": n}) for n in range(100))),
            timeout=60,
        )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [202] * cap + [503] * (100 - cap), statuses
    assert counts(sql) == (cap, cap)


async def test_backlog_cap_counts_runs_that_wait_for_a_worker_with_their_task(
    client: httpx.AsyncClient,
    start_worker_process: Callable[..., Any],
    sql: psycopg.Connection,
) -> None:
    """Runs no live worker can take wait as 'pending', out of the claims' way: they
    have not started, so the backlog cap still counts them."""
    start_worker_process("manual>*:1")
    await create_project(client, "acme", backlog_cap=2)
    trigger = await create_trigger(client, "acme", "orphans", mode="async", task="no_such_task")
    for n in range(2):
        response = await client.post(trigger["url"], json={"n": n})
        assert response.status_code == 202, response.text
    await wait_until(
        lambda: sql.execute("SELECT count(*) FROM runs WHERE state = 'pending'").fetchone() == (2,),
        10,
    )

    assert_problem(await client.post(trigger["url"], json={"n": 2}), 503)
    assert counts(sql) == (2, 2)


async def test_a_dead_workers_fast_lane_runs_hold_their_places_until_rescued(
    start_api: Callable[..., ApiServer],
    start_worker_process: Callable[..., Any],
    sql: psycopg.Connection,
) -> None:
    """A worker that stops heartbeating may still be executing (a stall is not a death):
    its runs count toward the cap until their leases lapse and a rescuer takes them
    back, the API's own when no worker is left (docs/guarantees.md). Only then do
    callers hear that no worker is live."""
    api = start_api(rescue_seconds=0.2)
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        await create_project(client, "acme", fast_lane_cap=2)
        sync = await create_trigger(
            client, "acme", "slow", mode="sync", task="hook_sleep", sync_timeout_seconds=0.5
        )
        # Its leases outlast the three heartbeats after which the API reads it as dead.
        worker = start_worker_process("fast_lane:2", "--lease-seconds", "6")
        held = [await client.post(sync["url"], json={"seconds": 60}) for _ in range(2)]
        assert [response.status_code for response in held] == [202, 202]
        held_ids = [response.json()["run_id"] for response in held]
        check_over_cap(await client.post(sync["url"], json={"seconds": 0}), 2)

        worker.kill()
        worker.wait(10)
        killed_at = time.monotonic()
        place: dict[str, str] = {}
        while True:  # a caller that keeps its place in the waiting room
            response = await client.post(sync["url"], json={"seconds": 0}, headers=place)
            if response.status_code != 429:
                break
            check_over_cap(response, 2)
            place = {PLACE_FIELD: response.headers[PLACE_FIELD]}
            assert time.monotonic() - killed_at < 30, "the dead worker's runs were never rescued"
            await asyncio.sleep(0.2)
        assert assert_problem(response, 503)["detail"].startswith("no live worker has task")
        # The places came back only once the API's rescuer took the runs (discarded: a
        # sync webhook's run has one attempt), not when the worker went quiet.
        rescued = sql.execute(
            "SELECT state::text, errors -> 0 ->> 'error' FROM runs WHERE id = ANY(%s)", [held_ids]
        ).fetchall()
        assert [state for state, _ in rescued] == ["discarded", "discarded"]
        assert all("lease expired" in error for _, error in rescued)
        assert time.monotonic() - killed_at >= 5

        start_worker_process("fast_lane:1")
        answered = await client.post(sync["url"], json={"seconds": 0})
        assert answered.status_code == 200, answered.text


async def test_a_trigger_naming_a_task_no_live_worker_has_is_made_with_a_warning(
    client: httpx.AsyncClient, start_worker_process: Callable[..., Any]
) -> None:
    start_worker_process("fast_lane:1 manual>*:1")
    await create_project(client, "acme")
    known = await create_trigger(client, "acme", "quote", mode="sync", task="echo")
    assert known["warnings"] == []
    typo = await create_trigger(client, "acme", "typo", mode="async", task="ecoh")
    assert typo["warnings"] == [
        "no live worker has task 'ecoh' for lane 'default': its webhooks wait until one starts"
    ]
    fixed = await client.patch(
        f"/admin/triggers/{typo['id']}", json={"task": "echo"}, headers=ADMIN
    )
    assert fixed.json()["warnings"] == []
