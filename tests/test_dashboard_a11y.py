"""Every page of the dashboard passes axe-core's accessibility rules, on a desktop and a phone.

axe-core (MPL-2.0) comes in the ``axe-playwright-python`` package (MIT), which ships
``axe.min.js`` in its wheel: it is injected into each page through Playwright (which
the page's Content-Security-Policy does not apply to) and reads the rendered page; it
fetches nothing. A violation of impact ``serious`` or ``critical`` fails the test, and
each is printed: the page, the screen, the rule, the element, and what the rule asks.
The pages are those a person meets, in the states that show most of their markup: a
discarded run with its traceback, a paused lane, a key held by its cap, a refused
webhook, every state tab of the runs list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests import test_dashboard_browser as browser_tests
from tests.test_dashboard_browser import (
    PHONE,
    VIEWPORT,
    create_project,
    create_trigger,
    sign_in,
    wait_for_state,
)
from tidegate import NewRun, Tidegate
from tidegate.runs import RunState
from tidegate.schedules import create_schedule

try:
    from axe_playwright_python.sync_playwright import Axe
    from playwright.sync_api import Page, expect
except ImportError:
    pytest.skip(
        f"the accessibility check needs axe-playwright-python; to run it: {browser_tests.ENABLE}",
        allow_module_level=True,
    )

# The browser tests' fixtures, by name: one Chromium, a page that fails on a script
# error or a CSP violation, signed in as the super admin; an HTTP client.
browser = browser_tests.browser
page = browser_tests.page
admin = browser_tests.admin
client = browser_tests.client

pytestmark = pytest.mark.browser

FAILING = ("serious", "critical")
"""The impacts that fail the check; ``moderate`` and ``minor`` ones are best practice."""
SCREENS = {"desktop": VIEWPORT, "phone": PHONE}
STATES = ("all", *(state.value for state in RunState))
AXE = Axe()


def violations(page: Page, where: str) -> list[str]:
    """Run axe-core on the page as it is now; one line per element of each serious or
    critical violation: where, rule, impact, element, and what the rule asks."""
    found = AXE.run(page).response["violations"]
    return [
        f"{where}: {rule['id']} ({rule['impact']}) {', '.join(map(str, node['target']))}"
        f" {node['html'][:120]!r}: {rule['help']} ({rule['helpUrl']})"
        for rule in found
        if rule["impact"] in FAILING
        for node in rule["nodes"]
    ]


def a_busy_cluster(
    app: Tidegate, client: httpx.Client, start_worker_process: Callable[..., Any]
) -> list[str]:
    """Give every page something to show; return the paths of the pages to check."""
    create_project(client, "acme", ingest_rate=1, ingest_burst=1)
    trigger = create_trigger(client, "acme", "orders", mode="async", task="echo")
    statuses = [client.post(trigger["url"], json={"order": n}).status_code for n in range(4)]
    assert 202 in statuses and 429 in statuses, statuses
    app.set_key_policy("default", "acme", max_running=1, weight=2)
    app.execute(create_schedule("acme", "nightly", "noop", cron="0 2 * * *"))
    app.pause_lane("reports", reason="month end")
    app.enqueue("noop", lane="reports")
    app.enqueue_many(NewRun("ship", {"order": n}, project="acme") for n in range(3))
    waiting = app.enqueue("ship", {"order": 9}, project="acme", delay=3600)
    cancelled = app.enqueue("ship", {"order": 10}, project="acme")
    app.cancel(cancelled.id)
    failed = app.enqueue("fail", {"until_attempt": 9}, max_attempts=1)
    start_worker_process("manual>*:2")
    wait_for_state(app, failed.id, RunState.DISCARDED)
    log = f"/ui/triggers/{trigger['id']}/log"
    return [
        "/ui/",
        "/ui/workers",
        "/ui/projects",
        "/ui/projects/acme",
        "/ui/keys",
        "/ui/schedules",
        "/ui/tasks",
        "/ui/keys/policy?lane=default&key=acme",
        "/ui/keys/policy/clear?lane=default&key=acme",
        "/ui/keys/breaker?lane=default&key=acme",
        *(f"/ui/runs?state={state}" if state != "all" else "/ui/runs" for state in STATES),
        f"/ui/runs/{failed.id}",
        f"/ui/runs/{waiting.id}",
        f"/ui/runs/{failed.id}/retry",
        f"/ui/runs/{waiting.id}/cancel",
        "/ui/bulk/retry?task=ship",
        "/ui/bulk/cancel?task=ship",
        log,
        f"request of {log}",
        "/ui/no-such-page",
    ]


def open_page(page: Page, path: str) -> None:
    """Open ``path`` (``request of LOG``: the newest request of that webhook log) and wait
    for what the page draws after it loads: the overview's charts."""
    if path.startswith("request of "):
        page.goto(path.removeprefix("request of "))
        page.get_by_role("link", name="request").first.click()
        expect(page.locator("#request-body")).to_be_visible()
        return
    page.goto(path)
    expect(page.locator("main h1")).to_be_visible()
    if path == "/ui/":
        expect(page.locator("#throughput-chart canvas").first).to_be_visible()
        expect(page.locator("#admissions-chart canvas").first).to_be_visible()


def test_every_dashboard_page_has_no_serious_accessibility_violation(
    admin: Page, app: Tidegate, client: httpx.Client, start_worker_process: Callable[..., Any]
) -> None:
    paths = a_busy_cluster(app, client, start_worker_process)
    found: list[str] = []
    for screen, size in SCREENS.items():
        admin.set_viewport_size(size)  # type: ignore[arg-type]
        for path in paths:
            open_page(admin, path)
            found += violations(admin, f"{path} ({screen})")
    admin.context.clear_cookies()
    for screen, size in SCREENS.items():
        admin.set_viewport_size(size)  # type: ignore[arg-type]
        admin.goto("/ui/login")
        expect(admin.locator("form#login")).to_be_visible()
        found += violations(admin, f"/ui/login ({screen})")
        sign_in(admin, "tga_not-the-token")  # the form again, with its message
        expect(admin.locator("main .error")).to_be_visible()
        found += violations(admin, f"/ui/login, wrong token ({screen})")
    assert not found, "accessibility violations:\n" + "\n".join(found)


def test_the_check_reports_an_unlabeled_field(page: Page) -> None:
    """The check above can fail: a field without a label, put on the sign-in page, is
    reported as the critical violation it is."""
    page.goto("/ui/login")
    expect(page.locator("form#login")).to_be_visible()
    assert violations(page, "sign-in") == []
    page.evaluate(
        """() => document.querySelector("form#login")
                 .appendChild(document.createElement("input"))"""
    )

    found = violations(page, "sign-in, seeded")

    assert len(found) == 1, found
    assert found[0].startswith("sign-in, seeded: label (critical) "), found
