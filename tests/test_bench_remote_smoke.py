"""The remote-workers benchmark runs end to end and checks its own work (not its speed)."""

from __future__ import annotations

from bench.remote import SCENARIOS, SMOKE_RUNS, run_benchmark


def test_remote_benchmark_smoke_run_verifies_every_run(database_url: str) -> None:
    samples = run_benchmark(database_url, SMOKE_RUNS, 1, progress=print)

    for scenario, api_processes in SCENARIOS:
        (drained,) = samples[scenario]
        # Every run succeeded at its first attempt; the workers spent CPU on them.
        assert drained["verified"], scenario
        assert drained["rate"] > 0
        assert drained["cpu_us_per_run"]["workers"] > 0
        if api_processes:  # the API did the claims: it spent CPU on them
            assert drained["cpu_us_per_run"]["api"] > 0
