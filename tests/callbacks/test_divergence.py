"""DivergenceCallback: counts every optimizer step's loss, stops once the last `window` steps are non-finite."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from cropscale import CropScaleError
from cropscale.callbacks import DivergenceCallback
from cropscale.callbacks.divergence import step_divergence
from cropscale.runs.record import load_run
from cropscale.testing.toy import ToyTask

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
    pytest.mark.filterwarnings("ignore:DivergenceCallback"),
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
]


class NaNFrom(ToyTask):
    """ToyTask whose loss is NaN at the optimizer steps in ``nan_steps`` (0-based, before the step counts).

    A NaN constant is added: the loss is NaN, its gradient stays finite, so the weights never turn NaN
    and one bad step stays one bad step.
    """

    def __init__(self, nan_steps, **kwargs) -> None:
        super().__init__(**kwargs)
        self.nan_steps = set(nan_steps)

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.global_step in self.nan_steps:
            loss = loss + torch.tensor(float("nan"))
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        return loss


def _fit(tmp_path, task, callback, log_every=2, accumulate=1):
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, log_every_n_steps=log_every, limit_val_batches=0,
                      logger=TensorBoardLogger(str(tmp_path), name="toy"), callbacks=[callback],
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      accumulate_grad_batches=accumulate)
    trainer.fit(task)
    return trainer


def _trailing(nan_steps, steps: int) -> int:
    """Brute force: the optimizer steps at the end of ``range(steps)`` that are all in ``nan_steps``."""
    n = 0
    for step in reversed(range(steps)):
        if step not in nan_steps:
            break
        n += 1
    return n


def test_stops_once_the_last_window_optimizer_steps_are_non_finite(tmp_path):
    # 64 samples / batch 4 = 16 steps, NaN from step 5 on. Every step counts; the counter is read at the log
    # steps (global step 2, 4, 6, 8 ...): after steps 0-7 it holds steps 5, 6, 7, so the run stops at global
    # step 8 (logged losses alone, steps 1, 3, 5, 7, 9, stopped it at 10).
    cb = DivergenceCallback(window=3)
    trainer = _fit(tmp_path, NaNFrom(range(5, 100), n_train=64), cb)
    assert cb.stopped_at_step == 8 and trainer.global_step == 8
    assert (cb.steps, cb.trailing) == (8, _trailing(range(5, 100), 8)) == (8, 3)
    assert cb.diverged and (cb.verdict.since_step, cb.verdict.last_finite_step) == (5, 4)
    assert cb.verdict.why == ("training loss non-finite at the last 3 optimizer step(s) (steps 5-7; last finite at"
                              " step 4)")
    summary = cb.summary()
    assert (summary.diverged, summary.stopped_at_step, summary.trailing_nonfinite_steps) == (True, 8, 3)


def test_one_non_finite_batch_is_not_a_divergence(tmp_path):
    cb = DivergenceCallback(window=3)
    trainer = _fit(tmp_path, NaNFrom([5], n_train=64), cb, log_every=1)
    assert cb.stopped_at_step is None and trainer.global_step == 16
    assert not cb.diverged and (cb.steps, cb.trailing) == (16, 0)
    assert load_run(trainer.log_dir).divergence.trailing == 0  # the logged series ends finite too


@pytest.mark.parametrize(("nan_steps", "steps", "diverged"), [
    (range(1, 4), 4, True),    # 3 trailing = the window: a divergence, though nothing was ever logged
    (range(2, 4), 4, False),   # 2 trailing < window 3
    (range(0, 2), 2, True),    # a run shorter than the window, non-finite at every step
    (range(1, 2), 2, False),   # ... and one finite step
])
def test_short_runs_are_judged_from_every_step_without_a_log_step(tmp_path, nan_steps, steps, diverged):
    """log_every_n_steps=50 in a run of 2 or 4 steps: no log step, the verdict still counts every step."""
    cb = DivergenceCallback(window=3)
    _fit(tmp_path, NaNFrom(nan_steps, n_train=4 * steps), cb, log_every=50)
    assert cb.steps == steps and cb.trailing == _trailing(set(nan_steps), steps)
    assert cb.verdict.diverged is diverged and cb.stopped_at_step is None


def test_a_divergence_at_the_fits_last_step_is_judged_but_not_called_a_stop(tmp_path):
    """4 steps, NaN from step 1, a log step at every step: the window fills at the last step, where the fit ends
    anyway; the verdict is diverged, and no stop is claimed (before: "stopped the run at step 4")."""
    cb = DivergenceCallback(window=3)
    trainer = _fit(tmp_path, NaNFrom(range(1, 4), n_train=16), cb, log_every=1)
    assert trainer.global_step == 4 and cb.diverged and cb.trailing == 3
    assert cb.stopped_at_step is None and cb.summary().stopped_at_step is None


class NaNMicroBatch(NaNFrom):
    """NaN on the second micro-batch (odd batch_idx) of each optimizer step whose index is in ``nan_steps``."""

    def training_step(self, batch, batch_idx):
        loss = ToyTask.training_step(self, batch, batch_idx)
        if self.global_step in self.nan_steps and batch_idx % 2 == 1:
            loss = loss + torch.tensor(float("nan"))
        return loss


def test_under_accumulation_a_step_counts_once_and_any_micro_batch_makes_it_non_finite(tmp_path):
    # 64 samples / batch 4 = 16 micro-batches = 8 optimizer steps of 2; steps 5, 6, 7 have a NaN second micro-batch
    cb = DivergenceCallback(window=3, action="log")
    trainer = _fit(tmp_path, NaNMicroBatch(range(5, 8), n_train=64), cb, log_every=1, accumulate=2)
    assert trainer.global_step == 8 and cb.steps == 8
    assert cb.trailing == 3 and cb.diverged and cb.verdict.since_step == 5


def test_log_action_records_without_stopping(tmp_path):
    cb = DivergenceCallback(window=2, action="log")
    trainer = _fit(tmp_path, NaNFrom(range(3, 100), n_train=32), cb)
    assert trainer.global_step == 8 and cb.stopped_at_step is None
    assert cb.diverged and (cb.trailing, cb.verdict.since_step) == (5, 3)  # steps 3-7


def test_state_dict_round_trip_keeps_the_verdict():
    cb = DivergenceCallback(window=2)
    cb.load_state_dict({"steps": 6, "trailing": 2, "stopped_at_step": None})
    other = DivergenceCallback(window=2)
    other.load_state_dict(cb.state_dict())
    assert (other.steps, other.trailing) == (6, 2)
    assert other.verdict.diverged is True and other.verdict.since_step == 4


@pytest.mark.parametrize(("trailing", "steps", "window", "diverged", "since", "last_finite"), [
    (0, 5, 3, False, None, 4),
    (2, 5, 3, False, 3, 2),
    (3, 5, 3, True, 2, 1),
    (5, 5, 3, True, 0, None),
    (1, 1, 3, True, 0, None),
    (0, 0, 3, None, None, None),
])
def test_step_rule_at_its_boundaries(trailing, steps, window, diverged, since, last_finite):
    v = step_divergence(trailing, steps, window)
    assert (v.diverged, v.since_step, v.last_finite_step) == (diverged, since, last_finite)


@pytest.mark.parametrize(("kwargs", "needle"), [({"window": 0}, "window=0"), ({"window": 2.5}, "window=2.5"),
                                                 ({"action": "halt"}, "action='halt'")])
def test_bad_arguments_are_named(kwargs, needle):
    with pytest.raises(CropScaleError, match=needle.replace("(", r"\(")):
        DivergenceCallback(**kwargs)
