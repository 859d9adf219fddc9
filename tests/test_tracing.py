"""Spans around enqueue, admission, claim and execute (tidegate/tracing.py).

An OpenTelemetry SDK with an in-memory exporter is this process's tracer provider; the
runs are enqueued, claimed and executed by a worker in this process, and the webhooks
go over real HTTP to a uvicorn server in this process, so every span lands here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from tests.conftest import running_worker, wait_until
from tests.http_fixtures import ADMIN_TOKEN, create_project, create_trigger, free_port
from tidegate import NewRun, Tidegate
from tidegate.api.server import create_server

trace = pytest.importorskip("opentelemetry.trace")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
export = pytest.importorskip("opentelemetry.sdk.trace.export")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")


@pytest.fixture(scope="module")
def exporter() -> Any:
    """The in-memory exporter of this process's tracer provider (set once per process)."""
    found = in_memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(found))
    trace.set_tracer_provider(provider)
    return found


@pytest.fixture
def spans(exporter: Any) -> Iterator[Any]:
    exporter.clear()
    yield exporter
    exporter.clear()


def named(exporter: Any, name: str) -> list[dict[str, Any]]:
    return [
        {**span.attributes, "status": span.status.status_code.name}
        for span in exporter.get_finished_spans()
        if span.name == name
    ]


@pytest.fixture
async def server(app: Tidegate) -> AsyncIterator[str]:
    """A real uvicorn server in this process, on the test's schema."""
    port = free_port()
    settings = app.settings.replace(admin_token=ADMIN_TOKEN)
    config = uvicorn.Config(create_server(settings), port=port, log_level="warning")
    served = uvicorn.Server(config)
    task = asyncio.create_task(served.serve())
    await wait_until(lambda: served.started, 10)
    yield f"http://127.0.0.1:{port}"
    served.should_exit = True
    await task


async def test_a_run_is_traced_from_enqueue_to_its_execution(app: Tidegate, spans: Any) -> None:
    runs = app.enqueue_many(
        [NewRun("noop", lane="manual", key="k1"), NewRun("fail", {"until_attempt": 9})]
    )
    async with running_worker(app, "manual>*:2"):
        await wait_until(lambda: len(named(spans, "tidegate.execute")) == 2, 10)
    (enqueue,) = named(spans, "tidegate.enqueue")
    assert enqueue == {
        "tidegate.runs": 2,
        "tidegate.task": "noop",
        "tidegate.lane": "manual",
        "status": "UNSET",
    }
    executed = {span["tidegate.run_id"]: span for span in named(spans, "tidegate.execute")}
    assert executed[runs[0].id] == {
        "tidegate.run_id": runs[0].id,
        "tidegate.task": "noop",
        "tidegate.lane": "manual",
        "tidegate.key": "k1",
        "tidegate.project": "default",
        "tidegate.attempt": 1,
        "tidegate.outcome": "succeeded",
        "status": "UNSET",
    }
    failed = executed[runs[1].id]
    assert (failed["tidegate.outcome"], failed["status"]) == ("failed", "ERROR")
    claims = named(spans, "tidegate.claim")
    assert sum(claim["tidegate.runs"] for claim in claims) == 2
    assert {claim["tidegate.chain"] for claim in claims} == {"manual>*"}


async def test_a_webhook_is_traced_from_arrival_to_answer(server: str, spans: Any) -> None:
    async with httpx.AsyncClient(base_url=server, timeout=20) as client:
        await create_project(client, "acme")
        trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")
        accepted = await client.post(trigger["url"], json={"a": 1})
        assert accepted.status_code == 202
        assert (await client.post("/hooks/nothing-here", json={})).status_code == 404
    admitted, unknown = named(spans, "tidegate.admit")
    assert admitted == {
        "tidegate.project": "acme",
        "tidegate.mode": "async",
        "tidegate.outcome": "admitted",
        "http.response.status_code": 202,
        "tidegate.trigger": "orders",
        "tidegate.run_id": accepted.json()["run_id"],
        "status": "UNSET",
    }
    assert unknown["tidegate.outcome"] == "unknown_trigger"
    assert unknown["http.response.status_code"] == 404
