"""The Retry-After benchmark runs end to end and measures every workload (not its figures)."""

from __future__ import annotations

from bench.retry_after import WORKLOADS, run_benchmark


def test_retry_after_benchmark_smoke_run_measures_every_workload(database_url: str) -> None:
    (found,) = run_benchmark(database_url, seconds=2.0, repeat=1, progress=print)

    for name in WORKLOADS:
        assert found[name]["admitted"] > 0, name
    assert found["tiny_rate"]["retry_after"] >= 1
    assert found["admission_ms"]["fast_lane"]["p50"] > 0
