"""Live progress: ``run.progress`` in handlers, server-sent events to whoever reads them.

Through real servers: ``tidegate serve --role api`` processes on a port, ``tidegate
worker`` processes running ``tests/apps.py``, PostgreSQL. Handlers that wait on a
``gate`` file prove that events arrive while the run is still executing, not after.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import running_worker, wait_until
from tests.http_fixtures import ADMIN, ApiServer, assert_problem, create_project, create_trigger
from tidegate import Run, RunState, Tidegate
from tidegate.worker.completer import MAX_UNWRITTEN_EVENTS, Completer
from tidegate.worker.execute import Outcome

EVENTS = {"Accept": "text/event-stream"}


@dataclass
class Event:
    event: str
    id: str | None
    data: Any


async def read_events(
    response: httpx.Response, until: Callable[[Event], bool] | None = None
) -> AsyncIterator[Event]:
    """The server-sent events of a streamed response, parsed (comments skipped)."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line == "":
            if "data" in fields:
                yield Event(
                    fields.get("event", "message"), fields.get("id"), json.loads(fields["data"])
                )
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = value


async def collect(response: httpx.Response, count: int | None = None) -> list[Event]:
    """Read events until the stream ends, or ``count`` of them."""
    got = []
    async for event in read_events(response):
        got.append(event)
        if count is not None and len(got) == count:
            break
    return got


def steps_of(events: list[Event]) -> list[int]:
    return [event.data["data"]["step"] for event in events if event.event == "progress"]


@pytest.fixture
async def client(api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
        yield client


async def test_a_runs_events_stream_live_then_its_result_ends_the_stream(
    app: Tidegate, client: httpx.AsyncClient, start_worker_process: Any, tmp_path: Path
) -> None:
    start_worker_process("manual>*:2")
    gate = tmp_path / "gate"
    run = await app.aenqueue("report_progress", {"steps": 4, "gate": str(gate)})

    async with client.stream("GET", f"/runs/{run.id}/events", headers=ADMIN) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = read_events(response)
        first = await anext(events)
        # The handler waits at the gate after its first event: this one came live.
        assert (first.event, first.data["data"], first.data["attempt"]) == (
            "progress",
            {"step": 1, "of": 4},
            1,
        )
        gate.touch()
        opened = time.monotonic()
        rest = [event async for event in events]
    # The run is in the default lane: its end woke the stream through NOTIFY, well
    # before the 15 s keep-alive a missed wake-up would have waited for.
    assert time.monotonic() - opened < 5
    assert steps_of(rest) == [2, 3, 4]
    ids = [int(e.id) for e in [first, *rest] if e.event == "progress" and e.id]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert rest[-1].event == "result" and rest[-1].id == "end"
    assert rest[-1].data["state"] == "succeeded"
    assert rest[-1].data["result"] == {"steps": 4}

    # A finished run's stream is its events and its result at once; after the end, 204.
    async with client.stream("GET", f"/runs/{run.id}/events", headers=ADMIN) as again:
        replayed = await collect(again)
    assert steps_of(replayed) == [1, 2, 3, 4] and replayed[-1].event == "result"
    done = await client.get(f"/runs/{run.id}/events", headers={**ADMIN, "Last-Event-ID": "end"})
    assert done.status_code == 204


async def test_a_sync_handlers_events_are_all_written_before_its_outcome(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    async with running_worker(app, "manual>*:4"):
        runs = [await app.aenqueue("report_progress_in_thread", {"steps": 60}) for _ in range(8)]
        await wait_until(
            lambda: (
                sql.execute("SELECT count(*) FROM runs WHERE state = 'succeeded'").fetchone()
                == (8,)
            )
        )
    for run in runs:
        async with client.stream("GET", f"/runs/{run.id}/events", headers=ADMIN) as response:
            got = await collect(response)
        assert steps_of(got) == list(range(1, 61)), f"run {run.id}"
        assert got[-1].event == "result" and got[-1].data["result"] == {"steps": 60}


async def test_a_sync_webhook_caller_gets_progress_then_the_reply_as_events(
    client: httpx.AsyncClient, start_worker_process: Any, tmp_path: Path
) -> None:
    start_worker_process("fast_lane:2 manual>*:1")
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "build", mode="sync", task="report_progress")
    gate = tmp_path / "gate"

    body = {"steps": 3, "gate": str(gate)}
    async with client.stream("POST", trigger["url"], json=body, headers=EVENTS) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        run_id = int(response.headers["location"].removeprefix("/runs/"))
        events = read_events(response)
        first = await anext(events)
        assert first.event == "progress" and first.data["data"] == {"step": 1, "of": 3}
        gate.touch()
        rest = [event async for event in events]
    assert steps_of(rest) == [2, 3]
    assert rest[-1].event == "result"
    assert rest[-1].data == {
        "run_id": run_id,
        "state": "succeeded",
        "status": 200,
        "headers": {},
        "content_type": "application/json",
        "body": {"steps": 3},
    }

    # A caller that does not ask for events gets the plain answer, as before.
    plain = await client.post(trigger["url"], json={"steps": 2})
    assert plain.status_code == 200 and plain.json() == {"steps": 2}

    # A handler's own reply and a failure come as the result event's status and body.
    shaped = await create_trigger(client, "acme", "shaped", mode="sync", task="hook_reply")
    async with client.stream("POST", shaped["url"], json={"a": 1}, headers=EVENTS) as response:
        (result,) = await collect(response)
    assert (result.data["status"], result.data["headers"], result.data["body"]) == (
        201,
        {"x-a": "b"},
        {"got": {"a": 1}},
    )


async def test_a_client_resumes_with_last_event_id_on_another_api_process(
    app: Tidegate,
    start_api: Callable[..., ApiServer],
    start_worker_process: Any,
    tmp_path: Path,
) -> None:
    start_worker_process("manual>*:1")
    gate = tmp_path / "gate"
    run = await app.aenqueue("report_progress", {"steps": 8, "gate": str(gate), "gate_at": 5})
    first_server = start_api()
    async with (
        httpx.AsyncClient(base_url=first_server.url, timeout=30) as client,
        client.stream("GET", f"/runs/{run.id}/events", headers=ADMIN) as response,
    ):
        seen = await collect(response, 3)
    assert steps_of(seen) == [1, 2, 3]
    assert first_server.stop() == 0  # the process that sent them is gone

    second_server = start_api()
    resume = {**ADMIN, "Last-Event-ID": str(seen[-1].id)}
    async with (
        httpx.AsyncClient(base_url=second_server.url, timeout=30) as client,
        client.stream("GET", f"/runs/{run.id}/events", headers=resume) as response,
    ):
        events = read_events(response)
        assert steps_of([await anext(events), await anext(events)]) == [4, 5]
        gate.touch()
        rest = [event async for event in events]
    assert steps_of(rest) == [6, 7, 8] and rest[-1].event == "result"


async def test_many_streams_on_two_api_processes_each_get_their_runs_events_once_in_order(
    app: Tidegate,
    start_api: Callable[..., ApiServer],
    start_worker_process: Any,
    tmp_path: Path,
) -> None:
    server = start_api(processes=2)
    for _ in range(2):
        start_worker_process("fast_lane:2 manual>*:4")
    gate = tmp_path / "gate"
    runs = [
        await app.aenqueue("report_progress", {"steps": 20, "gate": str(gate), "gate_at": 10})
        for _ in range(30)
    ]
    connected = 0
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        await create_project(client, "acme")
        trigger = await create_trigger(client, "acme", "build", mode="sync", task="report_progress")

        async def stream(run: Run) -> list[Event]:
            nonlocal connected
            async with client.stream("GET", f"/runs/{run.id}/events", headers=ADMIN) as response:
                assert response.status_code == 200
                connected += 1
                if connected == len(runs):  # every stream listens: let the runs go on
                    gate.touch()
                return await collect(response)

        async def sync_call(i: int) -> list[Event]:
            body = {"steps": 10 + i}
            async with client.stream("POST", trigger["url"], json=body, headers=EVENTS) as response:
                assert response.status_code in (200, 429, 503), response.status_code
                return await collect(response) if response.status_code == 200 else []

        streamed, called = await asyncio.gather(
            asyncio.gather(*(stream(run) for run in runs)),
            asyncio.gather(*(sync_call(i) for i in range(6))),
        )
    # 30 streams split over two processes, the runs' second halves reported while they
    # listened: each got its own run's events, every one once, in order, then the end.
    for run, events in zip(runs, streamed, strict=True):
        assert steps_of(events) == list(range(1, 21)), f"run {run.id}"
        assert len({event.id for event in events}) == len(events)
        assert events[-1].event == "result" and events[-1].data["state"] == "succeeded"
    answered = [events for events in called if events]
    assert answered, "no sync call was admitted"
    for i, events in enumerate(called):
        if events:
            assert steps_of(events) == list(range(1, 11 + i))
            assert events[-1].data["body"] == {"steps": 10 + i}


async def test_a_slow_client_does_not_make_the_server_buffer_its_stream(
    app: Tidegate, api: ApiServer, start_worker_process: Any, sql: psycopg.Connection
) -> None:
    start_worker_process("manual>*:1")
    steps, size = 2000, 20_000  # 40 MB of events, all written before the client comes
    run = await app.aenqueue("report_progress_in_thread", {"steps": steps, "size": size})
    await wait_until(
        lambda: (
            sql.execute("SELECT state FROM runs WHERE id = %s", [run.id]).fetchone()
            == ("succeeded",)
        ),
        timeout=120,
    )
    before = api_memory_mb(api)
    host, port = api.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as reader:
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        reader.sendall(
            f"GET /runs/{run.id}/events HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: {ADMIN['Authorization']}\r\n\r\n".encode()
        )
        await asyncio.sleep(2)  # the stream has had time to read all it would
        # The client has read nothing: the server holds a page of its stream, not 40 MB.
        assert api_memory_mb(api) < before + 20
        received = b""
        reader.settimeout(30)
        while b"event: result" not in received[-100_000:]:
            chunk = reader.recv(1 << 20)
            assert chunk, "the stream ended before its result"
            received += chunk
    assert received.count(b"event: progress") == steps


async def test_slow_readers_hold_a_bounded_page_each_and_give_it_back_when_they_go(
    app: Tidegate, start_api: Callable[..., ApiServer], sql: psycopg.Connection
) -> None:
    """500 slow readers of a run's 150 events of 60 KiB took the API from 359 to 2,424 MB
    (a page of 100 events each), and kept it once they had gone. A stream now holds a page
    of at most 64 KiB (or one event), a caller at most ``max_streams_per_caller`` streams
    and a process ``max_streams``, and what they held is given back."""
    api = start_api(max_streams=150, max_streams_per_caller=100)
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
        acme = await create_project(client, "acme")
        run = await app.aenqueue("report_progress", project="acme")
        worker, token = await remote_worker(client)
        claim = {"workloop": 0, "demand": 1}
        (held,) = (await client.post(f"{worker}/claim", json=claim, headers=token)).json()["runs"]
        event = {"run_id": run.id, "attempt": held["attempt"], "data": json.dumps("x" * 61_000)}
        batch = {"outcomes": [], "events": [event] * 15}  # within the API's body limit
        for _ in range(10):  # 150 events of 60 KiB
            written = await client.post(f"{worker}/complete", json=batch, headers=token)
            assert written.status_code == 200, written.text
    assert sql.execute("SELECT count(*) FROM run_events").fetchone() == (150,)
    before = api_memory_mb(api)
    admin = [await slow_reader(api, run.id, ADMIN) for _ in range(100)]
    project = {"Authorization": f"Bearer {acme['token']}"}
    readers = admin + [await slow_reader(api, run.id, project) for _ in range(50)]
    try:
        # Every stream has begun, its first page read: none reads more until its reader does.
        grown = api_memory_mb(api) - before
        assert grown < 90, f"150 slow readers took {grown:.0f} MB"
        async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
            path = f"/runs/{run.id}/events"
            over = await client.get(path, headers=ADMIN)  # the admin's 101st
            assert "100 event streams open" in assert_problem(over, 429)["detail"]
            assert over.headers["retry-after"] == "5"
            full = await client.get(path, headers=project)  # the process's 151st
            assert "150 event streams open" in assert_problem(full, 503)["detail"]
            assert full.headers["retry-after"] == "5"
    finally:
        for reader in readers:
            reader.close()
    # Gone, they give their places and their memory back.
    await wait_until(lambda: api_memory_mb(api) < before + 15, timeout=20, interval=0.2)
    async with (
        httpx.AsyncClient(base_url=api.url, timeout=30) as client,
        client.stream("GET", f"/runs/{run.id}/events", headers=ADMIN) as again,
    ):
        assert again.status_code == 200
        assert len(await collect(again, 150)) == 150


async def test_a_sync_caller_past_its_projects_streams_is_refused_before_a_run_is_made(
    start_api: Callable[..., ApiServer], sql: psycopg.Connection
) -> None:
    """A sync webhook's stream counts against its project's streams; past them, the caller
    is answered 429 before the admission: no run is made (and a repeat of an admitted
    request, which any sender can make, streams no more than a new one)."""
    api = start_api(max_streams_per_caller=1)
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
        await create_project(client, "acme")
        trigger = await create_trigger(client, "acme", "build", mode="sync", task="report_progress")
        await remote_worker(client)  # a slot that takes the fast lane: admission counts it
        first = {**EVENTS, "Idempotency-Key": "first"}
        async with client.stream("POST", trigger["url"], json={}, headers=first) as streaming:
            assert streaming.status_code == 200
            for headers in ({**EVENTS, "Idempotency-Key": "second"}, first):
                refused = await client.post(trigger["url"], json={}, headers=headers)
                assert "1 event streams open" in assert_problem(refused, 429)["detail"]
                assert refused.headers["retry-after"] == "5"
            assert sql.execute("SELECT count(*) FROM runs").fetchone() == (1,)
        # Its stream gone, the project may stream again.
        await wait_until_answered(client, trigger["url"], {**EVENTS, "Idempotency-Key": "first"})


async def wait_until_answered(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> None:
    """Send the webhook until its stream is no longer refused (the place of a stream that
    ended is free once the server has seen its client go)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        async with client.stream("POST", url, json={}, headers=headers) as response:
            if response.status_code == 200:
                return
            assert response.status_code == 429
        assert loop.time() < deadline, "the place of a stream whose client went stayed taken"
        await asyncio.sleep(0.05)


async def remote_worker(client: httpx.AsyncClient) -> tuple[str, dict[str, str]]:
    """Register a remote worker of ``report_progress`` with a new worker token: its path
    and its token's header."""
    created = await client.post(
        "/admin/worker-tokens", json={"name": "fleet", "lanes": ["*"]}, headers=ADMIN
    )
    assert created.status_code == 201, created.text
    token = {"Authorization": f"Bearer {created.json()['token']}"}
    body = {"workloops": "manual>*:1", "tasks": ["report_progress"]}
    registered = await client.post("/workers", json=body, headers=token)
    assert registered.status_code == 201, registered.text
    return f"/workers/{registered.json()['worker_id']}", token


async def slow_reader(api: ApiServer, run_id: int, token: dict[str, str]) -> socket.socket:
    """A client that asks for the run's events, takes the head and the first event, and
    reads no more (its receive buffer as small as the kernel allows)."""
    host, port = api.url.removeprefix("http://").split(":")
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.settimeout(30)
    await asyncio.to_thread(reader.connect, (host, int(port)))
    reader.sendall(
        f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: {token['Authorization']}\r\n\r\n".encode()
    )
    received = b""
    while b"event: progress" not in received:
        chunk = await asyncio.to_thread(reader.recv, 4096)
        assert chunk, "the stream ended before its first event"
        received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received[:200]
    return reader


def api_memory_mb(api: ApiServer) -> float:
    """Resident memory of the API server's processes, in MB."""
    return sum(rss_mb(pid) for pid in api_pids(api))


def api_pids(api: ApiServer) -> list[int]:
    children = Path(f"/proc/{api.process.pid}/task/{api.process.pid}/children")
    return [api.process.pid, *map(int, children.read_text().split())]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def test_bad_progress_fails_its_attempt_with_a_clear_error(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    async with running_worker(app, "manual>*:2"):
        not_json = await app.aenqueue("report_bad_progress", {"kind": "set"})
        too_large = await app.aenqueue("report_bad_progress", {"kind": "large"})
        await wait_until(
            lambda: (
                sql.execute("SELECT count(*) FROM runs WHERE state = 'discarded'").fetchone()
                == (2,)
            )
        )
    errors: dict[int, str] = dict(
        sql.execute(
            "SELECT id, errors -> 0 ->> 'error' FROM runs WHERE id = ANY(%s)",
            [[not_json.id, too_large.id]],
        ).fetchall()
    )
    assert errors[not_json.id].startswith("InputError: the progress data holds")
    assert errors[too_large.id].startswith("InputError: the progress data is 70002 bytes")
    assert sql.execute("SELECT count(*) FROM run_events").fetchone() == (0,)
    with pytest.raises(RuntimeError, match="inside the run's own handler"):
        not_json.progress({"step": 1})


async def test_the_events_route_refuses_bad_input_and_other_projects(
    app: Tidegate, client: httpx.AsyncClient
) -> None:
    acme = await create_project(client, "acme")
    other = await create_project(client, "other")
    run = await app.aenqueue("report_progress", project="acme")
    path = f"/runs/{run.id}/events"
    for value in ("abc", "-1", "1" * 30):
        assert_problem(await client.get(path, headers={**ADMIN, "Last-Event-ID": value}), 400)
    assert_problem(
        await client.get(path, headers={"Authorization": f"Bearer {other['token']}"}), 404
    )
    assert_problem(await client.get("/runs/999999/events", headers=ADMIN), 404)
    assert_problem(await client.get(path), 401)
    # Its own project's token may read it (and waits: the run has no worker yet).
    own = {"Authorization": f"Bearer {acme['token']}"}
    with pytest.raises(httpx.ReadTimeout):
        async with client.stream("GET", path, headers=own, timeout=1) as response:
            assert response.status_code == 200
            await collect(response)
    # A sync webhook caller's bad Last-Event-ID is refused before anything is admitted.
    trigger = await create_trigger(client, "acme", "build", mode="sync", task="report_progress")
    refused = await client.post(trigger["url"], json={}, headers={**EVENTS, "Last-Event-ID": "x"})
    assert_problem(refused, 400)


async def test_cancelling_a_watched_run_ends_its_stream(
    app: Tidegate, client: httpx.AsyncClient, start_worker_process: Any, tmp_path: Path
) -> None:
    start_worker_process("manual>*:1")
    gate = tmp_path / "gate"
    run = await app.aenqueue("report_progress", {"steps": 2, "gate": str(gate)})
    async with client.stream("GET", f"/runs/{run.id}/events", headers=ADMIN) as response:
        events = read_events(response)
        assert (await anext(events)).event == "progress"
        cancelled = await client.post(f"/runs/{run.id}/cancel", headers=ADMIN)
        assert cancelled.status_code == 200
        rest = await asyncio.wait_for(collect_rest(events), 5)
    assert [e.event for e in rest] == ["result"] and rest[0].data["state"] == "cancelled"


async def test_the_end_of_a_run_that_reports_nothing_wakes_its_stream(
    app: Tidegate, client: httpx.AsyncClient, start_worker_process: Any
) -> None:
    start_worker_process("manual>*:1")
    run = await app.aenqueue("async_sleep", {"seconds": 1})
    opened = time.monotonic()
    async with client.stream("GET", f"/runs/{run.id}/events", headers=ADMIN) as response:
        events = await collect(response)
    # Woken by its end's NOTIFY (the run is watched), not by the 15 s keep-alive.
    assert time.monotonic() - opened < 8
    assert [e.event for e in events] == ["result"] and events[0].data["result"] == "slept"


async def collect_rest(events: AsyncIterator[Event]) -> list[Event]:
    return [event async for event in events]


async def test_a_run_reporting_faster_than_the_database_writes_keeps_the_newest(
    app: Tidegate, caplog: pytest.LogCaptureFixture
) -> None:
    completer = Completer(app.database.async_pool(size=1), {})
    completer.loop = asyncio.get_running_loop()
    run = await app.aenqueue("noop")
    for step in range(MAX_UNWRITTEN_EVENTS + 50):
        completer.report(run, json.dumps({"step": step}))
    kept = [json.loads(event["data"])["step"] for event in completer.events[run.id]]
    assert kept == list(range(50, MAX_UNWRITTEN_EVENTS + 50))
    # The drop is said once, when the run's outcome comes.
    outcome = Outcome(run.id, 1, "default", RunState.SUCCEEDED)
    with caplog.at_level(logging.WARNING, "tidegate.worker"):
        completer.add(outcome, lambda recorded: None)
    assert "50 event(s) dropped unwritten" in caplog.text
