"""The million-rows benchmark runs end to end and checks its own work (its speed is not
tested)."""

from __future__ import annotations

from bench.rows import FIGURES, SMOKE, SMOKE_ROWS, curve, render, run_benchmark, summarize


def test_rows_benchmark_smoke_run_verifies_every_run_and_leaves_each_state_untouched(
    database_url: str,
) -> None:
    states = run_benchmark(database_url, SMOKE_ROWS, 1, SMOKE, smoke=True, progress=print)

    assert [state["label"] for state in states] == [label for label, *_ in curve(SMOKE_ROWS, True)]
    for state in states:
        # Every admitted webhook and enqueued run succeeded once; the state's own runs
        # (finished, or ready in lanes the worker does not serve) were not touched.
        assert state["verified"], state["label"]
        assert state["untouched"], state["label"]
        (sample,) = state["samples"]
        assert sample["drain"]["runs"] == SMOKE.batch_runs + SMOKE.single_runs
        for lane in ("fast_lane", "default"):
            assert sum(sample["admission"][lane]["decisions"].values()) == SMOKE.admission_calls
        assert set(sample["index_reads"]) == {"admission", "batch", "single", "drain"}
        assert state["sizes"]["runs_heap"] > 0 or state["kind"] == "empty"
    assert states[1]["states"] == {
        "succeeded": SMOKE_ROWS * 19 // 20,
        "discarded": SMOKE_ROWS // 20,
    }
    assert states[2]["states"] == {"available": SMOKE_ROWS}

    summary = summarize(states)
    for entry in summary.values():
        assert set(entry["figures"]) == set(FIGURES) == set(entry["ratios"])
    result = {
        "summary": summary,
        "states": states,
        "server": {"version": "15", "connection": "tcp"},
        "machine": {"cores": 2, "loadavg_at_start": [1.0], "loadavg_at_end": [1.0]},
        "code": {"commit": "abc1234"},
        "date": "2026-11-27",
        "repeat": 1,
        "seconds": 20.0,
        "command": "python -m bench.rows --smoke",
        "sizes": SMOKE.__dict__,
        "verified": True,
    }
    assert render(result).count("\n| ") == 3 * (len(states) + 2)
