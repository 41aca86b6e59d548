"""The validity rule's reasons word for word and where its step count comes from (issue 36: mutation survivors).

Each reason is the sentence the report's Status column and the end-of-fit summary show, written out by hand from
the rule (cropscale/runs/validity.py's module docstring); the step count is ``run.json["global_step"]`` (the whole
fit, a resume included), else ``summary.trained.optimizer_steps``, else not recorded.
"""

from __future__ import annotations

from cropscale.runs import validity as V
from cropscale.runs.schema import (
    DivergenceSummary,
    NonFiniteSummary,
    QualitySummary,
    RankCounts,
    RunJson,
    RunSummary,
    TrainedSummary,
)

UNKNOWN = "cannot tell whether the run trained (skipped steps not recorded; weight change not recorded)"


def _trained(steps=4, changed=True):
    return TrainedSummary(weights_changed=changed, parameters_changed=3 if changed else 0, parameters=3,
                          optimizer_steps=steps, weights_finite=True, nonfinite_parameters=0)


def test_the_valid_reason_names_what_was_not_recorded():
    v = V.validity(RunSummary(), 7)
    assert (v.valid, v.status) == (True, "finished")
    assert v.reason == f"7 optimizer step(s) ({UNKNOWN}); final weights not checked; validations not recorded"


def test_the_valid_reason_when_no_validation_was_configured():
    summary = RunSummary(trained=_trained(), quality=QualitySummary(validation_configured=False, validations=0))
    assert V.validity(summary, 4).reason == ("4 optimizer step(s) (skipped steps not recorded; the weights changed);"
                                             " final weights finite; no validation configured")


def test_the_not_validated_reason_word_for_word():
    summary = RunSummary(trained=_trained(steps=6), quality=QualitySummary(validation_configured=True, validations=0))
    v = V.validity(summary, 6)
    assert (v.valid, v.status) == (False, "not-validated")
    assert v.reason == ("validation was configured but never ran in 6 optimizer step(s): check"
                        " trainer.check_val_every_n_epoch and val_check_interval against the epochs trained")


def test_a_divergence_at_the_fits_last_step_claims_no_stop():
    why = "training loss non-finite at the last 3 optimizer step(s) (steps 1-3; last finite at step 0)"
    summary = RunSummary(trained=_trained(), divergence=DivergenceSummary(
        window=3, steps=4, trailing_nonfinite_steps=3, diverged=True, why=why, stopped_at_step=None))
    assert (V.validity(summary, 4).status, V.validity(summary, 4).reason) == ("diverged", why)
    stopped = RunSummary(trained=_trained(), divergence=DivergenceSummary(
        window=3, steps=4, trailing_nonfinite_steps=3, diverged=True, why=why, stopped_at_step=4))
    assert V.validity(stopped, 4).reason == f"{why}; DivergenceCallback stopped the run at step 4"


def test_without_global_step_the_trained_records_steps_count():
    """An older run.json without ``global_step``: the TrainedCallback's optimizer steps decide."""
    none = V.validity(RunSummary(trained=_trained(steps=0, changed=False)), None)
    assert (none.status, none.reason) == ("not-trained", V.NO_STEP)
    some = V.validity(RunSummary(trained=_trained(steps=4)), None)
    assert some.valid and some.reason.startswith("4 optimizer step(s) (skipped steps not recorded;")


def test_without_any_step_count_the_reason_says_so():
    """No ``global_step`` and no ``summary.trained``: the count is not recorded (before: 'None optimizer step(s)')."""
    v = V.validity(RunSummary(), None)
    assert v.valid and v.reason == (f"optimizer steps not recorded ({UNKNOWN}); final weights not checked;"
                                    " validations not recorded")
    unvalidated = V.validity(RunSummary(quality=QualitySummary(validation_configured=True, validations=0)), None)
    assert unvalidated.reason.startswith("validation was configured but never ran (optimizer steps not recorded):")


def test_the_skipped_share_is_judged_against_global_step_when_nothing_else_counts_steps():
    """Only the non-finite policy's skips are recorded: 4 skipped (3 on rank 0, 1 on rank 1) of global step 5."""
    summary = RunSummary(nonfinite=NonFiniteSummary(per_rank=[RankCounts(3, 3), RankCounts(1, 1)]))
    v = V.validity(summary, 5)
    assert (v.status, v.reason) == ("not-trained", "4 of 5 optimizer steps skipped, more than 50%")
    assert V.validity(summary, 8).status == "finished"  # 4 of 8: not more than half


def test_of_run_counts_the_whole_resumed_fit_from_global_step():
    """Resumed at step 6: global_step 10 for the whole fit, 4 optimizer steps in the last part (TrainedCallback)."""
    run = RunJson(status="finished", summary=RunSummary(trained=_trained(steps=4)), global_step=10)
    assert V.of_run(run).reason.startswith("10 optimizer step(s) (skipped steps not recorded;")
    nothing = RunJson(status="finished", summary=RunSummary(), global_step=0)
    assert (V.of_run(nothing).status, V.of_run(nothing).reason) == ("not-trained", V.NO_STEP)
