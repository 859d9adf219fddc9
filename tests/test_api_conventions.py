"""The HTTP API's conventions (docs/api.md), through a real server: errors as RFC 9457
problem details with a stable title per type, 400 for a body that is not JSON and 422
for one that fails validation, cursor pagination in ``Link``, named operation ids, and
an OpenAPI document that validates and that a client generator accepts."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openapi_spec_validator
import pytest

from tests.conftest import ROOT
from tests.http_fixtures import (
    ADMIN,
    ApiServer,
    assert_problem,
    create_project,
    create_trigger,
)
from tidegate import Settings, Tidegate
from tidegate.api.kernel import PROBLEM_TYPE_PREFIX, ProblemType

API_DOC = ROOT / "docs" / "api.md"


@pytest.fixture
async def client(api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        yield client


# -- problem details ------------------------------------------------------------------


def test_every_problem_type_is_documented_with_its_status_and_title() -> None:
    doc = API_DOC.read_text()
    rows = re.findall(
        r'^\| <a id="([a-z-]+)"></a>`([a-z-]+)` \| (\d{3}) \| ([^|]+) \|', doc, re.MULTILINE
    )
    documented = {
        anchor: (name, int(status), title.strip()) for anchor, name, status, title in rows
    }
    assert documented == {
        kind.uri.removeprefix(PROBLEM_TYPE_PREFIX): (
            kind.uri.removeprefix(PROBLEM_TYPE_PREFIX),
            kind.status,
            kind.title,
        )
        for kind in ProblemType
    }
    assert len({kind.title for kind in ProblemType}) == len(ProblemType)
    assert f'"type": "{PROBLEM_TYPE_PREFIX}not-found"' in doc


async def test_errors_are_problem_details_with_a_stable_title_and_the_specifics_in_detail(
    client: httpx.AsyncClient,
) -> None:
    one = assert_problem(await client.get("/admin/projects/nobody", headers=ADMIN), 404)
    two = assert_problem(await client.get("/runs/123456", headers=ADMIN), 404)
    assert one["type"] == two["type"] == PROBLEM_TYPE_PREFIX + "not-found"
    assert one["title"] == two["title"] == "Not found"
    assert (one["detail"], two["detail"]) == ("no project 'nobody'", "no run 123456")
    # The Guard's refusals, the framework's and the routes' go through the same function.
    unauthenticated = await client.get("/admin/projects")
    assert assert_problem(unauthenticated, 401)["detail"] == "missing bearer token"
    assert unauthenticated.headers["www-authenticate"] == "Bearer"
    assert_problem(await client.get("/admin/projects", headers={"Authorization": "Bearer x"}), 403)
    assert_problem(await client.delete("/admin/projects", headers=ADMIN), 405)
    assert_problem(await client.get("/nowhere"), 404)
    nul = assert_problem(await client.get("/runs?key=%00", headers=ADMIN), 400)
    assert "NUL" in nul["detail"]


async def test_a_body_that_is_not_json_gets_400_and_one_that_fails_validation_422(
    client: httpx.AsyncClient,
) -> None:
    headers = {**ADMIN, "Content-Type": "application/json"}
    for body in ('{"id": ', "{'id': 'acme'}", "not json", '{"id": "acme"} trailing'):
        response = await client.post("/admin/projects", content=body, headers=headers)
        problem = assert_problem(response, 400, ProblemType.MALFORMED_JSON)
        assert problem["detail"].startswith("the body is not JSON: "), problem
        assert "errors" not in problem
    invalid = await client.post(
        "/admin/projects", json={"id": "no spaces", "fast_lane_cap": -1}, headers=ADMIN
    )
    problem = assert_problem(invalid, 422, ProblemType.INVALID_REQUEST)
    assert sorted(error["loc"] for error in problem["errors"]) == [
        ["body", "fast_lane_cap"],
        ["body", "id"],
    ]
    assert "body.id" in problem["detail"] and "body.fast_lane_cap" in problem["detail"]
    await create_project(client, "acme")  # the server is none the worse


# -- pagination -----------------------------------------------------------------------


async def pages(client: httpx.AsyncClient, url: str) -> list[list[Any]]:
    """Every page of a list, from ``url`` on, following each ``Link: rel="next"``."""
    found = []
    next_url: str | None = url
    while next_url is not None:
        response = await client.get(next_url, headers=ADMIN)
        assert response.status_code == 200, response.text
        assert isinstance(response.json(), list)  # a bare array, as before pagination
        found.append(response.json())
        link = response.headers.get("link")
        next_url = None
        if link is not None:
            match = re.fullmatch(r'<(/[^>]*)>; rel="next"', link)
            assert match, link
            next_url = match[1]
        assert len(found) < 50, "the links never end"
    return found


async def test_every_growing_list_comes_in_pages_linked_by_a_cursor(
    client: httpx.AsyncClient, app: Tidegate
) -> None:
    for project in ("p3", "p1", "p5", "p2", "p4"):
        await create_project(client, project)
    for name in ("t1", "t2", "t3"):
        await create_trigger(client, "p1", name, mode="async", task="echo")
    for key in ("*", "b", "a", "c"):
        put = await client.put(
            f"/admin/lanes/default/keys/{key}", json={"weight": 2}, headers=ADMIN
        )
        assert put.status_code == 200, put.text
    for project, name in (("p2", "s1"), ("p1", "s2"), ("p1", "s1")):
        created = await client.post(
            f"/admin/projects/{project}/schedules",
            json={"name": name, "task": "echo", "interval_seconds": 3600},
            headers=ADMIN,
        )
        assert created.status_code == 201, created.text
    for name in ("w3", "w1", "w2"):
        created = await client.post(
            "/admin/worker-tokens", json={"name": name, "lanes": ["*"]}, headers=ADMIN
        )
        assert created.status_code == 201, created.text
    runs = [app.enqueue("echo", {"n": n}, project="p1").id for n in range(5)]

    listed = await pages(client, "/admin/projects?limit=2")
    assert [[p["id"] for p in page] for page in listed] == [["p1", "p2"], ["p3", "p4"], ["p5"]]
    listed = await pages(client, "/admin/projects/p1/triggers?limit=2")
    assert [[t["name"] for t in page] for page in listed] == [["t1", "t2"], ["t3"]]
    listed = await pages(client, "/admin/lanes/default/keys?limit=3")
    assert [[k["key"] for k in page] for page in listed] == [["*", "a", "b"], ["c"]]
    listed = await pages(client, "/admin/schedules?limit=1")
    assert [[(s["project"], s["name"]) for s in page] for page in listed] == [
        [("p1", "s1")],
        [("p1", "s2")],
        [("p2", "s1")],
    ]
    listed = await pages(client, "/admin/worker-tokens?limit=2")
    assert [[t["name"] for t in page] for page in listed] == [["w1", "w2"], ["w3"]]
    # The filters ride along in the links; runs come newest first.
    listed = await pages(client, "/runs?project=p1&limit=2")
    assert [[r["id"] for r in page] for page in listed] == [
        runs[:2:-1],
        runs[2:0:-1],
        runs[:1],
    ]
    # A page that ends the list has no link, even when it is full.
    last = await client.get("/admin/projects?limit=5", headers=ADMIN)
    assert len(last.json()) == 5 and "link" not in last.headers


async def test_a_page_starts_after_the_last_item_seen_whatever_changed_before_it(
    client: httpx.AsyncClient,
) -> None:
    """Keyset, not OFFSET: an item added before the cursor neither repeats nor hides one."""
    for project in ("b", "c", "d"):
        await create_project(client, project)
    first = await client.get("/admin/projects?limit=2", headers=ADMIN)
    assert [p["id"] for p in first.json()] == ["b", "c"]
    await create_project(client, "a")  # sorts before the page already read
    following = re.fullmatch(r'<(/[^>]*)>; rel="next"', first.headers["link"])
    assert following is not None
    second = await client.get(following[1], headers=ADMIN)
    assert [p["id"] for p in second.json()] == ["d"]


async def test_a_cursor_the_api_did_not_give_gets_400_and_a_page_size_out_of_range_422(
    client: httpx.AsyncClient,
) -> None:
    await create_project(client, "acme")
    nul = base64.urlsafe_b64encode(b'["a\\u0000"]').decode()
    wrong_type = base64.urlsafe_b64encode(b"[1]").decode()
    for cursor in ("not-base64!", "e30", nul, wrong_type):
        response = await client.get(f"/admin/projects?cursor={cursor}", headers=ADMIN)
        assert "cursor" in assert_problem(response, 400, ProblemType.BAD_REQUEST)["detail"]
    runs_cursor = base64.urlsafe_b64encode(b'["7"]').decode()
    assert_problem(await client.get(f"/runs?cursor={runs_cursor}", headers=ADMIN), 400)
    for limit in (0, 1001, -1):
        response = await client.get(f"/admin/projects?limit={limit}", headers=ADMIN)
        assert assert_problem(response, 422)["errors"][0]["loc"] == ["query", "limit"]


# -- the OpenAPI document -------------------------------------------------------------

OPERATION_IDS = {
    "POST /hooks/{token}": "receiveWebhook",
    "GET /runs": "listRuns",
    "POST /runs": "enqueueRun",
    "GET /runs/{run_id}": "getRun",
    "GET /runs/{run_id}/events": "streamRunEvents",
    "POST /runs/{run_id}/retry": "retryRun",
    "POST /runs/retry": "retryRuns",
    "POST /runs/retry-matching": "retryMatchingRuns",
    "POST /runs/cancel-matching": "cancelMatchingRuns",
    "POST /runs/delete-matching": "deleteMatchingRuns",
    "POST /runs/{run_id}/cancel": "cancelRun",
    "GET /admin/projects": "listProjects",
    "POST /admin/projects": "createProject",
    "GET /admin/projects/{project_id}": "getProject",
    "PATCH /admin/projects/{project_id}": "updateProject",
    "POST /admin/projects/{project_id}/token/rotate": "rotateProjectToken",
    "GET /admin/projects/{project_id}/triggers": "listTriggers",
    "POST /admin/projects/{project_id}/triggers": "createTrigger",
    "POST /admin/projects/{project_id}/triggers/{name}/rotate": "rotateTriggerUrl",
    "PATCH /admin/triggers/{trigger_id}": "updateTrigger",
    "GET /admin/lanes/{lane}/keys": "listKeyPolicies",
    "PUT /admin/lanes/{lane}/keys/{key}": "setKeyPolicy",
    "DELETE /admin/lanes/{lane}/keys/{key}": "deleteKeyPolicy",
    "GET /admin/breakers": "listBreakers",
    "GET /admin/lanes": "listLanes",
    "POST /admin/lanes/{lane}/pause": "pauseLane",
    "POST /admin/lanes/{lane}/resume": "resumeLane",
    "PUT /admin/lanes/{lane}/breakers/{key}": "setBreaker",
    "GET /admin/schedules": "listSchedules",
    "GET /admin/tasks": "listTasks",
    "POST /admin/projects/{project_id}/schedules": "createSchedule",
    "GET /admin/projects/{project_id}/schedules/{name}": "getSchedule",
    "PATCH /admin/projects/{project_id}/schedules/{name}": "updateSchedule",
    "DELETE /admin/projects/{project_id}/schedules/{name}": "deleteSchedule",
    "GET /admin/worker-tokens": "listWorkerTokens",
    "POST /admin/worker-tokens": "createWorkerToken",
    "DELETE /admin/worker-tokens/{name}": "deleteWorkerToken",
    "POST /workers": "registerWorker",
    "POST /workers/{worker_id}/claim": "claimRuns",
    "POST /workers/{worker_id}/heartbeat": "sendHeartbeat",
    "POST /workers/{worker_id}/runs/{run_id}/outcome": "reportOutcome",
    "POST /workers/{worker_id}/complete": "completeRuns",
    "POST /workers/{worker_id}/runs/{run_id}/progress": "reportProgress",
    "GET /workers/{worker_id}/runs/{run_id}/delivery": "getDelivery",
    "POST /workers/{worker_id}/stop": "stopWorker",
    "GET /metrics": "getMetrics",
    "GET /healthz": "getHealth",
    "GET /readyz": "getReadiness",
    "GET /readyz/workers": "getWorkersHealth",
}
"""Every route's operation id: what a generated client names its methods. Changing one
breaks every client generated before: this list makes that a decision, not an accident."""


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    from tidegate.api.server import create_server

    server = create_server(Settings(database_url="postgresql://unused@localhost/x"))
    openapi: dict[str, Any] = server.openapi()
    return openapi


@pytest.fixture(scope="module")
def document_file(document: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("openapi") / "openapi.json"
    path.write_text(json.dumps(document))
    return path


def test_every_route_has_a_named_operation_id(document: dict[str, Any]) -> None:
    named = {
        f"{method.upper()} {path}": operation["operationId"]
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    }
    assert named == OPERATION_IDS
    verbs = "get|list|create|update|delete|set|rotate|retry|cancel|stream|receive|register"
    verbs += "|claim|send|report|complete|stop|enqueue|pause|resume"
    for operation_id in named.values():
        assert re.fullmatch(rf"({verbs})([A-Z][a-z]+)+", operation_id), operation_id


def test_the_openapi_document_validates(document: dict[str, Any]) -> None:
    openapi_spec_validator.validate(document)  # raises on any fault
    problem = document["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"type", "title", "status", "detail"}


def test_a_python_client_generated_from_the_document_imports(
    document_file: Path, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("post_hooks: []\n")  # no formatter needed to accept the document
    generated = subprocess.run(
        [
            str(Path(sys.executable).with_name("openapi-python-client")),
            "generate",
            "--path",
            str(document_file),
            "--meta",
            "none",
            "--config",
            str(config),
            "--output-path",
            str(tmp_path / "tidegate_client"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert generated.returncode == 0, generated.stdout + generated.stderr
    assert "Warning" not in generated.stdout + generated.stderr, generated.stdout
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "from tidegate_client import AuthenticatedClient\n"
            "from tidegate_client.api.admin import create_project, list_projects\n"
            "from tidegate_client.api.runs import list_runs\n"
            "from tidegate_client.api.webhooks import receive_webhook\n"
            "print(list_runs.asyncio_detailed.__name__)",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert imported.returncode == 0, imported.stderr


@pytest.mark.skipif(shutil.which("java") is None, reason="openapi-generator needs a Java runtime")
def test_a_typescript_client_is_generated_from_the_document(
    document_file: Path, tmp_path: Path
) -> None:
    generated = subprocess.run(
        [
            str(Path(sys.executable).with_name("openapi-generator-cli")),
            "generate",
            "--input-spec",
            str(document_file),
            "--generator-name",
            "typescript-fetch",
            "--output",
            str(tmp_path / "ts"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert generated.returncode == 0, generated.stdout + generated.stderr
    admin = (tmp_path / "ts" / "apis" / "AdminApi.ts").read_text()
    assert "async createProject(" in admin and "async listProjects(" in admin
