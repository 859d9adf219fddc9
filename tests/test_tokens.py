"""Rotating tokens: a project's API token, a trigger's URL, the super admin's token, and
the dashboard sessions opened with them, on real ``tidegate serve`` processes over HTTP.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from click.testing import CliRunner

from tests.http_fixtures import ADMIN, ADMIN_TOKEN, ApiServer, create_project, create_trigger
from tidegate import Settings
from tidegate.api.hooks import TRIGGER_CACHE_SECONDS
from tidegate.cli import main

SPREAD_SECONDS = 5.0
"""How long, past the trigger cache's second, a busy test machine may take to show it."""


@pytest.fixture
async def clients(api: ApiServer) -> AsyncIterator[Callable[[], httpx.AsyncClient]]:
    """New clients of the API server (each its own cookies and connections)."""
    made: list[httpx.AsyncClient] = []

    def new() -> httpx.AsyncClient:
        made.append(httpx.AsyncClient(base_url=api.url, timeout=20))
        return made[-1]

    yield new
    for client in made:
        await client.aclose()


async def signed_in(client: httpx.AsyncClient, token: str) -> httpx.AsyncClient:
    response = await client.post("/ui/login", data={"token": token})
    assert response.status_code == 303, response.text
    assert (await client.get("/ui/runs")).status_code == 200
    return client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def cli(settings: Settings, *args: str) -> str:
    env = {"TIDEGATE_DATABASE_URL": settings.database_url or "", "TIDEGATE_SCHEMA": settings.schema}
    result = CliRunner().invoke(main, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.stdout


async def test_a_rotated_project_token_is_refused_and_its_dashboard_sessions_end(
    clients: Callable[[], httpx.AsyncClient],
) -> None:
    admin = clients()
    old = (await create_project(admin, "acme"))["token"]
    await create_project(admin, "other")
    project_session = await signed_in(clients(), old)
    admin_session = await signed_in(clients(), ADMIN_TOKEN)

    refused = await admin.post("/admin/projects/acme/token/rotate", headers=bearer(old))
    assert refused.status_code == 403
    assert (await admin.post("/admin/projects/nope/token/rotate", headers=ADMIN)).status_code == 404
    rotated = await admin.post("/admin/projects/acme/token/rotate", headers=ADMIN)
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()["token"]
    assert new != old and rotated.json()["id"] == "acme"

    assert (await admin.get("/runs", headers=bearer(old))).status_code == 403
    assert (await admin.get("/runs", headers=bearer(new))).status_code == 200
    # The session opened with the old token is over, on the next request.
    page = await project_session.get("/ui/runs")
    assert page.status_code == 303 and page.headers["location"] == "/ui/login"
    fragment = await project_session.get("/ui/runs", headers={"HX-Request": "true"})
    assert fragment.status_code == 401
    assert (await admin_session.get("/ui/runs")).status_code == 200  # not the admin's
    assert (await clients().post("/ui/login", data={"token": old})).status_code == 401
    await signed_in(clients(), new)


async def test_the_cli_rotates_a_project_token_and_the_admin_token_ending_their_sessions(
    clients: Callable[[], httpx.AsyncClient], settings: Settings
) -> None:
    admin = clients()
    old = (await create_project(admin, "acme"))["token"]
    project_session = await signed_in(clients(), old)
    admin_session = await signed_in(clients(), ADMIN_TOKEN)

    new = json.loads(cli(settings, "projects", "rotate-token", "acme"))["token"]
    assert (await admin.get("/runs", headers=bearer(old))).status_code == 403
    assert (await admin.get("/runs", headers=bearer(new))).status_code == 200
    assert (await project_session.get("/ui/runs")).status_code == 303
    assert (await admin_session.get("/ui/runs")).status_code == 200
    project_session = await signed_in(clients(), new)

    new_admin = cli(settings, "admin-token", "rotate").strip()
    assert (await admin.get("/runs", headers=ADMIN)).status_code == 403
    assert (await admin.get("/runs", headers=bearer(new_admin))).status_code == 200
    assert (await admin_session.get("/ui/runs")).status_code == 303
    assert (await project_session.get("/ui/runs")).status_code == 200  # not the project's
    await signed_in(clients(), new_admin)


async def test_a_rotated_trigger_url_is_404_at_once_here_and_within_a_second_everywhere(
    start_api: Callable[..., ApiServer], settings: Settings
) -> None:
    """Two API processes: the one that rotates the trigger drops its old URL at once; the
    other, which may have looked it up a moment before, within the trigger cache's second."""
    api = start_api(processes=2)
    senders = [httpx.AsyncClient(base_url=api.url, timeout=20) for _ in range(8)]
    try:
        admin = senders[0]
        await create_project(admin, "acme")
        old = (await create_trigger(admin, "acme", "orders", mode="async", task="echo"))["url"]
        # Each sender's connection is one process's: both look the trigger up.
        for sender in senders:
            assert (await sender.post(old, json={})).status_code == 202
        rotated = await admin.post("/admin/projects/acme/triggers/orders/rotate", headers=ADMIN)
        assert rotated.status_code == 200, rotated.text
        new = rotated.json()["url"]
        assert new != old
        assert (await admin.post(old, json={})).status_code == 404  # the same process
        await refused_by_all(senders, old)
        for sender in senders:
            assert (await sender.post(new, json={})).status_code == 202
        missing = await admin.post("/admin/projects/acme/triggers/nope/rotate", headers=ADMIN)
        assert missing.status_code == 404

        # The CLI does the same.
        shown = json.loads(cli(settings, "triggers", "rotate", "acme", "orders"))
        assert shown["url"] != new and shown["url"] == f"/hooks/{shown['token']}"
        await refused_by_all(senders, new)
        assert (await admin.post(shown["url"], json={})).status_code == 202
    finally:
        for sender in senders:
            await sender.aclose()


async def refused_by_all(senders: list[httpx.AsyncClient], url: str) -> None:
    """Wait until ``url`` is answered 404 on every sender's connection: within the trigger
    cache's second, and what a busy machine adds."""

    async def refused(sender: httpx.AsyncClient) -> None:
        while (await sender.post(url, json={})).status_code != 404:
            await asyncio.sleep(0.05)

    await asyncio.wait_for(
        asyncio.gather(*(refused(sender) for sender in senders)),
        TRIGGER_CACHE_SECONDS + SPREAD_SECONDS,
    )
