"""The schedules benchmark runs end to end and counts what it made (its speed is not tested)."""

from __future__ import annotations

from bench.schedules import SETUP, run_benchmark


def test_schedules_benchmark_smoke_run_makes_each_due_tick_one_run(database_url: str) -> None:
    samples = run_benchmark(database_url, count=200, seconds=2, repeat=1, progress=print)

    assert set(samples) == set(SETUP)
    (idle,) = samples["idle"]
    (steady,) = samples["steady"]
    (burst,) = samples["burst"]
    assert idle["runs"] == 0
    assert 0 < steady["runs"] <= 2 * 200 / 10 + 20  # every 10 s: at most 20 ticks a second
    assert burst["runs"] == 200  # each schedule due once, made once
    assert burst["db_cpu_per_second"] >= 0 and burst["enqueue_db_cpu_per_second"] >= 0
