"""How long the run's checkpoint writes take (``run.json["summary"]["checkpoint"]``).

Lightning writes a checkpoint on global rank 0 (``Strategy.save_checkpoint`` -> ``CheckpointIO.save_checkpoint``)
while the other ranks wait in the barrier of ``Trainer.save_checkpoint``, so a slow write costs every rank its
time. No Callback hook brackets the write: at ``setup`` this callback puts a timing wrapper around the strategy's
``CheckpointIO`` (any of them: Lightning's, :class:`~cropscale.checkpointing.AtomicCheckpointIO`, a remote one)
that times each ``save_checkpoint`` call with ``time.perf_counter`` and hands every other call through; the
original is put back at ``teardown``.

Each write is booked to the epoch it belongs to, and as *outside the epoch's wall time* when it ran after the
training epoch's end hook (ModelCheckpoint saves there by default; the epoch's ``wall_s`` of
:class:`~cropscale.callbacks.ThroughputCallback` ends before it), else inside it (a save after a validation in the
middle of an epoch). The diagnosis (:mod:`cropscale.diagnosis`) weighs the writes against the epoch period.

Cost: nothing per step (no per-step hook); one ``perf_counter`` pair per checkpoint write.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from cropscale.callbacks.base import EpochRecordsCallback
from cropscale.runs.schema import CheckpointEpoch, CheckpointSummary

__all__ = ["CheckpointTimingCallback"]


class _TimedCheckpointIO(CheckpointIO):
    """Delegates to ``inner`` and reports the duration of each ``save_checkpoint`` to ``owner`` (s)."""

    def __init__(self, inner: CheckpointIO, owner: CheckpointTimingCallback) -> None:
        self.inner = inner
        self._owner = owner

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        t0 = perf_counter()
        try:
            self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        finally:
            self._owner._add_write(perf_counter() - t0)

    def load_checkpoint(self, path: Any, map_location: Any = None, **kwargs: Any) -> dict[str, Any]:
        return self.inner.load_checkpoint(path, map_location=map_location, **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class CheckpointTimingCallback(EpochRecordsCallback):
    """Times every checkpoint write of ``fit`` (global rank 0's ``CheckpointIO.save_checkpoint``).

    ``state_dict`` keeps the per-epoch records, so a resumed run continues them. No arguments.

    Example::

        from lightning.pytorch import Trainer
        from lightning.pytorch.callbacks import ModelCheckpoint
        from cropscale.callbacks import CheckpointTimingCallback, ProvenanceCallback

        trainer = Trainer(callbacks=[ModelCheckpoint(save_last=True), CheckpointTimingCallback(),
                                     ProvenanceCallback()])  # run.json summary.checkpoint

        # command line (configs/default.yaml's CallbackGroup has it; another configuration gets it added):
        #   python -m cropscale fit --config callbacks/checkpoint_timing.yaml
    """

    record_type = CheckpointEpoch
    summary_key = "checkpoint"

    def __init__(self) -> None:
        self.epochs: list[CheckpointEpoch] = []
        self._io_name: str | None = None
        self._wrapper: _TimedCheckpointIO | None = None
        self._epoch = 0
        self._after_epoch_end = False

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        strategy = trainer.strategy
        if stage != "fit" or isinstance(strategy.checkpoint_io, _TimedCheckpointIO):
            return
        inner = strategy.checkpoint_io
        self._io_name = type(inner).__name__
        self._wrapper = _TimedCheckpointIO(inner, self)
        strategy.checkpoint_io = self._wrapper

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        wrapper, self._wrapper = self._wrapper, None
        if wrapper is not None and trainer.strategy.checkpoint_io is wrapper:
            trainer.strategy.checkpoint_io = wrapper.inner

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch, self._after_epoch_end = trainer.current_epoch, False

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._after_epoch_end = True  # ModelCheckpoint runs after every other callback: its saves come later

    def _add_write(self, seconds: float) -> None:
        """Book one write of ``seconds`` to the current epoch."""
        if not self.epochs or self.epochs[-1].epoch != self._epoch:
            self.epochs.append(CheckpointEpoch(epoch=self._epoch))
        record = self.epochs[-1]
        record.saves += 1
        record.write_s += seconds
        if self._after_epoch_end:
            record.outside_wall_s += seconds

    @override
    def summary(self) -> CheckpointSummary:
        return CheckpointSummary(checkpoint_io=self._io_name, saves=sum(e.saves for e in self.epochs),
                                 write_s=sum(e.write_s for e in self.epochs), epochs=list(self.epochs))
