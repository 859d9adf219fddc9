"""``tidegate demo``: enqueue runs across lanes, work them off, show what happened.

The demo's tasks exist only in its own worker, which claims only runs of tasks it has
(and the workers of a ``tidegate serve`` on the same database only theirs), so the demo
works beside a running server. The worker starts first, and the runs are enqueued once
it is live; a progress bar counts the runs done while it waits, and the worker's log
lines (the flaky task's failures) are written above it, never on its line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterator
from typing import IO

import click

from tidegate.app import NewRun, Tidegate
from tidegate.runs import Retry, current_run
from tidegate.settings import Settings
from tidegate.storage.database import describe_database
from tidegate.storage.sql import Statement, Steps
from tidegate.worker.runtime import Worker

POLL_SECONDS = 0.2


def build_app(settings: Settings) -> Tidegate:
    app = Tidegate(settings=settings)

    @app.task(name="resize_image")
    def resize_image(width: int, height: int) -> dict[str, int]:
        time.sleep(0.01)  # a sync handler: runs in the worker's thread pool
        return {"pixels": width * height}

    @app.task(name="send_reply", lane="fast_lane")
    async def send_reply(text: str) -> dict[str, str]:
        return {"reply": text.upper()}

    @app.task(name="flaky_sync", max_attempts=3, backoff=lambda attempt: 0.2)
    async def flaky_sync(account: str) -> str:
        if current_run().attempt == 1 and random.random() < 0.5:
            raise ConnectionError(f"upstream for {account} timed out")
        return "synced"

    @app.task(name="poll_status")
    async def poll_status(job: str) -> str:
        if current_run().attempt == 1:
            raise Retry(delay_seconds=0.5)  # not a failure: asks to run again later
        return f"{job} done"

    return app


def run_demo(settings: Settings, count: int) -> None:
    app = build_app(settings)
    app.migrate()
    click.echo(f"database: {describe_database(settings, name=True)}, schema {settings.schema!r}")
    batch = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            batch.append(
                NewRun("resize_image", {"width": 64 + i, "height": 48}, project=f"shop{i % 3}")
            )
        elif kind == 1:
            batch.append(NewRun("send_reply", {"text": f"hello {i}"}))
        elif kind == 2:
            batch.append(NewRun("flaky_sync", {"account": f"acct{i}"}, lane="manual"))
        else:
            batch.append(NewRun("poll_status", {"job": f"export-{i}"}, delay=0.2))
    ids, seconds = asyncio.run(_work_off(app, settings, batch))
    finished = [app.get_run(run_id) for run_id in ids]
    click.echo(f"\nall {len(ids)} runs finished in {seconds:.2f}s\n")
    summary: dict[tuple[str, str, str], int] = {}
    for run in finished:
        assert run is not None
        group = (run.task, run.lane, f"{run.state} after {run.attempt} attempt(s)")
        summary[group] = summary.get(group, 0) + 1
    for (task, lane, outcome), n in sorted(summary.items()):
        click.echo(f"  {n:5d}  {task:<13} lane={lane:<10} {outcome}")
    click.echo("\nlook closer: tidegate runs --limit 5, tidegate runs <id>")
    app.close()


async def _work_off(
    app: Tidegate, settings: Settings, batch: list[NewRun]
) -> tuple[list[int], float]:
    """Start the worker, enqueue ``batch`` once it is live, and wait with a progress bar
    until every run has finished; return the runs' ids and the seconds they took.

    The worker starts first, so that the enqueue finds a live worker with each of the
    demo's tasks (and does not warn that none has them), and its start line is written
    before the bar is drawn.
    """
    stop = asyncio.Event()
    worker = Worker(app, settings)
    running = asyncio.create_task(worker.run(stop))
    live = asyncio.create_task(worker.started.wait())
    await asyncio.wait([running, live], return_when=asyncio.FIRST_COMPLETED)
    live.cancel()
    if running.done():
        await running  # it could not start: its error
    started = time.monotonic()
    runs = await app.aenqueue_many(batch)
    click.echo(
        f"enqueued {len(runs)} runs in one statement to a worker ({settings.workloops});\n"
        "flaky_sync fails about half of its first attempts on purpose: the WARNING lines"
    )
    ids = [run.id for run in runs]
    waiting = set(ids)
    with click.progressbar(length=len(ids), label="runs done") as bar, _above(bar.file):
        while waiting and not running.done():
            finished = await app.aexecute(_finished(waiting))
            waiting -= finished
            bar.update(len(finished))
            if waiting:
                await asyncio.sleep(POLL_SECONDS)
    seconds = time.monotonic() - started
    stop.set()
    await running
    await app.aclose()
    return ids, seconds


@contextlib.contextmanager
def _above(terminal: IO[str]) -> Iterator[None]:
    """While the progress bar is drawn on ``terminal``, clear its line before each log
    line, so that the log line starts a line of its own instead of running on after
    the bar; the bar is drawn again below it at its next change."""
    if not terminal.isatty():
        yield  # no bar is drawn: click writes its label once
        return
    clear = _ClearLine(terminal)
    handlers = logging.getLogger().handlers
    for handler in handlers:
        handler.addFilter(clear)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(clear)


class _ClearLine(logging.Filter):
    def __init__(self, terminal: IO[str]) -> None:
        super().__init__()
        self.terminal = terminal

    def filter(self, record: logging.LogRecord) -> bool:
        self.terminal.write("\r\x1b[K")  # to the line's start, erase to its end
        self.terminal.flush()
        return True


def _finished(ids: set[int]) -> Steps[set[int]]:
    rows = yield Statement("find_finished_runs", {"ids": sorted(ids)})
    return {row[0] for row in rows}
