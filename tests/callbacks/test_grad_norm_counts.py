"""GradNormCallback's counts per log interval, per epoch and per run, against the test's own norms (issue 36).

One 16-mixed fit with a real CPU GradScaler, 2 epochs x 6 steps, logging every 2 steps: overflow steps 1, 3
(epoch 0, two different log intervals) and 8 (epoch 1) give non-finite norms; loss factors at steps 2, 4, 5, 10
give norms above the clipping threshold in both epochs, so per-epoch counts differ from the run's and from each
other. The reference norms are the test's own: ``sqrt(sum g^2)`` over every gradient in float64 at
``on_before_optimizer_step`` (Lightning calls it after the scaler's ``unscale_``, before clipping).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.plugins import MixedPrecision

from cropscale import CropScaleError
from cropscale.callbacks import GradNormCallback
from cropscale.testing.toy import ToyTask
from tests.callbacks.test_grad_norm_fused import ListLogger

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
    pytest.mark.filterwarnings("ignore:The number of training batches"),
]

OVERFLOW, BIG = {1, 3, 8}, {2: 30.0, 4: 30.0, 5: 30.0, 10: 300.0}
THRESHOLD = 0.5
PER_EPOCH = 6


class NormSpy(Callback):
    """The total 2-norm of the unscaled, unclipped gradients of every optimizer step, and the state mid-epoch."""

    def __init__(self, gn: GradNormCallback | None = None, state_at: int | None = None) -> None:
        self.norms: list[float] = []
        self.gn, self.state_at, self.state = gn, state_at, None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        g = torch.cat([p.grad.detach().double().flatten() for p in pl_module.parameters() if p.grad is not None])
        self.norms.append(float(torch.linalg.vector_norm(g)))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.gn is not None and trainer.global_step == self.state_at:
            self.state = self.gn.state_dict()


def _fit(gn, *, clip=None, state_at=None):
    torch.manual_seed(0)
    spy, logger = NormSpy(gn, state_at), ListLogger()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=100)
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=2, callbacks=[gn, spy], logger=logger,
                      log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0,
                      plugins=[MixedPrecision("16-mixed", "cpu", scaler)], gradient_clip_val=clip)
    trainer.fit(ToyTask(n_train=4 * PER_EPOCH, batch_size=4, overflow_steps=OVERFLOW, loss_factors=BIG))
    return spy, logger


@pytest.fixture(scope="module", params=["clipping", "computed"])
def run(request):
    """The clipping's own norm (trainer clips at THRESHOLD) and the callback's (no clipping, clip_val=THRESHOLD)."""
    if request.param == "clipping":
        gn = GradNormCallback()
        spy, logger = _fit(gn, clip=THRESHOLD, state_at=3)
    else:
        gn = GradNormCallback(clip_val=THRESHOLD)
        spy, logger = _fit(gn, state_at=3)
    return {"gn": gn, "spy": spy, "logger": logger, "mode": request.param}


def _finite(xs):
    return [x for x in xs if math.isfinite(x)]


def test_the_premise_norms_that_tell_per_epoch_from_cumulative_counts(run):
    """Non-finite steps in two log intervals of epoch 0 and in epoch 1; steps above the threshold in both epochs,
    in two log intervals of epoch 0, in different numbers per epoch."""
    norms = run["spy"].norms
    assert len(norms) == 2 * PER_EPOCH
    assert [i for i, n in enumerate(norms) if not math.isfinite(n)] == sorted(OVERFLOW)
    big = [i for i, n in enumerate(norms) if n > THRESHOLD]  # NaN > x is False
    per_epoch = [sum(i < PER_EPOCH for i in big), sum(i >= PER_EPOCH for i in big)]
    assert {2, 4, 5, 10} <= set(big) and per_epoch[0] != per_epoch[1]


def test_run_summary_counts_and_fraction_over_finite_steps(run):
    gn, norms = run["gn"], run["spy"].norms
    s = gn.summary()
    finite = _finite(norms)
    clipped = sum(n > THRESHOLD for n in finite)
    assert (s.steps, s.nonfinite_steps, s.clipped_steps) == (12, 3, clipped)
    assert s.clip_fraction == pytest.approx(clipped / len(finite))  # over the 9 finite steps, not the 12
    assert (s.norm_type, s.clip_threshold, s.clip_threshold_reason) == (2.0, THRESHOLD, None)
    assert (s.sharded_reduction, s.sharding, s.sharding_reason) == (False, "replicated", None)
    assert [e.epoch for e in s.epochs] == [0, 1]
    source = "the gradient clipping's total norm" if run["mode"] == "clipping" else "computed by the callback"
    assert gn.norm_source.startswith(source)


def test_each_epoch_counts_its_own_steps(run):
    norms = run["spy"].norms
    for e in run["gn"].summary().epochs:
        mine = norms[e.epoch * PER_EPOCH:(e.epoch + 1) * PER_EPOCH]
        finite = _finite(mine)
        assert e.steps == PER_EPOCH and e.nonfinite_steps == PER_EPOCH - len(finite)
        assert e.clipped_steps == sum(n > THRESHOLD for n in finite)
        assert e.clip_fraction == pytest.approx(e.clipped_steps / len(finite))
        assert e.grad_norm_median == pytest.approx(float(np.percentile(finite, 50)), rel=1e-4)
        assert e.grad_norm_p95 == pytest.approx(float(np.percentile(finite, 95)), rel=1e-4)
        assert e.grad_norm_max == pytest.approx(max(finite), rel=1e-4)
    e0, e1 = run["gn"].summary().epochs
    assert (e0.nonfinite_steps, e1.nonfinite_steps) == (2, 1) and e0.clipped_steps != e1.clipped_steps


def test_each_log_interval_is_the_mean_max_and_fraction_of_its_finite_steps(run):
    """Including the interval after the checkpoint taken at step 3 (its state_dict reads the pending norms)."""
    norms = run["spy"].norms
    rows = [m for _, m in run["logger"].rows if "numerics/grad_norm" in m]
    assert len(rows) == 6  # every 2 steps
    for k, m in enumerate(rows):
        finite = _finite(norms[2 * k:2 * k + 2])
        assert m["numerics/grad_norm"] == pytest.approx(sum(finite) / len(finite), rel=1e-4)
        assert m["numerics/grad_norm_max"] == pytest.approx(max(finite), rel=1e-4)
        assert m["numerics/grad_clip_fraction"] == pytest.approx(sum(n > THRESHOLD for n in finite) / len(finite))
    epoch_rows = [m for _, m in run["logger"].rows if "numerics/epoch/grad_norm_median" in m]
    assert [(m["numerics/epoch/grad_norm_median"], m["numerics/epoch/grad_norm_p95"],
             m["numerics/epoch/grad_clip_fraction"]) for m in epoch_rows] == [
        (e.grad_norm_median, e.grad_norm_p95, e.clip_fraction) for e in run["gn"].summary().epochs]


def test_a_checkpoint_inside_an_epoch_carries_the_epochs_steps_so_far(run):
    """Taken after 3 steps (logged at 2; the third, pending, is read by state_dict): steps 0-2 of epoch 0."""
    norms, state = run["spy"].norms, run["spy"].state
    first = norms[:3]
    clipped, bad = sum(n > THRESHOLD for n in first), sum(not math.isfinite(n) for n in first)
    assert (state["steps"], state["nonfinite_steps"], state["clipped_steps"]) == (3, bad, clipped) == (3, 1, 1)
    assert state["in_epoch"]["epoch"] == 0  # the epoch it was taken in: a resume in epoch 0 takes these steps
    assert state["in_epoch"]["norms"] == pytest.approx(_finite(first), rel=1e-4)
    assert (state["in_epoch"]["clipped"], state["in_epoch"]["nonfinite"]) == (clipped, bad)
    back = GradNormCallback()
    back.load_state_dict(state)
    assert (back.steps, back.nonfinite_steps, back.clipped_steps, back.epochs) == (3, bad, clipped, [])


def test_a_checkpoint_after_only_non_finite_steps_still_carries_them():
    gn = GradNormCallback()
    gn._epoch_now, gn._epoch_nonfinite = 0, 2  # an epoch whose only steps so far overflowed
    assert gn.state_dict()["in_epoch"] == {"epoch": 0, "norms": [], "clipped": 0, "nonfinite": 2}
    assert "in_epoch" not in GradNormCallback().state_dict()


def test_a_mid_epoch_resume_counts_each_step_once(tmp_path):
    """Stop after step 3 of epoch 0, resume from that checkpoint: the epochs equal the uninterrupted run's."""
    whole = GradNormCallback()
    _fit(whole, clip=THRESHOLD)
    torch.manual_seed(0)
    first = GradNormCallback()
    from lightning.pytorch.callbacks import ModelCheckpoint

    ckpt = ModelCheckpoint(dirpath=str(tmp_path), every_n_train_steps=3, save_top_k=-1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=100)
    common = dict(accelerator="cpu", devices=1, logger=False, log_every_n_steps=2, enable_progress_bar=False,
                  enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                  gradient_clip_val=THRESHOLD)
    task = dict(n_train=4 * PER_EPOCH, batch_size=4, overflow_steps=OVERFLOW, loss_factors=BIG)
    Trainer(max_steps=3, callbacks=[first, ckpt], plugins=[MixedPrecision("16-mixed", "cpu", scaler)],
            **common).fit(ToyTask(**task))
    second = GradNormCallback()
    scaler2 = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=100)
    Trainer(max_epochs=2, callbacks=[second], plugins=[MixedPrecision("16-mixed", "cpu", scaler2)],
            enable_checkpointing=False, **common).fit(ToyTask(**task), ckpt_path=str(next(tmp_path.glob("*.ckpt"))))
    a, b = whole.summary(), second.summary()
    assert (b.steps, b.nonfinite_steps, b.clipped_steps) == (a.steps, a.nonfinite_steps, a.clipped_steps)
    assert [(e.steps, e.nonfinite_steps, e.clipped_steps) for e in b.epochs] == [
        (e.steps, e.nonfinite_steps, e.clipped_steps) for e in a.epochs]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"norm_type": 0}, "GradNormCallback(norm_type=0): must be > 0"),
    ({"norm_type": -1.0}, "GradNormCallback(norm_type=-1.0): must be > 0"),
    ({"clip_val": 0.0}, "GradNormCallback(clip_val=0.0): must be > 0 or None"),
])
def test_bad_arguments_are_refused_with_the_call(kwargs, message):
    with pytest.raises(CropScaleError) as info:
        GradNormCallback(**kwargs)
    assert str(info.value) == message


def test_small_positive_arguments_are_accepted():
    gn = GradNormCallback(norm_type=0.5, clip_val=0.25)
    assert (gn.norm_type, gn.clip_val) == (0.5, 0.25)


def test_before_any_fit_nothing_is_counted_and_an_empty_state_is_a_fresh_one():
    gn = GradNormCallback()
    assert gn.norm_source == "not measured yet"
    s = gn.summary()
    assert (s.steps, s.nonfinite_steps, s.clipped_steps, s.clip_fraction, s.epochs) == (0, 0, None, None, [])
    gn.load_state_dict({"epochs": []})  # a checkpoint of an older version, without the counts
    assert (gn.steps, gn.clipped_steps, gn.nonfinite_steps, gn.epochs) == (0, 0, 0, [])
    gn.load_state_dict({})
    assert (gn.steps, gn.clipped_steps, gn.nonfinite_steps, gn.epochs) == (0, 0, 0, [])


def test_norms_read_by_two_checkpoints_between_log_steps_all_go_into_the_next_interval():
    from cropscale.callbacks._grads import GradNormParts

    gn = GradNormCallback()
    got: list[float] = []
    for value in (3.0, 4.0):  # two checkpoints, each reading the norm pending then
        gn._norms.append((GradNormParts([torch.tensor(value)]), None))
        gn._flush()
    gn._norms.append((GradNormParts([torch.tensor(5.0)]), None))
    gn._flush(then=got.extend)
    assert got == [3.0, 4.0, 5.0] and gn.steps == 3


def _plain_fit(gn, monkeypatch=None, layout=None, **trainer_kwargs):
    if layout is not None:
        from cropscale.callbacks import grad_norm as grad_norm_module

        monkeypatch.setattr(grad_norm_module, "shard_layout", lambda trainer: layout)
    torch.manual_seed(0)
    args = dict(accelerator="cpu", devices=1, max_epochs=1, callbacks=[gn], logger=False, log_every_n_steps=2,
                enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                num_sanity_val_steps=0, limit_val_batches=0)
    Trainer(**(args | trainer_kwargs)).fit(ToyTask(n_train=16, batch_size=4))
    return gn.summary()


def test_without_a_norm_threshold_nothing_is_called_clipped_and_the_reason_is_given():
    for kwargs in ({}, {"gradient_clip_val": 0.01, "gradient_clip_algorithm": "value"}):
        gn = GradNormCallback()
        s = _plain_fit(gn, **kwargs)
        assert s.steps == 4 and (s.clip_threshold, s.clipped_steps, s.clip_fraction) == (None, None, None)
        assert s.clip_threshold_reason == ("no gradient clipping by norm configured (trainer.gradient_clip_val unset "
                                           "or gradient_clip_algorithm='value')")
        (e,) = s.epochs
        assert (e.clipped_steps, e.clip_fraction, e.steps) == (None, None, 4)


def test_another_norm_type_is_computed_and_reported():
    gn = GradNormCallback(norm_type=1.0)
    s = _plain_fit(gn, gradient_clip_val=100.0)  # clipping by the 2-norm: not this norm, computed by the callback
    assert s.norm_type == 1.0 and gn.norm_source == "computed by the callback (norm_type is not 2)"
    assert s.clip_threshold == 100.0 and s.clipped_steps == 0


def test_forced_layouts_are_reported(monkeypatch):
    s = _plain_fit(GradNormCallback(sharded=False))
    assert (s.sharding, s.sharded_reduction) == ("replicated", False)
    s = _plain_fit(GradNormCallback(sharded=True))  # one process: the shards of a world of 1
    assert (s.sharding, s.sharded_reduction, s.steps) == ("world", True, 4)
    from cropscale.callbacks._grads import ShardLayout

    why = "DeepSpeed ZeRO-2/3 keeps the gradients outside p.grad"
    gn = GradNormCallback()
    s = _plain_fit(gn, monkeypatch, layout=ShardLayout("unsupported", reason=why), gradient_clip_val=1.0)
    assert (s.sharding, s.sharding_reason, s.sharded_reduction) == ("unsupported", why, False)
    assert gn.norm_source.startswith("computed by the callback")  # never the clipping's norm there
    # inside a CallbackGroup no per-step hook reaches it (there would be no p.grad to measure)
    assert not any(gn.wants_hook(h) for h in ("on_before_optimizer_step", "on_train_batch_end"))


def test_the_clipping_norm_path_needs_no_hook_of_its_own_before_the_step():
    gn = GradNormCallback()
    _plain_fit(gn, gradient_clip_val=1.0)
    assert gn._tap is not None  # the premise: the clipping's norm is taken
    assert gn.wants_hook("on_before_optimizer_step") is False and gn.wants_hook("on_train_batch_end") is True
    computed = GradNormCallback(norm_type=1.0)
    _plain_fit(computed, gradient_clip_val=1.0)
    assert computed.wants_hook("on_before_optimizer_step") is True


def test_an_epoch_whose_every_step_overflowed_has_no_norm_statistics():
    torch.manual_seed(0)
    gn = GradNormCallback(clip_val=THRESHOLD)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=100)
    Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[gn], logger=False, log_every_n_steps=2,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
            num_sanity_val_steps=0, limit_val_batches=0, plugins=[MixedPrecision("16-mixed", "cpu", scaler)]
            ).fit(ToyTask(n_train=8, batch_size=4, overflow_steps={0, 1}))
    (e,) = gn.summary().epochs
    assert (e.steps, e.nonfinite_steps, e.grad_norm_median, e.grad_norm_max) == (2, 2, None, None)
    assert e.clip_fraction is None
    assert e.clipped_steps == 0 and gn.summary().clip_fraction is None


def test_accumulated_micro_batches_log_at_optimizer_steps():
    """4 optimizer steps of 2 micro-batches, logging every 2 optimizer steps: 2 intervals of 2 norms (computed)."""
    torch.manual_seed(0)
    gn, logger = GradNormCallback(norm_type=1.0), ListLogger()
    Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[gn], logger=logger, log_every_n_steps=2,
            accumulate_grad_batches=2, enable_progress_bar=False, enable_model_summary=False,
            enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0
            ).fit(ToyTask(n_train=16, batch_size=2))
    assert gn.steps == 4
    assert [step for step, m in logger.rows if "numerics/grad_norm" in m] == [2, 4]


def test_an_exception_gives_the_clipping_back():
    tapped = []

    class Boom(ToyTask):
        def training_step(self, batch, batch_idx):
            if self.global_step == 2:
                tapped.append("clip_grad_by_norm" in self.trainer.precision_plugin.__dict__)
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    gn = GradNormCallback()
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[gn], logger=False,
                      gradient_clip_val=1.0, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom(n_train=16, batch_size=4))
    assert tapped == [True]  # the premise: during the fit the clipping's norm was tapped
    assert "clip_grad_by_norm" not in trainer.precision_plugin.__dict__  # the plugin's own method again
