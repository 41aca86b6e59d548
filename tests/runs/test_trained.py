"""The rule of a run that did not train (issue 23): skipped-step share and weight change, worked by hand."""

from cropscale.runs.rules import MAX_SKIPPED_SHARE, trained
from cropscale.runs.schema import LossScaleSummary, NonFiniteSummary, RunSummary, TrainedSummary


def _summary(steps=None, skipped=None, changed=None, policy_skipped=0):
    return RunSummary(
        loss_scale=LossScaleSummary(scaler_in_use=skipped is not None, steps=steps, skipped_steps=skipped),
        nonfinite=NonFiniteSummary(skipped_steps_rank0=policy_skipped),
        trained=None if changed is None else TrainedSummary(weights_changed=changed, optimizer_steps=steps),
    )


def test_every_step_skipped_is_not_trained():
    v = trained(_summary(steps=16, skipped=16, changed=False))
    assert v.trained is False and v.why.startswith("no weight changed over 16 optimizer step(s)")
    assert "16 of 16 optimizer steps skipped" in v.why


def test_more_than_half_skipped_is_not_trained_even_if_some_weights_moved():
    assert MAX_SKIPPED_SHARE == 0.5
    assert trained(_summary(steps=10, skipped=6, changed=True)).trained is False   # 6 > 0.5 x 10
    assert trained(_summary(steps=10, skipped=5, changed=True)).trained is True    # 5 = 0.5 x 10: not more
    # GradScaler skips and the non-finite policy's skips add up: 3 + 3 > 5
    v = trained(_summary(steps=10, skipped=3, changed=True, policy_skipped=3))
    assert v.trained is False and "6 of 10 optimizer steps skipped, more than 50%" == v.why


def test_unchanged_weights_without_skips_is_not_trained_and_nothing_recorded_cannot_tell():
    assert trained(_summary(steps=8, skipped=0, changed=False)).trained is False
    assert trained(RunSummary()).trained is None
    assert trained(RunSummary(), global_step=4).trained is None   # steps known, skips and weights not
    assert trained(_summary(steps=8, skipped=1, changed=True)).trained is True


def test_unchanged_weights_without_any_step_count_says_the_count_is_missing():
    # run.json holds weights_changed False but no step count anywhere (no trained.optimizer_steps, no loss-scale
    # steps, no global_step): the reason names the missing count instead of printing "None"
    v = trained(RunSummary(trained=TrainedSummary(weights_changed=False)))
    assert v.trained is False
    assert v.why == "no weight changed (optimizer steps not recorded; skipped steps not recorded)"
    assert "None" not in v.why
