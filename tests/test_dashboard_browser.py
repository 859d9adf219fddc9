"""The dashboard (/ui) in a real browser, used the way a person would use it.

Each test starts ``tidegate serve --role api`` on its own schema (``api``), worker
processes where runs must execute (``start_worker_process``), and drives Debian's
Chromium through Playwright: it signs in through the form, reads tables as they refresh
themselves, fills the runs filter, presses Retry, follows links. Conditions are waited
for with Playwright's auto-waiting ``expect`` (generous timeouts, for a loaded 2-core
machine), never with fixed sleeps.

Without ``/usr/bin/chromium`` or without the ``playwright`` package, the module skips.
Playwright's own browser download is never used. The screenshots of docs/dashboard.md
are taken by ``python -m tests.screenshots``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.http_fixtures import ADMIN, ADMIN_TOKEN, ApiServer
from tidegate import NewRun, Tidegate
from tidegate.policies import list_key_policies
from tidegate.runs import RunState
from tidegate.schedules import create_schedule

CHROMIUM = Path("/usr/bin/chromium")
ENABLE = "apt-get install -y chromium; pip install -e '.[test]'"

try:
    from playwright.sync_api import (
        Browser,
        Locator,
        Page,
        Request,
        Response,
        expect,
        sync_playwright,
    )
except ImportError:
    pytest.skip(
        f"the browser tests need the playwright package; to run them: {ENABLE}",
        allow_module_level=True,
    )
if not CHROMIUM.exists():
    pytest.skip(
        f"the browser tests need Chromium at {CHROMIUM}; to run them: {ENABLE}",
        allow_module_level=True,
    )

pytestmark = pytest.mark.browser

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
VIEWPORT = {"width": 1280, "height": 800}
WAIT_MS = 30_000
"""How long an ``expect`` waits by default: the page refreshes every 2 s, the machine
may be loaded."""
DRAIN_MS = 120_000
"""How long a lane may take to drain, or a retried run to finish."""

expect.set_options(timeout=WAIT_MS)


# -- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One Chromium for the module's tests; each test gets a fresh context (no cookies)."""
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, api: ApiServer) -> Iterator[Page]:
    """A page in a fresh browser context on the test's server; fails on a script error,
    on anything the dashboard's Content-Security-Policy refused (Chromium reports it on
    the console: a page that needs it to be looser is broken), on a request to another
    site (the dashboard works offline), and on a missing icon or static file."""
    context = browser.new_context(base_url=api.url, viewport=VIEWPORT)  # type: ignore[arg-type]
    context.set_default_timeout(WAIT_MS)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))

    def offline(request: Request) -> None:
        if not request.url.startswith((api.url, "data:")):
            errors.append(f"a request to another site: {request.url}")

    def found(response: Response) -> None:
        asset = response.url.endswith("/favicon.ico") or "/static" in response.url
        if asset and response.status >= 400:
            errors.append(f"{response.status} for {response.url}")

    tab.on("request", offline)
    tab.on("response", found)
    tab.on(
        "console",
        lambda message: (
            errors.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    yield tab
    context.close()
    assert errors == [], f"script errors or CSP violations on the dashboard: {errors}"


@pytest.fixture
def admin(page: Page) -> Page:
    """The page, signed in with the super admin's token."""
    sign_in(page, ADMIN_TOKEN)
    expect(page).to_have_url(re.compile(r"/ui/$"))
    return page


@pytest.fixture
def client(api: ApiServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=20) as http:
        yield http


# -- helpers ----------------------------------------------------------------------------


def sign_in(page: Page, token: str) -> None:
    """Sign in through the login form, as a person would."""
    page.goto("/ui/login")
    form = page.locator("form#login")
    form.locator('input[name="token"]').fill(token)
    form.get_by_role("button", name="Sign in").click()


def create_project(client: httpx.Client, project_id: str, **limits: Any) -> dict[str, Any]:
    response = client.post("/admin/projects", json={"id": project_id, **limits}, headers=ADMIN)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def create_trigger(
    client: httpx.Client, project_id: str, name: str, **fields: Any
) -> dict[str, Any]:
    response = client.post(
        f"/admin/projects/{project_id}/triggers", json={"name": name, **fields}, headers=ADMIN
    )
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


NEXT_DEPTH = """([lane, last]) => {
    const row = document.querySelector(`#lanes tr[data-lane="${lane}"]`);
    const depth = row ? parseInt(row.querySelector('td[data-state="available"]').textContent) : 0;
    return depth === last ? null : {depth};
}"""


def next_depth(page: Page, lane: str, last: int) -> int:
    """Wait for the lane's ``available`` depth to differ from ``last``, and return it.

    A lane with no run in any state leaves the table: its row gone reads as 0.
    """
    changed = page.wait_for_function(NEXT_DEPTH, arg=[lane, last], timeout=DRAIN_MS)
    depth: int = changed.json_value()["depth"]
    return depth


def fill_field(form: Locator, name: str, value: str) -> None:
    """Set a form field by name, whether it is a text input or a select."""
    field = form.locator(f'[name="{name}"]')
    if field.evaluate("element => element.tagName") == "SELECT":
        field.select_option(value)
    else:
        field.fill(value)


def wait_for_state(app: Tidegate, run_id: int, state: RunState, timeout: float = 60) -> None:
    """Poll the database until the run is in ``state``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (run := app.get_run(run_id)) is None or run.state != state:
        assert time.monotonic() < deadline, f"run {run_id} not {state} within {timeout}s: {run}"
        time.sleep(0.1)


def reload_until(page: Page, locator: Locator, count: int, timeout: float = 30) -> None:
    """Reload until ``locator`` matches ``count`` elements, for pages that show a moment's
    state (the webhook log gets refused requests about once a second from each API
    process's ledger)."""
    deadline = time.monotonic() + timeout
    while locator.count() != count:
        assert time.monotonic() < deadline, (
            f"{locator} matched {locator.count()} elements, not {count}, within {timeout}s"
        )
        page.wait_for_timeout(250)
        page.reload()


# -- the tests --------------------------------------------------------------------------


def test_admin_signs_in_through_the_form_and_gets_a_strict_http_only_cookie(
    page: Page, api: ApiServer
) -> None:
    sign_in(page, "tga_not-the-token")
    expect(page.locator("form#login")).to_be_visible()
    assert not [c for c in page.context.cookies() if c["name"] == "tidegate_session"]

    sign_in(page, ADMIN_TOKEN)

    expect(page).to_have_url(f"{api.url}/ui/")
    [cookie] = [c for c in page.context.cookies() if c["name"] == "tidegate_session"]
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert "tidegate_session" not in page.evaluate("document.cookie")
    nav = page.locator("nav")
    for name in ("Overview", "Workers", "Projects", "Keys", "Runs"):
        expect(nav.get_by_role("link", name=name, exact=True)).to_be_visible()
    expect(nav.get_by_role("button", name="Sign out")).to_be_visible()  # a POST, with CSRF
    expect(page.locator("table#lanes")).to_be_visible()


def test_overview_shows_a_lane_draining_to_zero_without_a_reload(
    admin: Page, app: Tidegate, start_worker_process: Callable[..., Any]
) -> None:
    app.enqueue_many(NewRun("sleep", {"seconds": 0.1}, lane="bulk") for _ in range(200))
    admin.goto("/ui/")
    available = admin.locator('#lanes tr[data-lane="bulk"] td[data-state="available"]')
    expect(available).to_have_text("200")
    admin.evaluate("window.sameDocument = true")  # gone if the page reloads

    start_worker_process("manual>*:2")  # 200 x 0.1 s on 2 slots: at least 10 s

    seen = [200]
    while seen[-1]:
        now = next_depth(admin, "bulk", seen[-1])
        assert now < seen[-1], f"the depth went up: {seen} then {now}"
        seen.append(now)
    assert len(seen) >= 3, f"no depth seen between 200 and 0: {seen}"
    assert admin.evaluate("window.sameDocument") is True, "the page reloaded"


def test_a_discarded_run_found_by_task_succeeds_when_retried(
    admin: Page,
    app: Tidegate,
    start_worker_process: Callable[..., Any],
    tmp_path: Path,
) -> None:
    flag = tmp_path / "fail"
    flag.touch()
    app.enqueue("fail", {"until_attempt": 9}, max_attempts=1)  # another discarded run
    app.enqueue("noop")
    run = app.enqueue("fail_while_flagged", {"flag": str(flag)})
    assert run.max_attempts == 1
    start_worker_process("manual>*:2")
    wait_for_state(app, run.id, RunState.DISCARDED)

    admin.get_by_role("link", name="Runs", exact=True).click()
    expect(admin.locator("table#runs")).to_be_visible()
    form = admin.locator('form:has([name="task"])')
    fill_field(form, "task", "fail_while_flagged")
    form.locator('button, input[type="submit"]').first.click()

    expect(admin).to_have_url(re.compile(r"[?&]task=fail_while_flagged"))
    rows = admin.locator("#runs tr[data-run]")
    expect(rows).to_have_count(1)
    expect(rows).to_have_attribute("data-run", str(run.id))
    expect(rows.locator("td.state")).to_contain_text("discarded")
    rows.locator("a").first.click()

    expect(admin).to_have_url(re.compile(rf"/ui/runs/{run.id}$"))
    expect(admin.locator("#run-state")).to_contain_text("discarded")
    expect(admin.locator("#run-args")).to_contain_text(str(flag))
    expect(admin.locator("#run-errors li")).to_have_count(1)
    expect(admin.locator("#run-errors")).to_contain_text("says to fail")

    flag.unlink()
    admin.get_by_role("link", name="Retry…").click()
    expect(admin.locator("h1")).to_have_text(f"Retry run {run.id}?")
    admin.get_by_role("button", name=f"Retry run {run.id}").click()

    expect(admin.locator("#run-state")).to_contain_text("succeeded", timeout=DRAIN_MS)
    expect(admin.locator("#run-result")).to_contain_text("flag gone")
    finished = app.get_run(run.id)
    assert finished is not None and finished.state == RunState.SUCCEEDED


def test_webhook_log_shows_a_rate_limited_burst_beside_the_admitted_request(
    admin: Page, client: httpx.Client, api: ApiServer
) -> None:
    create_project(client, "acme", ingest_rate=1, ingest_burst=1)
    trigger = create_trigger(client, "acme", "orders", mode="async", task="echo")
    statuses = [
        client.post(trigger["url"], json={"order": n}, headers={"X-Shop": "north"}).status_code
        for n in range(10)
    ]
    assert set(statuses) == {202, 429}, statuses
    admitted, refused = statuses.count(202), statuses.count(429)

    admin.get_by_role("link", name="Projects", exact=True).click()
    admin.locator('#projects tr[data-project="acme"] a').first.click()
    log_path = f"/ui/triggers/{trigger['id']}/log"
    admin.locator(f'a[href$="{log_path}"]').first.click()
    expect(admin).to_have_url(f"{api.url}{log_path}")

    rows = admin.locator("#requests tr[data-status]")
    reload_until(admin, rows, 10)
    expect(admin.locator('#requests tr[data-status="429"]')).to_have_count(refused)
    expect(admin.locator('#requests tr[data-outcome="rate_limited"]')).to_have_count(refused)
    expect(admin.locator('#requests tr[data-status="202"]')).to_have_count(admitted)
    newest_first = [str(status) for status in reversed(statuses)]
    assert [row.get_attribute("data-status") for row in rows.all()] == newest_first

    oldest = admin.locator('#requests tr[data-status="202"]').last  # the first sent: order 0
    oldest.get_by_role("link", name="request").click()
    expect(admin.locator("#request-headers")).to_contain_text("north")
    expect(admin.locator("#request-body")).to_contain_text('"order": 0')
    expect(admin.locator("form.replay").get_by_role("button", name="Replay")).to_be_visible()


def test_a_project_token_sees_only_its_own_project(
    page: Page, client: httpx.Client, app: Tidegate
) -> None:
    acme = create_project(client, "acme")
    create_project(client, "globex")
    mine = app.enqueue("noop", project="acme")
    theirs = app.enqueue("noop", project="globex")

    sign_in(page, acme["token"])
    expect(page).to_have_url(re.compile(r"/ui/$"))

    page.goto("/ui/projects")
    expect(page.locator("#projects tr[data-project]")).to_have_count(1)
    expect(page.locator('#projects tr[data-project="acme"]')).to_be_visible()
    page.goto("/ui/runs")
    expect(page.locator(f'#runs tr[data-run="{mine.id}"]')).to_be_visible()
    expect(page.locator(f'#runs tr[data-run="{theirs.id}"]')).to_have_count(0)
    response = page.goto(f"/ui/runs/{theirs.id}")
    assert response is not None and response.status in (403, 404), response


def test_an_operator_finds_a_run_by_its_args_and_cancels_it_once_confirmed(
    admin: Page, app: Tidegate
) -> None:
    made = app.enqueue_many(
        [NewRun("ship", {"order": n, "shop": "north"}, key=f"shop-{n}") for n in range(4)]
    )
    target = made[2]

    admin.get_by_role("link", name="Runs", exact=True).click()
    tabs = admin.locator("#state-tabs")
    expect(tabs.locator('a[data-state="available"] .count')).to_have_text("4")
    form = admin.locator("form#run-filter")
    fill_field(form, "args", '{"order": 2}')
    form.get_by_role("button", name="Search").click()
    rows = admin.locator("#runs tr[data-run]")
    expect(rows).to_have_count(1)
    expect(rows).to_have_attribute("data-run", str(target.id))
    expect(tabs.locator('a[data-state="available"] .count')).to_have_text("1")
    tabs.locator('a[data-state="available"]').click()  # a tab keeps the search
    expect(admin).to_have_url(re.compile(r"args=.*state=available|state=available.*args="))
    expect(rows).to_have_count(1)
    rows.locator("a").first.click()

    admin.get_by_role("link", name="Cancel…").click()
    expect(admin.locator("h1")).to_have_text(f"Cancel run {target.id}?")
    admin.get_by_role("link", name="Back").click()  # thought better of it: nothing changed
    expect(admin.locator("#run-state")).to_contain_text("available")
    admin.get_by_role("link", name="Cancel…").click()
    admin.get_by_role("button", name=f"Cancel run {target.id}").click()

    expect(admin).to_have_url(re.compile(rf"/ui/runs/{target.id}$"))
    expect(admin.locator("#run-state")).to_contain_text("cancelled")
    expect(admin.get_by_role("link", name="Retry…")).to_be_visible()
    assert [run.state for run in map(app.get_run, (r.id for r in made)) if run] == [
        RunState.AVAILABLE,
        RunState.AVAILABLE,
        RunState.CANCELLED,
        RunState.AVAILABLE,
    ]


def test_an_operator_retries_every_cancelled_run_of_a_task_once_confirmed(
    admin: Page, app: Tidegate
) -> None:
    made = app.enqueue_many([NewRun("invoice", {"n": n}) for n in range(3)])
    other = app.enqueue("receipt")
    for run in [*made, other]:
        app.cancel(run.id)

    admin.goto("/ui/runs")
    form = admin.locator("form#run-filter")
    fill_field(form, "task", "invoice")
    form.get_by_role("button", name="Search").click()
    admin.locator('#state-tabs a[data-state="cancelled"]').click()
    expect(admin.locator("#runs tr[data-run]")).to_have_count(3)
    admin.get_by_role("link", name="Retry 3 finished…").click()

    expect(admin.locator("#bulk-matching")).to_have_text("3")
    expect(admin.locator("#bulk-filter")).to_contain_text("invoice")
    admin.get_by_role("button", name="Retry 3 runs").click()
    expect(admin.locator("h1")).to_have_text("Retried 3 runs")
    admin.get_by_role("link", name="Back to the runs").click()
    expect(admin.locator("#runs tr[data-run]")).to_have_count(0)  # none cancelled now
    states = [app.get_run(run.id) for run in [*made, other]]
    assert [run.state if run else None for run in states] == [RunState.AVAILABLE] * 3 + [
        RunState.CANCELLED
    ]


PHONE = {"width": 390, "height": 844}
WIDTHS = """() => ({
    page: document.documentElement.scrollWidth,
    nav: Array.from(document.querySelectorAll("body > nav a, body > nav button"))
        .map(e => [e.textContent.trim(), Math.round(e.getBoundingClientRect().right)]),
})"""


def test_every_page_fits_a_phone_and_keeps_its_navigation_on_screen(
    admin: Page, app: Tidegate, client: httpx.Client
) -> None:
    """At 390 x 844 no page scrolls sideways (wide tables scroll in their own box) and
    every link of the navigation, Sign out too, lies within the screen's width."""
    create_project(client, "acme-corporation-with-a-long-name")
    trigger = create_trigger(
        client, "acme-corporation-with-a-long-name", "orders", mode="async", task="echo"
    )
    posted = client.post(trigger["url"], json={"order": "x" * 300, "note": "y " * 200})
    assert posted.status_code == 202, posted.text
    run_id = posted.json()["run_id"]
    long = app.enqueue("fail", {"unbroken": "z" * 400}, key="k" * 60, lane="a_long_lane_name")
    app.execute(
        create_schedule("acme-corporation-with-a-long-name", "nightly", "noop", cron="0 2 * * *")
    )
    app.set_key_policy("a_long_lane_name", "k" * 60, max_running=2)
    policy = "lane=a_long_lane_name&key=" + "k" * 60
    admin.set_viewport_size(PHONE)
    pages = [
        "/ui/",
        "/ui/workers",
        "/ui/tasks",
        f"/ui/keys/policy?{policy}",
        f"/ui/keys/policy/clear?{policy}",
        f"/ui/keys/breaker?{policy}",
        "/ui/projects",
        "/ui/projects/acme-corporation-with-a-long-name",
        "/ui/keys",
        "/ui/schedules",
        "/ui/runs",
        f"/ui/runs/{long.id}",
        f"/ui/runs/{long.id}/cancel",
        "/ui/bulk/cancel",
        f"/ui/runs/{run_id}",
        f"/ui/triggers/{trigger['id']}/log",
        "/ui/no-such-page",
    ]
    for path in pages:
        admin.goto(path)
        expect(admin.locator("main h1")).to_be_visible()
        widths = admin.evaluate(WIDTHS)
        assert widths["page"] <= PHONE["width"], (path, widths)
        names = [name for name, _ in widths["nav"]]
        assert {"Overview", "Runs", "Schedules", "Sign out"} <= set(names), (path, names)
        assert all(right <= PHONE["width"] for _, right in widths["nav"]), (path, widths)
    admin.goto(f"/ui/triggers/{trigger['id']}/log")
    admin.get_by_role("link", name="request").first.click()
    expect(admin.locator("#request-body")).to_be_visible()
    assert admin.evaluate(WIDTHS)["page"] <= PHONE["width"]
    admin.context.clear_cookies()
    admin.goto("/ui/login")
    assert admin.evaluate(WIDTHS)["page"] <= PHONE["width"]


def test_redoc_loads_nothing_from_another_site(browser: Browser, api: ApiServer) -> None:
    """ReDoc's script asks for its logo from a CDN; the page's policy stops the request
    in the browser, so nothing leaves for another site and no answer comes from one."""
    context = browser.new_context(base_url=api.url, viewport=VIEWPORT)  # type: ignore[arg-type]
    tab = context.new_page()
    answered: list[str] = []
    blocked: list[str] = []
    own = (api.url, "blob:", "data:")
    tab.on("response", lambda r: None if r.url.startswith(own) else answered.append(r.url))
    tab.on(
        "requestfailed",
        lambda r: None if r.url.startswith(own) else blocked.append(f"{r.url} {r.failure}"),
    )
    tab.goto("/redoc")
    expect(tab.get_by_role("heading", name=re.compile("tidegate"))).to_be_visible()
    expect(tab.get_by_text("API docs by Redocly")).to_be_visible()
    context.close()
    assert answered == []
    assert blocked == ["https://cdn.redoc.ly/redoc/logo-mini.svg csp"]


# -- acting on limits, live lists, what workers run, tasks over time --------------------


@pytest.mark.parametrize("viewport", [VIEWPORT, PHONE], ids=["desktop", "phone"])
def test_an_operator_changes_a_keys_limits_forces_its_breaker_and_pauses_a_schedule(
    admin: Page, app: Tidegate, viewport: dict[str, int]
) -> None:
    admin.set_viewport_size(viewport)  # type: ignore[arg-type]
    app.set_key_policy("default", "partner", max_running=1, breaker_failures=3)
    made = app.enqueue_many([NewRun("ship", {"n": n}, key="partner") for n in range(3)])
    app.execute(create_schedule("default", "nightly", "noop", cron="0 2 * * *"))

    admin.get_by_role("link", name="Keys", exact=True).click()
    row = admin.locator('#keys tr[data-lane="default"][data-key="partner"]')
    row.get_by_role("link", name="Policy…").click()
    form = admin.locator("form#policy")
    expect(form.locator('input[name="max_running"]')).to_have_value("1")
    fill_field(form, "max_running", "4")
    fill_field(form, "weight", "2")
    form.get_by_role("button", name="Save").click()
    expect(admin).to_have_url(re.compile(r"/ui/keys$"))
    expect(row.locator("td.num").first).to_have_text("4")
    expect(row.locator("td.num").nth(1)).to_have_text("2")

    row.get_by_role("link", name="Breaker…").click()
    expect(admin.locator("#breaker-state")).to_have_text("closed, counting nothing")
    admin.get_by_role("button", name="Force open").click()
    expect(admin.locator("#breaker-state")).to_have_attribute("data-state", "forced_open")
    admin.get_by_role("link", name="Back to the keys").click()
    expect(row.locator("td.breaker")).to_have_text("forced open")
    expect(row.locator("td.held")).to_have_text("breaker")
    row.get_by_role("link", name="Breaker…").click()
    admin.get_by_role("button", name="Auto").click()
    expect(admin.locator("#breaker-state")).to_have_attribute("data-state", "closed")

    admin.goto("/ui/keys")
    row.get_by_role("link", name="Policy…").click()
    admin.get_by_role("link", name="Clear policy…").click()
    expect(admin.locator("h1")).to_contain_text("Clear the policy of key")
    admin.get_by_role("link", name="Back").click()  # thought better of it: nothing changed
    assert app.get_run(made[0].id) is not None
    assert len(app.execute(list_key_policies("default"))) == 1
    admin.goto("/ui/keys/policy/clear?lane=default&key=partner")
    admin.get_by_role("button", name="Clear policy").click()
    expect(admin).to_have_url(re.compile(r"/ui/keys$"))
    expect(row.locator("td.num").first).to_have_text("")
    assert app.execute(list_key_policies("default")) == []

    admin.get_by_role("link", name="Schedules", exact=True).click()
    schedule = admin.locator('#schedules tr[data-project="default"][data-name="nightly"]')
    schedule.get_by_role("button", name="Pause").click()
    expect(schedule.locator("td.next")).to_have_text("paused")
    schedule.get_by_role("button", name="Resume").click()
    expect(schedule.locator("td.next")).to_contain_text("in ")
    assert admin.evaluate("document.documentElement.scrollWidth") <= viewport["width"]


LIVE_COUNT = """() => {
    window.polls = {sent: 0, skipped: 0};
    document.body.addEventListener("htmx:beforeRequest", (event) => {
        if (event.detail.elt.hasAttribute("data-live")) {
            window.polls[event.defaultPrevented ? "skipped" : "sent"] += 1;
        }
    });
}"""


SKIPPED = "(least) => window.polls.skipped >= least"


def test_a_filtered_run_list_refreshes_in_place_and_waits_while_a_form_is_filled(
    admin: Page, app: Tidegate
) -> None:
    app.enqueue_many([NewRun("ship", {"n": n}, key=f"shop-{n}") for n in range(60)])
    app.enqueue("receipt")
    admin.set_viewport_size(PHONE)
    admin.goto("/ui/runs?task=ship")
    rows = admin.locator("#runs tr[data-run]")
    expect(rows).to_have_count(50)
    admin.evaluate("window.sameDocument = true")  # gone if the page reloads
    admin.evaluate(LIVE_COUNT)
    admin.locator("#runs tr[data-run]").nth(40).scroll_into_view_if_needed()
    admin.evaluate("document.querySelector('.scroll:has(#runs)').scrollLeft = 120")
    scrolled = admin.evaluate(
        "[window.scrollY, document.querySelector('.scroll:has(#runs)').scrollLeft]"
    )
    assert scrolled[0] > 0 and scrolled[1] > 0

    newest = app.enqueue("ship", {"n": 60}, key="shop-60")
    app.enqueue("receipt")  # outside the filter: never shown
    expect(rows.first).to_have_attribute("data-run", str(newest.id))
    expect(rows).to_have_count(50)
    assert admin.locator('#runs tr[data-run] td code:text-is("receipt")').count() == 0
    assert admin.evaluate("window.sameDocument") is True, "the page reloaded"
    page_y, box_x = admin.evaluate(
        "[window.scrollY, document.querySelector('.scroll:has(#runs)').scrollLeft]"
    )
    assert box_x == scrolled[1] and abs(page_y - scrolled[0]) < 40, (page_y, box_x, scrolled)
    expect(admin).to_have_url(re.compile(r"/ui/runs\?task=ship$"))

    # Typing a search it has not sent yet: the polls wait, the rows stay as they were.
    form = admin.locator("form#run-filter")
    form.locator('input[name="key"]').fill("shop-1")
    admin.locator("h1").click()  # the field loses the focus, but keeps what was typed
    admin.wait_for_function(SKIPPED, arg=2, timeout=WAIT_MS)
    waited = app.enqueue("ship", {"n": 61}, key="shop-61")
    skipped = admin.evaluate("window.polls.skipped")
    admin.wait_for_function(SKIPPED, arg=skipped + 2, timeout=WAIT_MS)
    expect(rows.first).to_have_attribute("data-run", str(newest.id))
    expect(form.locator('input[name="key"]')).to_have_value("shop-1")
    form.locator('input[name="key"]').fill("")  # given up: the list goes on refreshing
    admin.locator("h1").click()
    expect(rows.first).to_have_attribute("data-run", str(waited.id))


FITS = "(width) => document.documentElement.scrollWidth <= width"


def test_workers_page_shows_what_each_worker_runs_and_tasks_page_charts_each_task(
    admin: Page, app: Tidegate, start_worker_process: Callable[..., Any]
) -> None:
    made = app.enqueue_many(
        [NewRun("noop") for _ in range(6)]
        + [NewRun("fail", max_attempts=1) for _ in range(3)]
        + [NewRun("async_sleep", {"seconds": 600}, key=f"sleeper-{n}") for n in range(2)]
    )
    start_worker_process("manual>*:3")
    admin.get_by_role("link", name="Workers", exact=True).click()
    running = admin.locator("#workers ul.running li")
    expect(running).to_have_count(2, timeout=DRAIN_MS)  # arrives without a reload
    expect(running.first).to_contain_text("async_sleep")
    expect(running.first).to_contain_text(re.compile(r"started [\d.]+ (s|min) ago"))
    running.first.get_by_role("link").click()
    expect(admin.locator("#run-state")).to_contain_text("running")

    admin.get_by_role("link", name="Tasks", exact=True).click()
    noop = admin.locator('#tasks tr[data-task="noop"] td.num')
    expect(noop.first).to_have_text("6", timeout=DRAIN_MS)  # counted by heartbeats
    fail = admin.locator('#tasks tr[data-task="fail"] td.num')
    expect(fail).to_have_text(["0", "3", "100.0"], timeout=DRAIN_MS)
    for task in ("noop", "fail"):
        expect(admin.locator(f'.task-chart[data-task="{task}"] canvas').first).to_be_visible()
    expect(admin.locator('.task-chart[data-task="fail"] .u-legend')).to_contain_text("failed")
    admin.set_viewport_size(PHONE)  # the charts follow the window's width
    admin.wait_for_function(FITS, arg=PHONE["width"], timeout=WAIT_MS)
    for sleeper in made[-2:]:
        app.cancel(sleeper.id)  # the worker stops at once, not after its grace period
