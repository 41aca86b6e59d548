"""ProvenanceCallback keeps run.json when a diagnosis rule fails, and says which."""

from __future__ import annotations

from cropscale.callbacks import provenance
from cropscale.runs.schema import RunJson


def test_a_failing_rule_leaves_the_record_and_names_the_error(monkeypatch):
    def broken(record):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(provenance, "diagnose", broken)
    diag = provenance._diagnosis(RunJson())
    assert diag.error == "ZeroDivisionError: float division by zero" and diag.findings == []
    assert RunJson(diagnosis=diag).to_json()["diagnosis"]["error"] == "ZeroDivisionError: float division by zero"


def test_an_empty_record_is_diagnosed_as_nothing_to_judge():
    diag = provenance._diagnosis(RunJson())
    assert diag.error is None and diag.limit == "none"
    assert any("no step timing" in n for n in diag.not_judged)
