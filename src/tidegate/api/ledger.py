"""What an API process answered to webhooks: counted in memory, written once a second.

Every answer of ``POST /hooks/{token}`` is counted by (project, mode, outcome, status)
with its time to answer (a sync request's round trip, its run included). A request to a
known trigger that did not become a run (refused, or a replay of an earlier one) is
kept for the webhook log, its body up to ``webhook_log_body_bytes``. About once a
second the ``Ledger`` adds what it holds in one statement (``add_ingress_counts``): to
``ingress_counters`` (what ``/metrics`` sums), to this minute's ``minute_counts`` (the
dashboard's charts) and to ``request_log``; then it trims the log of the triggers it
wrote to ``webhook_log_size`` rows each. A request writes nothing of its own: a burst
that is refused costs the database one statement a second, not one per request.

What the statement did not write stays in memory for the next round (a down database
loses nothing); between two rounds the log keeps at most ``MAX_UNWRITTEN_REQUESTS``
requests and ``MAX_UNWRITTEN_BYTES`` of their bodies, and says how many it let go (a
WARNING). A process that is killed loses its last second of counts.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from datetime import datetime

from psycopg_pool import AsyncConnectionPool

from tidegate.figures import ANSWER_BUCKETS
from tidegate.settings import Settings
from tidegate.worker.counters import Tallies, Tally
from tidegate.worker.services import Periodic, fetch

log = logging.getLogger("tidegate.ingress")

FLUSH_SECONDS = 1.0
MAX_UNWRITTEN_REQUESTS = 500
MAX_UNWRITTEN_BYTES = 4 * 1024 * 1024

Series = tuple[str, str, str, int]
"""(project, mode, outcome, status); the outcome one of ``tidegate.admission.Outcome``'s
(``status_<status>`` for an answer none names)."""


@dataclass(frozen=True)
class LoggedRequest:
    """A request to a known trigger answered without a new run."""

    trigger_id: int
    project: str
    outcome: str
    status: int
    detail: str
    run_id: int | None
    idempotency_key: str | None
    content_type: str | None
    headers: dict[str, str]
    body: bytes
    body_truncated: bool
    received_at: datetime

    def as_row(self) -> dict[str, object]:
        return {
            "trigger_id": self.trigger_id,
            "project": self.project,
            "outcome": self.outcome,
            "status": self.status,
            "detail": self.detail,
            "run_id": self.run_id,
            "idempotency_key": self.idempotency_key,
            "content_type": self.content_type,
            "headers": self.headers,
            "body": base64.b64encode(self.body).decode(),
            "body_truncated": self.body_truncated,
            "received_at": self.received_at.isoformat(),
        }


class Ledger:
    """This process's webhook answers not written yet, and the service that writes them."""

    def __init__(self, pool: AsyncConnectionPool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings
        self.counts: Tallies[Series] = Tallies(ANSWER_BUCKETS)
        self.requests: list[LoggedRequest] = []
        self.unwritten_bytes = 0
        self.let_go = 0
        self.service = Periodic("ledger", FLUSH_SECONDS, self.flush)

    def count(self, project: str, mode: str, outcome: str, status: int, seconds: float) -> None:
        self.counts.tally((project, mode, outcome, status)).observe(seconds)

    def keep(self, request: LoggedRequest) -> None:
        """Keep a request for the webhook log, unless the buffer is full."""
        size = len(request.body)
        if (
            len(self.requests) >= MAX_UNWRITTEN_REQUESTS
            or self.unwritten_bytes + size > MAX_UNWRITTEN_BYTES
        ):
            self.let_go += 1
            return
        self.requests.append(request)
        self.unwritten_bytes += size

    def _put_back(self, requests: list[LoggedRequest]) -> None:
        """Keep requests a failed flush did not write, oldest first, within the buffer's
        bounds: a database that stays down must not make the buffer grow every second."""
        waiting, self.requests, self.unwritten_bytes = requests + self.requests, [], 0
        for request in waiting:
            self.keep(request)

    async def flush(self) -> bool:
        """Write what was counted and kept since the last flush; keep it if that fails."""
        counted = self.counts.take()
        requests, self.requests, self.unwritten_bytes = self.requests, [], 0
        if self.let_go:
            log.warning(
                "webhook log: %d refused request(s) not kept, more than %d (or %d bytes) "
                "arrived within a second; they are counted",
                self.let_go,
                MAX_UNWRITTEN_REQUESTS,
                MAX_UNWRITTEN_BYTES,
            )
            self.let_go = 0
        if not counted and not requests:
            return False
        try:
            await fetch(
                self.pool,
                "add_ingress_counts",
                {"counters": _counters_json(counted), "requests": _requests_json(requests)},
            )
        except BaseException:
            self.counts.restore(counted)
            self._put_back(requests)
            raise
        if requests:
            await fetch(
                self.pool,
                "trim_request_log",
                {
                    "trigger_ids": sorted({r.trigger_id for r in requests}),
                    "size": self.settings.webhook_log_size,
                },
            )
        return False

    def start(self) -> None:
        self.service.start()

    async def stop(self) -> None:
        """Stop the service, then write what is left (a failure is logged, not raised)."""
        await self.service.stop()
        try:
            await self.flush()
        except Exception as error:  # the database is gone: the counts go with the process
            log.warning("webhook counts of this process not written at its stop: %s", error)


def _counters_json(counted: dict[Series, Tally]) -> str:
    return json.dumps(
        [
            {
                "project": project,
                "mode": mode,
                "outcome": outcome,
                "status": status,
                "requests": tally.count,
                "seconds": tally.seconds,
                "buckets": tally.buckets,
            }
            for (project, mode, outcome, status), tally in counted.items()
        ]
    )


def _requests_json(requests: list[LoggedRequest]) -> str:
    return json.dumps([request.as_row() for request in requests])
