"""Take the dashboard's screenshots for docs/dashboard.md.

::

    python -m tests.screenshots             # TIDEGATE_DATABASE_URL, else the embedded server
    python -m tests.screenshots --seconds 60 --out /tmp/shots

On a schema of its own, it starts ``tidegate serve --role api`` and two worker processes
with a small shop's tasks (``tests/apps.py``), runs the shop for ``--seconds`` (three
projects, four lanes, more receipts and reports than the workers keep up with, webhooks
over their rate, failing invoices, a task no worker has), then opens each page in
Chromium at 1200 x 800 and writes ``OUT/dashboard-NAME.png``, cut to 64 colours, so
that the pictures stay small in the repository. The schema is dropped at the end.

It reads the pages by their ids and roles only, as the browser tests do, so it keeps
working as the pages change; a page it cannot find fails it with Playwright's message.
It needs Chromium at /usr/bin/chromium (``apt-get install -y chromium``) and the test
extra (``pip install -e '.[test]'``: playwright, pillow).
"""

from __future__ import annotations

import argparse
import io
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
from PIL import Image
from playwright.sync_api import Page, expect, sync_playwright
from psycopg import sql

from tests.apps import EXECUTIONS, register
from tests.conftest import FAST, spawn_worker, stop_worker
from tests.http_fixtures import ADMIN, ADMIN_TOKEN, ApiServer, wait_for_workers
from tidegate import NewRun, Settings, Tidegate
from tidegate.runs import RunState
from tidegate.schedules import create_schedule

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]
SIZE = {"width": 1200, "height": 800}
COLOURS = 64
WAIT_MS = 60_000
PACE_SECONDS = 5.0
"""One wave of the shop's work every 5 s: the pace of the shop, not a wait for a condition."""


@contextmanager
def a_schema(url: str) -> Iterator[Settings]:
    """A fresh schema, migrated, with the shop's settings; dropped at the end."""
    schema = f"screenshots_{uuid.uuid4().hex[:8]}"
    settings = Settings(database_url=url, schema=schema, **FAST)  # type: ignore[arg-type]
    try:
        yield settings
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = client.post(path, json=body, headers=ADMIN)
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


def set_up_shop(app: Tidegate, client: httpx.Client) -> dict[str, dict[str, Any]]:
    """The shop's projects, triggers, key policies, schedules and waiting reports;
    return its triggers by name."""
    for project, limits in {
        "acme": {"ingest_rate": 1, "ingest_burst": 2, "fast_lane_cap": 2},
        "globex": {"concurrency": 6},
        "initech": {"backlog_cap": 5000},
    }.items():
        post(client, "/admin/projects", {"id": project, **limits})
    triggers = {
        name: post(client, f"/admin/projects/{project}/triggers", {"name": name, **fields})
        for project, name, fields in [
            ("acme", "orders", {"mode": "async", "task": "shop.send_receipt"}),
            ("acme", "quotes", {"mode": "sync", "task": "echo"}),
            ("globex", "invoices", {"mode": "async", "task": "shop.sync_invoice"}),
        ]
    }
    app.set_key_policy("emails", "*", rate=12, rate_burst=6)
    app.set_key_policy("default", "acme", max_running=2, weight=3)
    app.set_key_policy("reports", "initech", max_running=1)
    app.enqueue_many(
        NewRun("shop.build_report", {"month": f"2026-{m:02}"}, project="initech", delay=3600)
        for m in range(1, 13)
    )
    app.enqueue("billing.close_month", {"month": "2026-10"}, project="initech")
    for project, name, task, timing in [
        ("acme", "receipts-digest", "shop.send_receipt", {"cron": "*/2 * * * *"}),
        ("globex", "invoice-sync", "shop.sync_invoice", {"interval_seconds": 45}),
        ("initech", "month-end", "shop.build_report", {"cron": "0 6 L * *", "paused": True}),
        ("initech", "close-books", "billing.close_month", {"cron": "* * * * *"}),
    ]:
        app.execute(
            create_schedule(project, name, task, timezone="Europe/Berlin", catch_up="all", **timing)
        )
    return triggers


def run_shop(app: Tidegate, client: httpx.Client, triggers: dict[str, Any], seconds: float) -> None:
    """Enqueue a wave of work and send a few webhooks every PACE_SECONDS for ``seconds``."""
    projects = ("acme", "globex", "initech")
    started = time.monotonic()
    wave = 0
    while time.monotonic() - started < seconds:
        wave += 1
        app.enqueue_many(
            [
                *(
                    NewRun("shop.send_receipt", {"order": wave * 1000 + n}, project=projects[n % 3])
                    for n in range(120)
                ),
                *(
                    NewRun("shop.sync_invoice", {"invoice": wave * 10 + n}, project="globex")
                    for n in range(8)
                ),
                *(
                    NewRun("shop.build_report", {"shop": wave * 10 + n}, project="initech")
                    for n in range(4)
                ),
                NewRun("noop", project="acme", lane="fast_lane"),
            ]
        )
        for n in range(4):
            order = {"order": wave * 1000 + n, "total": "19.90"}
            client.post(triggers["orders"]["url"], json=order)
        client.post(triggers["invoices"]["url"], json={"invoice": wave * 10 + 9})
        print(f"  shop: wave {wave}, {time.monotonic() - started:.0f}/{seconds:.0f} s", flush=True)
        time.sleep(PACE_SECONDS)


def shoot(page: Page, out: Path, name: str) -> None:
    """Save the viewport as ``OUT/dashboard-NAME.png`` in COLOURS colours."""
    picture = Image.open(io.BytesIO(page.screenshot(animations="disabled")))
    small = picture.convert("RGB").quantize(COLOURS, method=Image.Quantize.MEDIANCUT)
    path = out / f"dashboard-{name}.png"
    small.save(path, optimize=True)
    print(
        f"  {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: "
        f"{path.stat().st_size // 1024} KB",
        flush=True,
    )


def photograph(page: Page, app: Tidegate, triggers: dict[str, Any], out: Path) -> None:
    """Open each page as a person would reach it, and save it."""
    page.goto("/ui/login")
    expect(page.locator("form#login")).to_be_visible()
    shoot(page, out, "login")
    page.locator('form#login input[name="token"]').fill(ADMIN_TOKEN)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#throughput-chart canvas").first).to_be_visible()
    expect(page.locator("#admissions-chart canvas").first).to_be_visible()
    shoot(page, out, "overview")

    page.goto("/ui/projects")
    expect(page.locator('#projects tr[data-project="acme"]')).to_be_visible()
    shoot(page, out, "projects")
    page.goto("/ui/projects/acme")
    expect(page.locator("#triggers tbody tr").first).to_be_visible()
    shoot(page, out, "project")

    page.goto("/ui/runs?task=shop.sync_invoice")
    expect(page.locator("#runs tr[data-run]").first).to_be_visible()
    shoot(page, out, "runs")
    discarded = app.list_runs(state=RunState.DISCARDED, task="shop.sync_invoice", limit=1)
    assert discarded, "no invoice was discarded: let the shop run longer (--seconds)"
    page.goto(f"/ui/runs/{discarded[0].id}")
    expect(page.locator("#run-errors li").first).to_be_visible()
    shoot(page, out, "run")
    page.goto(f"/ui/runs/{discarded[0].id}/retry")
    expect(page.locator("main form button")).to_be_visible()
    shoot(page, out, "confirm")
    page.goto("/ui/bulk/retry?task=shop.sync_invoice&state=discarded")
    expect(page.locator("#bulk-matching")).to_be_visible()
    shoot(page, out, "bulk")

    page.goto(f"/ui/triggers/{triggers['orders']['id']}/log")
    expect(page.locator('#requests tr[data-status="429"]').first).to_be_visible()
    shoot(page, out, "webhook-log")
    admitted = page.locator('#requests tr[data-status="202"]').first
    admitted.get_by_role("link", name="request").click()
    expect(page.locator("#request-body")).to_be_visible()
    shoot(page, out, "request")

    page.goto("/ui/workers")
    expect(page.locator("#workers tbody tr")).to_have_count(2)
    shoot(page, out, "workers")
    page.goto("/ui/keys")
    expect(page.locator("#keys tbody tr").first).to_be_visible()
    shoot(page, out, "keys")
    page.goto("/ui/schedules")
    expect(page.locator('#schedules tr[data-name="invoice-sync"] td.run a')).to_be_visible()
    shoot(page, out, "schedules")
    page.goto("/ui/tasks")
    expect(page.locator("#tasks tbody tr").first).to_be_visible()
    shoot(page, out, "tasks")
    page.goto("/ui/runs/999999999")
    expect(page.locator("main h1")).to_be_visible()
    shoot(page, out, "error")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.screenshots", description=__doc__)
    parser.add_argument("--database-url", default=os.environ.get("TIDEGATE_DATABASE_URL"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--seconds", type=float, default=300.0, help="the shop works (300)")
    options = parser.parse_args(argv)
    assert CHROMIUM.exists(), f"no Chromium at {CHROMIUM}: apt-get install -y chromium"
    url = options.database_url
    if not url:
        from tidegate.storage.embedded import start_embedded

        url = start_embedded(ROOT / ".tidegate" / "screenshots")
    options.out.mkdir(parents=True, exist_ok=True)
    with a_schema(url) as settings, Tidegate(settings=settings) as app:
        app.migrate()
        with app.database.connect() as conn:
            conn.execute(EXECUTIONS)
        register(app)
        server = ApiServer.start(settings)
        loops = ("fast_lane:1 manual>*:3", "emails:2")
        workers = [spawn_worker(settings, workloops) for workloops in loops]
        try:
            wait_for_workers(url, settings.schema, len(workers))
            with httpx.Client(base_url=server.url, timeout=20) as client:
                triggers = set_up_shop(app, client)
                print(f"the shop works for {options.seconds:.0f} s", flush=True)
                run_shop(app, client, triggers, options.seconds)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
                )
                context = browser.new_context(base_url=server.url, viewport=SIZE)  # type: ignore[arg-type]
                context.set_default_timeout(WAIT_MS)
                expect.set_options(timeout=WAIT_MS)
                photograph(context.new_page(), app, triggers, options.out)
                browser.close()
        finally:
            for worker in workers:
                stop_worker(worker)
            server.stop()


if __name__ == "__main__":
    main()
