"""``GET /healthz`` and ``GET /readyz``: whether this API process is up, and ready.

Neither needs a token: a load balancer or an orchestrator asks them.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from tidegate.api.kernel import DATABASE_RETRY_AFTER_SECONDS, Api, problem
from tidegate.storage.migrate import latest_version
from tidegate.storage.sql import Statement, Steps

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="getHealth")
async def healthz() -> dict[str, str]:
    """The process is up (it does not look at the database)."""
    return {"status": "ok"}


@router.get("/readyz", operation_id="getReadiness")
async def readyz(request: Request) -> JSONResponse:
    """Ready to serve webhooks: the database answers, its schema is the one this code
    needs, and at least one worker is alive (it heartbeated within three intervals).

    With no live worker, async webhooks would still be accepted, but nothing would
    run them and every sync webhook would be refused: that is not ready.
    """
    api: Api = request.app.state.api
    version, workers = await api.run(_readiness(3 * api.settings.heartbeat_seconds))
    wanted = latest_version()
    retry = {"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)}
    if version != wanted:
        return problem(503, f"schema is at version {version}, this server needs {wanted}", retry)
    if not workers:
        return problem(503, "no live worker", retry, schema_version=version, workers=0)
    return JSONResponse({"status": "ready", "schema_version": version, "workers": workers})


def _readiness(live_seconds: float) -> Steps[tuple[int, int]]:
    """The schema's version, and how many workers heartbeated within ``live_seconds``."""
    rows = yield Statement("check_ready", {"live_seconds": live_seconds})
    return (rows[0][0], rows[0][1]) if rows else (0, 0)
