"""Circuit breakers: a key whose downstream fails stops being claimed, and recovers.

Real ``tidegate serve --role api`` and ``tidegate worker`` processes, each test with
local workers and again with remote ones (``worker_mode``); the downstreams
are real HTTP servers in this process (``Endpoint``), one per port, so that each is its
own breaker key (``http://127.0.0.1:<port>``: a forwarding trigger's runs are keyed by
their destination).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from psycopg.rows import dict_row

from tests.conftest import Remote, WorkerOf, wait_until
from tests.http_fixtures import ADMIN, ApiServer, create_project, create_trigger
from tidegate import DownstreamFailing, Retry, Tidegate
from tidegate.cli import main
from tidegate.forward import breaker_key_of
from tidegate.policies import force_breaker, set_key_policy


class Endpoint:
    """An HTTP endpoint on a free port answering every request as ``mode`` says: ``ok``
    (200), ``fail`` (500), ``slow_fail`` (500 after ``delay`` seconds), ``staggered_fail``
    (500, every other request after ``delay`` seconds), ``hang`` (200 after ``delay``
    seconds), ``busy`` (429 with ``Retry-After: 1``) or ``bad`` (400). It records when
    each request came and went."""

    def __init__(self, mode: str = "ok", delay: float = 0.3) -> None:
        self.mode = mode
        self.delay = delay
        self.arrivals = 0
        self.spans: list[tuple[float, float, str]] = []
        """(arrived, answered, mode) of every request answered."""
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                arrived, mode = time.monotonic(), endpoint.mode
                with endpoint.lock:
                    endpoint.arrivals += 1
                    late = endpoint.arrivals % 2 == 0
                self.rfile.read(int(self.headers.get("content-length", 0)))
                if mode in ("slow_fail", "hang") or (mode == "staggered_fail" and late):
                    time.sleep(endpoint.delay)
                status = {"ok": 200, "hang": 200, "bad": 400, "busy": 429}.get(mode, 500)
                self.send_response(status)
                if mode == "busy":
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")
                with endpoint.lock:
                    endpoint.spans.append((arrived, time.monotonic(), mode))

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.key = breaker_key_of(self.url)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def hits(self) -> int:
        """Requests that arrived, answered or not yet."""
        return self.arrivals

    def most_at_once(self, since: float) -> int:
        """The most requests that arrived after ``since`` and were in flight together."""
        with self.lock:
            spans = [(start, end) for start, end, _ in self.spans if start >= since]
        edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
        most = now = 0
        for _, step in edges:
            now += step
            most = max(most, now)
        return most

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoints() -> Iterator[Callable[..., Endpoint]]:
    started: list[Endpoint] = []

    def start(mode: str = "ok", delay: float = 0.3) -> Endpoint:
        started.append(Endpoint(mode, delay))
        return started[-1]

    yield start
    for endpoint in started:
        endpoint.stop()


@pytest.fixture
async def client(start_api: Callable[..., ApiServer]) -> AsyncIterator[httpx.AsyncClient]:
    api = start_api(max_attempts=50)
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
        await create_project(client, "acme")
        yield client


async def set_policy(client: httpx.AsyncClient, lane: str, key: str, **fields: Any) -> None:
    response = await client.put(f"/admin/lanes/{lane}/keys/{key}", json=fields, headers=ADMIN)
    assert response.status_code == 200, response.text


async def forwarder(
    client: httpx.AsyncClient, name: str, endpoint: Endpoint, mode: str = "async", **fields: Any
) -> dict[str, Any]:
    return await create_trigger(client, "acme", name, mode=mode, forward_url=endpoint.url, **fields)


async def send(client: httpx.AsyncClient, trigger: dict[str, Any], count: int) -> list[int]:
    ids = []
    for n in range(count):
        response = await client.post(trigger["url"], json={"n": n})
        assert response.status_code == 202, response.text
        ids.append(response.json()["run_id"])
    return ids


def breaker(sql: psycopg.Connection, lane: str, key: str) -> dict[str, Any] | None:
    return (
        sql.cursor(row_factory=dict_row)
        .execute(
            "SELECT b.*, breaker_state(b) AS state FROM key_breakers b"
            " WHERE lane = %s AND key = %s",
            [lane, key],
        )
        .fetchone()
    )


def running(sql: psycopg.Connection, key: str) -> int:
    (count,) = sql.execute(
        "SELECT count(*) FROM runs WHERE key = %s AND state = 'running'", [key]
    ).fetchone() or (0,)
    return int(count)


def probes(sql: psycopg.Connection) -> int:
    (count,) = sql.execute(
        "SELECT count(*) FROM runs WHERE probe AND state = 'running'"
    ).fetchone() or (0,)
    return int(count)


def states(sql: psycopg.Connection, ids: list[int]) -> dict[str, int]:
    rows = sql.execute(
        "SELECT state::text, count(*) FROM runs WHERE id = ANY(%s) GROUP BY state", [ids]
    ).fetchall()
    return dict(rows)


async def test_an_open_breaker_stops_its_keys_runs_being_claimed_while_other_keys_flow(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    endpoints: Callable[..., Endpoint],
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    dead, live = endpoints("fail"), endpoints("ok")
    await set_policy(client, "default", "*", breaker_failures=3, breaker_cooldown_seconds=600)
    to_dead = await forwarder(client, "dead", dead)
    to_live = await forwarder(client, "live", live)
    doomed = await send(client, to_dead, 10)
    start_worker_process("manual>*:2", remote=worker_mode)

    fine = await send(client, to_live, 20)
    await wait_until(lambda: states(sql, fine) == {"succeeded": 20})

    # Three failures opened it. Runs claimed meanwhile may add some: the other slot's,
    # and those claimed into slots freed before the failures were written (at most
    # breaker_failures - 1 + 2 x slots in all).
    assert 3 <= dead.hits <= 6
    state = breaker(sql, "default", dead.key)
    assert state is not None and state["state"] == "open" and state["trips"] == 1
    hits = dead.hits
    await asyncio.sleep(1.5)  # three polls: nothing claims the key's runs
    assert dead.hits == hits
    assert states(sql, doomed).keys() <= {"available", "scheduled"}
    assert (
        sum(
            attempts
            for (attempts,) in sql.execute(
                "SELECT attempt FROM runs WHERE id = ANY(%s)", [doomed]
            ).fetchall()
        )
        == hits
    )  # no attempt spent while open

    listed = (await client.get("/admin/breakers", headers=ADMIN)).json()
    assert [(b["lane"], b["key"], b["state"]) for b in listed] == [("default", dead.key, "open")]
    assert listed[0]["failures"] >= 3
    metrics = (await client.get("/metrics", headers=ADMIN)).text
    assert f'tidegate_key_held{{by="breaker",key="{dead.key}",lane="default"}} 1.0' in metrics
    assert f'tidegate_key_held{{by="breaker",key="{live.key}",lane="default"}} 1.0' not in metrics


async def test_after_the_cooldown_one_probe_goes_through_and_its_success_closes_it(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    endpoints: Callable[..., Endpoint],
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    flaky = endpoints("fail")
    await set_policy(
        client, "default", "*", breaker_failures=2, breaker_cooldown_seconds=2, breaker_probes=1
    )
    ids = await send(client, await forwarder(client, "flaky", flaky), 6)
    start_worker_process("manual>*:3", remote=worker_mode)
    await wait_until(lambda: (breaker(sql, "default", flaky.key) or {}).get("state") == "open")
    # Runs claimed before it opened answer first; from then on, only the breaker lets
    # the key's runs through. A claim whose snapshot predates the opening can still
    # commit a run of the key just after (claims never lock breaker rows, docs/breakers.md):
    # look again a moment later.
    await wait_until(lambda: running(sql, flaky.key) == 0)
    await asyncio.sleep(0.3)
    await wait_until(lambda: running(sql, flaky.key) == 0)
    (left,) = sql.execute(
        "SELECT extract(epoch FROM open_until - now()) FROM key_breakers WHERE key = %s",
        [flaky.key],
    ).fetchone() or (None,)
    switched = time.monotonic()
    flaky.mode = "ok"

    await wait_until(lambda: states(sql, ids) == {"succeeded": 6})

    recovered = sorted(start for start, _, mode in flaky.spans if mode == "ok")
    # The probe comes once the cooldown is over, alone; the others follow once its
    # success has closed the breaker.
    assert recovered[0] >= switched + float(left) - 0.1
    probe_answered = min(end for _, end, mode in flaky.spans if mode == "ok")
    assert all(start >= probe_answered for start in recovered[1:])
    state = breaker(sql, "default", flaky.key)
    assert state is not None and (state["state"], state["trips"]) == ("closed", 1)
    assert (await client.get("/admin/breakers", headers=ADMIN)).json() == []


async def test_a_failed_probe_opens_it_again_for_twice_as_long_up_to_the_cap(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    endpoints: Callable[..., Endpoint],
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    dead = endpoints("fail")
    await set_policy(
        client,
        "default",
        "*",
        breaker_failures=1,
        breaker_cooldown_seconds=0.5,
        breaker_max_cooldown_seconds=2,
    )
    await send(client, await forwarder(client, "dead", dead), 3)
    start_worker_process("manual>*:1", remote=worker_mode)
    seen: list[float] = []

    def cooldowns() -> bool:
        state = breaker(sql, "default", dead.key)
        if state and state["cooldown_seconds"] and state["cooldown_seconds"] not in seen[-1:]:
            seen.append(state["cooldown_seconds"])
        return len(seen) >= 3 and dead.hits >= 6

    await wait_until(cooldowns, timeout=20, interval=0.02)

    assert seen == [0.5, 1.0, 2.0]  # and there it stays
    spans = sorted(start for start, _, _ in dead.spans)
    # The first two runs reach the endpoint before the first outcome is counted (a slot
    # frees when its handler returns, before its outcome is written); after that trip,
    # requests are probes spaced by the growing cooldown.
    gaps = [later - earlier for earlier, later in itertools.pairwise(spans[2:])]
    assert all(gap >= 0.4 for gap in gaps), gaps


async def test_a_half_open_round_escalates_the_cooldown_once_however_its_probes_end(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    endpoints: Callable[..., Endpoint],
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    """Two probes of one half-open round fail 0.3 s apart, in separate completion
    batches: the first reopens the breaker for twice the cooldown, the second, claimed
    before that, is not news. Each reopening comes a whole cooldown after the one before
    (a new round's probe), so the cooldown doubles once per round."""
    dead = endpoints("staggered_fail", delay=0.3)
    await set_policy(
        client,
        "default",
        "*",
        breaker_failures=1,
        breaker_cooldown_seconds=0.5,
        breaker_max_cooldown_seconds=8,
        breaker_probes=2,
    )
    await send(client, await forwarder(client, "dead", dead), 30)
    start_worker_process("manual>*:4", remote=worker_mode)
    openings: list[tuple[Any, float, int]] = []

    def watched() -> bool:
        state = breaker(sql, "default", dead.key)
        if state and state["opened_at"] is not None:
            seen = (state["opened_at"], state["cooldown_seconds"], state["trips"])
            if seen not in openings[-1:]:
                openings.append(seen)
        return bool(openings) and openings[-1][1] >= 2.0

    await wait_until(watched, timeout=30, interval=0.01)

    cooldowns = [cooldown for _, cooldown, _ in openings]
    assert cooldowns == [0.5, 1.0, 2.0], openings
    assert [trips for _, _, trips in openings] == [1, 2, 3], openings
    for (opened, cooldown, _), (reopened, _, _) in itertools.pairwise(openings):
        assert (reopened - opened).total_seconds() >= cooldown, openings


async def test_half_open_probes_in_flight_never_exceed_the_policy_across_four_workers(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    endpoints: Callable[..., Endpoint],
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    dead = endpoints("slow_fail", delay=0.4)
    await set_policy(
        client,
        "default",
        "*",
        breaker_failures=1,
        breaker_cooldown_seconds=0.5,
        breaker_max_cooldown_seconds=0.5,
        breaker_probes=2,
    )
    await send(client, await forwarder(client, "dead", dead), 40)
    for _ in range(4):
        start_worker_process(
            "manual>*:4", remote=worker_mode
        )  # 16 slots, all wanting the key's runs
    await wait_until(lambda: (breaker(sql, "default", dead.key) or {}).get("trips", 0) >= 1)
    # Runs claimed before the trip answer within 0.4 s; after that, only probes run.
    probes_from = time.monotonic() + 1.0
    probing: list[int] = []

    def probed_enough() -> bool:
        (running,) = sql.execute(
            "SELECT count(*) FROM runs WHERE probe AND state = 'running'"
        ).fetchone() or (0,)
        probing.append(running)
        return sum(1 for start, _, _ in dead.spans if start >= probes_from) >= 12

    await wait_until(probed_enough, timeout=60, interval=0.01)

    assert dead.most_at_once(since=probes_from) == 2
    assert max(probing) <= 2
    state = breaker(sql, "default", dead.key)
    assert state is not None and state["trips"] >= 6


@pytest.mark.parametrize("answer", ["hang", "busy"])
async def test_timeouts_and_429s_count_as_failures(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    endpoints: Callable[..., Endpoint],
    start_worker_process: Callable[..., Any],
    answer: str,
    worker_mode: Remote | None,
) -> None:
    # The hanging endpoint answers long after the forward's timeout, the busy one at once
    # and well inside it: each attempt's failure is the one the test names however slow
    # a loaded machine makes the request's way to the endpoint.
    down = endpoints(answer, delay=6)
    await set_policy(client, "default", "*", breaker_failures=2, breaker_cooldown_seconds=600)
    timeout = 1 if answer == "hang" else 10
    trigger = await forwarder(client, "down", down, forward_timeout_seconds=timeout)
    ids = await send(client, trigger, 4)
    start_worker_process("manual>*:1", remote=worker_mode)

    await wait_until(lambda: (breaker(sql, "default", down.key) or {}).get("state") == "open")

    await asyncio.sleep(1.5)  # its 1 s Retry-After, or the backoff, is over: still waiting
    rows = sql.execute(
        "SELECT attempt, max_attempts, errors -> 0 ->> 'error' FROM runs"
        " WHERE id = ANY(%s) AND attempt > 0",
        [ids],
    ).fetchall()
    # Two failures open it; a third run may be claimed into the slot freed before the
    # second failure was written (breaker_failures - 1 + 2 x slots).
    assert len(rows) in (2, 3)
    if answer == "busy":  # DownstreamFailing: counted, but the attempt given back
        assert [(a, m) for a, m, _ in rows] == [(1, 51)] * len(rows)
        assert all("answered 429" in error for *_, error in rows)
    else:
        assert all("no answer within 1" in error for *_, error in rows)


async def test_a_rescued_probe_frees_its_place_for_the_next_one(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    endpoints: Callable[..., Endpoint],
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    down = endpoints("fail", delay=30)
    await set_policy(
        client, "default", "*", breaker_failures=1, breaker_cooldown_seconds=0.5, breaker_probes=1
    )
    ids = await send(client, await forwarder(client, "down", down, forward_timeout_seconds=60), 3)
    first = start_worker_process("manual>*:2", remote=worker_mode)
    await wait_until(lambda: (breaker(sql, "default", down.key) or {}).get("trips") == 1)
    down.mode = "hang"  # the next probe hangs: its worker dies holding it
    await wait_until(lambda: probes(sql) == 1)
    first.kill()
    down.mode = "ok"
    start_worker_process("manual>*:2", remote=worker_mode)

    # Its lease lapses, the rescuer hands it back (no longer a probe), and the next
    # probe, which succeeds, closes the breaker: every run goes through.
    await wait_until(lambda: states(sql, ids) == {"succeeded": 3})
    state = breaker(sql, "default", down.key)
    assert state is not None and state["state"] == "closed"
    rescued = sql.execute(
        "SELECT count(*) FROM runs, jsonb_array_elements(errors) AS e"
        " WHERE id = ANY(%s) AND e ->> 'error' LIKE 'lease expired%%'",
        [ids],
    ).fetchone()
    # The probe; and maybe a run claimed before the trip was written (into a slot freed
    # when a failing handler returned) that met the endpoint hanging too.
    assert rescued in ((1,), (2,))


async def test_bad_input_does_not_trip_the_breaker_of_its_key(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    endpoints: Callable[..., Endpoint],
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    refusing = endpoints("bad")
    await set_policy(client, "default", "*", breaker_failures=2)
    ids = await send(client, await forwarder(client, "picky", refusing), 8)
    start_worker_process("manual>*:2", remote=worker_mode)

    await wait_until(lambda: states(sql, ids) == {"discarded": 8})

    # A 400 is the endpoint refusing the request (a Discard): its runs end at once, and
    # the endpoint, which is up, is not cut off.
    assert refusing.hits == 8
    assert breaker(sql, "default", refusing.key) is None


async def test_a_sync_webhook_whose_breaker_is_open_gets_503_with_the_cooldown_left(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    endpoints: Callable[..., Endpoint],
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    dead = endpoints("fail")
    await set_policy(client, "fast_lane", "*", breaker_failures=2, breaker_cooldown_seconds=30)
    trigger = await forwarder(client, "quote", dead, mode="sync")
    start_worker_process("fast_lane:1 manual>*:1", remote=worker_mode)

    answers = [await client.post(trigger["url"], json={"n": n}) for n in range(2)]
    # The endpoint's own failure is passed on, as a proxy would, and counted.
    assert [a.status_code for a in answers] == [500, 500]
    refused = await client.post(trigger["url"], json={"n": 3})

    assert refused.status_code == 503, refused.text
    assert 25 <= int(refused.headers["retry-after"]) <= 30
    assert dead.key in refused.json()["detail"]
    (made,) = sql.execute("SELECT count(*) FROM runs WHERE key = %s", [dead.key]).fetchone() or ()
    assert made == 2  # the refused one made no run
    state = breaker(sql, "fast_lane", dead.key)
    assert state is not None and state["state"] == "open"
    # An async webhook to the same destination is still accepted: it waits.
    waiting = await forwarder(client, "later", dead)
    assert len(await send(client, waiting, 1)) == 1


async def test_an_admin_forces_a_breaker_open_and_hands_it_back(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    endpoints: Callable[..., Endpoint],
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    live = endpoints("ok")
    ids = await send(client, await forwarder(client, "live", live), 3)
    # A destination key holds slashes: percent-encoded, it is one path segment.
    path = f"/admin/lanes/default/breakers/{quote(live.key, safe='')}"
    forced = await client.put(path, json={"force": "open"}, headers=ADMIN)
    assert forced.status_code == 200, forced.text
    assert (forced.json()["key"], forced.json()["state"]) == (live.key, "forced_open")
    start_worker_process("manual>*:2", remote=worker_mode)

    await asyncio.sleep(1.5)  # three polls: nothing claims the key's runs
    assert live.hits == 0 and states(sql, ids) == {"available": 3}
    listed = (await client.get("/admin/breakers?lane=default", headers=ADMIN)).json()
    assert [(b["key"], b["state"]) for b in listed] == [(live.key, "forced_open")]

    released = await client.put(path, json={"force": None}, headers=ADMIN)
    assert released.json()["state"] == "closed"
    await wait_until(lambda: states(sql, ids) == {"succeeded": 3})
    assert (await client.get("/admin/breakers", headers=ADMIN)).json() == []


async def test_a_breaker_forced_closed_counts_nothing_and_lets_runs_through(
    client: httpx.AsyncClient,
    sql: psycopg.Connection,
    endpoints: Callable[..., Endpoint],
    start_worker_process: Callable[..., Any],
    worker_mode: Remote | None,
) -> None:
    dead = endpoints("fail")
    await set_policy(client, "default", "*", breaker_failures=1)
    path = f"/admin/lanes/default/breakers/{quote(dead.key, safe='')}"
    assert (await client.put(path, json={"force": "closed"}, headers=ADMIN)).status_code == 200
    ids = await send(client, await forwarder(client, "dead", dead), 2)
    start_worker_process("manual>*:2", remote=worker_mode)

    await wait_until(lambda: dead.hits >= 6)

    state = breaker(sql, "default", dead.key)
    assert state is not None and (state["state"], state["failures"]) == ("forced_closed", 0)
    assert states(sql, ids).keys() <= {"available", "scheduled", "running"}


async def test_breaker_settings_and_forces_out_of_bounds_get_422(
    client: httpx.AsyncClient,
) -> None:
    for fields in (
        {"breaker_ratio": 0},
        {"breaker_ratio": 1.5},
        {"breaker_failures": 0},
        {"breaker_probes": 1001},
        {"breaker_cooldown_seconds": float("inf")},
        {"breaker_window_seconds": 0},
        {"breaker_max_cooldown_seconds": 10**9},
    ):
        response = await client.put(
            "/admin/lanes/default/keys/*",
            content=json.dumps(fields).replace("Infinity", "1e999"),
            headers={**ADMIN, "content-type": "application/json"},
        )
        assert response.status_code == 422, (fields, response.text)
        assert next(iter(fields)) in response.text
    for force in ("half", 1, "OPEN"):
        response = await client.put(
            "/admin/lanes/default/breakers/k", json={"force": force}, headers=ADMIN
        )
        assert response.status_code == 422, response.text
    missing = await client.put("/admin/lanes/default/breakers/k", json={}, headers=ADMIN)
    assert missing.status_code == 422


async def test_downstream_failing_counts_for_the_breaker_and_gives_the_attempt_back(
    app: Tidegate, sql: psycopg.Connection, worker_of: WorkerOf
) -> None:
    calls: list[int] = []

    @app.task(name="call_partner", max_attempts=2)
    async def call_partner(**_: Any) -> str:
        calls.append(1)
        if len(calls) <= 3:
            raise DownstreamFailing("partner answered 503", retry_after=0.05)
        return "done"

    app.execute(set_key_policy("default", "partner", breaker_failures=10))
    run = app.enqueue("call_partner", key="partner")
    run_id = run.id
    async with worker_of(app, "manual>*:1"):
        await wait_until(lambda: (app.get_run(run_id) or run).state.finished)

    done = app.get_run(run_id)
    assert done is not None
    # Three failures given back, then the fourth attempt succeeds within max_attempts 2.
    assert (done.state, done.attempt, done.max_attempts) == ("succeeded", 4, 5)
    assert [e["error"] for e in done.errors] == ["DownstreamFailing: partner answered 503"] * 3
    state = breaker(sql, "default", "partner")
    assert state is not None and (state["state"], state["failures"]) == ("closed", 3)


def test_retry_delays_out_of_bounds_fail_in_the_handler_that_asks() -> None:
    for delay in (-1, float("nan"), float("inf"), 10**12, "5"):
        with pytest.raises(ValueError, match=r"delay_seconds|retry_after"):
            Retry(delay)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="retry_after"):
            DownstreamFailing("x", retry_after=delay)  # type: ignore[arg-type]
    # A reply that could not be stored (or sent) fails in the handler that gives it.
    for reply in ({"status": 500, "body": b"bytes"}, {"body": float("nan")}, [500], "500"):
        with pytest.raises(ValueError, match="reply"):
            DownstreamFailing("x", reply=reply)  # type: ignore[arg-type]


def test_the_cli_lists_and_forces_breakers(app: Tidegate, settings: Any) -> None:
    env = {"TIDEGATE_DATABASE_URL": settings.database_url, "TIDEGATE_SCHEMA": settings.schema}
    runner = CliRunner()
    forced = runner.invoke(
        main, ["keys", "force", "default", "https://a.example:443", "open"], env=env
    )
    assert forced.exit_code == 0, forced.output
    assert json.loads(forced.output)["state"] == "forced_open"
    listed = runner.invoke(main, ["keys", "breakers"], env=env)
    assert [(b["key"], b["state"]) for b in json.loads(listed.output)] == [
        ("https://a.example:443", "forced_open")
    ]
    released = runner.invoke(
        main, ["keys", "force", "default", "https://a.example:443", "auto"], env=env
    )
    assert json.loads(released.output)["state"] == "closed"
    assert json.loads(runner.invoke(main, ["keys", "breakers"], env=env).output) == []
    bad = runner.invoke(main, ["keys", "set", "default", "--breaker-ratio", "2"], env=env)
    assert bad.exit_code == 2 and "breaker-ratio" in bad.output
    wrong = runner.invoke(main, ["keys", "force", "default", "k", "half"], env=env)
    assert wrong.exit_code == 2
    shown = app.execute(force_breaker("default", "k", "closed"))
    assert shown is not None and shown["state"] == "forced_closed"
