"""Stop a run that has diverged: its last logged training losses are all non-finite.

The rule is :func:`cropscale.runs.rules.divergence` (the last ``window`` logged losses non-finite),
applied here online at the log steps to the value Lightning logs (``train/loss_step`` by default), so
that the report and the end-of-fit summary, which apply the same rule to the TensorBoard series, reach
the same verdict. One non-finite batch in a finite series (bad data, an AMP overflow) does not stop
the run; :class:`~cropscale.callbacks.NonFiniteCallback` records such batches.

Cost: nothing on steps that do not log; at a log step one read of the logged loss to the host (Lightning
reads it there too, to log it) and, under DDP, one boolean all-reduce so that every rank stops together.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from cropscale.errors import CropScaleError
from cropscale.runs.rules import DIVERGENCE_WINDOW, Divergence, LossTail, divergence_of_tail


class DivergenceCallback(Callback):
    """Stops training once the last ``window`` logged training losses are all non-finite.

    Args:
        window: logged losses that must all be non-finite (:data:`~cropscale.runs.rules.DIVERGENCE_WINDOW`).
        monitor: the logged training loss (``trainer.callback_metrics`` key); where the module logs no
            such key, the loss ``training_step`` returned.
        action: ``"stop"`` sets ``trainer.should_stop`` on every rank (Lightning then validates, saves its
            checkpoints and ends ``fit`` normally); ``"log"`` only records the verdict.

    Attributes:
        verdict: the rule's :class:`~cropscale.runs.rules.Divergence` on the losses seen so far, their
            steps numbered as Lightning's logger numbers them (TensorBoard's step).
        stopped_at_step: the global step at which this callback stopped the run (None: it did not).

    The run is stopped only once ``window`` losses have been logged (a run that logged fewer, all
    non-finite, ends as it would; its verdict is "diverged" all the same, as the report's).

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

    def __init__(self, window: int = DIVERGENCE_WINDOW, monitor: str = "train/loss_step",
                 action: Literal["stop", "log"] = "stop") -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise CropScaleError(f"DivergenceCallback(window={window!r}): must be an integer >= 1 (logged losses)")
        if action not in ("stop", "log"):
            raise CropScaleError(f"DivergenceCallback(action={action!r}): use 'stop' or 'log'")
        self.window = window
        self.monitor = monitor
        self.action = action
        self.tail = LossTail()
        self.verdict: Divergence = divergence_of_tail(self.tail, window, monitor)
        self.stopped_at_step: int | None = None
        self._every = 0
        self._last_step = -1

    @property
    def diverged(self) -> bool:
        """True when the losses seen so far meet the divergence rule."""
        return bool(self.verdict.diverged)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"tail": dataclasses.asdict(self.tail), "stopped_at_step": self.stopped_at_step}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.tail = LossTail(**state_dict.get("tail", {}))
        self.stopped_at_step = state_dict.get("stopped_at_step")
        self.verdict = divergence_of_tail(self.tail, self.window, self.monitor)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._every = int(trainer.log_every_n_steps or 0)
        self._last_step = -1

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if self._every <= 0 or step % self._every or step == self._last_step:
            return  # not a log step, or a further micro-batch of the same optimizer step
        self._last_step = step
        loss = trainer.callback_metrics.get(self.monitor)
        if loss is None:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, (torch.Tensor, float, int)):
            return
        # a log step: Lightning reads the logged values to the host here too. Its logger numbers this
        # step global_step - 1 (it logs before counting the step): so does the tail, as TensorBoard does
        self.tail.add(step - 1, float(loss))
        self.verdict = divergence_of_tail(self.tail, self.window, self.monitor)
        # only a full window stops a run that goes on; every rank takes part at the same log steps
        full = self.tail.trailing >= self.window
        stop = trainer.strategy.reduce_boolean_decision(full and self.diverged, all=False)
        if stop and self.action == "stop" and not trainer.should_stop:
            trainer.should_stop = True
            self.stopped_at_step = step
            if self.diverged:
                rank_zero_warn(f"DivergenceCallback: training diverged, stopping at step {step}: {self.verdict.why}")
            else:  # another rank's losses diverged (rank 0 speaks for the run: not its own losses' verdict)
                rank_zero_warn(f"DivergenceCallback: training diverged on another rank, stopping at step {step} "
                               f"(this rank: {self.verdict.why})")
