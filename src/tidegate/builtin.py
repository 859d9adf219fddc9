"""The app ``tidegate serve`` runs when given none: tasks to try triggers with.

- ``tidegate.echo``: replies with the webhook's body (``{"echo": body}``).
- ``tidegate.sleep``: sleeps ``body["seconds"]`` (at most 60), then replies.

Every app, this one too, also has ``tidegate.forward``, the task of triggers with a
``forward_url`` (``tidegate.forward``, docs/forwarding.md).
"""

from __future__ import annotations

import asyncio
from typing import Any

from tidegate.app import Tidegate

app = Tidegate()


@app.task(name="tidegate.echo")
async def echo(body: Any = None, **_: Any) -> dict[str, Any]:
    return {"echo": body}


@app.task(name="tidegate.sleep")
async def sleep(body: Any = None, **_: Any) -> dict[str, Any]:
    seconds = float(body.get("seconds", 1)) if isinstance(body, dict) else 1.0
    await asyncio.sleep(min(max(seconds, 0.0), 60.0))
    return {"slept": seconds}
