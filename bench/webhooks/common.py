"""What every part of the webhook benchmark shares: its settings and options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

WORKER_READY = " started: "
"""What tidegate's worker logs once it listens and its workloops claim."""

ADMIN_TOKEN = "tga_bench-http-super-admin"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
JSON_HEADERS = {"content-type": "application/json"}
WORKLOOPS = "fast_lane:4 manual>*:4"
WORKER_APP = "tidegate.builtin:app"
START_SECONDS = 60.0
HTTP_TIMEOUT_SECONDS = 60.0
SAMPLER_INTERVAL_SECONDS = 0.005

# What ``admit_webhook`` is given besides the webhook, as the API would with tidegate's
# defaults (``Settings``: max_attempts 20, fast_lane_cap 10, heartbeat 2 s).
DEFAULT_MAX_ATTEMPTS = 20
DEFAULT_FAST_LANE_CAP = 10
LIVE_SECONDS = 3 * 2.0

AIM_SYNC_P50_MS = 5.0
AIM_SYNC_P99_MS = 15.0
AIM_ADMISSION_P99_MS = 3.0

STAGES = ("send", "admit", "run", "reply")
"""Stages of a sync round trip, from the client's clock and the run's timestamps: send
(client send to the admission transaction's start: HTTP in, trigger lookup, body, pool),
admit (admission transaction start to claim start: admission, commit, NOTIFY, worker
wake-up), run (claim start to completion start: claim, commit, the handler, the
completer's batch), reply (completion start to the reply in the client: completion write
and commit, NOTIFY to the API, reading the run, the HTTP reply)."""


# -- options ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """What to measure; the defaults are the published benchmark."""

    rate: float = 100.0
    steady_seconds: float = 10.0
    floor_requests: int = 300
    warmup_requests: int = 50
    burst: int = 200
    admission_calls: int = 500
    admission_interval_ms: float = 5.0
    admission_cap: int = DEFAULT_FAST_LANE_CAP
    cap: int = 3
    cap_clients: int = 200
    cap_api_processes: int = 3
    cap_sleep_seconds: float = 0.2
    cap_seconds: float = 6.0
    ingest_requests: int = 5000
    ingest_clients: int = 16
    ingest_api_processes: int = 2
    repeat: int = 3
    smoke: bool = False


SMOKE = Options(
    steady_seconds=0.3,
    floor_requests=20,
    warmup_requests=10,
    burst=20,
    admission_calls=30,
    cap_clients=20,
    cap_api_processes=2,
    cap_sleep_seconds=0.05,
    cap_seconds=1.0,
    ingest_requests=200,
    ingest_clients=4,
    repeat=1,
    smoke=True,
)
