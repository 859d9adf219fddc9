"""The bulk-retry benchmark runs end to end and checks what it did (its speed is not tested)."""

from __future__ import annotations

from bench.bulk import PHASES, render, run_benchmark


def test_bulk_benchmark_smoke_run_retries_every_run_while_the_drain_claims(
    database_url: str,
) -> None:
    [sample] = run_benchmark(database_url, finished=1_200, seconds=2.0, repeat=1, progress=print)

    assert sample["bulk"]["retried"] == 1_200  # and each is available again in 'default'
    assert sample["before"]["claims"] > 0 and sample["after"]["claims"] > 0
    assert all(sample[phase]["seconds"] > 0 for phase in PHASES)
    text = render({"finished": 1_200, "samples": [sample]})
    assert "| during |" in text and "1,200 runs" in text
