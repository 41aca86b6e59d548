"""LossScaleCallback per epoch, per log step and across a resume, against the test's own replay of GradScaler's rule.

16-mixed with a real CPU GradScaler (init 1024, growth x2 after 2 clean steps, back-off x0.5), 3 epochs x 4
steps; a NaN sample in the second batch of every epoch (a non-finite loss: steps 1, 5, 9), overflows of a finite
loss at steps 2 and 10: the counts differ from epoch to epoch, so per-epoch
and cumulative counts tell apart. The reference is :func:`replay`, written from PyTorch's documented rule
(``torch/amp/grad_scaler.py``, ``_amp_update_scale_``), not from the callback.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins import MixedPrecision

from cropscale.callbacks import LossScaleCallback
from cropscale.callbacks.loss_scale import _Step
from cropscale.testing.toy import ToyTask
from tests.callbacks.test_grad_norm_fused import ListLogger

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
    pytest.mark.filterwarnings("ignore:NonFiniteCallback"),
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
]

PER_EPOCH, EPOCHS = 4, 3
OVERFLOW, NAN_SAMPLE = {2, 10}, 1004  # sample 4 of the 16: in batch 1 of each epoch
INIT, GROWTH, BACKOFF, INTERVAL = 1024.0, 2.0, 0.5, 2


def replay(skipped: list[bool]) -> list[tuple[float, str]]:
    """(scale after the step, event) per step: "backoff" on a skipped step, "growth" after INTERVAL clean ones."""
    scale, tracker, out = INIT, 0, []
    for skip in skipped:
        if skip:
            scale, tracker, event = scale * BACKOFF, 0, "backoff"
        else:
            tracker += 1
            event = ""
            if tracker == INTERVAL:
                scale, tracker, event = scale * GROWTH, 0, "growth"
        out.append((scale, event))
    return out


def nan_loss(step: int) -> bool:
    return step % PER_EPOCH == 1


def _scaler():
    return torch.amp.GradScaler("cpu", init_scale=INIT, growth_factor=GROWTH, backoff_factor=BACKOFF,
                                growth_interval=INTERVAL)


def _trainer(callbacks, scaler, logger=False, **kw):
    return Trainer(accelerator="cpu", devices=1, callbacks=callbacks, logger=logger, log_every_n_steps=3,
                   plugins=[MixedPrecision("16-mixed", "cpu", scaler)], enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, **kw)


def _task():
    return ToyTask(n_train=4 * PER_EPOCH, batch_size=4, overflow_steps=OVERFLOW, nan_patch_ids={NAN_SAMPLE},
                   step_lr_scheduler=True)


@pytest.fixture(scope="module")
def fit():
    torch.manual_seed(0)
    amp, logger, scaler = LossScaleCallback(), ListLogger(), _scaler()
    _trainer([amp], scaler, logger=logger, max_epochs=EPOCHS, enable_checkpointing=False).fit(_task())
    return {"amp": amp, "logger": logger, "scaler": scaler}


def _expected():
    skipped = [i in OVERFLOW or nan_loss(i) for i in range(PER_EPOCH * EPOCHS)]
    return skipped, replay(skipped)


def test_each_epoch_counts_its_own_events(fit):
    skipped, steps = _expected()
    amp = fit["amp"]
    for e in amp.epochs:
        lo, hi = e.epoch * PER_EPOCH, (e.epoch + 1) * PER_EPOCH
        events = [ev for _, ev in steps[lo:hi]]
        assert e.steps == PER_EPOCH
        assert (e.backoff_events, e.growth_events) == (events.count("backoff"), events.count("growth"))
        assert e.skipped_steps == sum(skipped[lo:hi])
        assert e.overflow_skips == sum(i in OVERFLOW for i in range(lo, hi))
        assert e.nonfinite_loss_skips == sum(nan_loss(i) for i in range(lo, hi)) == 1
        assert e.lr_scheduler_steps_on_skipped == sum(skipped[lo:hi])  # one step-interval scheduler
        assert e.loss_scale_end == steps[hi - 1][0]
    per_epoch = [(e.backoff_events, e.growth_events, e.overflow_skips) for e in amp.epochs]
    assert len(set(per_epoch)) > 1  # the premise: the epochs differ


def test_run_totals_and_the_summary(fit):
    skipped, steps = _expected()
    amp, scaler = fit["amp"], fit["scaler"]
    events = [ev for _, ev in steps]
    c = amp.counts
    assert (c["steps"], c["skipped_steps"], c["backoff_events"], c["growth_events"]) == (
        12, sum(skipped), events.count("backoff"), events.count("growth"))
    assert (c["overflow_skips"], c["nonfinite_loss_skips"], c["lr_scheduler_steps_on_skipped"]) == (2, 3, 5)
    s = amp.summary()
    assert (s.initial_scale, s.final_scale) == (INIT, steps[-1][0]) and s.final_scale == scaler.get_scale()
    assert (s.growth_factor, s.backoff_factor, s.growth_interval) == (GROWTH, BACKOFF, INTERVAL)
    assert s.scaler_in_use is True and s.precision == "16-mixed" and s.reason is None
    assert [e.epoch for e in s.epochs] == [0, 1, 2]


def test_log_steps_carry_the_cumulative_counts_so_far(fit):
    skipped, steps = _expected()
    rows = [(step, m) for step, m in fit["logger"].rows if "amp/skipped_steps" in m]
    for step, m in rows:
        events = [ev for _, ev in steps[:step]]
        assert m["amp/loss_scale"] == steps[step - 1][0]
        assert (m["amp/backoff_events"], m["amp/growth_events"]) == (events.count("backoff"), events.count("growth"))
        assert m["amp/skipped_steps"] == sum(skipped[:step]) == m["amp/lr_scheduler_steps_on_skipped"]
        assert m["amp/overflow_skips"] == sum(i in OVERFLOW for i in range(step))
    # log steps 3, 6, 9, 12 and the end of each epoch (4, 8, 12)
    assert sorted({step for step, _ in rows}) == [3, 4, 6, 8, 9, 12]


def test_a_resume_continues_the_counts_and_the_epochs(tmp_path):
    """Stopped after epoch 0 and resumed from its checkpoint: the same counts and epochs as the uninterrupted run."""
    torch.manual_seed(0)
    first = LossScaleCallback()
    ckpt = ModelCheckpoint(dirpath=str(tmp_path), save_last=True)
    _trainer([first, ckpt], _scaler(), max_epochs=1).fit(_task())
    second = LossScaleCallback()
    _trainer([second], _scaler(), max_epochs=EPOCHS,
             enable_checkpointing=False).fit(_task(), ckpt_path=str(tmp_path / "last.ckpt"))
    skipped, steps = _expected()
    events = [ev for _, ev in steps]
    assert (second.counts["steps"], second.counts["backoff_events"], second.counts["growth_events"]) == (
        12, events.count("backoff"), events.count("growth"))
    assert [e.epoch for e in second.epochs] == [0, 1, 2] and second.epochs[0] == first.epochs[0]
    s = second.summary()
    assert (s.initial_scale, s.final_scale) == (INIT, steps[-1][0])  # the first run's initial scale, kept


def test_a_state_without_counts_is_a_fresh_one():
    amp = LossScaleCallback()
    amp.load_state_dict({"counts": {"steps": 5}})
    assert amp.counts["steps"] == 5 and amp.counts["growth_events"] == 0 and amp.epochs == []
    assert (amp._last_scale, amp._initial_scale) == (None, None)


def test_a_growth_that_would_overflow_float32_keeps_the_scale():
    """GradScaler does not grow a scale to inf; the replay must not count such a growth."""
    amp = LossScaleCallback()
    amp._config = {"growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 1}
    big = float(torch.finfo(torch.float32).max) / 1.5
    amp._replay = (big, 0)
    amp._count([_Step(False, None, [], 0)], [big, 0.0])
    assert amp.counts["growth_events"] == 0 and amp._replay == (pytest.approx(big), 0)


def test_a_scale_set_from_outside_is_followed():
    """update(new_scale=...) by hand: the replay starts again from the scaler's scale and growth tracker."""
    amp = LossScaleCallback()
    amp._config = {"growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3}
    amp._replay = (1024.0, 0)
    amp._count([_Step(False, None, [], 0)], [64.0, 0.0])  # the replay says (1024, 1); the scaler holds (64, 0)
    assert amp._replay == (64.0, 0) and amp._last_scale == 64.0 and amp.counts["growth_events"] == 0
    amp._count([_Step(False, None, [], 0), _Step(False, None, [], 0)], [64.0, 2.0])
    assert amp._replay == (64.0, 2) and amp.counts["steps"] == 3


def test_without_a_scaler_nothing_is_counted_or_hooked():
    amp = LossScaleCallback()
    Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[amp], logger=False, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0).fit(ToyTask())
    s = amp.summary()
    assert (s.scaler_in_use, s.precision) == (False, "32-true")
    assert s.reason == "precision=32-true: no GradScaler in use (FP16 loss scaling only applies to 16-mixed)"
    assert amp.counts["steps"] == 0 and amp.epochs == []
    assert not any(amp.wants_hook(h) for h in ("on_train_batch_end", "on_before_optimizer_step"))


def test_per_step_hooks_are_wanted_with_a_scaler_but_never_the_backward_ones(fit):
    amp = fit["amp"]
    assert amp.wants_hook("on_train_batch_end") and amp.wants_hook("on_before_optimizer_step")
    assert not any(amp.wants_hook(h) for h in ("on_before_backward", "on_after_backward", "on_before_zero_grad"))


def test_the_optimizer_hooks_are_removed_at_the_end(fit):
    assert fit["amp"]._hooks == []


def test_replay_of_the_documented_rule_hand_worked():
    """The reference itself, checked by hand: 1024 -> clean, clean (x2) -> skip (x0.5) -> clean."""
    assert replay([False, False, True, False]) == [(1024.0, ""), (2048.0, "growth"), (1024.0, "backoff"),
                                                   (1024.0, "")]
    assert math.isfinite(replay([False] * 40)[-1][0])


class FusedTask(ToyTask):
    """A fused AdamW (it unscales inside step(): the step post-hook fires on skipped steps too)."""

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01, fused=True)


def test_a_fused_optimizer_is_counted_from_the_scalers_found_inf(tmp_path):
    torch.manual_seed(0)
    amp, scaler = LossScaleCallback(), _scaler()
    _trainer([amp], scaler, max_epochs=EPOCHS, enable_checkpointing=False).fit(
        FusedTask(n_train=4 * PER_EPOCH, batch_size=4, overflow_steps=OVERFLOW, nan_patch_ids={NAN_SAMPLE}))
    assert amp._fused is True  # the premise
    skipped, steps = _expected()
    events = [ev for _, ev in steps]
    c = amp.counts
    assert (c["steps"], c["skipped_steps"], c["backoff_events"], c["growth_events"]) == (
        12, sum(skipped), events.count("backoff"), events.count("growth"))
    assert (c["overflow_skips"], c["nonfinite_loss_skips"]) == (2, 3)
    assert amp.summary().final_scale == steps[-1][0] == scaler.get_scale()
    assert [e.skipped_steps for e in amp.epochs] == [sum(skipped[e * 4:(e + 1) * 4]) for e in range(EPOCHS)]


class SkipsOneStep(ToyTask):
    def training_step(self, batch, batch_idx):
        return None if self.global_step == 1 and batch_idx == 1 else super().training_step(batch, batch_idx)


def test_a_step_that_returned_no_loss_is_not_counted():
    """training_step returned None: Lightning neither steps the optimizer nor updates the scaler."""
    torch.manual_seed(0)
    amp, scaler = LossScaleCallback(), _scaler()
    _trainer([amp], scaler, max_epochs=1, enable_checkpointing=False).fit(SkipsOneStep(n_train=16, batch_size=4))
    assert amp.counts["steps"] == 3 and amp.counts["skipped_steps"] == 0
    assert amp.summary().final_scale == scaler.get_scale() == INIT * GROWTH  # one growth after 2 clean steps


def test_a_disabled_scaler_is_no_scaler_and_the_reason_is_logged(caplog):
    amp = LossScaleCallback()
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    with caplog.at_level("INFO"):
        _trainer([amp], scaler, max_epochs=1, enable_checkpointing=False).fit(ToyTask(n_train=8, batch_size=4))
    s = amp.summary()
    assert (s.scaler_in_use, s.precision) == (False, "16-mixed") and amp.counts["steps"] == 0
    line = "LossScaleCallback: precision=16-mixed: no GradScaler in use (FP16 loss scaling only applies to 16-mixed)"
    assert line in caplog.text


def test_the_summary_carries_the_counts(fit):
    s, c = fit["amp"].summary(), fit["amp"].counts
    assert (s.steps, s.backoff_events, s.growth_events, s.skipped_steps, s.overflow_skips, s.nonfinite_loss_skips,
            s.lr_scheduler_steps_on_skipped) == tuple(c[k] for k in ("steps", "backoff_events", "growth_events",
                                                                      "skipped_steps", "overflow_skips",
                                                                      "nonfinite_loss_skips",
                                                                      "lr_scheduler_steps_on_skipped"))


def test_the_last_scale_survives_a_state_round_trip():
    amp = LossScaleCallback()
    amp.counts["steps"], amp._last_scale, amp._initial_scale = 7, 512.0, 1024.0
    back = LossScaleCallback()
    back.load_state_dict(amp.state_dict())
    assert (back.counts["steps"], back._last_scale, back._initial_scale) == (7, 512.0, 1024.0)
    empty = LossScaleCallback()
    empty.load_state_dict({})
    assert empty.counts == dict.fromkeys(empty.counts, 0)


def _counting(interval, replay):
    amp = LossScaleCallback()
    amp._config = {"growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": interval}
    amp._replay = replay
    return amp


def test_two_growths_in_one_read_and_a_growth_after_a_back_off():
    amp = _counting(2, (1024.0, 0))
    amp._count([_Step(False, None, [], 0)] * 4, [4096.0, 0.0])  # growths after steps 2 and 4
    assert (amp.counts["growth_events"], amp._replay) == (2, (4096.0, 0))
    big = float(torch.finfo(torch.float32).max) / 1.5
    amp = _counting(1, (big, 0))
    # back-off to big / 2, then a growth back to big (finite): one of each (dividing by the back-off would overflow)
    amp._count([_Step(True, None, [torch.tensor(1.0)], 0), _Step(False, None, [], 0)], [big, 0.0, 1.0])
    assert (amp.counts["backoff_events"], amp.counts["growth_events"], amp.counts["overflow_skips"]) == (1, 1, 1)


def test_the_scalers_state_before_and_after_its_first_scale():
    from cropscale.callbacks.loss_scale import _scaler_state, _scheduler_steps

    scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    assert _scaler_state(scaler) == (64.0, 0)  # no scale tensor yet: the initial values
    scaler.scale(torch.tensor(1.0))
    scaler.update(new_scale=256.0)
    assert _scaler_state(scaler) == (256.0, 0)
    assert _scheduler_steps([SimpleNamespace(last_epoch=3), SimpleNamespace(), SimpleNamespace(last_epoch=2)]) == 5


class ManualTask(ToyTask):
    """Manual optimisation: training_step steps the optimizer itself (through the scaler) and returns the loss."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss


def test_manual_optimisation_steps_are_counted_too():
    amp, scaler = LossScaleCallback(), _scaler()
    _trainer([amp], scaler, max_epochs=1, enable_checkpointing=False).fit(
        ManualTask(n_train=12, batch_size=4, overflow_steps={1}))
    assert (amp.counts["steps"], amp.counts["skipped_steps"], amp.counts["overflow_skips"]) == (3, 1, 1)
    assert amp.summary().final_scale == scaler.get_scale() == INIT * BACKOFF
