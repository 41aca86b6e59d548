"""TrainedCallback's hooks driven by hand: the copy at the start, the comparison at the end, the count over ranks.

A fake trainer (``global_step``, ``world_size``, a strategy whose ``reduce(..., "sum")`` adds the other ranks'
counts) and a real ``nn.Module`` whose parameters the test changes in place, as an optimizer does. The whole
rule on real fits: tests/integration/test_not_trained.py (slow), two gloo ranks: test_ranks_disagree_ddp.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cropscale.callbacks import TrainedCallback
from cropscale.runs.schema import TrainedSummary


class Module(torch.nn.Module):
    def __init__(self, device="cpu"):
        super().__init__()
        self.a = torch.nn.Linear(2, 2)  # two tensors: a.weight, a.bias
        self.b = torch.nn.Linear(2, 1, bias=False)  # one more: b.weight
        self.reported_device = torch.device(device)

    @property
    def device(self):
        return self.reported_device


class SumOverRanks:
    """``reduce(t, reduce_op="sum")``: this rank's count (``mine`` for a meta tensor, which holds no value) plus
    the other ranks' counts: ``others`` (changed tensors) at the first call, ``others_nonfinite`` (non-finite
    tensors) at the second; records the tensor's device, dtype and the operation."""

    def __init__(self, others, mine=None, others_nonfinite=()):
        self.calls, self.mine, self.seen = [others, list(others_nonfinite) or [0] * len(others)], mine, []

    def reduce(self, t, reduce_op=None):
        self.seen.append((t.device.type, t.dtype, reduce_op))
        if reduce_op != "sum":
            raise AssertionError(f"reduce_op={reduce_op!r}")
        mine = self.mine if t.device.type == "meta" else t.item()
        return torch.tensor(float(mine) + sum(self.calls[len(self.seen) - 1]))


def _trainer(world_size=1, others=(), step=0, mine=None, others_nonfinite=()):
    return SimpleNamespace(world_size=world_size, global_step=step,
                           strategy=SumOverRanks(list(others), mine, others_nonfinite))


def test_before_training_the_summary_is_empty_and_no_per_step_hook_is_wanted():
    cb = TrainedCallback()
    assert cb.summary() == TrainedSummary()  # a run that failed before training writes this
    assert not any(cb.wants_hook(h) for h in ("on_train_batch_start", "on_train_batch_end", "on_before_backward",
                                              "on_after_backward", "on_before_optimizer_step"))


def test_in_place_updates_are_seen_against_the_copy_taken_at_the_start():
    m, cb, trainer = Module(), TrainedCallback(), _trainer(step=0)
    cb.on_train_start(trainer, m)
    with torch.no_grad():  # an optimizer updates the tensors in place: the start values must be a copy
        m.a.weight.add_(1.0)
        m.b.weight.mul_(2.0)
    trainer.global_step = 6
    cb.on_train_end(trainer, m)
    assert cb.summary() == TrainedSummary(weights_changed=True, parameters_changed=2, parameters=3,
                                          optimizer_steps=6, weights_finite=True, nonfinite_parameters=0)
    assert trainer.strategy.seen == []  # one process: no collective
    assert cb._start == {}  # the copy is released


def test_nothing_changed_is_not_trained_and_steps_count_from_the_resume():
    m, cb, trainer = Module(), TrainedCallback(), _trainer(step=40)  # resumed at optimizer step 40
    cb.on_train_start(trainer, m)
    trainer.global_step = 47
    cb.on_train_end(trainer, m)
    assert cb.summary() == TrainedSummary(weights_changed=False, parameters_changed=0, parameters=3,
                                          optimizer_steps=7, weights_finite=True,
                                          nonfinite_parameters=0)  # since the resume, not 47 nor 87


def test_one_changed_tensor_is_trained():
    m, cb, trainer = Module(), TrainedCallback(), _trainer()
    cb.on_train_start(trainer, m)
    with torch.no_grad():
        m.a.bias[0] += 0.5
    cb.on_train_end(trainer, m)
    assert cb.summary().weights_changed is True and cb.summary().parameters_changed == 1


def test_a_tensor_added_after_the_start_is_not_compared():
    m, cb, trainer = Module(), TrainedCallback(), _trainer()
    cb.on_train_start(trainer, m)
    m.extra = torch.nn.Parameter(torch.ones(2))  # e.g. a lazily built head: no start value to compare with
    cb.on_train_end(trainer, m)
    assert cb.summary().parameters_changed == 0 and cb.summary().parameters == 3


@pytest.mark.parametrize(("mine_changed", "others", "total"), [(0, [2], 2), (1, [0, 3], 4), (0, [0], 0)])
def test_changed_tensors_are_summed_over_ranks_any_rank_makes_it_trained(mine_changed, others, total):
    """A sharded model changes on some ranks only: this rank changed none, another did -> trained."""
    m, cb = Module(), TrainedCallback()
    trainer = _trainer(world_size=1 + len(others), others=others)
    cb.on_train_start(trainer, m)
    if mine_changed:
        with torch.no_grad():
            m.b.weight.neg_()
    cb.on_train_end(trainer, m)
    assert cb.summary().parameters_changed == total and cb.summary().weights_changed is (total > 0)
    assert trainer.strategy.seen == [("cpu", torch.float32, "sum")] * 2  # changed, then non-finite tensors
    assert cb.summary().weights_finite is True


def test_non_finite_weights_on_another_rank_make_every_rank_see_them():
    """Only another rank's copy went NaN (NonFiniteWeightsAt): this rank's finite weights do not hide it."""
    m, cb = Module(), TrainedCallback()
    trainer = _trainer(world_size=3, others=[0, 0], others_nonfinite=[0, 2])
    cb.on_train_start(trainer, m)
    with torch.no_grad():
        m.a.weight.add_(1.0)
    cb.on_train_end(trainer, m)
    assert (cb.summary().weights_finite, cb.summary().nonfinite_parameters) == (False, 2)
    assert cb.summary().weights_changed is True


def test_the_count_is_reduced_on_the_modules_device():
    """NCCL reduces CUDA tensors only: the count is made on ``pl_module.device`` (the meta device here)."""
    m, cb = Module(device="meta"), TrainedCallback()
    trainer = _trainer(world_size=2, others=[1], mine=0)
    cb.on_train_start(trainer, m)
    cb.on_train_end(trainer, m)
    assert trainer.strategy.seen[0] == ("meta", torch.float32, "sum") and cb.summary().parameters_changed == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_start_copy_is_kept_in_host_memory():
    """The copy costs host memory, not device memory (the module docstring's promise)."""
    m, cb, trainer = Module(device="cuda").to("cuda"), TrainedCallback(), _trainer()
    cb.on_train_start(trainer, m)
    assert {t.device.type for t in cb._start.values()} == {"cpu"}
    with torch.no_grad():
        m.a.weight.add_(1.0)
    cb.on_train_end(trainer, m)
    assert cb.summary().parameters_changed == 1


def test_non_finite_weights_on_this_rank_alone_count_on_every_rank():
    """The mirror case: this rank's a.weight holds an inf (and an inf update also changes it), the two other ranks
    are finite and unchanged: 1 changed tensor over 3 ranks, 1 non-finite tensor, weights not finite."""
    m, cb = Module(), TrainedCallback()
    trainer = _trainer(world_size=3, others=[0, 0], others_nonfinite=[0, 0])
    cb.on_train_start(trainer, m)
    with torch.no_grad():
        m.a.weight[1, 0] = float("inf")
    cb.on_train_end(trainer, m)
    assert cb.summary() == TrainedSummary(weights_changed=True, parameters_changed=1, parameters=3,
                                          optimizer_steps=0, weights_finite=False, nonfinite_parameters=1)
