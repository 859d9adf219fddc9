"""The shares benchmark runs end to end and measures every lane (not its figures)."""

from __future__ import annotations

import pytest

from bench.shares import LANES, SMOKE, WORKLOOPS, run_benchmark


def test_shares_benchmark_smoke_run_measures_every_lane_of_each_workloop(
    database_url: str,
) -> None:
    result = run_benchmark(database_url, progress=print, **SMOKE)  # type: ignore[arg-type]

    assert set(result["samples"]) == set(WORKLOOPS)
    (shares,) = result["samples"]["shares"]
    assert sum(shares[lane]["measured"] for lane in LANES) == pytest.approx(1.0, abs=0.01)
    assert all(shares[lane]["runs_started"] > 0 for lane in LANES), shares  # none starved
    (chain,) = result["samples"]["chain"]
    assert chain["a"]["configured"] == 1.0
    assert result["claim_ms"]["one_statement"] > 0
