"""The one validity rule (issue 37), worked by hand on typed records: which status, which reason, which order."""

from __future__ import annotations

import pytest

from cropscale.runs import validity as V
from cropscale.runs.rules import Divergence
from cropscale.runs.schema import (
    DivergenceSummary,
    LossScaleSummary,
    NonFiniteSummary,
    QualitySummary,
    RankCounts,
    RunJson,
    RunSummary,
    TrainedSummary,
    ValidityRecord,
)


def _summary(steps=4, changed=True, finite=True, nonfinite=0, validations=2, configured=True, diverged=False,
             skipped=0) -> RunSummary:
    return RunSummary(
        trained=TrainedSummary(weights_changed=changed, parameters_changed=10 if changed else 0, parameters=118,
                               optimizer_steps=steps, weights_finite=finite, nonfinite_parameters=nonfinite),
        quality=QualitySummary(validation_configured=configured, validations=validations),
        divergence=DivergenceSummary(window=3, steps=steps, trailing_nonfinite_steps=3 if diverged else 0,
                                     diverged=diverged, why="training loss non-finite at the last 3 optimizer"
                                     " step(s) (steps 1-3; last finite at step 0)" if diverged else "finite",
                                     stopped_at_step=4 if diverged else None),
        loss_scale=LossScaleSummary(scaler_in_use=True, steps=steps, skipped_steps=skipped),
        nonfinite=NonFiniteSummary(per_rank=[RankCounts(0, 0)]),
    )


def test_a_run_that_trained_finite_and_validated_is_valid():
    v = V.validity(_summary(), 4)
    assert (v.valid, v.status) == (True, "finished")
    assert v.reason == ("4 optimizer step(s) (0 of 4 optimizer steps skipped; the weights changed); final weights"
                        " finite; validated 2 time(s)")


def test_no_optimizer_step_is_not_trained_whatever_else():
    # no step, no validation either (max_epochs=0): the first rule decides
    v = V.validity(RunSummary(quality=QualitySummary(validation_configured=True, validations=0)), 0)
    assert (v.valid, v.status, v.reason) == (False, "not-trained", V.NO_STEP)


def test_an_empty_summary_with_steps_is_valid_for_want_of_facts():
    v = V.validity(RunSummary(), 7)
    assert v.valid and v.reason.startswith("7 optimizer step(s)") and "final weights not checked" in v.reason


@pytest.mark.parametrize(("skipped", "status"), [(2, "finished"), (3, "not-trained"), (4, "not-trained")])
def test_the_skipped_share_boundary(skipped, status):
    # 2 of 4 = 50 %: not more than the share (trained); 3 of 4 skipped: more than half
    summary = _summary(skipped=skipped)
    assert V.validity(summary, 4).status == status


def test_unchanged_weights_are_not_trained():
    v = V.validity(_summary(changed=False), 4)
    assert v.status == "not-trained" and v.reason.startswith("no weight changed over 4 optimizer step(s)")


def test_non_finite_final_weights_are_diverged_before_a_missing_validation():
    v = V.validity(_summary(finite=False, nonfinite=118, validations=0), 4)
    assert v.status == "diverged"
    assert v.reason == "118 of 118 parameter tensor(s) hold NaN or inf at the end of training (summed over ranks)"


def test_a_loss_non_finite_to_the_end_is_diverged_and_both_reasons_are_said():
    v = V.validity(_summary(diverged=True), 4)
    assert v.status == "diverged" and v.reason == ("training loss non-finite at the last 3 optimizer step(s)"
                                                   " (steps 1-3; last finite at step 0); DivergenceCallback stopped"
                                                   " the run at step 4")
    both = V.validity(_summary(diverged=True, finite=False, nonfinite=5), 4)
    assert both.reason.startswith("5 of 118 parameter tensor(s) hold NaN") and "; training loss" in both.reason


@pytest.mark.parametrize(("configured", "validations", "status"), [
    (True, 0, "not-validated"), (True, 1, "finished"), (False, 0, "finished"), (None, 0, "finished")])
def test_validation_is_required_only_when_configured(configured, validations, status):
    v = V.validity(_summary(configured=configured, validations=validations), 4)
    assert v.status == status
    if status == "not-validated":
        assert v.reason.startswith("validation was configured but never ran in 4 optimizer step(s)")


def test_of_run_reads_the_recorded_verdict_first():
    recorded = ValidityRecord(valid=False, status="diverged", reason="recorded")
    run = RunJson(status="diverged", summary=_summary(), global_step=4, validity=recorded)
    assert V.of_run(run) is recorded


def test_of_run_judges_an_older_run_json_and_its_logged_loss():
    old = RunJson(status="finished", summary=_summary(), global_step=4)
    assert V.of_run(old).status == "finished"
    logged = Divergence(True, "train/loss_step non-finite at the last 3 logged step(s)")
    assert (V.of_run(old, logged).status, V.of_run(old, logged).reason) == ("diverged", logged.why)
    assert V.of_run(None, logged).status == "diverged"
    assert V.of_run(None, Divergence(False, "finite")) is None
    assert V.of_run(RunJson(status="failed")) is None and V.of_run(RunJson(status="running")) is None


def test_excluded_says_why():
    assert V.excluded("finished", ValidityRecord(valid=True, status="finished", reason="ok")) is None
    assert V.excluded("diverged", ValidityRecord(valid=False, status="diverged", reason="NaN")) == "diverged: NaN"
    assert V.excluded("failed", None) == "failed: the fit did not run to its end"
    assert V.excluded("ok", None) is None
