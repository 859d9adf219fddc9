"""The benchmark runs end to end and checks its own work (its speed is not tested)."""

from __future__ import annotations

from bench.run import SMOKE, WORKLOADS, render, run_benchmark


def test_benchmark_smoke_run_verifies_every_run_of_every_workload(database_url: str) -> None:
    result = run_benchmark(database_url, SMOKE)

    assert list(result["workloads"]) == list(WORKLOADS)
    for name, workload in result["workloads"].items():
        assert workload["verified"], name
        for side in ("tidegate", "raw"):
            samples = workload[side]["samples"]
            assert len(samples) == SMOKE.repeat, (name, side)
            for sample in samples:
                assert sample["verified"], (name, side, sample)
                if name == "wakeup":
                    assert sample["samples"] == SMOKE.wakeup_runs
                else:
                    assert sample["runs"] == SMOKE.runs
                    assert sample["rate"] > 0
                if name == "drain":
                    # Every queued run finished, each in exactly one attempt.
                    assert sample["total"] == sample["finished"] == SMOKE.runs
                    assert sample["max_attempt"] == 1
    assert "| drain, runs/s" in render(result)
