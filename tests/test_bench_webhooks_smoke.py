"""The webhook benchmark runs end to end and checks its own work (its speed is not tested)."""

from __future__ import annotations

from bench.webhooks.common import SMOKE
from bench.webhooks.report import render, run_benchmark


def test_http_benchmark_smoke_run_verifies_every_webhook(database_url: str) -> None:
    result = run_benchmark(database_url, SMOKE)

    (repetition,) = result["repetitions"]
    for part in ("sync", "admission", "cap"):
        assert repetition[part]["verified"], (part, repetition[part].get("problems"))

    sync = repetition["sync"]
    for client in ("steady", "steady_plain"):  # httpx, and the minimal client
        steady = sync[client]
        assert steady["requests"] == round(SMOKE.rate * SMOKE.steady_seconds)
        # Every request was answered; every admitted one has its succeeded run and its
        # request row (checked in the run), and a rejected one left nothing. The load is
        # an open loop at a fixed rate: on a loaded machine more requests are in flight
        # at once, and the project's cap or the slots answer some of them, as they must.
        assert set(steady["statuses"]) <= {
            "200",
            "202",
            "429 the project's fast-lane cap is reached",
            "503 no worker has a free fast-lane slot",
        }, steady["statuses"]
        answered = steady["statuses"].get("200", 0) + steady["statuses"].get("202", 0)
        assert steady["verified_runs"] == answered > 0
    assert sum(sync["burst"]["statuses"].values()) == SMOKE.burst
    assert sync["burst"]["admitted"] > 0

    admission = repetition["admission"]
    for lane in ("fast_lane", "default"):
        assert sum(admission["decisions"][lane].values()) == SMOKE.admission_calls
        assert admission["decisions"][lane].get("admitted", 0) > 0
        assert admission["ms"][f"admit_{lane}"]["p50"] > 0
        assert admission["ms"][f"admit_{lane}_rolled_back"]["p50"] > 0

    cap = repetition["cap"]
    assert cap["admitted"] > 0
    assert cap["max_running"] <= SMOKE.cap, cap
    assert cap["max_inflight_sampled"] <= SMOKE.cap, cap
    assert cap["over_admission"] == 0

    ingest = repetition["ingest"]
    for side in ("tidegate", "raw"):
        assert ingest[side]["verified"], (side, ingest[side]["problems"])
        assert ingest[side]["accepted"] == SMOKE.ingest_requests
        assert ingest[side]["rate"] > 0
    plain = ingest["tidegate"]["plain_client"]
    assert plain["verified"], plain["problems"]
    assert plain["accepted"] == SMOKE.ingest_requests
    assert result["verified"]
    assert "| async ingest" in render(result)
