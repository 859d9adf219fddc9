"""Fuzzing the HTTP API: generated requests never get a 5xx or an undocumented status.

- schemathesis generates requests for every operation of the server's own OpenAPI
  document, valid and invalid ones, and sends them to a real ``tidegate serve`` with
  the super admin's token and with a project's token;
- hypothesis sends any bytes, under any of a few content types, to a real trigger: the
  answer is a 2xx or a 4xx, and a 4xx stores nothing;
- hypothesis writes whole numbers with other scripts' digits (``²``, U+0661, U+1D7D8) where
  the server reads a number from text (headers, query and path parameters, workloop
  specs), which schemathesis does not: each is a 4xx, never a 500.

The example counts are bounded for CI (``FUZZ_EXAMPLES``); raise them to hunt.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, example, given, settings, strategies
from schemathesis.checks import not_a_server_error, status_code_conformance

from tests.http_fixtures import ADMIN, ApiServer, counts

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
REMOTE_TASK = "fuzz.remote"
"""The task of the remote worker's runs: no local worker has it."""
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture
def server(
    start_api: Callable[..., ApiServer], start_worker_process: Callable[..., Any]
) -> ApiServer:
    """An API server, and a worker: with none, sync webhooks answer 503 by design."""
    started = start_api()
    start_worker_process("manual>*:2")
    return started


def seed(server: ApiServer) -> dict[str, Any]:
    """A project with a trigger and a schedule, so that generated requests also meet
    real rows."""
    with httpx.Client(base_url=server.url, headers=ADMIN, timeout=20) as client:
        project = client.post("/admin/projects", json={"id": "acme", "fast_lane_cap": 2})
        assert project.status_code == 201, project.text
        trigger = client.post(
            "/admin/projects/acme/triggers",
            json={"name": "orders", "mode": "async", "task": "echo"},
        )
        assert trigger.status_code == 201, trigger.text
        schedule = client.post(
            "/admin/projects/acme/schedules",
            json={"name": "nightly", "task": "echo", "cron": "30 2 * * *"},
        )
        assert schedule.status_code == 201, schedule.text
        return {
            "token": project.json()["token"],
            "url": trigger.json()["url"],
            "trigger_id": trigger.json()["id"],
        }


def seed_fleet(server: ApiServer) -> tuple[dict[str, str], str]:
    """A worker token, and a remote worker of it that holds runs of a task only it has
    (the local worker would take them), for its claims, outcomes and progress to meet.
    Only for the worker token's fuzzing: a run that never ends is an endless event
    stream to a generated ``GET /runs/{id}/events``."""
    with httpx.Client(base_url=server.url, headers=ADMIN, timeout=20) as client:
        fleet = client.post("/admin/worker-tokens", json={"name": "fleet", "lanes": ["*"]})
        assert fleet.status_code == 201, fleet.text
        token = {"Authorization": f"Bearer {fleet.json()['token']}"}
        worker_id = register(server, token)
        remote = client.post(
            "/admin/projects/acme/triggers",
            json={"name": "remote", "mode": "async", "task": REMOTE_TASK},
        )
        assert remote.status_code == 201, remote.text
        for n in range(50):
            sent = client.post(remote.json()["url"], json={"n": n})
            assert sent.status_code == 202, sent.text
        claimed = client.post(
            f"/workers/{worker_id}/claim", json={"workloop": 0, "demand": 2}, headers=token
        )
        assert claimed.status_code == 200 and len(claimed.json()["runs"]) == 2, claimed.text
        return token, worker_id


@pytest.mark.parametrize("caller", ["admin", "project", "worker"])
def test_no_generated_request_gets_a_5xx_or_an_undocumented_status(
    server: ApiServer, caller: str
) -> None:
    """The super admin's and a project's token meet every operation; a worker token the
    remote worker protocol's (``/workers``), aimed at a registered worker that holds
    runs."""
    seeded = seed(server)
    token = ADMIN if caller == "admin" else {"Authorization": f"Bearer {seeded['token']}"}
    if caller == "worker":
        token, seeded["worker_id"] = seed_fleet(server)
    real_rows: dict[str, dict[str, Any]] = {
        "/admin/projects/{project_id}": {"project_id": "acme"},
        "/admin/triggers/{trigger_id}": {"trigger_id": seeded["trigger_id"]},
        "/admin/projects/{project_id}/schedules/{name}": {"project_id": "acme", "name": "nightly"},
    }
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12
    if caller == "worker":
        operations = [op for op in operations if op.path.startswith("/workers")]
        assert len(operations) >= 8
    for operation in operations:

        @FUZZ
        @given(case=operation.as_strategy())
        def call(case: schemathesis.Case) -> None:
            if case.method in ("GET", "PATCH") and case.path in real_rows:
                # Random ids and names only meet 404s: aim the bodies at the seeded rows.
                case.path_parameters = real_rows[case.path]
            if caller == "worker" and "worker_id" in (case.path_parameters or {}):
                # A stop removes its worker: each stop gets a new one.
                stopping = case.path.endswith("/stop")
                case.path_parameters["worker_id"] = (
                    register(server, token) if stopping else seeded["worker_id"]
                )
                if case.path.endswith("/claim") and isinstance(case.body, dict):
                    # A valid long poll (the default one too) is kept short.
                    wait = case.body.get("wait_seconds", 30)
                    if isinstance(wait, int | float) and 1 < wait <= 60:
                        case.body["wait_seconds"] = 1
            case.call_and_validate(
                base_url=server.url,
                headers=token,
                checks=[not_a_server_error, status_code_conformance],
            )

        call()
    assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200, (
        "the server stopped answering"
    )


def register(server: ApiServer, token: dict[str, str]) -> str:
    """Register a remote worker of ``REMOTE_TASK`` with two slots; return its id."""
    body = {"workloops": "default:2", "tasks": [REMOTE_TASK]}
    registered = httpx.post(server.url + "/workers", json=body, headers=token, timeout=20)
    assert registered.status_code == 201, registered.text
    worker_id: str = registered.json()["worker_id"]
    return worker_id


CONTENT_TYPES = [
    "application/json",
    "application/cloudevents+json",
    "application/json; charset=utf-8",
    "text/plain",
    "",
]


def test_any_bytes_to_a_trigger_get_a_2xx_or_a_4xx_and_a_4xx_stores_nothing(
    server: ApiServer, sql: psycopg.Connection
) -> None:
    url = seed(server)["url"]
    # A trigger that keys its runs by a field of the body: whatever that field holds,
    # or if it is missing, the answer is a 2xx or a 4xx too.
    keyed = httpx.post(
        server.url + "/admin/projects/acme/triggers",
        json={"name": "keyed", "mode": "async", "task": "echo", "key_from": "/id"},
        headers=ADMIN,
        timeout=20,
    )
    assert keyed.status_code == 201, keyed.text
    json_values = strategies.recursive(
        strategies.none()
        | strategies.booleans()
        | strategies.floats(allow_nan=True, allow_infinity=True)
        | strategies.integers()
        | strategies.text(),
        lambda children: (
            strategies.lists(children) | strategies.dictionaries(strategies.text(), children)
        ),
        max_leaves=20,
    )
    bodies = strategies.one_of(
        strategies.binary(max_size=2048),
        json_values.map(lambda value: repr(value).encode("utf-8", "surrogatepass")),
        json_values.map(_json_bytes),
        json_values.map(lambda value: _json_bytes({"id": value})),
    )

    with httpx.Client(base_url=server.url, timeout=20) as client:

        @FUZZ
        @given(
            body=bodies,
            content_type=strategies.sampled_from(CONTENT_TYPES),
            to=strategies.sampled_from([url, keyed.json()["url"]]),
        )
        def send(body: bytes, content_type: str, to: str) -> None:
            before = counts(sql)
            headers = {"Content-Type": content_type} if content_type else {}
            response = client.post(to, content=body, headers=headers)
            assert response.status_code < 500, (response.status_code, response.text, body)
            if response.status_code >= 400:
                assert counts(sql) == before, (response.status_code, body)
            else:
                assert response.status_code == 202, response.text

        send()


def _json_bytes(value: Any) -> bytes:
    """JSON text as a lenient encoder writes it: NaN, lone surrogates and all."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def test_any_reply_a_handler_gives_is_sent_as_asked_or_answered_502(
    start_api: Callable[..., ApiServer], start_worker_process: Callable[..., Any]
) -> None:
    """A sync handler's ``$reply`` may carry what its sender sent; whatever it holds, the
    answer is the reply it describes or a 502 naming the run, never a 500 of the server's
    own or a broken connection."""
    server = start_api()
    start_worker_process("fast_lane:1")
    with httpx.Client(base_url=server.url, headers=ADMIN, timeout=20) as admin:
        assert admin.post("/admin/projects", json={"id": "acme"}).status_code == 201
        created = admin.post(
            "/admin/projects/acme/triggers",
            json={"name": "echo", "mode": "sync", "task": "hook_reply_as_sent"},
        )
        assert created.status_code == 201, created.text
    url = created.json()["url"]
    text = strategies.text(
        strategies.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=20
    )
    scalars = (
        strategies.none()
        | strategies.booleans()
        | strategies.integers(-1000, 2000)
        | strategies.floats(allow_nan=False, allow_infinity=False)
        | text
    )
    statuses = strategies.sampled_from([200, 201, 204, 205, 304, 404, 500, 599]) | scalars
    replies = strategies.fixed_dictionaries(
        {},
        optional={
            "status": statuses,
            "headers": strategies.dictionaries(text, scalars, max_size=3) | scalars,
            "body": strategies.recursive(
                scalars,
                lambda children: (
                    strategies.lists(children, max_size=3)
                    | strategies.dictionaries(text, children, max_size=3)
                ),
                max_leaves=10,
            ),
        },
    )

    with httpx.Client(base_url=server.url, timeout=20) as client:

        @FUZZ
        @given(reply=replies)
        def send(reply: dict[str, Any]) -> None:
            response = client.post(url, json=reply)
            asked = reply.get("status", 200)
            assert response.status_code in (asked, 502), (response.status_code, reply)
            if response.status_code == 502 and asked != 502:
                assert isinstance(response.json()["run_id"], int)

        send()


DIGITS = strategies.text(
    strategies.sampled_from("0123456789") | strategies.characters(categories=["Nd", "No"]),
    min_size=1,
    max_size=24,
)
"""Text ``str.isdigit`` may take: ASCII digits among other scripts' digits (the
Arabic-Indic U+0661, the mathematical U+1D7D8) and other numbers (``²``, ``¼``), which
``int`` refuses or reads as no client meant."""


def _finished_run(client: httpx.Client, url: str) -> int:
    run_id: int = client.post(url, json={"n": 1}).json()["run_id"]
    deadline = time.monotonic() + 30
    while client.get(f"/runs/{run_id}", headers=ADMIN).json()["state"] != "succeeded":
        assert time.monotonic() < deadline, f"run {run_id} did not finish"
        time.sleep(0.05)
    return run_id


def test_unicode_digits_where_a_number_is_read_get_a_4xx_never_a_5xx(server: ApiServer) -> None:
    """A number read from text (``Last-Event-ID`` of a run's events and of a sync
    webhook's stream, the dashboard's ``before``, a path's id, a remote worker's
    workloops) is ASCII digits; anything else is refused with a 4xx."""
    seeded = seed(server)
    with httpx.Client(base_url=server.url, timeout=20) as client:
        run_id = _finished_run(client, seeded["url"])
        sync = client.post(
            "/admin/projects/acme/triggers",
            json={"name": "sync", "mode": "sync", "task": "echo"},
            headers=ADMIN,
        )
        assert sync.status_code == 201, sync.text
        fleet = client.post(
            "/admin/worker-tokens", json={"name": "digits", "lanes": ["*"]}, headers=ADMIN
        )
        assert fleet.status_code == 201, fleet.text
        worker = {"Authorization": f"Bearer {fleet.json()['token']}"}
        signed_in = client.post("/ui/login", data={"token": ADMIN["Authorization"][7:]})
        assert signed_in.status_code == 303, signed_in.text
        trigger_id = seeded["trigger_id"]

        @FUZZ
        @given(number=DIGITS)
        @example(number="\u00b2")  # ²: isdigit, and int refuses it
        @example(number="\u0661\u0662")  # ١٢: isdigit, and int reads 12
        @example(number="1\u00b3")
        @example(number="9" * 30)
        @example(number="0" * 5000)
        def send(number: str) -> None:
            # A header carries Latin-1 (``²``, ``¹``): other characters go in the URL.
            header = number.encode("latin-1", "replace")
            answers = [
                client.get(f"/runs/{run_id}/events", headers={**ADMIN, "Last-Event-ID": header}),
                client.post(
                    sync.json()["url"],
                    json={"n": 1},
                    headers={"Accept": "text/event-stream", "Last-Event-ID": header},
                ),
                client.get("/ui/runs", params={"before": number}),
                client.get(
                    f"/ui/triggers/{trigger_id}/log",
                    params={"before": f"admitted.{number}.2024-01-01T00:00:00+00:00"},
                ),
                client.get(f"/ui/runs/{quote(number)}"),
                client.get(f"/ui/triggers/{quote(number)}/log"),
                client.get(f"/runs/{quote(number)}", headers=ADMIN),
                client.get(f"/runs/{quote(number)}/events", headers=ADMIN),
                client.post(
                    "/workers",
                    json={"workloops": f"emails:{number}", "tasks": ["echo"]},
                    headers=worker,
                ),
            ]
            lowest = 400 if not number.isascii() else 200
            wrong = [
                (f"{r.request.method} {r.request.url}", r.status_code, r.text[:200])
                for r in answers
                if not lowest <= r.status_code < 500
            ]
            assert not wrong, wrong

        send()
