"""The admission's verdicts are declared once (``tidegate.admission``) and agree with the
function that returns them and with what docs/architecture.md and docs/metrics.md say."""

from __future__ import annotations

import re
from importlib import resources

from tests.conftest import ROOT
from tidegate.admission import Unjudged, Verdict


def admit_webhook() -> str:
    return (
        resources.files("tidegate.storage").joinpath("functions", "admit_webhook.sql").read_text()
    )


def test_admit_webhook_returns_exactly_the_declared_verdicts() -> None:
    returned = re.findall(r"RETURN QUERY\s+SELECT\s+'([a-z_]+)'", admit_webhook())
    assert sorted(set(returned)) == sorted(Verdict)


def test_admit_webhook_documents_its_checks_in_the_declared_order() -> None:
    header = admit_webhook().split("CREATE OR REPLACE FUNCTION", 1)[0]
    documented = re.findall(r"^--   ([a-z_]+)  ", header, re.MULTILINE)
    assert documented == list(Verdict)


def test_the_metrics_doc_lists_every_webhook_outcome_with_its_status() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    table = doc.split("Outcomes of a webhook", 1)[1].split("\n\n", 2)[1]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| ([^|`][^|]*) \|", table, re.MULTILINE))
    assert sorted(rows) == sorted([*Verdict, *Unjudged])
    for verdict in Verdict:
        if verdict.refusal is not None:
            assert rows[verdict].strip() == str(verdict.refusal.status), verdict


def test_the_architecture_doc_lists_the_verdicts_in_the_order_they_are_checked() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc.split("## The admission, as SQL", 1)[1].split("\n\n", 3)[2]
    listed = re.findall(r"^\| `([a-z_]+)` \|", table, re.MULTILINE)
    assert listed == list(Verdict)
