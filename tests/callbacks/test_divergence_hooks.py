"""DivergenceCallback's hooks driven by hand (no Trainer): which losses it reads, when, and the decision over ranks.

A fake trainer holds what Lightning hands the hook (``global_step`` after the optimizer step,
``callback_metrics``, ``log_every_n_steps``) and a fake strategy whose ``reduce_boolean_decision`` stands for
other ranks that voted beforehand, with Lightning's semantics (``all=True`` by default: every rank; ``all=False``:
any rank). The fits of the same rule: test_divergence.py; two real gloo ranks: test_ranks_disagree_ddp.py.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from cropscale.callbacks import DivergenceCallback
from cropscale.runs.rules import Divergence

NAN = float("nan")


class Ranks:
    """``reduce_boolean_decision`` over this rank's vote and the ``others``' (Lightning's ``all=True`` default)."""

    def __init__(self, others=()):
        self.others = list(others)
        self.calls = []

    def reduce_boolean_decision(self, decision, all=True):  # noqa: A002 (Lightning's name)
        self.calls.append((bool(decision), all))
        votes = [bool(decision), *self.others]
        return __builtins__["all"](votes) if all else any(votes)


def _trainer(log_every=1, others=()):
    return SimpleNamespace(global_step=0, log_every_n_steps=log_every, callback_metrics={}, should_stop=False,
                           strategy=Ranks(others))


def _step(cb, trainer, loss, *, metric=None, outputs="dict"):
    """One optimizer step whose training loss was ``loss``; ``metric`` is what the module logged (if it did)."""
    trainer.global_step += 1
    trainer.callback_metrics = {} if metric is None else {cb.monitor: torch.tensor(metric)}
    out = {"loss": torch.tensor(loss)} if outputs == "dict" else torch.tensor(loss)
    cb.on_train_batch_end(trainer, None, out, None, 0)


def test_a_window_of_one_is_allowed_and_stops_at_the_first_non_finite_log():
    cb, trainer = DivergenceCallback(window=1), _trainer()
    cb.on_train_start(trainer, None)
    _step(cb, trainer, 1.0)
    _step(cb, trainer, NAN)
    assert trainer.should_stop and cb.stopped_at_step == 2 and cb.verdict.since_step == 1


def test_the_verdict_names_the_monitored_loss_before_and_after_losses_and_after_a_resume():
    cb = DivergenceCallback(window=2, monitor="train/loss")
    assert cb.verdict == Divergence(None, "no train/loss logged: divergence cannot be judged")
    trainer = _trainer()
    cb.on_train_start(trainer, None)
    _step(cb, trainer, 1.0, metric=1.0)
    assert cb.verdict.why == "the last logged train/loss is finite"
    other = DivergenceCallback(window=2, monitor="train/loss")
    other.load_state_dict(cb.state_dict())
    assert other.verdict.why == "the last logged train/loss is finite"


def test_state_round_trip_keeps_the_stop_step_and_an_empty_state_is_a_fresh_one():
    cb, trainer = DivergenceCallback(window=2), _trainer()
    cb.on_train_start(trainer, None)
    for loss in (1.0, NAN, NAN):
        _step(cb, trainer, loss)
    assert cb.stopped_at_step == 3
    other = DivergenceCallback(window=2)
    other.load_state_dict(cb.state_dict())
    assert other.stopped_at_step == 3 and other.tail == cb.tail and other.diverged
    fresh = DivergenceCallback(window=2)
    fresh.load_state_dict({})  # a checkpoint written before this callback was added
    assert fresh.stopped_at_step is None and fresh.tail.logged == 0 and fresh.verdict.diverged is None


@pytest.mark.parametrize("log_every", [0, None])
def test_no_logging_reads_no_loss(log_every):
    cb, trainer = DivergenceCallback(window=1), _trainer(log_every=log_every)
    cb.on_train_start(trainer, None)
    _step(cb, trainer, NAN)
    assert cb.tail.logged == 0 and not trainer.should_stop and trainer.strategy.calls == []


def test_only_log_steps_are_read_and_each_optimizer_step_once():
    cb, trainer = DivergenceCallback(window=3), _trainer(log_every=2)
    cb.on_train_start(trainer, None)
    for loss in (1.0, 2.0, 3.0, 4.0):  # global steps 1..4: logged at 2 and 4 (losses of steps 1 and 3)
        _step(cb, trainer, loss)
        cb.on_train_batch_end(trainer, None, {"loss": torch.tensor(NAN)}, None, 1)  # a further micro-batch
    assert (cb.tail.logged, cb.tail.last_step, cb.tail.trailing) == (2, 3, 0)


def test_the_logged_value_wins_over_the_returned_loss_and_the_returned_one_is_the_fallback():
    cb, trainer = DivergenceCallback(window=1), _trainer()
    cb.on_train_start(trainer, None)
    _step(cb, trainer, NAN, metric=2.0)  # the module logged 2.0 (what the report reads); it returned NaN
    assert cb.tail.last_finite_step == 0 and not trainer.should_stop
    _step(cb, trainer, NAN)  # nothing logged under the monitor: the returned loss
    assert cb.tail.trailing == 1 and trainer.should_stop
    cb2, trainer2 = DivergenceCallback(window=1), _trainer()
    cb2.on_train_start(trainer2, None)
    _step(cb2, trainer2, NAN, outputs="tensor")  # training_step returned a bare tensor
    assert cb2.diverged and trainer2.should_stop


def test_an_early_non_finite_log_is_a_verdict_but_not_yet_a_stop():
    """Fewer logs than the window, all non-finite: the rule says diverged, but only a full window stops a run."""
    cb, trainer = DivergenceCallback(window=3), _trainer()
    cb.on_train_start(trainer, None)
    _step(cb, trainer, NAN)
    assert cb.diverged and not trainer.should_stop and trainer.strategy.calls == [(False, False)]
    _step(cb, trainer, NAN)
    _step(cb, trainer, NAN)
    assert trainer.should_stop and cb.stopped_at_step == 3


def test_any_rank_that_diverged_stops_this_one():
    """This rank's losses are finite, another rank's window is full of non-finite ones: this rank stops too."""
    cb, trainer = DivergenceCallback(window=2), _trainer(others=[True])
    cb.on_train_start(trainer, None)
    with pytest.warns(UserWarning) as seen:  # rank 0 speaks for the run: it must not call its own losses the cause
        _step(cb, trainer, 1.0)
    assert [str(w.message) for w in seen] == [
        "DivergenceCallback: training diverged on another rank, stopping at step 1 "
        "(this rank: the last logged train/loss_step is finite)"]
    assert trainer.should_stop and cb.stopped_at_step == 1 and not cb.diverged
    assert trainer.strategy.calls == [(False, False)]  # asked "any rank", with this rank's own "no"
    cb2, trainer2 = DivergenceCallback(window=2), _trainer(others=[False])
    cb2.on_train_start(trainer2, None)
    _step(cb2, trainer2, 1.0)
    assert not trainer2.should_stop and cb2.stopped_at_step is None
    assert math.isfinite(cb2.tail.last_finite_step)
