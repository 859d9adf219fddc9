"""The app the benchmark's tidegate worker process loads (``--app bench.apps:app``).

Two async handlers that do nothing, so what is measured is tidegate itself: ``noop``
for the drain, ``wakeup`` for the wake-up latency (it returns the wall time at which
it started, which becomes the run's result).
"""

from __future__ import annotations

import time
from typing import Any

from tidegate import Tidegate

app = Tidegate()


@app.task(name="noop")
async def noop(**_: Any) -> None:
    return None


@app.task(name="wakeup")
async def wakeup(**_: Any) -> dict[str, float]:
    return {"started_at": time.time()}
