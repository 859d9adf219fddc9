"""Remote workers: the claim protocol over HTTP, through a real ``tidegate serve``.

The test plays the worker with httpx (what any language would send), and runs the
JavaScript worker of ``examples/`` under Node where Node is installed. No worker here
touches PostgreSQL; the test reads the tables to check what the API did for them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import ROOT, Remote, running_worker, wait_until
from tests.http_fixtures import ADMIN, ApiServer, assert_problem, create_project, create_trigger
from tidegate import NewRun, RunState, Tidegate
from tidegate.access import WorkerCaller
from tidegate.api.claims import MAX_KINDS_PER_TOKEN, Claims, Queue, Turn
from tidegate.api.kernel import MAX_CLAIMER_NAMES, Claimers, ProblemType
from tidegate.limits import MAX_SLOTS, MAX_TEXT_CHARS
from tidegate.runs import RUN_FIELDS, Run
from tidegate.signatures import verify
from tidegate.storage.sql import query
from tidegate.worker.counters import DURATION_BUCKETS
from tidegate.worker.link import RemoteLink
from tidegate.worker.services import LinkError


@pytest.fixture
async def client(api: ApiServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
        yield client


async def worker_token(client: httpx.AsyncClient, name: str, lanes: list[str]) -> dict[str, str]:
    created = await client.post(
        "/admin/worker-tokens", json={"name": name, "lanes": lanes}, headers=ADMIN
    )
    assert created.status_code == 201, created.text
    assert created.json()["token"].startswith("tgw_")
    return {"Authorization": f"Bearer {created.json()['token']}"}


class RemoteWorker:
    """A worker speaking the protocol, as the test's own client."""

    def __init__(self, client: httpx.AsyncClient, token: dict[str, str], worker_id: str) -> None:
        self.client, self.token, self.id = client, token, worker_id

    @classmethod
    async def register(
        cls, client: httpx.AsyncClient, token: dict[str, str], workloops: str, tasks: list[str]
    ) -> RemoteWorker:
        response = await client.post(
            "/workers", json={"workloops": workloops, "tasks": tasks}, headers=token
        )
        assert response.status_code == 201, response.text
        return cls(client, token, response.json()["worker_id"])

    async def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return await self.client.post(f"/workers/{self.id}{path}", json=body, headers=self.token)

    async def claim(self, demand: int, workloop: int = 0, wait: float = 0) -> list[dict[str, Any]]:
        body = {"workloop": workloop, "demand": demand, "wait_seconds": wait}
        response = await self.post("/claim", body)
        assert response.status_code == 200, response.text
        runs: list[dict[str, Any]] = response.json()["runs"]
        return runs

    async def succeed(self, run: dict[str, Any], result: Any = None) -> httpx.Response:
        body = {"state": "succeeded", "attempt": run["attempt"], "result": result}
        return await self.post(f"/runs/{run['id']}/outcome", body)


def state_of(sql: psycopg.Connection, run_id: int) -> tuple[str, int]:
    row = sql.execute("SELECT state::text, attempt FROM runs WHERE id = %s", [run_id]).fetchone()
    assert row is not None
    return row[0], row[1]


async def test_a_worker_claims_its_workloops_free_slots_only_and_completes_what_it_holds(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    token = await worker_token(client, "fleet", ["default"])
    worker = await RemoteWorker.register(client, token, "default:2", ["echo"])
    other = await RemoteWorker.register(client, token, "default:2", ["echo"])
    runs = [await app.aenqueue("echo", {"n": n}) for n in range(5)]
    foreign = await app.aenqueue("noop")  # a task the workers do not have

    first = await worker.claim(10)
    assert len(first) == 2  # its workloop's slots, whatever it asks
    assert {run["task"] for run in first} == {"echo"}
    assert await worker.claim(5) == []  # no slot lent, none free: answered at once
    # Another worker cannot complete what this one holds; nor can a stale attempt.
    stolen = await other.succeed(first[0])
    assert_problem(stolen, 409)
    stale = await worker.post(
        f"/runs/{first[0]['id']}/outcome", {"state": "succeeded", "attempt": 9}
    )
    assert_problem(stale, 409)
    done = await worker.succeed(first[0], {"ok": first[0]["args"]["n"]})
    assert done.status_code == 200 and done.json()["state"] == "succeeded"
    assert sql.execute("SELECT result FROM runs WHERE id = %s", [first[0]["id"]]).fetchone() == (
        {"ok": first[0]["args"]["n"]},
    )
    again = await worker.succeed(first[0])
    assert_problem(again, 409)  # finished: no second outcome
    assert len(await worker.claim(5)) == 1  # one slot freed
    assert {run["id"] for run in first} <= {run.id for run in runs}
    assert state_of(sql, foreign.id)[0] == "available"

    # A failure is retried with backoff, as a local handler's exception would be.
    third = (await other.claim(1))[0]
    failed = await other.post(
        f"/runs/{third['id']}/outcome", {"state": "failed", "attempt": 1, "error": "boom"}
    )
    assert failed.json()["state"] == "scheduled"
    errors = sql.execute("SELECT errors FROM runs WHERE id = %s", [third["id"]]).fetchone()
    assert errors is not None and errors[0][0]["error"] == "boom"


async def test_a_claim_carrying_outcomes_writes_them_and_takes_the_slots_they_free(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    """One call a cycle: the outcomes a claim carries are written first, in its
    transaction, and the slots they free are claimed in the same call; an outcome of a
    run the worker does not hold frees nothing; a bad one refuses the whole call."""
    token = await worker_token(client, "fleet", ["default"])
    registered = await client.post(
        "/workers", json={"workloops": "default:2", "tasks": ["echo"]}, headers=token
    )
    assert registered.json()["claim_outcomes"] is True
    worker = RemoteWorker(client, token, registered.json()["worker_id"])
    for n in range(4):
        await app.aenqueue("echo", {"n": n})
    held = await worker.claim(2)

    def row(
        run: dict[str, Any], attempt: int | None = None, result: str = '"ok"'
    ) -> dict[str, Any]:
        return {
            "id": run["id"],
            "attempt": attempt or run["attempt"],
            "state": "succeeded",
            "result": result,
            "max_attempts": run["max_attempts"],
        }

    # Not this attempt: nothing written, no slot freed, so nothing claimed.
    stale = await worker.post(
        "/claim", {"workloop": 0, "demand": 2, "outcomes": [row(held[0], attempt=9)]}
    )
    assert stale.status_code == 200, stale.text
    assert stale.json() == {"runs": [], "recorded": [], "breakers": []}
    # Not JSON: refused, nothing written.
    bad = await worker.post(
        "/claim", {"workloop": 0, "demand": 2, "outcomes": [row(held[0], result="{")]}
    )
    assert_problem(bad, 422)
    assert state_of(sql, held[0]["id"]) == ("running", 1)

    answer = await worker.post(
        "/claim",
        {"workloop": 0, "demand": 2, "outcomes": [row(run) for run in held], "format": "rows"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["recorded"] == sorted(run["id"] for run in held)
    assert len(answer.json()["rows"]) == 2  # both slots, freed in the same call
    for run in held:
        assert state_of(sql, run["id"]) == ("succeeded", 1)
    assert sql.execute(
        "SELECT count(*) FROM runs WHERE state = 'running' AND worker_id = %s", [worker.id]
    ).fetchone() == (2,)
    # With no run left, a claim that carries outcomes is still answered at once, not at
    # the end of its long poll: its worker learns what was written.
    last = [dict(zip(answer.json()["columns"], r, strict=True)) for r in answer.json()["rows"]]
    started = time.monotonic()
    done = await worker.post(
        "/claim",
        {"workloop": 0, "demand": 2, "wait_seconds": 60, "outcomes": [row(r) for r in last]},
    )
    assert done.json() == {"runs": [], "recorded": sorted(r["id"] for r in last), "breakers": []}
    assert time.monotonic() - started < 30


async def test_a_workers_cycle_is_answered_alike_whichever_handler_reads_it(
    app: Tidegate, client: httpx.AsyncClient
) -> None:
    """A claim, a batch of outcomes and a heartbeat are read in one call where they are
    well formed (api/workers.py ``WorkerRoute``), else by FastAPI: what the one path
    cannot read, the other still serves or refuses as before. A UTF-16 body (JSON's own
    reader takes it) is served; a body of another worker's id, one with a wrong field,
    one that is not JSON and one without a JSON type are refused as FastAPI refuses
    them."""
    token = await worker_token(client, "fleet", ["*"])
    worker = await RemoteWorker.register(client, token, "manual>*:2", ["echo"])
    other = await RemoteWorker.register(client, token, "manual>*:2", ["echo"])
    await app.aenqueue("echo")
    claim = {"workloop": 0, "demand": 2, "format": "rows"}
    path = f"/workers/{worker.id}"

    def send(where: str, body: bytes, kind: str = "application/json") -> Any:
        return client.post(where, content=body, headers={**token, "content-type": kind})

    wide = json.dumps(claim).encode("utf-16")
    served = await send(f"{path}/claim", wide)
    assert served.status_code == 200, served.text
    (row,) = served.json()["rows"]
    columns = served.json()["columns"]
    run = dict(zip(columns, row, strict=True))
    outcome = {
        "id": run["id"],
        "attempt": 1,
        "state": "succeeded",
        "result": "7",
        "max_attempts": run["max_attempts"],
    }
    done = await send(f"{path}/complete", json.dumps({"outcomes": [outcome]}).encode())
    assert done.json() == {"recorded": [run["id"]], "breakers": []}, done.text
    beat = await send(f"{path}/heartbeat", b'{"run_ids": [%d]}' % run["id"], "application/x+json")
    assert beat.json() == {"renewed": [], "lost": [run["id"]]}, beat.text

    mine = await send(f"/workers/{other.id}/claim", json.dumps(claim).encode())
    assert mine.status_code == 200, mine.text  # its own token, another of its workers
    assert_problem(await send(f"{path}x/claim", json.dumps(claim).encode()), 404)
    wrong = await send(f"{path}/claim", json.dumps({**claim, "demand": 0}).encode())
    assert assert_problem(wrong, 422)["errors"][0]["loc"] == ["body", "demand"]
    assert_problem(await send(f"{path}/claim", b'{"workloop": 0,'), 400, ProblemType.MALFORMED_JSON)
    untyped = await send(f"{path}/claim", json.dumps(claim).encode(), "text/plain")
    assert_problem(untyped, 422)


def test_the_workers_remembered_for_their_claims_hold_no_more_than_their_budget() -> None:
    """One token's workers, each registered with as many tasks as a registration allows
    (1,000 of 255 characters), and claiming once, leave an API process remembering at
    most ``MAX_CLAIMER_NAMES`` names, the longest remembered forgotten first; a worker
    alone past the budget is not remembered (its claims go by the lookup)."""
    tasks = [f"{n:03d}".ljust(MAX_TEXT_CHARS, "t") for n in range(1000)]
    claimers = Claimers()
    for n in range(500):
        fleet = WorkerCaller("hostile", ("*",), f"w{n}", ([{"chain": ["*"], "slots": 1}], tasks))
        claimers.remember(("Bearer t", f"w{n}"), fleet)
        assert claimers.held <= MAX_CLAIMER_NAMES
    assert claimers.held == len(claimers.workers) * 1002
    assert claimers.get(("Bearer t", "w499")) is not None  # the latest kept
    assert claimers.get(("Bearer t", "w0")) is None  # the first forgotten
    claimers.forget(("Bearer t", "w499"))
    assert claimers.held == len(claimers.workers) * 1002

    small = Claimers(budget=100)
    small.remember(("Bearer t", "big"), WorkerCaller("t", ("*",), "big", ([], tasks)))
    assert small.get(("Bearer t", "big")) is None and small.held == 0


def test_a_claim_commits_its_runs_through_the_wal_flush_and_its_outcomes_without(
    app: Tidegate, sql: psycopg.Connection
) -> None:
    """The outcomes a claim carries commit as the completer's do, without waiting for the
    WAL flush; the runs it takes through it, as every claim (docs/architecture.md, "What
    commits how"): a crash must not undo a claim whose runs a handler may have started.
    The claim's one statement leaves the transaction's synchronous_commit as it must be at
    its commit."""
    sql.execute("INSERT INTO worker_tokens (name, token_hash, lanes) VALUES ('f', 'h', '{*}')")
    sql.execute(
        "INSERT INTO workers (id, host, pid, workloops, tasks, token)"
        " VALUES ('w', '', 0, %s, '{echo}', 'f')",
        [json.dumps([{"chain": ["default"], "slots": 2}])],
    )
    claim = {
        "token_hash": "h", "worker_id": "w", "workloop": 0, "slots": 2, "demand": 1,
        "outcomes": None, "completed_channel": "c", "channel": "a", "lanes": ["default"],
        "wildcard": False, "demands": None, "others_demand": None, "lease_seconds": 30.0,
        "scan_limit": 500, "head_scan": 64, "tasks": ["echo"], "live_seconds": 30.0,
    }  # fmt: skip
    first = app.enqueue("echo")
    [(free, claimed, *_)] = sql.execute(query("claim_workloop"), claim).fetchall()
    assert (free, claimed) == (2, 1)
    done = [{"id": first.id, "attempt": 1, "state": "succeeded", "max_attempts": 20}]
    carrying = {**claim, "outcomes": json.dumps(done)}
    with sql.transaction(force_rollback=True):  # no run to take: the outcomes' mode
        [(_, claimed, *_)] = sql.execute(query("claim_workloop"), carrying).fetchall()
        assert claimed == 0 and state_of(sql, first.id) == ("succeeded", 1)
        assert sql.execute("SHOW synchronous_commit").fetchone() == ("off",)
    app.enqueue("echo")
    with sql.transaction(force_rollback=True):  # a run taken: the claim's
        [(_, claimed, *_)] = sql.execute(query("claim_workloop"), carrying).fetchall()
        assert claimed == 1 and state_of(sql, first.id) == ("succeeded", 1)
        assert sql.execute("SHOW synchronous_commit").fetchone() == ("on",)


async def test_a_claim_in_rows_carries_the_runs_an_old_claim_gets_as_objects(
    app: Tidegate, client: httpx.AsyncClient
) -> None:
    """A worker that asks for ``rows`` gets the same runs, each field named once; one
    that does not (a worker of before) still gets objects; an unknown format is a 422."""
    token = await worker_token(client, "fleet", ["default"])
    registered = await client.post(
        "/workers", json={"workloops": "default:4", "tasks": ["echo"]}, headers=token
    )
    assert registered.json()["claim_formats"] == ["objects", "rows"]
    worker = RemoteWorker(client, token, registered.json()["worker_id"])
    old = await RemoteWorker.register(client, token, "default:4", ["echo"])
    deep: Any = [{"n": 1, "at": "2026-01-01T00:00:00+00:00"}]
    enqueued = [await app.aenqueue("echo", {"deep": deep, "n": n}) for n in range(4)]

    body = {"workloop": 0, "demand": 2, "wait_seconds": 0, "format": "rows"}
    answer = (await worker.post("/claim", body)).json()
    assert "runs" not in answer and len(answer["rows"]) == 2
    assert answer["columns"] == list(RUN_FIELDS)  # read at once, not by name
    in_rows = [Run.from_row(answer["columns"], row) for row in answer["rows"]]
    as_objects = [Run.from_json(run) for run in await old.claim(2)]
    assert {run.id for run in in_rows + as_objects} == {run.id for run in enqueued}
    for run in in_rows:  # as the database holds it, and as an object would carry it
        stored = app.get_run(run.id)
        assert stored is not None and run == stored and run.to_json() == stored.to_json()
        assert run.args == {"deep": deep, "n": run.args["n"]}
    empty = (await worker.post("/claim", body)).json()
    assert empty == {"columns": list(RUN_FIELDS), "rows": []}  # none left
    wrong = await worker.post("/claim", {**body, "format": "msgpack"})
    assert_problem(wrong, 422)


def test_a_claim_row_under_other_columns_is_read_by_name() -> None:
    """An API of another version may name other fields, or the same in another order:
    the worker reads the row by name, the fields it does not know left out."""
    now = "2026-01-01T00:00:00+00:00"
    values: dict[str, Any] = {name: None for name in RUN_FIELDS}
    values.update(
        id=7, project="default", lane="default", key="k", task="echo", args={"n": 1},
        state="running", priority=0, attempt=1, max_attempts=3, scheduled_at=now,
        inserted_at=now, lease_expires_at=now, errors=[], unique_states=["running"],
        vtime=0.0, rank=0.0, probe=False, watched=False,
    )  # fmt: skip
    in_order = Run.from_row(list(RUN_FIELDS), [values[name] for name in RUN_FIELDS])
    columns = [*reversed(RUN_FIELDS), "a_later_field"]
    other = Run.from_row(columns, [*(values[name] for name in reversed(RUN_FIELDS)), 1])
    assert other == in_order == Run.from_json(values)
    assert other.unique_states == (RunState.RUNNING,) and other.lease_expires_at is not None


async def test_a_token_scopes_the_lanes_its_workers_may_claim_from(
    client: httpx.AsyncClient,
) -> None:
    token = await worker_token(client, "emails", ["emails", "default"])
    for workloops in ("fast_lane:1", "emails>*:2", "emails:1 manual:1"):
        refused = await client.post(
            "/workers", json={"workloops": workloops, "tasks": ["echo"]}, headers=token
        )
        assert_problem(refused, 422)
    for bad in ({"workloops": "x:0", "tasks": ["echo"]}, {"workloops": "emails:1", "tasks": []}):
        assert_problem(await client.post("/workers", json=bad, headers=token), 422)
    worker = await RemoteWorker.register(client, token, "emails>default:2", ["echo"])
    # Another token's worker id is not found; an admin's or a project's token is refused.
    other = await worker_token(client, "other", ["*"])
    assert_problem(
        await client.post(
            f"/workers/{worker.id}/claim", json={"workloop": 0, "demand": 1}, headers=other
        ),
        404,
    )
    assert_problem(
        await client.post(
            "/workers", json={"workloops": "emails:1", "tasks": ["x"]}, headers=ADMIN
        ),
        403,
    )
    assert_problem(await client.post("/workers", json={}), 401)
    # A deleted token's workers are refused from the next call on, their claims too
    # (which the API process remembers after a first: the claim's statement checks).
    claim = {"workloop": 0, "demand": 1, "wait_seconds": 0}
    assert (await worker.post("/claim", claim)).status_code == 200
    assert (await client.delete("/admin/worker-tokens/emails", headers=ADMIN)).status_code == 204
    assert_problem(await worker.post("/claim", claim), 403)
    assert_problem(await worker.post("/heartbeat", {"run_ids": []}), 403)
    listed = await client.get("/admin/worker-tokens", headers=ADMIN)
    assert [t["name"] for t in listed.json()] == ["other"]
    taken = await client.post(
        "/admin/worker-tokens", json={"name": "other", "lanes": ["*"]}, headers=ADMIN
    )
    assert_problem(taken, 409)


async def test_only_a_token_for_every_lane_declares_task_settings(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    """A declaration routes every run enqueued by the task's name: a token scoped to
    'emails' that declared `charge` in 'emails' would draw other services' runs of it
    into the only lane it may claim from. Its registration stands; its settings do not."""
    charge = {"name": "charge", "lane": "emails", "max_attempts": 1}
    scoped = await worker_token(client, "emails", ["emails"])
    await RemoteWorker.register(client, scoped, "emails:1", [charge])  # type: ignore[list-item]
    assert sql.execute("SELECT count(*) FROM tasks").fetchone() == (0,)

    fleet = await worker_token(client, "fleet", ["*"])
    await RemoteWorker.register(client, fleet, "*:1", [charge])  # type: ignore[list-item]
    row = sql.execute("SELECT lane, max_attempts FROM tasks WHERE name = 'charge'").fetchone()
    assert row == ("emails", 1)


async def test_a_long_poll_is_answered_as_soon_as_a_run_comes(
    app: Tidegate, client: httpx.AsyncClient
) -> None:
    token = await worker_token(client, "fleet", ["*"])
    worker = await RemoteWorker.register(client, token, "manual>*:1", ["echo"])
    started = time.monotonic()
    assert await worker.claim(1, wait=0.5) == []  # nothing came: empty after the wait
    assert time.monotonic() - started >= 0.5

    async def enqueue_soon() -> int:
        await asyncio.sleep(1)
        return (await app.aenqueue("echo", {"late": True})).id

    started = time.monotonic()
    claimed, run_id = await asyncio.gather(worker.claim(1, wait=20), enqueue_soon())
    assert [run["id"] for run in claimed] == [run_id]
    assert time.monotonic() - started < 10  # woken by the lane's NOTIFY, not the wait's end


async def test_a_silent_workers_runs_are_rescued_and_a_stopping_one_hands_back(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    token = await worker_token(client, "fleet", ["*"])
    silent = await RemoteWorker.register(client, token, "manual>*:1", ["echo"])
    living = await RemoteWorker.register(client, token, "manual>*:2", ["echo"])
    run = await app.aenqueue("echo")
    (held,) = await silent.claim(1)
    # The living worker's beats renew its own leases and rescue the silent one's (lease
    # 2 s in the tests' settings).
    assert state_of(sql, run.id) == ("running", 1)
    deadline = time.monotonic() + 20
    while state_of(sql, run.id) == ("running", 1) and time.monotonic() < deadline:
        await living.post("/heartbeat", {"run_ids": []})
        await asyncio.sleep(0.3)
    assert state_of(sql, run.id) == ("available", 1)
    assert_problem(await silent.succeed(held), 409)  # too late: the run left it
    beat = await silent.post("/heartbeat", {"run_ids": [run.id]})
    assert beat.json() == {"renewed": [], "lost": [run.id]}

    reclaimed = await living.claim(2)
    assert [r["id"] for r in reclaimed] == [run.id] and reclaimed[0]["attempt"] == 2
    stopped = await living.post("/stop", {"hand_back": [run.id]})
    assert stopped.json() == {"handed_back": 1}
    assert state_of(sql, run.id) == ("available", 1)  # the interrupted attempt not counted
    assert sql.execute("SELECT count(*) FROM workers WHERE id = %s", [living.id]).fetchone() == (0,)
    gone = await living.post("/claim", {"workloop": 0, "demand": 1})
    assert_problem(gone, 404)  # it must register again


async def test_a_remote_fast_lane_slot_counts_for_admission_and_serves_sync_webhooks(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    await create_project(client, "acme")
    trigger = await create_trigger(client, "acme", "quote", mode="sync", task="echo")
    refused = await client.post(trigger["url"], json={})
    assert_problem(refused, 503)  # no worker has a fast-lane slot
    token = await worker_token(client, "fast", ["fast_lane"])
    worker = await RemoteWorker.register(client, token, "fast_lane:1", ["echo"])

    async def serve_one() -> None:
        (run,) = await worker.claim(1, wait=20)
        progress = await worker.post(
            f"/runs/{run['id']}/progress", {"attempt": run["attempt"], "data": {"half": True}}
        )
        assert progress.status_code == 204
        # While it holds the slot, the next sync webhook finds no capacity.
        assert_problem(await client.post(trigger["url"], json={"second": True}), 503)
        assert (await worker.succeed(run, {"echo": run["args"]["body"]})).status_code == 200

    answer, _ = await asyncio.gather(client.post(trigger["url"], json={"q": 1}), serve_one())
    assert answer.status_code == 200 and answer.json() == {"echo": {"q": 1}}
    run_id = int(answer.headers["location"].removeprefix("/runs/"))
    events = sql.execute("SELECT data FROM run_events WHERE run_id = %s", [run_id]).fetchall()
    assert events == [({"half": True},)]


async def test_a_forwarding_run_s_request_comes_signed_to_the_worker_that_holds_it(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    await create_project(client, "acme")
    secret = "whsec_" + base64.b64encode(b"a forwarding secret of 32 bytes!").decode()
    trigger = await create_trigger(
        client,
        "acme",
        "relay",
        mode="async",
        forward_url="http://127.0.0.1:9/in",
        forward_secret=secret,
        forward_headers=["x-shop"],
    )
    sent = await client.post(
        trigger["url"],
        content=b'{"order": 7}',
        headers={"content-type": "application/json", "x-shop": "s1", "x-other": "o"},
    )
    assert sent.status_code == 202, sent.text
    token = await worker_token(client, "edge", ["default"])
    worker = await RemoteWorker.register(client, token, "default:1", ["tidegate.forward"])
    other = await RemoteWorker.register(client, token, "default:1", ["tidegate.forward"])
    (run,) = await worker.claim(1)

    path = f"/runs/{run['id']}/delivery"
    answer = await client.get(f"/workers/{worker.id}{path}", params={"attempt": 1}, headers=token)
    assert answer.status_code == 200, answer.text
    delivery = answer.json()["delivery"]
    body = base64.b64decode(delivery["body"])
    assert (delivery["method"], delivery["url"], body) == (
        "POST",
        "http://127.0.0.1:9/in",
        sent.request.content,
    )
    assert delivery["headers"]["x-shop"] == "s1" and "x-other" not in delivery["headers"]
    assert delivery["headers"]["content-type"] == "application/json"
    verify(secret, delivery["headers"], body)  # signed by the API
    assert secret not in answer.text and secret.removeprefix("whsec_") not in answer.text
    # Only the worker holding that attempt gets it.
    assert_problem(
        await client.get(f"/workers/{other.id}{path}", params={"attempt": 1}, headers=token), 409
    )
    assert_problem(
        await client.get(f"/workers/{worker.id}{path}", params={"attempt": 2}, headers=token), 409
    )
    assert_problem(
        await client.get(f"/workers/{worker.id}{path}", params={"attempt": 0}, headers=token), 422
    )

    # A trigger that stops forwarding: nothing to send, the worker discards the run.
    cleared = await client.patch(
        f"/admin/triggers/{trigger['id']}",
        json={"forward_url": None, "task": "echo"},
        headers=ADMIN,
    )
    assert cleared.status_code == 200, cleared.text
    gone = await client.get(f"/workers/{worker.id}{path}", params={"attempt": 1}, headers=token)
    assert gone.status_code == 200 and gone.json() == {"delivery": None}
    assert state_of(sql, run["id"]) == ("running", 1)


async def test_key_limits_hold_for_remote_claims(app: Tidegate, client: httpx.AsyncClient) -> None:
    app.set_key_policy("default", "tenant", max_running=1)
    token = await worker_token(client, "fleet", ["default"])
    worker = await RemoteWorker.register(client, token, "default:4", ["echo"])
    for _ in range(3):
        await app.aenqueue("echo", key="tenant")
    other = await app.aenqueue("echo", key="someone")
    claimed = await worker.claim(4)
    assert sorted(run["key"] for run in claimed) == ["someone", "tenant"]
    assert other.id in {run["id"] for run in claimed}


async def test_bad_outcomes_are_refused_with_a_4xx(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    token = await worker_token(client, "fleet", ["*"])
    worker = await RemoteWorker.register(client, token, "manual>*:1", ["echo"])
    await app.aenqueue("echo")
    (run,) = await worker.claim(1)
    path = f"/workers/{worker.id}/runs/{run['id']}/outcome"
    headers = {**token, "content-type": "application/json"}
    for body in (
        b'{"state": "succeeded", "attempt": 1, "result": NaN}',
        b'{"state": "won", "attempt": 1}',
        b'{"state": "retry", "attempt": 1, "delay_seconds": -1}',
        b'{"state": "succeeded", "attempt": 0}',
        b"[]",
    ):
        answer = await client.post(path, content=body, headers=headers)
        assert answer.status_code == 422, (body, answer.text)
    assert state_of(sql, run["id"]) == ("running", 1)  # nothing was written


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
async def test_the_javascript_example_worker_runs_tasks_and_reports_progress(
    app: Tidegate, api: ApiServer, client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    token = await worker_token(client, "node", ["*"])
    env = {
        **os.environ,
        "TIDEGATE_URL": api.url,
        "TIDEGATE_WORKER_TOKEN": token["Authorization"].removeprefix("Bearer "),
        "TIDEGATE_WORKLOOPS": "fast_lane:1 manual>*:2",
    }
    node = subprocess.Popen(["node", str(ROOT / "examples" / "node-worker.mjs")], env=env)
    try:
        await wait_until(
            lambda: (
                sql.execute("SELECT count(*) FROM workers WHERE token = 'node'").fetchone() == (1,)
            )
        )
        shout = await app.aenqueue("js.shout", {"text": "hello remote world"})
        fail = await app.aenqueue("js.fail", max_attempts=2)
        await create_project(client, "acme")
        trigger = await create_trigger(client, "acme", "shout", mode="sync", task="js.shout")
        answer = await client.post(trigger["url"], json={"text": "sync too"})
        assert answer.status_code == 200 and answer.json() == {"shouted": "SYNC TOO", "by": "node"}
        await wait_until(
            lambda: (
                state_of(sql, shout.id)[0] == "succeeded"
                and state_of(sql, fail.id)[0] == "discarded"
            ),
            timeout=30,
        )
    finally:
        node.send_signal(signal.SIGTERM)
        assert node.wait(30) == 0
    result = sql.execute("SELECT result, errors FROM runs WHERE id = %s", [shout.id]).fetchone()
    assert result is not None and result[0] == {"shouted": "HELLO REMOTE WORLD", "by": "node"}
    events = sql.execute(
        "SELECT data FROM run_events WHERE run_id = %s ORDER BY id", [shout.id]
    ).fetchall()
    assert [row[0] for row in events] == [{"word": i, "of": 3} for i in (1, 2, 3)]
    errors = sql.execute("SELECT errors FROM runs WHERE id = %s", [fail.id]).fetchone()
    assert (
        errors is not None
        and [e["error"] for e in errors[0]] == ["Error: this task always fails"] * 2
    )
    # It stopped cleanly: its row is gone, so its slots no longer count.
    assert sql.execute("SELECT count(*) FROM workers WHERE token = 'node'").fetchone() == (0,)


async def test_remote_and_local_workers_share_a_burst_exactly_once_within_key_limits(
    app: Tidegate, start_api: Any, start_worker_process: Any, sql: psycopg.Connection
) -> None:
    server: ApiServer = start_api(processes=2)
    app.set_key_policy("default", "*", max_running=2)
    runs = await app.aenqueue_many(
        [NewRun("async_sleep", {"seconds": 0.05, "n": n}, key=f"tenant{n % 8}") for n in range(400)]
    )
    widest = 0

    async def sample() -> None:
        nonlocal widest
        while True:
            rows = sql.execute(
                "SELECT count(*) FROM runs WHERE state = 'running' GROUP BY key"
            ).fetchall()
            widest = max([widest, *(row[0] for row in rows)])
            await asyncio.sleep(0.01)

    async def remote(client: httpx.AsyncClient, token: dict[str, str]) -> list[int]:
        worker = await RemoteWorker.register(client, token, "default:4", ["async_sleep"])
        done: list[int] = []
        while True:
            claimed = await worker.claim(4, wait=1)
            if not claimed and state_counts(sql).get("available", 0) == 0:
                return done
            for run in claimed:
                await asyncio.sleep(0.05)
                answer = await worker.succeed(run, {"by": worker.id})
                assert answer.status_code == 200, answer.text
                done.append(run["id"])
                started.set()

    started = asyncio.Event()
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        token = await worker_token(client, "fleet", ["default"])
        sampler = asyncio.create_task(sample())
        remotes = asyncio.gather(*(remote(client, token) for _ in range(4)))
        # The local worker joins once a remote one has finished a run: what is tested is
        # the sharing, whichever side a loaded machine starts faster.
        await asyncio.wait_for(started.wait(), timeout=30)
        await asyncio.to_thread(start_worker_process, "default:4")
        by_remote = await remotes
        await wait_until(lambda: state_counts(sql) == {"succeeded": 400}, timeout=60)
        sampler.cancel()
    remote_ids = [run_id for ids in by_remote for run_id in ids]
    assert len(remote_ids) == len(set(remote_ids)), "a run was completed twice remotely"
    assert remote_ids, "the remote workers took no run"
    attempts = sql.execute(
        "SELECT count(*) FROM runs WHERE id = ANY(%s) AND attempt = 1", [[r.id for r in runs]]
    ).fetchone()
    assert attempts == (400,)  # every run claimed once: none twice, none rescued
    assert widest <= 2, f"a key had {widest} runs in flight (max_running 2)"


def state_counts(sql: psycopg.Connection) -> dict[str, int]:
    rows = sql.execute("SELECT state::text, count(*) FROM runs GROUP BY state").fetchall()
    return {state: count for state, count in rows}


async def test_a_python_worker_in_remote_mode_needs_no_database(
    app: Tidegate, api: ApiServer, client: httpx.AsyncClient, sql: psycopg.Connection, tmp_path: Any
) -> None:
    token = await worker_token(client, "python", ["*"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    env.update(
        PYTHONPATH=str(ROOT),
        TIDEGATE_SCHEMA=app.settings.schema,  # tests.apps registers its tasks with it
        TIDEGATE_SERVER_URL=api.url,
        TIDEGATE_WORKER_TOKEN=token["Authorization"].removeprefix("Bearer "),
        TIDEGATE_HEARTBEAT_SECONDS="0.5",
    )
    command = ["-m", "tidegate", "worker", "--app", "tests.apps:app", "--workloops", "manual>*:2"]
    worker = subprocess.Popen([sys.executable, *command], env=env, cwd=tmp_path)
    try:
        await wait_until(
            lambda: (
                sql.execute("SELECT count(*) FROM workers WHERE token = 'python'").fetchone()
                == (1,)
            )
        )
        runs = [await app.aenqueue("echo", {"n": n}) for n in range(20)]
        retried = await app.aenqueue("retry_once")
        await wait_until(lambda: state_counts(sql) == {"succeeded": 21}, timeout=30, interval=0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    results = dict(sql.execute("SELECT id, result FROM runs").fetchall())
    assert [results[run.id] for run in runs] == [{"n": n} for n in range(20)]
    assert results[retried.id] == "second time"  # a Retry came back, staged by the API
    # Its attempts were counted (the metrics read these rows), its row is gone, and it
    # made no database of its own.
    counted = sql.execute(
        "SELECT sum(attempts) FROM worker_counters WHERE outcome = 'succeeded'"
    ).fetchone()
    assert counted == (21,)
    assert sql.execute("SELECT count(*) FROM workers WHERE token = 'python'").fetchone() == (0,)
    assert list(tmp_path.iterdir()) == []


async def test_a_remote_worker_refused_by_the_api_says_so_in_one_line(
    api: ApiServer, tmp_path: Any
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    env.update(PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "tidegate", "worker", "--app", "tests.apps:app"]
    command += ["--server", api.url, "--token", "tgw_wrong"]  # short for --server-url ...
    done = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"tidegate: the API at {api.url} answered /workers with 403: unknown worker token"
    )


async def test_a_remote_worker_calls_the_api_through_the_proxy_its_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``HTTP_PROXY`` (its credentials sent to the proxy) and ``NO_PROXY`` hold, read as
    the link opens (tidegate.worker.link ``_proxied``). The proxy here answers every call
    503; the API's port is closed, so a call that went past the proxy is refused."""
    heads: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    closed = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    api_port = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    worker: Any = SimpleNamespace(settings=SimpleNamespace(workloops="manual:1"), tasks={}, id="w")
    for name in ("NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(
        "HTTP_PROXY", f"http://tg:s3cret@127.0.0.1:{server.sockets[0].getsockname()[1]}"
    )
    async with server:
        proxied = RemoteLink(f"http://localhost:{api_port}", "tgw_x", 1.0)
        with pytest.raises(LinkError, match="answered /workers with 503"):
            await proxied.open(worker)
        (head,) = heads
        assert head.startswith(f"POST http://localhost:{api_port}/workers HTTP/1.1".encode())
        credentials = base64.b64encode(b"tg:s3cret").decode()
        assert f"Proxy-Authorization: Basic {credentials}\r\n" in head.decode()

        monkeypatch.setenv("NO_PROXY", "localhost")
        direct = RemoteLink(f"http://localhost:{api_port}", "tgw_x", 1.0)
        with pytest.raises(LinkError, match="cannot reach the API"):
            await direct.open(worker)
        assert len(heads) == 1


async def test_a_run_nested_as_deep_as_allowed_is_claimed_and_completed(
    app: Tidegate, start_api: Callable[..., ApiServer], sql: psycopg.Connection
) -> None:
    """Whatever depth a run may hold (``max_json_depth``, up to 512), a remote worker
    gets it and can give it back as its result: no serializer with a lower limit on the
    way (pydantic's stops at about 255 levels)."""
    deep = Tidegate(settings=app.settings.replace(max_json_depth=512))
    api = start_api(max_json_depth=512)
    nested: Any = "bottom"
    for _ in range(510):
        nested = [nested]
    run = await deep.aenqueue("echo", {"deep": nested})
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
        token = await worker_token(client, "deep", ["*"])
        worker = await RemoteWorker.register(client, token, "default:1", ["echo"])
        (claimed,) = await worker.claim(1)
        assert claimed["id"] == run.id and claimed["args"] == {"deep": nested}
        done = await worker.succeed(claimed, claimed["args"])
        assert done.status_code == 200, done.text
    assert state_of(sql, run.id) == ("succeeded", 1)
    deep.close()


async def test_a_remote_worker_logs_its_own_lines_not_each_http_call(
    app: Tidegate, api: ApiServer, client: httpx.AsyncClient, sql: psycopg.Connection, tmp_path: Any
) -> None:
    """httpx logs every request at INFO: a remote worker's long polls and heartbeats
    would be a line each, idle or not (494 lines for 171 runs)."""
    token = await worker_token(client, "python", ["*"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    env.update(
        PYTHONPATH=str(ROOT),
        TIDEGATE_SCHEMA=app.settings.schema,
        TIDEGATE_SERVER_URL=api.url,
        TIDEGATE_WORKER_TOKEN=token["Authorization"].removeprefix("Bearer "),
        TIDEGATE_HEARTBEAT_SECONDS="0.5",
    )
    command = ["-m", "tidegate", "worker", "--app", "tests.apps:app", "--workloops", "manual>*:2"]
    worker = subprocess.Popen(
        [sys.executable, *command], env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        await wait_until(
            lambda: (
                sql.execute("SELECT count(*) FROM workers WHERE token = 'python'").fetchone()
                == (1,)
            )
        )
        for n in range(10):
            await app.aenqueue("echo", {"n": n})
        await wait_until(lambda: state_counts(sql) == {"succeeded": 10}, timeout=30, interval=0.1)
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    lines = stderr.splitlines()
    assert [line for line in lines if "HTTP Request" in line] == []
    assert any("INFO tidegate.worker: worker remote:python:" in line for line in lines), stderr
    assert any("stopped" in line for line in lines), stderr


async def test_a_workloop_past_the_slot_bound_is_refused_and_cannot_be_stored(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    """A worker that registered ``*:99999999999999999999`` made every sync webhook for
    its tasks, and ``/metrics``, answer 422 (an integer overflow in admission) for as long
    as it heartbeated."""
    token = await worker_token(client, "fleet", ["*"])
    for workloops in ("*:99999999999999999999", f"*:{MAX_SLOTS + 1}", "fast_lane:1 *:" + "9" * 30):
        refused = await client.post(
            "/workers", json={"workloops": workloops, "tasks": ["echo"]}, headers=token
        )
        assert "slots must be a whole number from 1 to" in assert_problem(refused, 422)["detail"]
    await RemoteWorker.register(client, token, f"fast_lane:{MAX_SLOTS} *:{MAX_SLOTS}", ["echo"])
    await create_project(client, "acme")
    trigger = await create_trigger(
        client, "acme", "quote", mode="sync", task="echo", sync_timeout_seconds=0.5
    )
    answer = await client.post(trigger["url"], json={})
    assert answer.status_code == 202, answer.text  # admitted; nothing runs it
    assert (await client.get("/metrics", headers=ADMIN)).status_code == 200
    # The table holds the same bound, whoever writes a worker's row.
    row = "INSERT INTO workers (id, host, pid, workloops) VALUES (%s, 'h', 1, %s)"
    for slots in (MAX_SLOTS + 1, 0, 2.5, "4", 99999999999999999999):
        loops = json.dumps([{"chain": ["*"], "slots": slots, "busy": 0}])
        with pytest.raises(psycopg.errors.CheckViolation):
            sql.execute(row, [f"w{slots}", loops])
    sql.execute(row, ["w", json.dumps([{"chain": ["*"], "slots": MAX_SLOTS, "busy": 0}])])


async def test_a_batch_of_outcomes_moves_max_attempts_only_as_giving_an_attempt_back_does(
    app: Tidegate, client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    """A worker raises a run's max_attempts by one to give an attempt back (``Retry``,
    ``DownstreamFailing``) and never otherwise; a batch that says 32,767 is held to it."""
    token = await worker_token(client, "fleet", ["*"])
    worker = await RemoteWorker.register(client, token, "manual>*:3", ["echo"])
    runs = [await app.aenqueue("echo", {"n": n}, max_attempts=3) for n in range(3)]
    claimed = {run["id"]: run for run in await worker.claim(3)}
    assert claimed.keys() == {run.id for run in runs}

    def row(run_id: int, state: str, max_attempts: int) -> dict[str, Any]:
        return {"id": run_id, "attempt": 1, "state": state, "max_attempts": max_attempts}

    batch = [
        row(runs[0].id, "scheduled", 32767),  # given back: at most one more
        row(runs[1].id, "scheduled", 1),  # never fewer
        row(runs[2].id, "succeeded", 99),  # finished: unchanged
    ]
    answer = await worker.post("/complete", {"outcomes": batch, "events": []})
    assert answer.status_code == 200, answer.text
    assert sorted(answer.json()["recorded"]) == sorted(claimed)
    rows = dict(
        sql.execute(
            "SELECT id, max_attempts FROM runs WHERE id = ANY(%s)", [[r.id for r in runs]]
        ).fetchall()
    )
    assert rows == {runs[0].id: 4, runs[1].id: 3, runs[2].id: 3}


async def test_concurrent_claims_on_two_api_processes_never_exceed_a_workloops_slots(
    app: Tidegate, start_api: Callable[..., ApiServer], sql: psycopg.Connection
) -> None:
    """Each claim counts the runs its workloop holds, then claims the rest of its slots:
    two at once, on two API processes, both counted none held (50 concurrent claims on a
    one-slot workloop held 2 to 34 runs)."""
    servers = [start_api(), start_api()]
    await app.aenqueue_many([NewRun("echo", {"n": n}) for n in range(400)])
    clients = [httpx.AsyncClient(base_url=server.url, timeout=30) for server in servers]
    try:
        token = await worker_token(clients[0], "fleet", ["default"])
        workers = [
            await RemoteWorker.register(clients[0], token, "default:1", ["echo"]) for _ in range(20)
        ]

        async def claim(worker: RemoteWorker, client: httpx.AsyncClient) -> list[dict[str, Any]]:
            body = {"workloop": 0, "demand": 5, "wait_seconds": 0}
            answer = await client.post(f"/workers/{worker.id}/claim", json=body, headers=token)
            assert answer.status_code in (200, 429), answer.text
            runs: list[dict[str, Any]] = answer.json()["runs"] if answer.status_code == 200 else []
            return runs

        for _ in range(5):
            answers = await asyncio.gather(
                *(claim(worker, client) for worker in workers for client in clients)
            )
            held = sql.execute(
                "SELECT max(n) FROM (SELECT count(*) AS n FROM runs WHERE state = 'running'"
                " GROUP BY worker_id) AS held"
            ).fetchone()
            assert held is not None and held[0] == 1, f"a one-slot workloop held {held[0]} runs"
            for worker, first, second in zip(workers, answers[0::2], answers[1::2], strict=True):
                for run in [*first, *second]:
                    assert (await worker.succeed(run)).status_code == 200
    finally:
        for client in clients:
            await client.aclose()


def counted(task: str, lane: str = "default", attempts: int = 1, **fields: Any) -> dict[str, Any]:
    """A heartbeat's counter row: ``attempts`` that succeeded, each within 5 ms."""
    buckets = [attempts] + [0] * len(DURATION_BUCKETS)
    row = {"task": task, "lane": lane, "outcome": "succeeded", "attempts": attempts}
    return {**row, "seconds": 0.001 * attempts, "buckets": buckets, **fields}


async def test_a_heartbeats_counters_outside_the_workers_tasks_lanes_or_bounds_are_refused(
    client: httpx.AsyncClient, sql: psycopg.Connection
) -> None:
    token = await worker_token(client, "fleet", ["default", "manual"])
    worker = await RemoteWorker.register(client, token, "default:2", ["echo"])
    for row, why in (
        (counted("made_up"), "task 'made_up' is not one this worker registered"),
        (counted("echo", lane="manual"), "lane 'manual' is not one this worker's workloops"),
        (counted("echo", attempts=2**31), "less than or equal to 1000000"),
        (counted("echo", buckets=[5] + [0] * len(DURATION_BUCKETS)), "holds 5 attempts, more"),
    ):
        refused = await worker.post("/heartbeat", {"run_ids": [], "counters": [row]})
        assert why in refused.text, refused.text
        assert_problem(refused, 422)
    assert sql.execute("SELECT count(*) FROM worker_counters").fetchone() == (0,)
    beat = await worker.post("/heartbeat", {"run_ids": [], "counters": [counted("echo")]})
    assert beat.status_code == 200, beat.text
    assert sql.execute("SELECT task, lane, attempts FROM worker_counters").fetchall() == [
        ("echo", "default", 1)
    ]


async def test_one_workers_counters_cannot_push_the_others_out_of_the_metrics(
    client: httpx.AsyncClient,
) -> None:
    """``/metrics`` reports at most 1,000 series of attempts; a worker with 1,000 series
    of names that sort first took every place (in name order) from everyone else's."""
    token = await worker_token(client, "fleet", ["*"])
    names = [f"aaa{n:04d}" for n in range(1000)]
    crowd = await RemoteWorker.register(client, token, "*:1", names)
    beat = await crowd.post(
        "/heartbeat", {"run_ids": [], "counters": [counted(name, attempts=5) for name in names]}
    )
    assert beat.status_code == 200, beat.text
    worker = await RemoteWorker.register(client, token, "*:1", ["echo"])
    beat = await worker.post("/heartbeat", {"run_ids": [], "counters": [counted("echo")]})
    assert beat.status_code == 200, beat.text
    scraped = (await client.get("/metrics", headers=ADMIN)).text
    assert 'tidegate_attempts_total{lane="default",outcome="succeeded",task="echo"} 1.0' in scraped
    assert scraped.count("tidegate_attempts_total{") == 1000


async def test_claims_past_a_workloops_or_a_tokens_bound_are_answered_429(
    start_api: Callable[..., ApiServer],
) -> None:
    """One claim at a time per workloop, ``max_claims_per_token`` per token, on an API
    process; a claim whose client went frees its place at once."""
    api = start_api(max_claims_per_token=3)
    async with httpx.AsyncClient(base_url=api.url, timeout=60) as client:
        token = await worker_token(client, "fleet", ["*"])
        workers = [
            await RemoteWorker.register(client, token, "manual>*:1", ["echo"]) for _ in range(4)
        ]
        waits = {"workloop": 0, "demand": 1, "wait_seconds": 30}
        now = {**waits, "wait_seconds": 0}
        claims = [asyncio.create_task(worker.post("/claim", waits)) for worker in workers]
        done, waiting = await asyncio.wait(claims, return_when=asyncio.FIRST_COMPLETED)
        (refused,) = done  # three wait (no run comes), the fourth is over the token's bound
        assert "at most 3" in assert_problem(refused.result(), 429)["detail"]
        assert 1 <= int(refused.result().headers["retry-after"]) <= 30
        idle = workers[claims.index(refused)]
        assert_problem(await idle.post("/claim", now), 429)
        # A workloop with a claim waiting: a second claim of it is refused.
        busy = workers[claims.index(next(iter(waiting)))]
        again = await busy.post("/claim", now)
        assert "has a claim waiting" in assert_problem(again, 429)["detail"]
        assert 1 <= int(again.headers["retry-after"]) <= 30
        # A claim whose client goes away leaves its place at once, not at its deadline.
        gone = waiting.pop()
        gone.cancel()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while (answer := await idle.post("/claim", now)).status_code == 429:
            assert loop.time() < deadline, "the place of a claim whose client went stayed taken"
            await asyncio.sleep(0.05)
        assert answer.status_code == 200 and answer.json() == {"runs": []}
        for claim in waiting:
            claim.cancel()


async def test_a_tokens_claims_of_more_kinds_than_its_bound_are_answered_429(
    client: httpx.AsyncClient,
) -> None:
    """Every kind of waiting claim (chain and tasks) costs a look at each NOTIFY of its
    lanes: a token's claims may be of ``MAX_KINDS_PER_TOKEN`` kinds on an API process."""
    token = await worker_token(client, "fleet", ["*"])
    workers = [
        await RemoteWorker.register(client, token, "manual>*:1", [f"task{n}"])
        for n in range(MAX_KINDS_PER_TOKEN + 1)
    ]
    claims, _ = await all_waiting(workers[:-1])
    try:
        body = {"workloop": 0, "demand": 1, "wait_seconds": 30}
        refused = await workers[-1].post("/claim", body)
        assert f"of {MAX_KINDS_PER_TOKEN} kinds" in assert_problem(refused, 429)["detail"]
        # Another claim of a kind already waiting is welcome.
        same = await RemoteWorker.register(client, token, "manual>*:1", ["task0"])
        assert (await same.claim(1)) == []
    finally:
        for claim in claims:
            claim.cancel()


async def test_a_new_run_wakes_one_waiting_claim_of_a_kind_not_every_one(
    app: Tidegate, start_api: Callable[..., ApiServer], sql: psycopg.Connection, schema: str
) -> None:
    """A NOTIFY of a lane woke every waiting claim, each a transaction of statements: 500
    waiting claims took the database from 93 to 1,330 transactions a second. Now it wakes
    the first claim of each kind (chain and tasks); one that takes all it asked for wakes
    the next, so a batch of runs in one NOTIFY is taken at once all the same."""
    api = start_api()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=api.url, timeout=60, limits=limits) as client:
        token = await worker_token(client, "fleet", ["default"])
        workers = [
            await RemoteWorker.register(client, token, "default:1", ["echo"]) for _ in range(150)
        ]
        claims, looks = await all_waiting(workers)

        async def claimed(count: int) -> None:
            await wait_until(
                lambda: (
                    sql.execute("SELECT count(*) FROM runs WHERE state = 'running'").fetchone()
                    == (count,)
                ),
                timeout=10,  # the claims wait 60 s: this is a wake, not a deadline
            )

        for n in range(10):  # a NOTIFY each
            await app.aenqueue("echo", {"n": n})
            await claimed(n + 1)
        await app.aenqueue_many([NewRun("echo", {"n": n}) for n in range(20)])  # one NOTIFY
        await claimed(30)
        # Each claim is running in the database before its answer reaches its worker.
        await wait_until(lambda: sum(claim.done() for claim in claims) >= 30, timeout=10)
        answered = [claim for claim in claims if claim.done()]
        assert len(answered) == 30
        assert all(len(claim.result().json()["runs"]) == 1 for claim in answered)
        for claim in claims:
            claim.cancel()
    assert api.stop() == 0  # its connections' backends report their statistics as they exit
    # Every look runs claim_runs, which reads key_breakers once: count the reads.
    read = "SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables"
    read += " WHERE schemaname = %s AND relname = 'key_breakers'"
    counts = [-1]
    while True:
        counts.append(sql.execute(read, [schema]).fetchone()[0])  # type: ignore[index]
        if counts[-1] == counts[-2]:
            break
        await asyncio.sleep(0.5)  # until the exiting backends' figures are all in
    # 150 first looks, the probes that looked, then per run about one look to take it and
    # one after (it took all it asked for: the next of its kind looks).
    assert counts[-1] <= 150 + looks + 3 * 30, counts[-1]


async def all_waiting(
    workers: list[RemoteWorker],
) -> tuple[list[asyncio.Task[httpx.Response]], int]:
    """Start a long claim of each worker's workloop 0 and return once every one waits
    (a claim of it with no wait is then answered 429), with the number of such probes that
    looked (they took the place first: their long claim was refused, and sent again)."""
    waits = {"workloop": 0, "demand": 1, "wait_seconds": 60}
    claims = [asyncio.create_task(worker.post("/claim", waits)) for worker in workers]
    looks = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    pending = set(range(len(workers)))
    while pending:
        assert loop.time() < deadline, f"{len(pending)} claims never waited"
        for i in sorted(pending):
            if claims[i].done():  # refused: a probe had the place
                assert claims[i].result().status_code == 429, claims[i].result().text
                claims[i] = asyncio.create_task(workers[i].post("/claim", waits))
                continue
            probe = await workers[i].post("/claim", {**waits, "wait_seconds": 0})
            if probe.status_code == 429:
                pending.discard(i)
            else:
                looks += 1
        await asyncio.sleep(0.05)
    return claims, looks


async def test_no_run_waits_while_a_claim_that_could_take_it_sleeps(
    app: Tidegate, start_api: Callable[..., ApiServer], sql: psycopg.Connection
) -> None:
    """Runs of two kinds' tasks arrive in batches of every size, while claims of both
    kinds sleep, look and come back: each is taken on a wake, never left for a claim's
    deadline (60 s) or a worker's next poll."""
    api = start_api()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=api.url, timeout=90, limits=limits) as client:
        token = await worker_token(client, "fleet", ["*"])
        kinds = {"echo": "manual>*:2", "noop": "default:1"}
        workers = [
            await RemoteWorker.register(client, token, workloops, [task])
            for task, workloops in kinds.items()
            for _ in range(10)
        ]
        done: list[int] = []

        async def work(worker: RemoteWorker) -> None:
            while True:
                answer = await worker.post(
                    "/claim", {"workloop": 0, "demand": 2, "wait_seconds": 60}
                )
                assert answer.status_code == 200, answer.text
                for run in answer.json()["runs"]:
                    assert (await worker.succeed(run)).status_code == 200
                    done.append(run["id"])

        working = [asyncio.create_task(work(worker)) for worker in workers]
        try:
            rng = random.Random(7)
            ids: list[int] = []
            while len(ids) < 200:
                batch = [
                    NewRun(rng.choice(list(kinds)), {}) for _ in range(rng.choice([1, 1, 2, 5, 17]))
                ]
                ids += [run.id for run in await app.aenqueue_many(batch)]
                await asyncio.sleep(rng.random() * 0.02)
            await wait_until(lambda: len(done) >= len(ids), timeout=30)
        finally:
            for task in working:
                task.cancel()
    assert sorted(done) == sorted(ids)


KIND = (("default",), ("echo",))


async def test_a_wake_while_every_claim_of_its_kind_looks_makes_one_look_again() -> None:
    """A run whose NOTIFY comes while the claims that could take it are all looking (their
    reads may predate it) is not left until a deadline: one of them looks again."""
    queue = Queue(KIND[0])
    turn = Turn(queue, "fleet", deadline=0.0)
    turn.look()
    queue.wake()  # the NOTIFY: no claim of the kind asleep
    turn.looked(asked=1, got=0)  # came back empty
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    await asyncio.wait_for(turn.sleep(30, never), 5)  # back at once, to look again
    turn.look()
    turn.looked(asked=1, got=0)
    with pytest.raises(TimeoutError):  # nothing new: it sleeps
        await asyncio.wait_for(turn.sleep(30, never), 0.2)


async def test_a_claim_woken_that_leaves_without_looking_wakes_the_next() -> None:
    """A claim woken for a new run that goes (its deadline, its client) before it looks
    hands the wake to the next claim of its kind."""
    loop = asyncio.get_running_loop()
    claims = Claims(lambda: loop.create_future(), "available", max_per_token=10)
    claims.listener.task = loop.create_future()  # as if listening already
    claims.listener.listening.set()
    never: asyncio.Future[None] = loop.create_future()
    woken: list[str] = []

    async def claim(worker: str, looks: bool) -> None:
        async with claims.claiming("fleet", (worker, 0), KIND, loop.time() + 30) as turn:
            await turn.sleep(30, never)
            woken.append(worker)
            if looks:  # and finds nothing
                turn.look()
                turn.looked(asked=1, got=0)

    waiting = [
        asyncio.create_task(claim(worker, looks))
        for worker, looks in (("w1", False), ("w2", True), ("w3", True))
    ]
    await wait_until(lambda: KIND in claims.queues and len(claims.queues[KIND].asleep) == 3)
    claims._ready("available", "default")
    await asyncio.wait_for(asyncio.gather(*waiting[:2]), 5)
    assert woken == ["w1", "w2"]  # the first, gone unlooked, then the next in its place
    assert not waiting[2].done()
    waiting[2].cancel()


async def test_a_remote_worker_with_a_free_slot_takes_a_new_run_at_once_not_at_its_next_poll(
    app: Tidegate, remote: Remote, sql: psycopg.Connection
) -> None:
    """A remote worker hears of new runs only through a claim waiting at the API: after
    a claim that took fewer runs than it has free slots, the next waits there at once,
    rather than after its poll (here 10 s), so a run enqueued meanwhile starts within
    moments."""
    first = app.enqueue("async_sleep", {"seconds": 5})
    link = RemoteLink(remote.url, remote.token, 10.0)
    async with running_worker(app, "manual>*:2", link, poll_seconds=10.0):
        await wait_until(lambda: app.get_run(first.id).state is RunState.RUNNING, 10)  # type: ignore[union-attr]
        second = app.enqueue("echo", {"n": 2})
        enqueued = time.monotonic()
        await wait_until(lambda: app.get_run(second.id).state is RunState.SUCCEEDED, 30)  # type: ignore[union-attr]
        waited = time.monotonic() - enqueued
    assert waited < 5, f"the second run waited {waited:.1f}s for a free slot's claim"
