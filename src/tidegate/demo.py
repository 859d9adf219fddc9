"""``tidegate demo``: enqueue runs across lanes, work them off, show what happened.

The demo's tasks exist only in its own worker, which claims only runs of tasks it has
(and the workers of a ``tidegate serve`` on the same database only theirs), so the demo
works beside a running server. A progress bar counts the runs done while it waits.
"""

from __future__ import annotations

import asyncio
import random
import time

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
    started = time.monotonic()
    runs = app.enqueue_many(batch)
    click.echo(
        f"enqueued {len(runs)} runs in one statement; starting a worker ({settings.workloops});\n"
        "flaky_sync fails about half of its first attempts on purpose: the WARNING lines"
    )
    ids = [run.id for run in runs]
    asyncio.run(_work_until_finished(app, settings, ids))
    finished = [app.get_run(run_id) for run_id in ids]
    click.echo(f"\nall {len(ids)} runs finished in {time.monotonic() - started:.2f}s\n")
    summary: dict[tuple[str, str, str], int] = {}
    for run in finished:
        assert run is not None
        group = (run.task, run.lane, f"{run.state} after {run.attempt} attempt(s)")
        summary[group] = summary.get(group, 0) + 1
    for (task, lane, outcome), n in sorted(summary.items()):
        click.echo(f"  {n:5d}  {task:<13} lane={lane:<10} {outcome}")
    click.echo("\nlook closer: tidegate runs --limit 5, tidegate runs <id>")
    app.close()


async def _work_until_finished(app: Tidegate, settings: Settings, ids: list[int]) -> None:
    stop = asyncio.Event()
    worker = asyncio.create_task(Worker(app, settings).run(stop))
    waiting = set(ids)
    with click.progressbar(length=len(ids), label="runs done") as bar:
        while waiting and not worker.done():
            finished = await app.aexecute(_finished(waiting))
            waiting -= finished
            bar.update(len(finished))
            if waiting:
                await asyncio.sleep(POLL_SECONDS)
    stop.set()
    await worker
    await app.aclose()


def _finished(ids: set[int]) -> Steps[set[int]]:
    rows = yield Statement("find_finished_runs", {"ids": sorted(ids)})
    return {row[0] for row in rows}
