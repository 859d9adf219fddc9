"""A FastAPI app that enqueues a report in a request and streams the run's progress.

``POST /reports`` enqueues a run of ``build_report`` and answers 202 at once; the run's
handler reports each page with ``current_run().aprogress``. ``GET
/reports/{id}/progress`` relays the run's server-sent events from tidegate's API
(``GET /runs/{id}/events``: each ``progress`` event, then the ``result``): the clients
see this app alone, and tidegate's token stays on the server. Run it beside ``tidegate
serve --role api`` and a worker::

    TIDEGATE_API_URL=http://127.0.0.1:8000 TIDEGATE_API_TOKEN=... uvicorn reports:api --port 8080
    tidegate worker --app reports:tidegate_app
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse

from tidegate import Tidegate, current_run

tidegate_app = Tidegate()
api = FastAPI()
TIDEGATE_API_URL = os.environ.get("TIDEGATE_API_URL", "http://127.0.0.1:8000")
TIDEGATE_API_TOKEN = os.environ.get("TIDEGATE_API_TOKEN", "")
"""A token of the project the runs are in (``default``), or the super admin's."""


@tidegate_app.task
async def build_report(pages: int) -> dict[str, int]:
    run = current_run()
    for page in range(1, pages + 1):
        ...  # build the page
        await run.aprogress({"page": page, "of": pages})
    return {"pages": pages}


@api.post("/reports", status_code=202)
async def create_report(pages: int = 3) -> dict[str, object]:
    run = await tidegate_app.aenqueue(build_report, {"pages": pages})
    return {"id": run.id, "progress": f"/reports/{run.id}/progress"}


@api.get("/reports/{run_id}/progress")
async def report_progress(run_id: int) -> StreamingResponse:
    """Relay the run's events as they come (check here that the caller may see it)."""
    client = httpx.AsyncClient(
        base_url=TIDEGATE_API_URL,
        headers={"Authorization": f"Bearer {TIDEGATE_API_TOKEN}"},
        timeout=httpx.Timeout(10, read=None),  # a stream waits as long as its run
    )
    upstream = await client.send(client.build_request("GET", f"/runs/{run_id}/events"), stream=True)
    if upstream.status_code != 200:
        await upstream.aread()
        await client.aclose()
        raise HTTPException(upstream.status_code, upstream.json().get("title"))

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await upstream.aclose()
            await client.aclose()

    return StreamingResponse(
        relay(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
