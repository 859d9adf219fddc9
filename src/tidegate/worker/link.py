"""How a worker reaches its runs: PostgreSQL itself, or the API over HTTP.

A worker's workloops, completer and heartbeat are the same in both modes; only these
few calls differ. ``DatabaseLink`` runs the statements on the worker's own pool.
``RemoteLink`` (``tidegate worker --server-url URL --worker-token T``) asks the API to
run the same statements on its behalf (docs/workers.md): the worker needs no database
connection, and the API keeps every rule (lanes, key limits, fairness, breakers). In
remote mode the API also does what the local worker's stager and rescuer would, at each
heartbeat; schedules, pruning and counter folding are left to local workers.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

import aiohttp
from psycopg_pool import AsyncConnectionPool

from tidegate.forward import Delivery
from tidegate.runs import Run, run_row
from tidegate.storage.migrate import check_schema
from tidegate.storage.sql import query
from tidegate.worker.services import LinkError, fetch

if TYPE_CHECKING:
    from tidegate.app import Tidegate
    from tidegate.worker.runtime import Worker

Rows = list[tuple[Any, ...]]

REQUEST_SECONDS = 30.0
"""How long a call to the API may take, beyond a claim's own long poll."""
PASSING_STATUSES = frozenset({408, 429, 502, 503, 504})
"""Answers that say "not now" (the API, or a proxy before it, is overloaded, restarting
or cannot reach the database): the call is retried. A 500 is a refusal like any 4xx (a
statement the database refused, or a bug): a completer retrying it would hold back
every other outcome behind it."""


class DatabaseLink:
    """A worker on PostgreSQL: its own pool, the statements run there."""

    remote = False
    carries_outcomes = False
    """Whether a claim may carry the outcomes of its workloop's runs (``RemoteLink``)."""

    def __init__(self, app: Tidegate, size: int) -> None:
        self.app = app
        self.pool: AsyncConnectionPool = app.database.async_pool(size=size)

    async def open(self, worker: Worker) -> None:
        """Refuse a schema older or newer than this code; open the pool."""

        def prepare() -> None:
            with self.app.database.connect() as conn:
                check_schema(conn, worker.settings.schema)

        await asyncio.to_thread(prepare)
        await self.pool.open(wait=True)

    async def claim(self, params: dict[str, Any]) -> list[Run]:
        async with self.pool.connection() as conn:
            cursor = conn.cursor(row_factory=run_row)
            await cursor.execute(query("claim_runs"), params)
            return await cursor.fetchall()

    async def complete(self, params: dict[str, Any]) -> Rows:
        return await fetch(self.pool, "complete_runs", params)

    async def note_late(self, params: dict[str, Any]) -> None:
        await fetch(self.pool, "note_late_outcomes", params)

    async def beat(self, params: dict[str, Any]) -> list[int]:
        """Renew the worker's row and its runs' leases; return the runs renewed."""
        rows = await fetch(self.pool, "beat_worker", params)
        return list(rows[0][0])

    async def release(self, worker_id: str, run_ids: list[int], channel: str) -> None:
        """Hand back runs it holds and has not started: available again, the attempts
        not counted, their lanes woken."""
        params = {"ids": run_ids, "worker_id": worker_id, "channel": channel}
        await fetch(self.pool, "release_runs", params)

    async def leave(self, worker_id: str, handed_back: list[int], channel: str) -> None:
        """Hand back the runs it will not finish, and remove the worker's row."""
        if handed_back:
            await self.release(worker_id, handed_back, channel)
        await fetch(self.pool, "delete_worker", {"worker_id": worker_id})

    async def close(self) -> None:
        await self.pool.close()


class RemoteLink:
    """A worker on the API: the remote worker protocol, over HTTP (docs/workers.md)."""

    remote = True

    def __init__(self, server_url: str, token: str, poll_seconds: float) -> None:
        self.base = server_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"}
        self.session: aiohttp.ClientSession | None = None
        """Opened with the link, on the worker's loop. aiohttp, not httpx (which the
        forwarding task uses): a call costs the worker a quarter of the CPU, and a
        remote worker makes one a cycle (docs/benchmarks.md, "Remote workers")."""
        self.poll_seconds = poll_seconds
        self.path = ""
        self.claim_format = "objects"
        """``rows`` once the API says at registration that it answers claims so
        (api/workers.py ``CLAIM_FORMATS``); an API of before did not, and refuses the
        field."""
        self.carries_outcomes = False
        """Whether a claim may carry the outcomes of its workloop's runs, writing them
        before it counts the free slots (one call a cycle instead of two): once the API
        says so at registration (``claim_outcomes``); an API of before refuses the
        field."""

    async def open(self, worker: Worker) -> None:
        """Register; the API names the worker, and says how often it must beat."""
        if self.session is None:
            self.session = aiohttp.ClientSession(
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=REQUEST_SECONDS + self.poll_seconds),
                trust_env=_proxied(self.base),
            )
        body = {
            "workloops": worker.settings.workloops,
            "tasks": [worker.tasks[name].settings.declaration() for name in sorted(worker.tasks)],
            "host": worker.id,
        }
        try:
            registered = await self._call("POST", "/workers", body)
        except BaseException:  # the worker stops: its session with it
            await self.close()
            raise
        worker.id = registered["worker_id"]
        self.path = f"/workers/{registered['worker_id']}"
        if "rows" in registered.get("claim_formats", ()):
            self.claim_format = "rows"
        self.carries_outcomes = registered.get("claim_outcomes") is True
        worker.heartbeat.interval = min(
            worker.heartbeat.interval, float(registered["heartbeat_seconds"])
        )

    async def claim(self, params: dict[str, Any]) -> list[Run]:
        """A long poll: answered once runs are claimed, or empty after ``poll_seconds``."""
        runs, _ = await self.claim_carrying(params, [])
        return runs

    async def claim_carrying(
        self, params: dict[str, Any], outcomes: list[dict[str, Any]]
    ) -> tuple[list[Run], Rows]:
        """``claim``, carrying ``outcomes`` (``complete_runs``' rows, only where
        ``carries_outcomes``): the runs, and the rows ``complete`` returns."""
        body: dict[str, Any] = {
            "workloop": params["workloop"],
            "demand": params["demand"],
            "wait_seconds": self.poll_seconds,
        }
        if outcomes:
            body["outcomes"] = outcomes
        if self.claim_format == "rows":
            body["format"] = "rows"
        answer = await self._call("POST", f"{self.path}/claim", body)
        if self.claim_format == "rows":
            columns = answer["columns"]
            runs = [Run.from_row(columns, row) for row in answer["rows"]]
        else:
            runs = [Run.from_json(run) for run in answer["runs"]]
        return runs, _completed(answer) if outcomes else []

    async def complete(self, params: dict[str, Any]) -> Rows:
        """The rows ``complete_runs`` returns: recorded ids, then breaker changes."""
        body = {"outcomes": json.loads(params["outcomes"]), "events": json.loads(params["events"])}
        return _completed(await self._call("POST", f"{self.path}/complete", body))

    async def note_late(self, params: dict[str, Any]) -> None:
        """Nothing to do: the API notes late outcomes in their runs as it refuses them."""

    async def beat(self, params: dict[str, Any]) -> list[int]:
        body = {"run_ids": params["run_ids"], "counters": json.loads(params["counters"])}
        answer = await self._call("POST", f"{self.path}/heartbeat", body)
        return list(answer["renewed"])

    async def leave(self, worker_id: str, handed_back: list[int], channel: str) -> None:
        await self._call("POST", f"{self.path}/stop", {"hand_back": handed_back})

    async def delivery(self, run: Run) -> Delivery | None:
        """The request a forwarding attempt sends, as the API reads and signs it."""
        path = f"{self.path}/runs/{run.id}/delivery"
        answer = await self._call("GET", path, params={"attempt": run.attempt})
        return Delivery.from_json(answer["delivery"]) if answer["delivery"] else None

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def _call(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        """Call the API; the answer's JSON, or ``LinkError`` (transient: the API is
        unreachable, overloaded or restarting; else it refused the call)."""
        assert self.session is not None, "the link is not open"
        base = self.base
        try:
            async with self.session.request(
                method, base + path, json=body, params=params
            ) as response:
                status, content = response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise LinkError(f"cannot reach the API at {base}: {error!r}", transient=True) from None
        if status >= 400:
            try:
                said = json.loads(content)["detail"]
            except (ValueError, KeyError, TypeError):
                said = content[:200].decode(errors="replace")
            raise LinkError(
                f"the API at {base} answered {path} with {status}: {said}",
                transient=status in PASSING_STATUSES,
            )
        return json.loads(content) if content else None


def _proxied(base: str) -> bool:
    """Whether the environment names a proxy for the API (``HTTP_PROXY``,
    ``HTTPS_PROXY``, less ``NO_PROXY``): then aiohttp reads them (its ``trust_env``),
    as httpx does. Not otherwise: ``trust_env`` reads them again at every call, and
    ``~/.netrc``, each in a thread: two trips through the thread pool per claim, and a
    remote worker's CPU per run in a drain 134 µs against 98 without (docs/benchmarks.md,
    "Remote workers")."""
    url = urllib.parse.urlsplit(base)
    named = urllib.request.getproxies().get(url.scheme)
    return bool(named) and not (url.hostname and urllib.request.proxy_bypass(url.hostname))


def _completed(answer: dict[str, Any]) -> Rows:
    """An answer's ``recorded`` and ``breakers`` as the rows ``complete_runs`` returns."""
    rows: Rows = [(run_id, None, None, None) for run_id in answer["recorded"]]
    rows += [(None, b["lane"], b["key"], b["change"]) for b in answer["breakers"]]
    return rows
