"""DivergenceCallback: stops once the last `window` logged losses are non-finite, agrees with the report's rule."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from cropscale import CropScaleError
from cropscale.callbacks import DivergenceCallback
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


def _fit(tmp_path, task, callback, log_every=2):
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, log_every_n_steps=log_every, limit_val_batches=0,
                      logger=TensorBoardLogger(str(tmp_path), name="toy"), callbacks=[callback],
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(task)
    return trainer


def test_stops_after_the_window_of_logged_non_finite_losses_and_agrees_with_the_report(tmp_path):
    # 64 samples / batch 4 = 16 steps. NaN from step 5 on. Logged at global steps 2, 4, 6, 8, 10 (after the
    # step), i.e. the losses of steps 1, 3, 5, 7, 9 (TensorBoard numbers them so). Steps 5, 7, 9 are NaN:
    # the third NaN log is at global step 10, where the run stops.
    cb = DivergenceCallback(window=3)
    trainer = _fit(tmp_path, NaNFrom(range(5, 100), n_train=64), cb)
    assert cb.stopped_at_step == 10 and trainer.global_step == 10
    assert cb.diverged and (cb.verdict.trailing, cb.verdict.since_step, cb.verdict.last_finite_step) == (3, 5, 3)
    record = load_run(trainer.log_dir)  # the report's reading of the same run: the same verdict
    assert record.divergence == cb.verdict
    assert record.divergence.why == ("train/loss_step non-finite at the last 3 logged step(s)"
                                     " (steps 5-9; last finite at step 3)")


def test_one_non_finite_batch_is_not_a_divergence(tmp_path):
    cb = DivergenceCallback(window=3)
    trainer = _fit(tmp_path, NaNFrom([5], n_train=64), cb, log_every=1)
    assert cb.stopped_at_step is None and trainer.global_step == 16
    assert not cb.diverged and load_run(trainer.log_dir).divergence == cb.verdict
    assert (cb.tail.logged, cb.tail.trailing, cb.tail.last_finite_step) == (16, 0, 15)


def test_log_action_records_without_stopping(tmp_path):
    cb = DivergenceCallback(window=2, action="log")
    trainer = _fit(tmp_path, NaNFrom(range(3, 100), n_train=32), cb)
    assert trainer.global_step == 8 and cb.stopped_at_step is None
    assert cb.diverged and (cb.verdict.trailing, cb.verdict.since_step) == (3, 3)  # steps 3, 5, 7 logged, all NaN
    assert load_run(trainer.log_dir).divergence == cb.verdict


def test_state_dict_round_trip_keeps_the_verdict():
    cb = DivergenceCallback(window=2)
    for step, value in [(1, 2.0), (3, float("nan")), (5, float("nan"))]:
        cb.tail.add(step, value)
    other = DivergenceCallback(window=2)
    other.load_state_dict(cb.state_dict())
    assert other.tail == cb.tail and other.verdict.diverged is True and other.verdict.since_step == 3


@pytest.mark.parametrize(("kwargs", "needle"), [({"window": 0}, "window=0"), ({"window": 2.5}, "window=2.5"),
                                                 ({"action": "halt"}, "action='halt'")])
def test_bad_arguments_are_named(kwargs, needle):
    with pytest.raises(CropScaleError, match=needle.replace("(", r"\(")):
        DivergenceCallback(**kwargs)
