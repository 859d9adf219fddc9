"""``GET /healthz``, ``GET /readyz`` and ``GET /readyz/workers``: whether this API
process is up, whether it can accept requests, and whether the fleet's workers are alive.

None needs a token: a load balancer, an orchestrator or a monitor asks them. Readiness is
the API process's own: it accepts webhooks while its database answers with the schema
this code needs, whatever the workers do. With every worker gone, async webhooks are
still accepted and kept until workers return (the ack-fast promise), and sync ones get
503 with ``Retry-After`` from the API itself: taking every API process out of a load
balancer's rotation would turn both into connection errors. The workers' health is a
question of its own (``/readyz/workers``, and ``tidegate_workers_live`` in ``/metrics``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from tidegate.api.kernel import DATABASE_RETRY_AFTER_SECONDS, Api, problem
from tidegate.figures import read_live_workers
from tidegate.storage.migrate import SchemaRelease, functions_fingerprint, latest_version
from tidegate.storage.sql import Statement, Steps

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="getHealth")
async def healthz() -> dict[str, str]:
    """The process is up (it does not look at the database)."""
    return {"status": "ok"}


@router.get("/readyz", operation_id="getReadiness")
async def readyz(request: Request) -> JSONResponse:
    """Ready to accept requests: the database answers, and its schema serves this code
    (its own, or a later release's that still serves it, while a release rolls). Live
    workers are not asked for (``/readyz/workers`` is)."""
    api: Api = request.app.state.api
    release = await api.run(_schema_release())
    refusal = release.refusal(api.settings.schema, _code_release()["version"])
    if refusal is not None:
        return problem(503, refusal, {"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)})
    return JSONResponse({"status": "ready", "schema_version": release.version})


@router.get("/readyz/workers", operation_id="getWorkersHealth")
async def workers_health(request: Request) -> JSONResponse:
    """At least one worker is live (it heartbeated within three intervals): 200, else
    503. Either way the answer counts the live workers and their slots, busy and in all,
    at their last heartbeats."""
    api: Api = request.app.state.api
    live = await api.run(read_live_workers(api.settings))
    counts = {
        "workers": live.workers,
        "slots": sum(loop.slots for loop in live.workloops),
        "busy": sum(loop.busy for loop in live.workloops),
        "heartbeat_age_seconds": live.heartbeat_age_seconds,
    }
    if not live.workers:
        return problem(503, "no live worker", None, **counts)
    return JSONResponse({"status": "ok", **counts})


@cache
def _code_release() -> dict[str, Any]:
    """This code's release: its version and its functions' fingerprint (read from the
    package's files once, not at every probe)."""
    return {"version": latest_version(), "functions": functions_fingerprint()}


def _schema_release() -> Steps[SchemaRelease]:
    """What the schema serves, for this code's release."""
    [row] = yield Statement("read_schema_release", _code_release())
    return SchemaRelease(*row)
