"""The scale benchmark runs end to end and checks its own work (its speed is not tested)."""

from __future__ import annotations

from bench.scale import DRAINS, PROCESSES, SMOKE_INGEST, SMOKE_RUNS, run_benchmark


def test_scale_benchmark_smoke_run_verifies_every_run_and_webhook(database_url: str) -> None:
    samples = run_benchmark(database_url, SMOKE_RUNS, 1, SMOKE_INGEST, progress=print)

    for scenario, *_ in DRAINS:
        (drained,) = samples[f"drain: {scenario}"]
        # Every run succeeded at its first attempt; both sides spent CPU on them.
        assert drained["verified"], scenario
        assert drained["rate"] > 0
        assert drained["cpu_us_per_run"]["workers"] > 0
    for processes in PROCESSES:
        (ingested,) = samples[f"ingest: {processes} API"]
        assert ingested["verified"], processes
        assert ingested["tidegate"]["accepted"] == SMOKE_INGEST.ingest_requests
