"""What callers hold open costs a bounded share of an API process (docs/architecture.md, invariant
13): hundreds of long-polling claims and slow readers of event streams, some of them
past their bounds, while webhooks flow through the same process.

Real processes throughout: one ``tidegate serve --role api``, PostgreSQL, the test as
every client. The figures it checks are in docs/guarantees.md ("What callers hold open").
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable

import httpx

from tests.http_fixtures import ADMIN, ApiServer, create_project, create_trigger
from tests.test_progress import api_memory_mb, slow_reader
from tests.test_remote_workers import RemoteWorker, all_waiting, worker_token
from tidegate import Tidegate

LATENCY_FACTOR = 10
"""How much slower webhooks may be answered under the load than without it (medians).
Measured on 2 cores: 1.4-2.6 times, up to 4.3 with two processes spinning beside the
test; before the bounds, 27 times (56 with every waiting claim woken by each run)."""
MEMORY_MB = 100
"""How much the API process may grow under the load: about 26 MB measured (the readers'
pages and send buffers, the claims' requests); before the bounds, 261 MB."""


async def webhook_times(client: httpx.AsyncClient, url: str, count: int) -> float:
    """Send ``count`` webhooks one after the other; the median time to an answer, in ms."""
    times = []
    for n in range(count):
        started = time.perf_counter()
        answer = await client.post(url, json={"n": n})
        times.append(time.perf_counter() - started)
        assert answer.status_code == 202, answer.text
    return statistics.median(times) * 1000


async def test_webhooks_stay_fast_and_memory_bounded_while_claims_and_readers_hold_on(
    app: Tidegate, start_api: Callable[..., ApiServer]
) -> None:
    """300 waiting claims over three tokens and 40 slow readers of a run's 9 MB of events,
    with claims and streams past their bounds refused, on one API process: another
    project's webhooks are answered within ``LATENCY_FACTOR`` of their time without the
    load, and the process grows by less than ``MEMORY_MB``.

    Before the bounds, each webhook woke every waiting claim (two statements each) and
    each slow reader held a page of 100 events (6 MB): here the webhooks' median went
    from 1.9 to 51 ms, and the process grew by 261 MB."""
    api = start_api(max_claims_per_token=100, max_streams_per_caller=40)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=api.url, timeout=90, limits=limits) as client:
        await create_project(client, "other")
        trigger = await create_trigger(client, "other", "ping", mode="async", task="noop")
        url = trigger["url"]

        # A run whose events the readers come for: 150 of 60 KiB, through a worker.
        run = await app.aenqueue("report_progress")
        writer_token = await worker_token(client, "writer", ["*"])
        writer = await RemoteWorker.register(
            client, writer_token, "manual>*:1", ["report_progress"]
        )
        (held,) = await writer.claim(1)
        event = {"run_id": run.id, "attempt": held["attempt"], "data": json.dumps("x" * 61_000)}
        for _ in range(10):
            written = await writer.post("/complete", {"outcomes": [], "events": [event] * 15})
            assert written.status_code == 200, written.text

        tokens = [await worker_token(client, f"fleet{n}", ["*"]) for n in range(3)]
        workers = [
            await RemoteWorker.register(client, token, "manual>*:1", ["echo"])
            for token in tokens
            for _ in range(110)
        ]
        await webhook_times(client, url, 10)  # warm
        before = await webhook_times(client, url, 80)
        memory = api_memory_mb(api)

        # The load: 100 waiting claims per token (its bound), 40 slow readers (the
        # admin's bound), then claims and a stream past the bounds.
        waiting, _ = await all_waiting([w for n in range(3) for w in workers[n * 110 :][:100]])
        readers = [await slow_reader(api, run.id, ADMIN) for _ in range(40)]
        try:
            body = {"workloop": 0, "demand": 1, "wait_seconds": 30}
            extra = [w for n in range(3) for w in workers[n * 110 + 100 :][:10]]
            again = [workers[n * 110 + i] for n in range(3) for i in range(5)]
            refused = await asyncio.gather(
                *(worker.post("/claim", body) for worker in extra + again)
            )
            assert [answer.status_code for answer in refused] == [429] * len(refused)
            stream = await client.get(f"/runs/{run.id}/events", headers=ADMIN)
            assert stream.status_code == 429

            loaded = await webhook_times(client, url, 80)
            grown = api_memory_mb(api) - memory
            assert not any(claim.done() for claim in waiting), "a claim stopped waiting"
        finally:
            for reader in readers:
                reader.close()
            for claim in waiting:
                claim.cancel()
        after = await webhook_times(client, url, 80)
    # The unloaded figure: the larger of before and after, so that a machine that got
    # busier meanwhile (other tests, other processes) does not count against the load.
    unloaded = max(before, after)
    assert loaded <= LATENCY_FACTOR * unloaded, (
        f"webhooks took {loaded:.1f} ms (median) under the load, {unloaded:.1f} ms without"
    )
    assert grown < MEMORY_MB, f"the API grew by {grown:.0f} MB under the load"
