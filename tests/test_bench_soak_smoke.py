"""The soak runs end to end and checks its own work (its speed is not tested)."""

from __future__ import annotations

from bench.soak import render, soak, verdicts


def test_soak_smoke_run_verifies_every_run_and_reports_its_samples_and_verdicts(
    database_url: str,
) -> None:
    found = soak(database_url, minutes=0.2, retention=4, sample_seconds=2, rate=300, progress=print)

    # The worker's counters hold every enqueued run as succeeded, nothing else; what the
    # pruner left succeeded at its first attempt.
    assert found["verified"], found["checked"]
    assert found["enqueued"] > 0
    assert found["checked"]["left"] < found["enqueued"]  # the pruner deleted some
    assert 5 <= len(found["samples"]) <= 7
    for sample in found["samples"]:
        assert sample["runs_heap"] > 0 and sample["runs_indexes"] > 0
        assert {"live", "dead", "autovacuums", "last_autovacuum"} <= set(sample["tables"]["runs"])
        assert sample["finished"] >= 0 and set(sample["wake_up_ms"]) == {"p50", "p99"}
    result = {
        "soak": found,
        "server": {"version": "15", "connection": "tcp"},
        "machine": {"cores": 2, "loadavg_at_start": [1.0], "loadavg_at_end": [1.0]},
        "code": {"commit": "abc1234"},
        "date": "2026-11-27",
        "command": "python -m bench.soak --smoke",
        "autovacuum": {"autovacuum": "on"},
    }
    result["verdicts"] = verdicts(result)
    assert set(result["verdicts"]) == {"sizes_flat", "p99_not_creeping", "autovacuum_keeping_up"}
    assert all(isinstance(v["holds"], bool) for v in result["verdicts"].values())
    assert render(result).count("\n| ") == len(found["samples"]) + 2 + 2 + 3
