"""The fairness benchmark runs end to end and checks its own work (not its speed)."""

from __future__ import annotations

from bench.fairness import (
    MODES,
    SCENARIOS,
    SMOKE,
    WARMUP_CLAIMS,
    claim_cells,
    render,
    run_fairness,
)


def test_fairness_smoke_run_verifies_every_run_of_both_parts(database_url: str) -> None:
    result = run_fairness(database_url, SMOKE)

    assert result["verified"]
    starvation = result["starvation"]
    assert starvation["verified"]
    for scenario in SCENARIOS:
        samples = starvation[scenario]["samples"]
        assert len(samples) == SMOKE.repeat, scenario
        hot = 0 if scenario == "tidegate_cold_only" else SMOKE.hot_runs
        for sample in samples:
            assert sample["verified"], (scenario, sample)
            # Every run there and finished in exactly one attempt; the cold runs distinct,
            # spread over their keys, each one's wait measured.
            assert sample["hot_runs"] == hot
            assert sample["cold_runs"] == sample["cold_distinct"] == SMOKE.cold_runs
            assert sample["cold_keys"] == SMOKE.cold_keys
            assert sample["finished_once"] == hot + SMOKE.cold_runs
            assert sample["db_ms"]["p99"] >= 0
            assert sample["cadence"]["claims"] >= 1

    claims = result["claims"]
    assert claims["verified"]
    assert [(c["ready_runs"], c["keys"]) for c in claims["cells"]] == claim_cells(SMOKE)
    claimed = (WARMUP_CLAIMS + SMOKE.claims) * SMOKE.demand
    for cell in claims["cells"]:
        for mode in MODES:
            for sample in cell[mode]["samples"]:
                # Every claim full, every claimed run finished once, the backlog kept.
                assert sample["verified"], (mode, sample)
                assert sample["short_claims"] == 0
                assert sample["claimed"] == sample["claimed_distinct"] == claimed
                assert sample["claimed_finished_once"] == claimed
                assert sample["running"] == 0
                assert sample["available"] == cell["ready_runs"]
                assert sample["runs_per_second"] > 0
            # policies: the per-candidate path (policy rows); fast: none at all.
            policies = [s["key_policies"] for s in cell[mode]["samples"]]
            if mode == "policies":
                assert all(n > 0 for n in policies)
            elif mode == "fast":
                assert all(n == 0 for n in policies)
    text = render(result)
    assert "**Starvation**" in text
    assert "**Claim throughput**" in text
