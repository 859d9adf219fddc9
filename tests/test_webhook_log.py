"""What the API processes answered to webhooks: counted, and kept in the webhook log.

Each test sends real requests to real ``tidegate serve`` processes and reads what they
wrote back: ``GET /metrics`` (``tidegate_webhooks_total``, the answer times) and the
``request_log`` rows (api/ledger.py). The counts must match, request for request,
what the client was answered, however many API processes answered them.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from tests.conftest import wait_until
from tests.http_fixtures import ApiServer, create_project, create_trigger
from tests.test_metrics import scrape, series
from tidegate import Settings, Tidegate
from tidegate.api.ledger import MAX_UNWRITTEN_REQUESTS, Ledger, LoggedRequest

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


def answered(api: ApiServer) -> dict[tuple[str, str, str, str], float]:
    """tidegate_webhooks_total by (project, mode, outcome, status)."""
    found = series(scrape(api), "tidegate_webhooks_total").items()
    names = ("project", "mode", "outcome", "status")
    return {tuple(dict(labels)[name] for name in names): count for labels, count in found}  # type: ignore[misc]


async def test_every_answer_is_counted_and_every_refusal_kept_across_api_processes(
    app: Tidegate, sql: psycopg.Connection, start_api: Callable[..., ApiServer]
) -> None:
    api = start_api(processes=2)
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        await create_project(client, "acme", ingest_rate=0.2, ingest_burst=2)
        orders = await create_trigger(
            client, "acme", "orders", mode="async", task="echo", max_body_bytes=2000
        )
        signed = await create_trigger(
            client, "acme", "signed", mode="async", task="echo", secret=SECRET
        )
        sent: Counter[tuple[str, int]] = Counter()

        async def post(url: str, outcome: str, **request: Any) -> httpx.Response:
            response = await client.post(url, **request)
            sent[outcome, response.status_code] += 1
            return response

        burst = await asyncio.gather(
            *(
                client.post(
                    orders["url"],
                    json={"n": n},
                    headers={"Idempotency-Key": f"k{n}", "X-Source": "burst"},
                )
                for n in range(20)
            )
        )
        statuses = Counter(r.status_code for r in burst)
        assert statuses == {202: 2, 429: 18}, statuses
        sent["admitted", 202] += 2
        sent["rate_limited", 429] += 18
        first = next(r for r in burst if r.status_code == 202)
        replay_key = first.request.headers["idempotency-key"]
        await post(  # the same body: another one with the key would be refused (422)
            orders["url"],
            "replayed",
            content=first.request.content,
            headers={"Idempotency-Key": replay_key, "content-type": "application/json"},
        )
        for _ in range(3):
            await post("/hooks/no-such-trigger", "unknown_trigger", json={})
        await post(orders["url"], "too_large", content=b"x" * 3000)
        await post(orders["url"], "not_json", content=b"hi", headers={"content-type": "text/plain"})
        await post(
            orders["url"], "bad_request", content=b"{", headers={"content-type": "application/json"}
        )
        await post(signed["url"], "bad_signature", json={"forged": True})
    assert all(status in (202, 404, 413, 415, 400, 401) for _, status in sent if status != 429)
    assert sent["replayed", 202] == 1

    expected = {
        (
            "" if outcome == "unknown_trigger" else "acme",
            "" if outcome == "unknown_trigger" else "async",
            outcome,
            str(status),
        ): count
        for (outcome, status), count in sent.items()
    }
    await wait_until(lambda: answered(api) == expected, 10)

    # Every request to a known trigger that made no run is in the log, as it arrived.
    logged = sql.execute(
        "SELECT outcome, status, detail, idempotency_key, headers, body, body_truncated, run_id"
        " FROM request_log ORDER BY id"
    ).fetchall()
    assert Counter((row[0], row[1]) for row in logged) == {
        key: count for key, count in sent.items() if key[0] not in ("admitted", "unknown_trigger")
    }
    refused = [row for row in logged if row[0] == "rate_limited"]
    assert {row[3] for row in refused} == {f"k{n}" for n in range(20)} - {
        r.request.headers["idempotency-key"] for r in burst if r.status_code == 202
    }
    _, _, detail, _, headers, body, truncated, run_id = refused[0]
    assert detail == "the project's ingest rate is exceeded"
    assert headers["x-source"] == "burst" and "authorization" not in headers
    assert body.startswith(b'{"n":') and not truncated and run_id is None
    replayed = next(row for row in logged if row[0] == "replayed")
    assert replayed[7] == first.json()["run_id"]
    too_large = next(row for row in logged if row[0] == "too_large")
    assert too_large[5] == b"" and too_large[6] is True


async def test_the_log_keeps_the_newest_requests_of_each_trigger(
    app: Tidegate, sql: psycopg.Connection, start_api: Callable[..., ApiServer]
) -> None:
    api = start_api(webhook_log_size=5, webhook_log_body_bytes=4)
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        await create_project(client, "acme")
        trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")
        for n in range(12):
            response = await client.post(
                trigger["url"],
                content=b"not json",
                headers={"content-type": "text/plain", "X-N": str(n)},
            )
            assert response.status_code == 415
            if n == 5:
                # Past the first flush, so that the trim also meets an older round.
                await wait_until(
                    lambda: sql.execute("SELECT count(*) FROM request_log").fetchone()[0] > 0,
                    10,
                )

    def kept() -> list[tuple[Any, ...]]:
        return sql.execute(
            "SELECT headers ->> 'x-n', body, body_truncated FROM request_log ORDER BY received_at"
        ).fetchall()

    await wait_until(lambda: [row[0] for row in kept()] == [str(n) for n in range(7, 12)], 10)
    assert {(row[1], row[2]) for row in kept()} == {(b"not ", True)}


async def test_a_sync_round_trip_is_timed_with_its_run(
    app: Tidegate,
    start_api: Callable[..., ApiServer],
    start_worker_process: Callable[..., subprocess.Popen[bytes]],
) -> None:
    api = start_api()
    start_worker_process("fast_lane:2")
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        await create_project(client, "acme")
        trigger = await create_trigger(client, "acme", "quote", mode="sync", task="hook_sleep")
        for _ in range(3):
            response = await client.post(trigger["url"], json={"seconds": 0.2})
            assert response.status_code == 200, response.text

    def round_trips() -> dict[str, float]:
        samples = scrape(api)
        labels = (("mode", "sync"), ("outcome", "admitted"))
        return {
            "count": series(samples, "tidegate_webhook_answer_seconds_count").get(labels, 0),
            "sum": series(samples, "tidegate_webhook_answer_seconds_sum").get(labels, 0),
            "under_0.1": series(samples, "tidegate_webhook_answer_seconds_bucket").get(
                (("le", "0.1"), *labels), 0
            ),
        }

    await wait_until(lambda: round_trips()["count"] == 3, 10)
    figures = round_trips()
    # Each round trip holds its run's 0.2 s: the histogram times the run, not the ack.
    assert figures["sum"] >= 0.6 and figures["under_0.1"] == 0, figures


def test_metrics_name_no_more_than_the_busiest_projects(
    app: Tidegate, sql: psycopg.Connection, start_api: Callable[..., ApiServer]
) -> None:
    api = start_api(metrics_max_projects=2)
    sql.execute(
        "INSERT INTO ingress_counters VALUES"
        " ('a', 'async', 'admitted', 202, 50, 0.5, %(zero)s),"
        " ('b', 'async', 'admitted', 202, 40, 0.4, %(zero)s),"
        " ('c', 'async', 'admitted', 202, 3, 0.3, %(zero)s),"
        " ('d', 'sync', 'over_cap', 429, 2, 0.2, %(zero)s)",
        {"zero": [0] * 15},
    )
    assert answered(api) == {
        ("a", "async", "admitted", "202"): 50,
        ("b", "async", "admitted", "202"): 40,
        ("(other)", "async", "admitted", "202"): 3,
        ("(other)", "sync", "over_cap", "429"): 2,
    }


async def test_the_log_waiting_for_a_database_that_is_down_stays_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A pool whose server cannot be reached: every flush fails, as with a database down.
    pool = AsyncConnectionPool(
        "host=127.0.0.1 port=1 connect_timeout=1", min_size=0, max_size=1, timeout=0.2, open=False
    )
    await pool.open(wait=False)
    ledger = Ledger(pool, Settings())
    request = LoggedRequest(
        1, "acme", "rate_limited", 429, "", None, None, None, {}, b"{}", False,
        datetime.now(UTC),
    )  # fmt: skip
    try:
        for _ in range(3):
            for _ in range(400):
                ledger.keep(request)
                ledger.count("acme", "async", "rate_limited", 429, 0.001)
            # More arrive while the flush waits for the database: put back with them,
            # the buffer keeps its bound.
            flush = asyncio.create_task(ledger.flush())
            await wait_until(lambda: not ledger.requests, 5, interval=0.001)
            for _ in range(400):
                ledger.keep(request)
            with pytest.raises(psycopg.OperationalError):
                await flush
            assert len(ledger.requests) <= MAX_UNWRITTEN_REQUESTS
        assert len(ledger.requests) == MAX_UNWRITTEN_REQUESTS
        # What did not fit was said, each round, and counted: none silently dropped.
        said = [int(r.getMessage().split()[2]) for r in caplog.records if "not kept" in r.message]
        assert sum(said) + ledger.let_go == 3 * 800 - MAX_UNWRITTEN_REQUESTS
        # The counts are all kept for the next flush: nothing counted is lost.
        assert ledger.counts.unwritten[("acme", "async", "rate_limited", 429)].count == 1200
    finally:
        await pool.close()
