"""The benchmark runs end to end and checks its own work (its speed is not tested)."""

from __future__ import annotations

from bench.run import RATES, SMOKE, render, run_benchmark


def test_benchmark_smoke_run_verifies_every_workload_on_tidegate_and_raw(
    database_url: str,
) -> None:
    result = run_benchmark(database_url, SMOKE)

    assert list(result["workloads"]) == list(SMOKE.workloads)
    options = SMOKE.options
    for name, workload in result["workloads"].items():
        assert workload["verified"], (name, workload)
        for system in SMOKE.systems:
            (sample,) = workload[system]["samples"]
            assert sample["verified"], (name, system, sample)
            if name in RATES:
                assert sample["rate"] > 0
            if name in ("enqueue", "single"):
                # What the enqueue wrote: WAL, and at least the primary key's entry per job.
                assert sample["wal_bytes_per_job"] > 0, (name, system, sample)
                assert sample["index_entries_per_job"] >= 1, (name, system, sample)
            if name in ("drain", "wakeup", "starvation"):
                # Every job recorded done in the database, each started exactly once.
                assert sample["done"] == sample["starts"], (name, system, sample)
            if name == "wakeup":
                assert sample["done"] == options.wakeup_warmup + options.wakeup_jobs
            if name == "starvation":
                cold = options.cold_tenants * options.cold_per_tenant
                assert sample["done"] == options.hot_jobs + cold
                assert sample["jobs"] == cold
    assert result["workloads"]["starvation"]["tidegate"]["fairness"].startswith("per-key")
    text = render(result)
    for title in ("Batch enqueue", "Drain", "Single enqueue", "Wake-up", "Starvation", "Aims"):
        assert title in text
