"""The waiting room: a caller refused by a limit gets a place, and room goes to places in
the order they were given, whichever API process each caller reaches."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from itertools import pairwise
from pathlib import Path

import httpx
import psycopg

from tests.http_fixtures import (
    ADMIN,
    ApiServer,
    assert_problem,
    counts,
    create_project,
    create_trigger,
)
from tidegate.admission import PLACE_FIELD, PLACE_GRACE_SECONDS


def place_of(response: httpx.Response) -> dict[str, str]:
    """The field a caller sends back: its ticket, as it was given."""
    assert_problem(response, 429)
    return {PLACE_FIELD: response.headers[PLACE_FIELD]}


@contextlib.asynccontextmanager
async def rate_on_two_processes(
    start_api: Callable[..., ApiServer], rate: float
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, str]]:
    """A client of each of two API processes, and the URL of a trigger of a project with
    an ingest rate of ``rate`` and a burst of one, spent by a first webhook."""
    one, two = start_api(), start_api()
    async with (
        httpx.AsyncClient(base_url=one.url, timeout=20) as first,
        httpx.AsyncClient(base_url=two.url, timeout=20) as second,
    ):
        await create_project(first, "acme", ingest_rate=rate, ingest_burst=1)
        url = (await create_trigger(first, "acme", "orders", mode="async", task="echo"))["url"]
        assert (await first.post(url, json={})).status_code == 202
        yield first, second, url


async def test_places_are_served_in_order_and_lapse_across_two_api_processes(
    start_api: Callable[..., ApiServer], sql: psycopg.Connection
) -> None:
    async with rate_on_two_processes(start_api, 0.5) as (first, second, url):
        a = await first.post(url, json={"caller": "a"})
        b = await second.post(url, json={"caller": "b"})
        assert ";ahead=0;" in a.headers[PLACE_FIELD]
        assert ";ahead=1;" in b.headers[PLACE_FIELD]

        # At a's time, room is a's: b, come early through the other process, waits.
        await asyncio.sleep(int(a.headers["retry-after"]))
        early_at = time.monotonic()
        early = await first.post(url, json={"caller": "b"}, headers=place_of(b))
        assert early.headers[PLACE_FIELD].split(";")[0] == b.headers[PLACE_FIELD].split(";")[0]
        assert ";ahead=1;" in early.headers[PLACE_FIELD]
        assert (
            await second.post(url, json={"caller": "a"}, headers=place_of(a))
        ).status_code == 202

        # b gives up. c, refused after it, gets in at the instant the rate reserved for
        # it, whether b comes or not: b's place holds b's instant, not c's.
        c = await second.post(url, json={"caller": "c"})
        assert ";ahead=1;" in c.headers[PLACE_FIELD]
        ticket_c = place_of(c)

        async def c_admitted() -> bool:
            nonlocal ticket_c
            answer = await first.post(url, json={"caller": "c"}, headers=ticket_c)
            if answer.status_code == 202:
                return True
            ticket_c = place_of(answer)
            return False

        await wait_until_async(c_admitted, timeout=20)
        # Once b's place has lapsed (the grace past the whole second b was last told),
        # its ticket is stale: b is a newcomer, with a new place.
        told_b = early_at + int(early.headers["retry-after"]) + PLACE_GRACE_SECONDS
        await asyncio.sleep(max(0.0, told_b - time.monotonic()) + 0.5)
        late = await first.post(url, json={"caller": "b"}, headers=place_of(b))
        assert_problem(late, 429)
        assert late.headers[PLACE_FIELD].split(";")[0] != b.headers[PLACE_FIELD].split(";")[0]
    assert counts(sql) == (3, 3)


async def wait_until_async(check: Callable[[], object], timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():  # type: ignore[misc]
        assert loop.time() < deadline, "not admitted in time"
        await asyncio.sleep(0.2)


async def test_a_forged_ticket_is_a_newcomer_and_no_ticket_still_gets_an_exact_429(
    api: ApiServer, sql: psycopg.Connection
) -> None:
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        await create_project(client, "acme", ingest_rate=0.1, ingest_burst=2)
        url = (await create_trigger(client, "acme", "orders", mode="async", task="echo"))["url"]
        # No line yet: a forged ticket is harmless, the caller is admitted as anyone.
        for forged in ("not a ticket", f'"{uuid.uuid4()}";ahead=0;due=0.000'):
            answer = await client.post(url, json={}, headers={PLACE_FIELD: forged})
            assert answer.status_code == 202, answer.text
        # The rate is spent: without a ticket, a 429 with Retry-After and a place.
        refused = await client.post(url, json={})
        assert_problem(refused, 429)
        assert int(refused.headers["retry-after"]) >= 1
        assert ";ahead=0;" in refused.headers[PLACE_FIELD]
        # The RateLimit field says what the whole seconds round up: the due time.
        due = re.search(r";t=(\d+);due=(\d+\.\d{3})$", refused.headers["ratelimit"])
        assert due, refused.headers["ratelimit"]
        assert (
            int(due[1]) == int(refused.headers["retry-after"]) == max(1, math.ceil(float(due[2])))
        )
        assert refused.headers[PLACE_FIELD].endswith(f";due={due[2]}")
        # A forged ticket does not jump the line: it goes behind the real place.
        forged = await client.post(url, json={}, headers={PLACE_FIELD: str(uuid.uuid4())})
        assert_problem(forged, 429)
        assert ";ahead=1;" in forged.headers[PLACE_FIELD]
    assert counts(sql) == (2, 2)


async def test_callers_share_a_second_when_the_rate_has_room_for_them_in_any_order(
    api: ApiServer, sql: psycopg.Connection
) -> None:
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        await create_project(client, "acme", ingest_rate=2, ingest_burst=1)
        url = (await create_trigger(client, "acme", "orders", mode="async", task="echo"))["url"]
        assert (await client.post(url, json={})).status_code == 202
        a, b, c = [await client.post(url, json={"caller": n}) for n in "abc"]
        # The rate reserves an instant for each place, one interval (0.5 s) apart: a
        # and b are due within the next second.
        reserved = [due for (due,) in sql.execute("SELECT due_at FROM waiting_places ORDER BY id")]
        assert [(later - before).total_seconds() for before, later in pairwise(reserved)] == [
            0.5,
            0.5,
        ]
        assert [int(r.headers["retry-after"]) for r in (a, b)] == [1, 1]
        await asyncio.sleep(1)
        # Back at the second they were told, in the other order: both are admitted,
        # each on the instant reserved for it.
        assert (
            await client.post(url, json={"caller": "b"}, headers=place_of(b))
        ).status_code == 202
        assert (
            await client.post(url, json={"caller": "a"}, headers=place_of(a))
        ).status_code == 202
        # c, back when a and b were told, is early: it keeps its place, told again.
        early = await client.post(url, json={"caller": "c"}, headers=place_of(c))
        if early.status_code != 202:  # a slow machine may reach c's instant by now
            assert early.headers[PLACE_FIELD].split(";")[0] == c.headers[PLACE_FIELD].split(";")[0]
            await asyncio.sleep(int(early.headers["retry-after"]))
            early = await client.post(url, json={"caller": "c"}, headers=place_of(early))
        assert early.status_code == 202
    # The places spent the rate once each, when they were given: its arrival time is
    # one interval past c's instant.
    (tat,) = sql.execute("SELECT ingest_tat FROM projects").fetchone()  # type: ignore[misc]
    assert (tat - reserved[2]).total_seconds() == 0.5
    assert counts(sql) == (4, 4)


async def test_a_reservation_admits_one_webhook_however_many_bring_its_ticket_at_once(
    start_api: Callable[..., ApiServer], sql: psycopg.Connection
) -> None:
    """A ticket copied to many webhooks, sent at once through two API processes when its
    instant comes: one is admitted on the reservation; every other is a newcomer, and
    the rate has no room for them."""
    async with rate_on_two_processes(start_api, 0.2) as (first, second, url):
        refused = await first.post(url, json={"caller": "a"})
        ticket = place_of(refused)
        await asyncio.sleep(int(refused.headers["retry-after"]))
        answers = await asyncio.gather(
            *((first, second)[n % 2].post(url, json={"copy": n}, headers=ticket) for n in range(10))
        )
    assert sorted(a.status_code for a in answers) == [202] + [429] * 9
    assert counts(sql) == (2, 2)


async def test_a_reservation_that_came_due_is_kept_while_a_cap_holds_its_caller(
    api: ApiServer, sql: psycopg.Connection
) -> None:
    """A caller whose reserved instant came due but whose key's backlog is full: its
    place in the backlog's line takes the same ticket, and the rate's reservation lives
    as long, so when room frees it is admitted without spending the rate again."""
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        await create_project(client, "acme", ingest_rate=0.5, ingest_burst=1, backlog_cap=1)
        url = (await create_trigger(client, "acme", "orders", mode="async", task="echo"))["url"]
        first = await client.post(url, json={"caller": "first"})
        assert first.status_code == 202
        a = await client.post(url, json={"caller": "a"})
        # Three more behind a: the rate's next free instant is 8 s away.
        for n in "bcd":
            assert_problem(await client.post(url, json={"caller": n}), 429)
        (tat,) = sql.execute("SELECT ingest_tat FROM projects").fetchone()  # type: ignore[misc]
        await asyncio.sleep(int(a.headers["retry-after"]))
        full = await client.post(url, json={"caller": "a"}, headers=place_of(a))
        assert_problem(full, 503)
        assert full.headers[PLACE_FIELD].split(";")[0] == a.headers[PLACE_FIELD].split(";")[0]
        # Room in the backlog: the first run is cancelled (no worker took it).
        cancelled = await client.post(f"/runs/{first.json()['run_id']}/cancel", headers=ADMIN)
        assert cancelled.status_code == 200, cancelled.text
        # Back at the backlog's time, past its first place's lapse and before the rate's
        # next free instant: admitted on its reservation.
        await asyncio.sleep(int(full.headers["retry-after"]))
        done = await client.post(
            url, json={"caller": "a"}, headers={PLACE_FIELD: full.headers[PLACE_FIELD]}
        )
        assert done.status_code == 202, done.text
    assert sql.execute("SELECT ingest_tat FROM projects").fetchone() == (tat,)
    assert sql.execute(
        "SELECT count(*) FROM waiting_places WHERE ticket = %s",
        [a.headers[PLACE_FIELD].split(";")[0].strip('"')],
    ).fetchone() == (0,)


async def test_a_ticket_brought_to_another_keys_full_backlog_gets_a_503_not_an_error(
    api: ApiServer,
) -> None:
    """A caller whose reservation came due holds a place in key a's backlog line; the same
    ticket on a webhook of key b, whose backlog is full too, gets a place there as well."""
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        await create_project(client, "acme", ingest_rate=0.5, ingest_burst=1, backlog_cap=1)
        url = (
            await create_trigger(client, "acme", "orders", mode="async", task="echo", key_from="/k")
        )["url"]
        assert (await client.post(url, json={"k": "a"})).status_code == 202
        refused = await client.post(url, json={"k": "a", "n": 1})
        await asyncio.sleep(int(refused.headers["retry-after"]))
        full_a = await client.post(url, json={"k": "a", "n": 1}, headers=place_of(refused))
        assert_problem(full_a, 503)
        ticket = {PLACE_FIELD: full_a.headers[PLACE_FIELD]}

        place_b: dict[str, str] = {}

        async def b_admitted() -> bool:
            answer = await client.post(url, json={"k": "b"}, headers=place_b)
            if answer.status_code == 202:
                return True
            place_b.update(place_of(answer))
            return False

        await wait_until_async(b_admitted, timeout=20)  # once the rate has room: b is full
        full_b = await client.post(url, json={"k": "b", "n": 2}, headers=ticket)
        assert_problem(full_b, 503)
        assert full_b.headers[PLACE_FIELD].split(";")[0] == ticket[PLACE_FIELD].split(";")[0]


def example_client() -> Callable[..., httpx.Response]:
    """The ``deliver`` of docs/waiting-room.md, from its Python block as it is."""
    text = (Path(__file__).parent.parent / "docs" / "waiting-room.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, re.S)
    namespace: dict[str, object] = {}
    exec(block, namespace)
    return namespace["deliver"]  # type: ignore[return-value]


async def test_the_example_client_of_the_docs_gets_in_in_the_order_it_was_refused(
    api: ApiServer, sql: psycopg.Connection
) -> None:
    deliver = example_client()
    async with httpx.AsyncClient(base_url=api.url, timeout=20) as client:
        await create_project(client, "acme", ingest_rate=1, ingest_burst=1)
        url = (await create_trigger(client, "acme", "orders", mode="async", task="echo"))["url"]
    firsts: list[tuple[int, str]] = []  # each webhook's first answer: (places ahead, key)

    def note(response: httpx.Response) -> None:
        if PLACE_FIELD not in response.request.headers:
            place = response.headers.get(PLACE_FIELD, ";ahead=-1;")
            ahead = int(place.split(";ahead=")[1].split(";")[0])
            firsts.append((ahead, response.request.headers["idempotency-key"]))

    with httpx.Client(base_url=api.url, timeout=20, event_hooks={"response": [note]}) as http:
        done = await asyncio.gather(
            *(asyncio.to_thread(deliver, http, url, {"n": n}, f"k{n}") for n in range(4))
        )
    assert [a.status_code for a in done] == [202] * 4
    # Admitted in turn: the one that found room, then the others in their places' order.
    admitted = sql.execute("SELECT idempotency_key FROM requests ORDER BY id").fetchall()
    assert [key for (key,) in admitted] == [key for _, key in sorted(firsts)]
    assert [ahead for ahead, _ in sorted(firsts)] == [-1, 0, 1, 2]
    assert sql.execute("SELECT count(*) FROM waiting_places").fetchone() == (0,)
