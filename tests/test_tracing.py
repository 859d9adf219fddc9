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


def finished(exporter: Any, name: str) -> list[Any]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


async def test_a_run_is_traced_from_enqueue_to_its_execution(app: Tidegate, spans: Any) -> None:
    tracer = trace.get_tracer("the-application")
    with tracer.start_as_current_span("request") as request:
        runs = app.enqueue_many(
            [NewRun("noop", lane="manual", key="k1"), NewRun("fail", {"until_attempt": 9})]
        )
        single = app.enqueue("noop", lane="manual")  # insert_run.sql, not insert_runs.sql
    async with running_worker(app, "manual>*:2"):
        await wait_until(lambda: len(named(spans, "tidegate.execute")) == 3, 10)
    batch, one = named(spans, "tidegate.enqueue")
    assert batch == {
        "tidegate.runs": 2,
        "tidegate.task": "noop",
        "tidegate.lane": "manual",
        "messaging.system": "tidegate",
        "messaging.operation.type": "send",
        "messaging.destination.name": "manual",
        "status": "UNSET",
    }
    assert one["tidegate.runs"] == 1
    executed = {span["tidegate.run_id"]: span for span in named(spans, "tidegate.execute")}
    assert executed[runs[0].id] == {
        "tidegate.run_id": runs[0].id,
        "tidegate.task": "noop",
        "tidegate.lane": "manual",
        "tidegate.key": "k1",
        "tidegate.project": "default",
        "tidegate.attempt": 1,
        "tidegate.outcome": "succeeded",
        "messaging.system": "tidegate",
        "messaging.operation.type": "process",
        "messaging.destination.name": "manual",
        "messaging.message.id": str(runs[0].id),
        "status": "UNSET",
    }
    failed = executed[runs[1].id]
    assert (failed["tidegate.outcome"], failed["status"]) == ("failed", "ERROR")
    claims = named(spans, "tidegate.claim")
    assert sum(claim["tidegate.runs"] for claim in claims) == 3
    assert {claim["tidegate.chain"] for claim in claims} == {"manual>*"}

    # Each enqueue is a producer span under the application's; each run stores its
    # context, and its attempt is a consumer span of a trace of its own, linked to it.
    producers = finished(spans, "tidegate.enqueue")
    consumers = {
        span.attributes["tidegate.run_id"]: span for span in finished(spans, "tidegate.execute")
    }
    for producer, made in ((producers[0], runs), (producers[1], [single])):
        assert producer.kind is trace.SpanKind.PRODUCER
        assert producer.parent.span_id == request.get_span_context().span_id
        for run in made:
            stored = app.get_run(run.id)
            assert stored is not None and stored.trace_context == run.trace_context
            assert run.trace_context is not None
            assert f"{producer.context.span_id:016x}" in run.trace_context["traceparent"]
            consumer = consumers[run.id]
            assert consumer.kind is trace.SpanKind.CONSUMER
            assert consumer.context.trace_id != producer.context.trace_id
            assert [link.context.span_id for link in consumer.links] == [producer.context.span_id]


async def test_a_webhook_is_traced_from_arrival_to_answer(
    app: Tidegate, server: str, spans: Any
) -> None:
    sender = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with httpx.AsyncClient(base_url=server, timeout=20) as client:
        await create_project(client, "acme")
        trigger = await create_trigger(client, "acme", "orders", mode="async", task="echo")
        traced = {"traceparent": sender, "tracestate": "vendor=1"}
        accepted = await client.post(trigger["url"], json={"a": 1}, headers=traced)
        assert accepted.status_code == 202
        assert (await client.post("/hooks/nothing-here", json={})).status_code == 404
        plain = await client.post(trigger["url"], json={"a": 2})
    admitted, unknown, _ = named(spans, "tidegate.admit")
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

    # The sender's span is the admission's parent and the run's producer: the run keeps
    # its headers, and its attempt links to the sender's span.
    admit_span = finished(spans, "tidegate.admit")[0]
    assert f"{admit_span.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    by_id = {span.context.span_id: span for span in spans.get_finished_spans()}
    root = admit_span  # up through the server's own spans, where it makes some
    while root.parent.span_id in by_id:
        root = by_id[root.parent.span_id]
    assert (f"{root.parent.span_id:016x}", root.parent.is_remote) == ("b7ad6b7169203331", True)
    run = app.get_run(accepted.json()["run_id"])
    assert run is not None and run.trace_context == traced
    untraced = app.get_run(plain.json()["run_id"])
    assert untraced is not None and untraced.trace_context is None
    async with running_worker(app, "*:1"):
        await wait_until(lambda: len(finished(spans, "tidegate.execute")) == 2, 10)
    attempts = {
        span.attributes["tidegate.run_id"]: span for span in finished(spans, "tidegate.execute")
    }
    (link,) = attempts[run.id].links
    assert f"{link.context.span_id:016x}" == "b7ad6b7169203331"
    assert attempts[untraced.id].links == ()
