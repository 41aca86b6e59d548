"""Stop a run that has diverged: its training loss is non-finite at the last ``window`` optimizer steps.

Every optimizer step counts, from the first (not only the logged ones): the loss ``training_step`` returned
(Lightning's detached copy, in ``on_train_batch_end``) updates a device counter of the trailing steps whose loss
was non-finite on some micro-batch. Nothing is read per step: the counter is read to the host at log steps (where
Lightning reads the logged loss too), at each epoch end and at the end of training; under DDP it is all-reduced
(max) there, at points every rank reaches together, so that every rank stops at the same step and reaches the same
verdict. The verdict (``run.json`` ``summary.divergence``) is the divergence part of the run's validity
(:func:`cropscale.runs.validity.validity`): a run whose last ``min(window, steps)`` optimizer steps had a
non-finite loss diverged. One non-finite batch in a finite series (bad data, an AMP overflow) is no divergence;
:class:`~cropscale.callbacks.NonFiniteCallback` records such batches.

Cost per optimizer step: 3 device operations on 0-d tensors (``isfinite``, a logical or, an add-or-reset), no
host read; per log step: one 4-byte read and, under DDP, one all-reduce of one integer.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from cropscale.callbacks.base import ScalingCallback
from cropscale.errors import CropScaleError
from cropscale.runs.rules import DIVERGENCE_WINDOW, Divergence
from cropscale.runs.schema import DivergenceSummary

__all__ = ["DivergenceCallback", "step_divergence"]


def step_divergence(trailing: int, steps: int, window: int) -> Divergence:
    """The verdict on a run whose last ``trailing`` of ``steps`` optimizer steps had a non-finite training loss.

    Diverged when ``trailing >= min(window, steps)`` (a run shorter than the window diverged when every step was
    non-finite); the steps are 0-based indices, so the trailing ones are ``steps - trailing .. steps - 1``.

    Args:
        trailing: optimizer steps at the end whose loss was non-finite (on some micro-batch, on some rank).
        steps: optimizer steps seen.
        window: the steps that make a divergence (>= 1).

    Raises:
        CropScaleError: ``window < 1``.
    """
    if window < 1:
        raise CropScaleError(f"divergence window must be >= 1 optimizer steps, got {window}")
    if steps <= 0:
        return Divergence(None, "no optimizer step: divergence cannot be judged")
    since = steps - trailing if trailing else None
    last_finite = (steps - trailing - 1) if steps > trailing else None
    facts = {"trailing": trailing, "since_step": since, "last_finite_step": last_finite}
    if trailing == 0:
        return Divergence(False, "the training loss of the last optimizer step is finite", **facts)
    where = f"step {since}" if trailing == 1 else f"steps {since}-{steps - 1}"
    if trailing < min(window, steps):
        return Divergence(False, f"training loss non-finite at the last {trailing} optimizer step(s) ({where}), fewer"
                                 f" than the {window} that make a divergence", **facts)
    before = f"last finite at step {last_finite}" if last_finite is not None else "never finite"
    return Divergence(True, f"training loss non-finite at the last {trailing} optimizer step(s) ({where};"
                            f" {before})", **facts)


def _last_epoch(trainer: Trainer) -> bool:
    return trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch + 1


class DivergenceCallback(ScalingCallback):
    """Stops training once the training loss has been non-finite at the last ``window`` optimizer steps.

    Args:
        window: optimizer steps whose loss must all be non-finite (:data:`~cropscale.runs.rules.DIVERGENCE_WINDOW`).
        action: ``"stop"`` sets ``trainer.should_stop`` on every rank (Lightning then validates, saves its
            checkpoints and ends ``fit`` normally); ``"log"`` only records the verdict.

    Attributes:
        verdict: :func:`step_divergence` of the steps read so far (at the last log step or epoch end; final
            after ``on_train_end``).
        stopped_at_step: the global step at which this callback stopped the run (None: it did not).

    The run is stopped at the first log step (or epoch end) at which ``window`` trailing steps are non-finite; its
    verdict at the end counts every step, a run shorter than the window included.

    Raises:
        CropScaleError: ``window < 1`` or an unknown ``action``.

    Example::

        from lightning.pytorch import Trainer
        from cropscale.callbacks import DivergenceCallback

        trainer = Trainer(callbacks=[DivergenceCallback(window=3)], log_every_n_steps=10)

        # configs/default.yaml has it (window: 3); in a configuration of your own, a --config file with
        #   trainer:
        #     callbacks+:
        #       - class_path: cropscale.callbacks.DivergenceCallback
        #         init_args: {window: 3, action: stop}
    """

    summary_key = "divergence"

    def __init__(self, window: int = DIVERGENCE_WINDOW, action: Literal["stop", "log"] = "stop") -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise CropScaleError(f"DivergenceCallback(window={window!r}): must be an integer >= 1 (optimizer steps)")
        if action not in ("stop", "log"):
            raise CropScaleError(f"DivergenceCallback(action={action!r}): use 'stop' or 'log'")
        self.window = window
        self.action = action
        self.steps = 0
        self.trailing = 0
        self.verdict: Divergence = step_divergence(0, 0, window)
        self.stopped_at_step: int | None = None
        self._count: torch.Tensor | None = None  # device: trailing non-finite steps
        self._step_bad: torch.Tensor | None = None  # device: this optimizer step's micro-batches so far
        self._seen_step = -1

    @property
    def diverged(self) -> bool:
        """True when the steps read so far meet the divergence rule."""
        return bool(self.verdict.diverged)

    @override
    def wants_hook(self, hook: str) -> bool:
        return hook == "on_train_batch_end"

    @override
    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        return None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "trailing": self.trailing, "stopped_at_step": self.stopped_at_step}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps = int(state_dict.get("steps", 0))
        self.trailing = int(state_dict.get("trailing", 0))
        self.stopped_at_step = state_dict.get("stopped_at_step")
        self.verdict = step_divergence(self.trailing, self.steps, self.window)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start_log_schedule(trainer)
        self._seen_step = int(trainer.global_step)
        self._count = torch.tensor(self.trailing, dtype=torch.int64, device=pl_module.device)
        self._step_bad = None

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            bad = ~torch.isfinite(loss.detach()).all()
            self._step_bad = bad if self._step_bad is None else self._step_bad | bad
        step = trainer.global_step
        if step == self._seen_step:
            return  # gradients still accumulate: the optimizer step is not done
        self._seen_step = step
        self.steps += 1
        if self._step_bad is not None and self._count is not None:
            self._count = torch.where(self._step_bad, self._count + 1, torch.zeros_like(self._count))
        self._step_bad = None
        if self._count_step():
            ends = (_last_epoch(trainer) and bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)) or (
                trainer.max_steps is not None and 0 < trainer.max_steps <= step)
            self._judge(trainer, stop=not ends)  # the fit's last step: it ends anyway, nothing to stop

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._judge(trainer, stop=not _last_epoch(trainer))  # the last epoch ends anyway: nothing to stop

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._judge(trainer, stop=False)

    def _judge(self, trainer: Trainer, stop: bool = True) -> None:
        """Read the counter (max over ranks), update the verdict, and stop every rank when it is a divergence."""
        if self._count is None:
            return
        count = self._count
        if trainer.world_size > 1:
            count = trainer.strategy.reduce(count.clone().float(), reduce_op="max")
        self.trailing = int(count.item())
        self.verdict = step_divergence(self.trailing, self.steps, self.window)
        if not stop or self.action != "stop" or trainer.should_stop or self.trailing < self.window:
            return
        trainer.should_stop = True
        self.stopped_at_step = trainer.global_step
        rank_zero_warn(f"DivergenceCallback: training diverged, stopping at step {self.stopped_at_step}:"
                       f" {self.verdict.why}")

    @override
    def summary(self) -> DivergenceSummary:
        v = self.verdict
        return DivergenceSummary(window=self.window, steps=self.steps, trailing_nonfinite_steps=self.trailing,
                                 since_step=v.since_step, last_finite_step=v.last_finite_step, diverged=v.diverged,
                                 why=v.why, stopped_at_step=self.stopped_at_step)
