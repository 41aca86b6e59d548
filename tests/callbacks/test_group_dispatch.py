"""The group's per-step fast paths: the same figures as separate callbacks, and the hooks Lightning skips.

A :class:`CallbackGroup` hands Lightning ``None`` for a per-step hook no member wants, a member's bound method
for a hook only one member wants, and sets the step flag itself for members that keep the default
``on_before_optimizer_step``. The non-finite check under ``log`` reads the loss from ``on_train_batch_end``.
None of this may change a figure: the grouped run is compared with the same run made of separate
callbacks, and with values worked out by hand from the toy data.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.profilers import SimpleProfiler

from cropscale.callbacks import (
    CallbackGroup,
    GradNormCallback,
    MemoryCallback,
    NonFiniteCallback,
    StepTimingCallback,
    ThroughputCallback,
)
from cropscale.testing.toy import ToyTask
from tests.callbacks.test_fit import NormSpy  # total L2 norm of the gradients, one concatenated vector

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
    pytest.mark.filterwarnings("ignore:NonFiniteCallback"),
    pytest.mark.filterwarnings("ignore:The number of training batches"),
]


def _members():
    return [StepTimingCallback(warmup_steps=0), ThroughputCallback(warmup_steps=0), NonFiniteCallback(),
            GradNormCallback(), MemoryCallback()]


def _fit(root: Path, callbacks: list, profiler=None, nan_patch_ids=()) -> Trainer:
    torch.manual_seed(3)
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=2, callbacks=callbacks, logger=False,
                      accumulate_grad_batches=2, log_every_n_steps=1, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                      default_root_dir=str(root), profiler=profiler)
    # 16 samples (patch ids 1000-1015) in batches of 4, accumulated by 2: 2 optimizer steps per epoch
    trainer.fit(ToyTask(n_train=16, batch_size=4, nan_patch_ids=nan_patch_ids))
    return trainer


def _figures(cbs: list, spy: NormSpy) -> dict:
    st, th, nf, gn, mem = cbs
    return {
        "steps_total": st.steps_total,
        "samples": [e.samples for e in th.epochs],
        "latencies": [e.step_latency_ms.n for e in th.epochs],
        "records": [(r.global_step, r.micro_batch, r.patch_id, r.loss_finite, r.grads_finite) for r in nf.records],
        "grad_steps": gn.steps,
        "grad_nonfinite": gn.nonfinite_steps,
        "grad_epochs": [(e.grad_norm_median, e.grad_norm_max) for e in gn.epochs],
        "memory_epochs": len(mem.epochs),
        "spy": spy.norms,
    }


def test_grouped_and_separate_callbacks_record_the_same_figures(tmp_path):
    grouped, spy_g = _members(), NormSpy()
    separate, spy_s = _members(), NormSpy()
    _fit(tmp_path / "g", [spy_g, CallbackGroup(grouped)])
    _fit(tmp_path / "s", [spy_s, *separate])
    fg, fs = _figures(grouped, spy_g), _figures(separate, spy_s)
    assert fg == fs
    # by hand: 2 epochs x 2 optimizer steps; 16 samples per epoch; every gradient norm as the spy computed it
    assert fg["steps_total"] == 4 == fg["grad_steps"] == len(spy_g.norms)
    assert fg["samples"] == [16, 16] and fg["latencies"] == [1, 1] and fg["memory_epochs"] == 2
    assert fg["records"] == [] and fg["grad_nonfinite"] == 0
    for epoch, (median, top) in enumerate(fg["grad_epochs"]):
        norms = spy_g.norms[2 * epoch:2 * epoch + 2]
        assert median == pytest.approx(statistics.median(norms), rel=1e-6)
        assert top == pytest.approx(max(norms), rel=1e-6)


def test_nonfinite_log_records_name_the_micro_batch_grouped_or_not(tmp_path):
    grouped, separate = _members(), _members()
    _fit(tmp_path / "g", [NormSpy(), CallbackGroup(grouped)], nan_patch_ids={1005})
    _fit(tmp_path / "s", [NormSpy(), *separate], nan_patch_ids={1005})
    rg = _figures(grouped, NormSpy())["records"]
    assert rg == _figures(separate, NormSpy())["records"]
    # by hand: sample 1005 is in batch 1 (ids 1004-1007), the second micro-batch (index 1) of optimizer step 0
    # (steps numbered from 0); its NaN loss makes the gradients, then the weights NaN (policy log does not skip),
    # so every later micro-batch is NaN too: batches 2, 3 (step 1), then all four batches of epoch 1 (steps 2, 3)
    ids = [[1000, 1001, 1002, 1003], [1004, 1005, 1006, 1007], [1008, 1009, 1010, 1011], [1012, 1013, 1014, 1015]]
    expected = [(0, 1, ids[1], False, False), (1, 0, ids[2], False, False), (1, 1, ids[3], False, False),
                (2, 0, ids[0], False, False), (2, 1, ids[1], False, False), (3, 0, ids[2], False, False),
                (3, 1, ids[3], False, False)]
    assert rg == expected
    assert grouped[2].nonfinite_batches == 7 and grouped[3].nonfinite_steps == 4


def test_lightning_skips_the_group_hooks_no_member_wants(tmp_path):
    profiler = SimpleProfiler(dirpath=str(tmp_path), filename="prof")
    group = CallbackGroup(_members())
    _fit(tmp_path, [group], profiler=profiler)
    actions = set(profiler.recorded_durations)
    key = group.state_key

    def ran(hook):
        return f"[Callback]{key}.{hook}" in actions

    assert not ran("on_before_zero_grad")  # no member wants it: Lightning never called the group
    assert ran("on_train_batch_start") and ran("on_before_optimizer_step") and ran("on_train_batch_end")
    # after the fit the group is back to its class methods (a later fit or validate sees the full table)
    assert not any(h in group.__dict__ for h in ("on_before_zero_grad", "on_train_batch_start",
                                                  "on_before_backward", "on_after_backward"))


def test_a_group_fit_after_a_failed_one_still_counts_every_step(tmp_path):
    class Boom(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 1:
                raise RuntimeError("boom")

    members = [StepTimingCallback(warmup_steps=0), MemoryCallback(), ThroughputCallback(warmup_steps=0)]
    group = CallbackGroup(members)
    with pytest.raises(RuntimeError, match="boom"):
        _fit(tmp_path / "a", [group, Boom()])
    assert "on_before_zero_grad" not in group.__dict__  # on_exception restored the class methods
    for cb in members:
        cb.load_state_dict({})
    _fit(tmp_path / "b", [group])
    assert members[0].steps_total == 4 and [e.samples for e in members[2].epochs] == [16, 16]


def test_a_group_inside_a_group_forwards_every_step(tmp_path):
    """The inner group binds its per-step hooks in its own on_train_start (called by the outer one first)."""
    st, th, mem = StepTimingCallback(warmup_steps=0), ThroughputCallback(warmup_steps=0), MemoryCallback()
    _fit(tmp_path, [CallbackGroup([CallbackGroup([st, mem]), th])])
    assert st.steps_total == 4 and [e.samples for e in th.epochs] == [16, 16] and len(mem.epochs) == 2
