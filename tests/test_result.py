"""Waiting for a run's result (``result``, ``aresult``) over a real worker process.

The waiters' safety-net interval is set to a minute: any answer within the tests'
bounds came from the run's completion notification, not from reading the run again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import tidegate.app
from tidegate import (
    NewRun,
    ResultTimeout,
    RunCancelled,
    RunFailed,
    RunState,
    Tidegate,
    UnknownRunError,
)


@pytest.fixture
def worker(start_worker_process: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tidegate.app, "RESULT_POLL_SECONDS", 60.0)
    start_worker_process("manual>*:8")


def test_result_returns_a_succeeded_runs_result_and_at_once_once_it_has(
    app: Tidegate, worker: None
) -> None:
    run = app.enqueue("async_sleep", {"seconds": 0.5})
    assert app.result(run.id, timeout=20) == "slept"
    # Already finished: answered from the run itself, with no notification to come (a
    # waiter that waited for one would raise ResultTimeout, at once with timeout 0).
    assert app.result(run.id, timeout=20) == "slept"
    assert app.result(run.id, timeout=0) == "slept"


async def test_aresult_raises_for_a_discarded_a_cancelled_and_an_unknown_run(
    app: Tidegate, worker: None
) -> None:
    failed = await app.aenqueue("fail", max_attempts=1)
    with pytest.raises(RunFailed) as raised:
        await app.aresult(failed.id, timeout=20)
    assert raised.value.run.state is RunState.DISCARDED
    assert [error["error"] for error in raised.value.errors] == ["ValueError: boom on attempt 1"]

    cancelled = await app.aenqueue("cancel_me")  # its handler raises Cancel
    with pytest.raises(RunCancelled) as raised_cancel:
        await app.aresult(cancelled.id, timeout=20)
    assert raised_cancel.value.run.state is RunState.CANCELLED

    with pytest.raises(UnknownRunError):
        await app.aresult(cancelled.id + 1000, timeout=20)
    with pytest.raises(LookupError):
        app.result(cancelled.id + 1000)


async def test_a_run_cancelled_while_awaited_raises_and_a_timeout_leaves_the_run_going(
    app: Tidegate, worker: None
) -> None:
    run = await app.aenqueue("async_sleep", {"seconds": 30})
    with pytest.raises(ResultTimeout) as raised:
        await app.aresult(run.id, timeout=0.5)
    assert isinstance(raised.value, TimeoutError)
    assert raised.value.run.state in (RunState.AVAILABLE, RunState.RUNNING)
    with pytest.raises(ResultTimeout):
        await asyncio.to_thread(app.result, run.id, 0.2)

    waiting = asyncio.create_task(app.aresult(run.id, timeout=20))
    await asyncio.sleep(0.5)
    assert app.cancel(run.id) is not None
    with pytest.raises(RunCancelled):
        await waiting


async def test_many_waiters_each_get_their_own_runs_result(app: Tidegate, worker: None) -> None:
    runs = await app.aenqueue_many([NewRun("echo", {"i": i}) for i in range(50)])
    results = await asyncio.wait_for(
        asyncio.gather(*(app.aresult(run.id, timeout=30) for run in runs)), 40
    )
    assert results == [{"i": i} for i in range(50)]

    # Several waiters, async and sync, on one run that ends after they all wait.
    run = await app.aenqueue("async_sleep", {"seconds": 1})
    with ThreadPoolExecutor(3) as threads:
        sync = [asyncio.wrap_future(threads.submit(app.result, run.id, 20)) for _ in range(3)]
        both = await asyncio.gather(*(app.aresult(run.id, timeout=20) for _ in range(5)), *sync)
    assert both == ["slept"] * 8
