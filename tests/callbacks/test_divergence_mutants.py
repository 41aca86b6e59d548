"""DivergenceCallback's hooks driven by hand (issue 36: the survivors of mutation testing, issue 37's rule).

A fake trainer (``global_step``, ``log_every_n_steps``, ``max_epochs`` / ``max_steps``, ``current_epoch``, the
epoch loop's ``is_last_batch``, ``should_stop``) and a fake strategy whose ``reduce`` follows Lightning's DDP
semantics (``"mean"`` -> average, other names -> ``ReduceOp[name.upper()]``) over this rank's counter and the
other ranks' counters, which DISAGREE with it. Every expectation is worked out by hand from the rule: a run
diverged when its last ``min(window, steps)`` optimizer steps had a non-finite loss on some micro-batch, on some
rank; the counter is read at log steps, epoch ends and the end of training; the fit's last step stops nothing.
Real fits: tests/callbacks/test_divergence.py; two gloo ranks: tests/integration/test_ranks_disagree_ddp.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cropscale import CropScaleError
from cropscale.callbacks import DivergenceCallback
from cropscale.callbacks.divergence import step_divergence
from cropscale.runs.schema import DivergenceSummary

pytestmark = pytest.mark.filterwarnings("ignore:DivergenceCallback")

NAN, OK = float("nan"), 1.0


class Ranks:
    """``reduce(t, reduce_op)`` as Lightning's DDPStrategy does it, over this rank's value (``mine`` for a meta
    tensor, which holds none) and ``others``; records (device, dtype, operation) of every call, the operation
    lower-cased as Lightning reads it (``getattr(ReduceOp, op.upper())``: "MAX" is "max")."""

    def __init__(self, others=(), mine=None):
        self.others, self.mine, self.seen = list(others), mine, []

    def _others(self):
        """The other ranks' values at this read: a number is every read's, a list holds one per read."""
        n = len(self.seen) - 1
        return [v[min(n, len(v) - 1)] if isinstance(v, list) else v for v in self.others]

    def reduce(self, t, reduce_op="mean"):
        self.seen.append((t.device.type, t.dtype, reduce_op.lower() if isinstance(reduce_op, str) else reduce_op))
        if not isinstance(reduce_op, str):
            raise TypeError(f"reduce_op={reduce_op!r}")  # torch.distributed.all_reduce(op=None) fails too
        name = ("avg" if reduce_op == "mean" else reduce_op).upper()
        values = [float(self.mine if t.device.type == "meta" else t.item()), *self._others()]
        ops = {"SUM": sum, "MAX": max, "MIN": min, "AVG": lambda v: sum(v) / len(v)}
        if name not in ops:
            raise AttributeError(f"ReduceOp has no {name}")
        return torch.tensor(float(ops[name](values)))


def _trainer(world_size=1, others=(), mine=None, log_every=1, max_epochs=1, max_steps=-1, epoch=0, step=0):
    return SimpleNamespace(world_size=world_size, strategy=Ranks(others, mine), global_step=step,
                           log_every_n_steps=log_every, max_epochs=max_epochs, max_steps=max_steps,
                           current_epoch=epoch, should_stop=False,
                           fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(
                               batch_progress=SimpleNamespace(is_last_batch=False))))


def _module(device="cpu"):
    return SimpleNamespace(device=torch.device(device))


def _start(cb, **kwargs):
    trainer, module = _trainer(**kwargs), _module()
    cb.on_train_start(trainer, module)
    return trainer, module


def _step(cb, trainer, module, *losses, last_batch=False, wrap=dict):
    """One optimizer step of ``len(losses)`` micro-batches: the global step advances before the last one's hook."""
    for i, loss in enumerate(losses):
        if i == len(losses) - 1:
            trainer.global_step += 1
            trainer.fit_loop.epoch_loop.batch_progress.is_last_batch = last_batch
        value = torch.tensor(loss) if loss is not None else None
        cb.on_train_batch_end(trainer, module, wrap(loss=value) if wrap is dict else wrap(value), None, i)


# ------------------------------------------------------------------------------------------------- the rule
@pytest.mark.parametrize(("trailing", "steps", "window", "diverged", "why"), [
    (0, 0, 3, None, "no optimizer step: divergence cannot be judged"),
    (0, 5, 3, False, "the training loss of the last optimizer step is finite"),
    (1, 5, 3, False, "training loss non-finite at the last 1 optimizer step(s) (step 4), fewer than the 3 that make"
                     " a divergence"),
    (2, 5, 3, False, "training loss non-finite at the last 2 optimizer step(s) (steps 3-4), fewer than the 3 that"
                     " make a divergence"),  # window - 1
    (3, 5, 3, True, "training loss non-finite at the last 3 optimizer step(s) (steps 2-4; last finite at step 1)"),
    (2, 2, 3, True, "training loss non-finite at the last 2 optimizer step(s) (steps 0-1; never finite)"),
    (1, 1, 3, True, "training loss non-finite at the last 1 optimizer step(s) (step 0; never finite)"),
    (1, 5, 1, True, "training loss non-finite at the last 1 optimizer step(s) (step 4; last finite at step 3)"),
])
def test_the_step_rule_says_why_word_for_word(trailing, steps, window, diverged, why):
    v = step_divergence(trailing, steps, window)
    assert (v.diverged, v.why, v.trailing) == (diverged, why, trailing)


def test_a_window_of_one_step_is_allowed_and_one_bad_step_stops():
    cb = DivergenceCallback(window=1)
    trainer, module = _start(cb, max_epochs=2)
    _step(cb, trainer, module, OK)
    _step(cb, trainer, module, NAN)
    assert trainer.should_stop and cb.stopped_at_step == 2 and cb.verdict.since_step == 1


# ------------------------------------------------------------------------------ window, reset, accumulation
def test_the_stop_comes_when_the_window_fills_not_one_step_before():
    cb = DivergenceCallback(window=3)
    trainer, module = _start(cb, max_epochs=2)
    for loss in (OK, NAN, NAN):
        _step(cb, trainer, module, loss)
    assert not trainer.should_stop and (cb.steps, cb.trailing, cb.diverged) == (3, 2, False)  # window - 1
    _step(cb, trainer, module, NAN)
    assert trainer.should_stop and cb.stopped_at_step == 4 and (cb.steps, cb.trailing) == (4, 3)
    assert cb.summary() == DivergenceSummary(
        window=3, steps=4, trailing_nonfinite_steps=3, since_step=1, last_finite_step=0, diverged=True,
        why="training loss non-finite at the last 3 optimizer step(s) (steps 1-3; last finite at step 0)",
        stopped_at_step=4)


def test_a_finite_step_resets_the_count():
    cb = DivergenceCallback(window=3)
    trainer, module = _start(cb, max_epochs=2)
    for loss in (NAN, NAN, OK, NAN, NAN):
        _step(cb, trainer, module, loss)
    assert not trainer.should_stop and (cb.trailing, cb.verdict.since_step) == (2, 3)  # not 4 bad of 5
    _step(cb, trainer, module, NAN)
    assert cb.stopped_at_step == 6 and cb.verdict.last_finite_step == 2


def test_under_accumulation_a_bad_first_micro_batch_makes_the_step_bad_and_a_step_counts_once():
    """3 micro-batches per optimizer step; only the FIRST is NaN (a later finite one must not clear it)."""
    cb = DivergenceCallback(window=2)
    trainer, module = _start(cb, max_epochs=2)
    _step(cb, trainer, module, NAN, OK, OK)
    assert (cb.steps, cb.trailing, trainer.should_stop) == (1, 1, False)
    _step(cb, trainer, module, OK, OK, OK)
    assert cb.trailing == 0
    _step(cb, trainer, module, OK, NAN, OK)
    _step(cb, trainer, module, NAN, OK, OK)
    assert (cb.steps, cb.trailing) == (4, 2) and cb.stopped_at_step == 4 and cb.verdict.since_step == 2


def test_a_step_without_a_loss_neither_counts_as_bad_nor_resets():
    """Manual optimization may return no loss (outputs None): that step says nothing about the loss."""
    cb = DivergenceCallback(window=3)
    trainer, module = _start(cb, max_epochs=2)
    _step(cb, trainer, module, NAN)
    _step(cb, trainer, module, NAN)
    _step(cb, trainer, module, None, wrap=lambda v: v)
    assert (cb.steps, cb.trailing, trainer.should_stop) == (3, 2, False)
    _step(cb, trainer, module, NAN)
    assert cb.trailing == 3 and cb.stopped_at_step == 4


def test_a_bare_tensor_output_is_the_loss():
    """Manual optimization returning the loss tensor itself (not a dict) is read as the loss."""
    cb = DivergenceCallback(window=2)
    trainer, module = _start(cb, max_epochs=2)
    _step(cb, trainer, module, NAN, wrap=lambda v: v)
    _step(cb, trainer, module, NAN, wrap=lambda v: v)
    assert cb.trailing == 2 and cb.stopped_at_step == 2


# --------------------------------------------------------------------------- when it is read, when it stops
def test_the_counter_is_read_at_log_steps_only():
    """log_every_n_steps=3, window 2: the window fills at global step 2, a non-log step; the stop waits for 3."""
    cb = DivergenceCallback(window=2)
    trainer, module = _start(cb, log_every=3, max_epochs=2)
    _step(cb, trainer, module, NAN)
    _step(cb, trainer, module, NAN)
    assert not trainer.should_stop and cb.trailing == 0 and cb.steps == 2  # not read yet
    _step(cb, trainer, module, NAN)
    assert trainer.should_stop and cb.stopped_at_step == 3 and cb.trailing == 3


def test_after_a_resume_the_log_steps_are_still_the_multiples_of_log_every_n_steps():
    """Lightning's rule (global step % log_every_n_steps == 0) continues across a resume at step 10."""
    cb = DivergenceCallback(window=1)
    trainer, module = _start(cb, log_every=3, step=10, max_epochs=5)
    _step(cb, trainer, module, NAN)  # global step 11: no log step
    assert not trainer.should_stop and cb.trailing == 0
    _step(cb, trainer, module, NAN)  # 12 = 4 x 3
    assert cb.stopped_at_step == 12 and cb.trailing == 2


@pytest.mark.parametrize(("max_steps", "window", "bad"), [(3, 3, 3), (1, 1, 1)])
def test_the_fits_last_step_by_max_steps_is_judged_but_not_stopped(max_steps, window, bad):
    cb = DivergenceCallback(window=window)
    trainer, module = _start(cb, max_steps=max_steps, max_epochs=-1)
    for _ in range(bad):
        _step(cb, trainer, module, NAN)
    assert trainer.global_step == max_steps and cb.diverged and cb.trailing == bad
    assert not trainer.should_stop and cb.stopped_at_step is None


def test_one_step_before_max_steps_still_stops():
    cb = DivergenceCallback(window=2)
    trainer, module = _start(cb, max_steps=3, max_epochs=-1)
    _step(cb, trainer, module, NAN)
    _step(cb, trainer, module, NAN)
    assert cb.stopped_at_step == 2


@pytest.mark.parametrize(("max_epochs", "epoch", "stops"), [(2, 1, False), (2, 0, True), (3, 1, True), (-1, 4, True)])
def test_the_last_batch_stops_only_before_the_last_epoch(max_epochs, epoch, stops):
    """The last batch of the last epoch (epoch max_epochs - 1) ends the fit anyway; -1 means no epoch limit."""
    cb = DivergenceCallback(window=2)
    trainer, module = _start(cb, max_epochs=max_epochs, epoch=epoch)
    _step(cb, trainer, module, NAN)
    _step(cb, trainer, module, NAN, last_batch=True)
    assert cb.diverged and trainer.should_stop is stops and cb.stopped_at_step == (2 if stops else None)


@pytest.mark.parametrize(("max_epochs", "epoch", "stops"), [(3, 0, True), (3, 1, True), (3, 2, False), (-1, 7, True)])
def test_an_epoch_end_reads_the_counter_and_stops_unless_it_is_the_last_epoch(max_epochs, epoch, stops):
    cb = DivergenceCallback(window=2)
    trainer, module = _start(cb, log_every=50, max_epochs=max_epochs, epoch=epoch)
    _step(cb, trainer, module, NAN)
    _step(cb, trainer, module, NAN)
    assert cb.trailing == 0  # no log step yet
    cb.on_train_epoch_end(trainer, module)
    assert cb.trailing == 2 and cb.diverged and trainer.should_stop is stops
    assert cb.stopped_at_step == (2 if stops else None)


def test_the_end_of_training_judges_every_step_and_stops_nothing():
    cb = DivergenceCallback(window=3)
    trainer, module = _start(cb, log_every=50, max_epochs=-1)
    for loss in (OK, NAN, NAN, NAN):
        _step(cb, trainer, module, loss)
    cb.on_train_end(trainer, module)
    assert cb.diverged and cb.trailing == 3 and not trainer.should_stop and cb.stopped_at_step is None


def test_log_action_records_the_verdict_without_stopping():
    cb = DivergenceCallback(window=2, action="log")
    trainer, module = _start(cb, max_epochs=2)
    for _ in range(4):
        _step(cb, trainer, module, NAN)
    assert cb.diverged and cb.trailing == 4 and not trainer.should_stop and cb.stopped_at_step is None


def test_a_stop_already_asked_for_by_another_callback_is_not_claimed():
    cb = DivergenceCallback(window=1)
    trainer, module = _start(cb, max_epochs=2)
    trainer.should_stop = True
    _step(cb, trainer, module, NAN)
    assert cb.diverged and cb.stopped_at_step is None


# -------------------------------------------------------------------------------------- ranks that disagree
def test_one_process_reads_its_own_counter_without_a_collective():
    cb = DivergenceCallback(window=2)
    trainer, module = _start(cb, world_size=1, others=[99])
    _step(cb, trainer, module, NAN)
    assert trainer.strategy.seen == [] and cb.trailing == 1


@pytest.mark.parametrize(("mine", "others", "trailing", "stops"), [
    ([OK, OK, OK], [[1, 2, 3]], 3, True),           # 2 ranks: only the other rank diverged: this one stops too
    ([NAN, NAN, NAN], [0], 3, True),                # 2 ranks: only this rank diverged (a mean says 1.5)
    ([OK, OK, NAN], [[1, 2, 3], 0], 3, True),       # 3 ranks: max 3 (a sum says 4, a mean 1.33)
    ([OK, NAN, NAN], [[0, 1, 1], 0], 2, False),     # 3 ranks: max 2 < window (a sum says 3)
])
def test_the_counter_is_the_maximum_over_ranks(mine, others, trailing, stops):
    cb = DivergenceCallback(window=3)
    trainer, module = _start(cb, world_size=1 + len(others), others=others, max_epochs=2)
    for loss in mine:
        _step(cb, trainer, module, loss)
    assert trainer.strategy.seen[-1] == ("cpu", torch.float32, "max")
    assert cb.trailing == trailing and cb.summary().trailing_nonfinite_steps == trailing
    assert trainer.should_stop is stops and cb.stopped_at_step == (3 if stops else None)


def test_the_counter_lives_on_the_modules_device():
    """NCCL reduces CUDA tensors only, and a host counter would cost a copy per step: the counter is made on
    ``pl_module.device`` (the meta device here) and reduced there."""
    cb = DivergenceCallback(window=2)
    trainer, module = _trainer(world_size=2, others=[0], mine=1, max_epochs=2), _module("meta")
    cb.on_train_start(trainer, module)
    trainer.global_step += 1
    cb.on_train_batch_end(trainer, module, {"loss": torch.tensor(NAN, device="meta")}, None, 0)
    assert trainer.strategy.seen == [("meta", torch.float32, "max")] and cb.trailing == 1


def test_a_read_before_any_step_reduces_on_the_modules_device_too():
    """The first read may come before this fit's first step (on_train_end of a fit that took none): the counter
    is on ``pl_module.device`` from ``on_train_start`` on, not only once a step's result has moved it there."""
    cb = DivergenceCallback(window=2)
    cb.load_state_dict({"steps": 6, "trailing": 1, "stopped_at_step": None})  # resumed with one bad step
    trainer, module = _trainer(world_size=2, others=[0], mine=1, step=6), _module("meta")
    cb.on_train_start(trainer, module)
    cb.on_train_end(trainer, module)
    assert trainer.strategy.seen == [("meta", torch.float32, "max")] and (cb.steps, cb.trailing) == (6, 1)


# ------------------------------------------------------------------------------------------ state and hooks
def test_state_round_trip_carries_the_verdict_the_stop_and_the_count_into_a_resumed_fit():
    cb = DivergenceCallback(window=3)
    trainer, module = _start(cb, max_epochs=2)
    for loss in (OK, OK, NAN, NAN):
        _step(cb, trainer, module, loss)
    fresh = DivergenceCallback(window=3)
    fresh.load_state_dict(cb.state_dict())
    assert fresh.summary() == cb.summary() == DivergenceSummary(
        window=3, steps=4, trailing_nonfinite_steps=2, since_step=2, last_finite_step=1, diverged=False,
        why="training loss non-finite at the last 2 optimizer step(s) (steps 2-3), fewer than the 3 that make a"
            " divergence")
    resumed, module = _start(fresh, step=4, max_epochs=2)
    _step(fresh, resumed, module, NAN)  # the 3rd non-finite step in a row, across the resume
    assert fresh.stopped_at_step == 5 and (fresh.steps, fresh.trailing) == (5, 3)
    again = DivergenceCallback(window=3)
    again.load_state_dict(fresh.state_dict())
    assert again.summary() == fresh.summary() and again.stopped_at_step == 5 and again.diverged


def test_a_checkpoint_without_the_callbacks_state_starts_from_nothing():
    cb = DivergenceCallback(window=3)
    cb.load_state_dict({})
    assert (cb.steps, cb.trailing, cb.stopped_at_step) == (0, 0, None)
    assert cb.summary() == DivergenceSummary(window=3, why="no optimizer step: divergence cannot be judged")


def test_only_the_per_step_hook_it_uses_is_wanted():
    cb = DivergenceCallback()
    assert cb.wants_hook("on_train_batch_end")
    assert not any(cb.wants_hook(h) for h in ("on_train_batch_start", "on_before_backward", "on_after_backward",
                                              "on_before_optimizer_step"))


def test_before_any_step_the_verdict_is_that_nothing_can_be_judged():
    """A fit that fails before training writes this summary: no step, no verdict (not 'finite')."""
    cb = DivergenceCallback(window=3)
    assert not cb.diverged and cb.verdict.diverged is None
    assert cb.summary() == DivergenceSummary(window=3, why="no optimizer step: divergence cannot be judged")


def test_the_step_rule_names_a_bad_window():
    with pytest.raises(CropScaleError, match=r"^divergence window must be >= 1 optimizer steps, got 0$"):
        step_divergence(0, 5, 0)
