"""Checkpoints that mean what they say: written atomically, ``last.ckpt`` always the latest state, SIGTERM-safe.

Three pieces, each through Lightning's own extension points (nothing patches the Trainer):

- :class:`AtomicCheckpointIO`, a ``CheckpointIO`` plugin: ``torch.save`` into a temporary file in the
  checkpoint's folder, ``fsync``, ``os.replace`` (:func:`cropscale.files.atomic_write`). A kill or a
  full disk during a save leaves the previous complete checkpoint; a failed save ends with one
  :class:`~cropscale.errors.CropScaleError` line naming the path. The CLI installs it when the
  configuration names no other ``CheckpointIO``.
- :class:`ResumableCheckpoint`, a ``ModelCheckpoint``: in Lightning 2.6 ``save_last=True`` rewrites
  ``last.ckpt`` only at a step where a top-k checkpoint was saved, so with ``monitor: val/mIoU`` it holds
  the best epoch, not the last one. This subclass also writes it at every other save point (each
  epoch end by default) and when the run is stopped by SIGTERM (:class:`StopOnSigterm`).
- :class:`StopOnSigterm`, a callback: SIGTERM (what SLURM sends before pre-emption) stops training at
  the next optimiser-step boundary, on every rank at the same step, raising Lightning's
  ``SIGTERMException``; :class:`ResumableCheckpoint` then saves ``last.ckpt`` and the CLI exits with
  status 0. Lightning's own SIGTERM handler is replaced while training runs: it broadcasts from inside
  the signal handler and lets each rank stop at its own step, which can leave the ranks in different
  collectives (a hang or a gloo error instead of a checkpoint).

:func:`find_last_checkpoint` resolves ``--ckpt_path last`` to the newest ``last.ckpt`` of the runs of
the same logger name (``<save_dir>/<name>/version_*/checkpoints/last.ckpt``).
"""

from __future__ import annotations

import io
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from cropscale.errors import CropScaleError
from cropscale.files import atomic_write

__all__ = ["AtomicCheckpointIO", "ResumableCheckpoint", "StopOnSigterm", "find_last_checkpoint", "run_version"]


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose saves are atomic: the target is the previous complete file or the new one.

    Remote paths (``s3://`` ...) are left to Lightning's own writer.

    Raises:
        CropScaleError: the checkpoint cannot be written (full disk, read-only or missing folder, a
            folder in the way); the message names the path and says the previous file is unchanged.
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None,
                        ) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target = Path(path)
        existed = target.is_file()
        try:
            atomic_write(target, lambda f: self._write(checkpoint, f), binary=True)
        except CropScaleError as err:
            kept = f"the previous {target.name} is unchanged" if existed else f"no {target.name} was written"
            raise CropScaleError(f"checkpoint not saved: {err} ({kept})") from None

    def _write(self, checkpoint: dict[str, Any], f: IO[bytes]) -> None:
        """Serialise ``checkpoint`` into the open temporary file ``f`` (a hook for fault-injection tests).

        ``torch.save`` goes to memory first (as Lightning's own writer does): its zip writer turns a failed
        file write (a full disk) into an unrelated ``RuntimeError``, while ``f.write`` raises the ``OSError``.
        """
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        f.write(buffer.getbuffer())


class ResumableCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` is always the latest state: each save point and at SIGTERM.

    Takes :class:`~lightning.pytorch.callbacks.ModelCheckpoint`'s arguments (``save_last`` defaults to
    True here). The top-k files by ``monitor`` are kept as ModelCheckpoint keeps them; ``last.ckpt`` is
    written at every save point where no top-k file was written (there it is written by
    ModelCheckpoint itself), and from :meth:`on_exception` when the run stops with Lightning's
    ``SIGTERMException`` (see :class:`StopOnSigterm`). At the start of ``fit`` it removes the temporary
    files that a kill in the middle of a save left in its folder (``.<name>.ckpt.*.tmp``).

    Example (``configs/default.yaml``)::

        - class_path: cropscale.checkpointing.ResumableCheckpoint
          init_args: {monitor: val/mIoU, mode: max, filename: best-epoch{epoch:02d}, save_last: true}
    """

    def __init__(self, *args: Any, save_last: bool | None = True, **kwargs: Any) -> None:
        super().__init__(*args, save_last=save_last, **kwargs)

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit" and trainer.is_global_zero and self.dirpath and "://" not in str(self.dirpath):
            # temporary files of saves that a kill interrupted (AtomicCheckpointIO): never a checkpoint
            for leftover in Path(self.dirpath).glob(".*.ckpt.*.tmp"):
                leftover.unlink(missing_ok=True)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_behind(trainer)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_behind(trainer)

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        if isinstance(exception, SIGTERMException) and self.save_last:
            if self._last_global_step_saved != trainer.global_step:
                self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
            rank_zero_info(f"cropscale: SIGTERM: resumable checkpoint saved to {self.last_model_path}"
                           f" (epoch {trainer.current_epoch}, global step {trainer.global_step})")

    def _save_last_if_behind(self, trainer: Trainer) -> None:
        """Write ``last.ckpt`` unless a checkpoint of this very step was just written (then it is current)."""
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class StopOnSigterm(Callback):
    """Stop training at the next optimiser-step boundary after a SIGTERM, on every rank at the same step.

    While training runs (``on_train_start`` to ``on_train_end``) SIGTERM only sets a flag on the rank
    that received it. At each optimiser-step boundary (``on_train_batch_end`` of the last micro-batch
    of an accumulation window) every rank starts a non-blocking all-reduce (max) of its flag on a CPU
    tensor (the default group under gloo, a gloo side group under NCCL) and waits for the one it
    started at the previous boundary, which has long completed: the decision costs no host-device
    synchronisation and is the same on every rank, one step after the signal. With one process the
    flag is read directly. When set, Lightning's ``SIGTERMException`` is raised on every rank; a
    :class:`ResumableCheckpoint` saves ``last.ckpt`` from its ``on_exception``, and the CLI exits with
    status 0 and one line saying where the checkpoint is.

    A SIGTERM outside training (set-up, sanity check) keeps the handler in place then (Lightning's).
    """

    def __init__(self) -> None:
        super().__init__()
        self._flag = False
        self._previous: Any = None
        self._group: Any = None
        self._pending: tuple[Any, torch.Tensor] | None = None
        self.stopped_at_step: int | None = None

    def _handler(self, signum: int, frame: Any) -> None:
        self._flag = True

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit" or trainer.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return
        # every rank runs setup at the same point: creating the group is a collective
        self._group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._flag, self._pending = False, None
        self._previous = signal.signal(signal.SIGTERM, self._handler)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish_pending()
        self._restore()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore()

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        accumulate = max(1, int(trainer.accumulate_grad_batches))
        last = (batch_idx + 1) >= trainer.num_training_batches
        if (batch_idx + 1) % accumulate and not last:
            return  # inside an accumulation window: stopping here would lose accumulated gradients
        if self._decide(trainer):
            self.stopped_at_step = trainer.global_step
            raise SIGTERMException()

    def _decide(self, trainer: Trainer) -> bool:
        if trainer.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return self._flag
        decided = self._finish_pending()
        flag = torch.tensor([1 if self._flag else 0], dtype=torch.int32)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        self._pending = (work, flag)
        return decided

    def _finish_pending(self) -> bool:
        if self._pending is None:
            return False
        work, flag = self._pending
        self._pending = None
        work.wait()
        return bool(flag.item())

    def _restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


def run_version(ckpt_path: str | os.PathLike, save_dir: str | os.PathLike, name: str) -> int | None:
    """The ``N`` of ``<save_dir>/<name>/version_N/checkpoints/<file>`` when ``ckpt_path`` lies there, else None."""
    path, runs = Path(ckpt_path).resolve(), (Path(save_dir) / name).resolve()
    if path.parent.name != "checkpoints" or path.parent.parent.parent != runs:
        return None
    match = re.fullmatch(r"version_(\d+)", path.parent.parent.name)
    return int(match.group(1)) if match else None


def find_last_checkpoint(save_dir: str | os.PathLike, name: str, exists: Callable[[Path], bool] = Path.is_file,
                         ) -> Path:
    """The newest ``last.ckpt`` (modification time) under ``<save_dir>/<name>/version_*/checkpoints/``.

    Args:
        save_dir: the logger's ``save_dir`` (``runs`` in ``configs/default.yaml``).
        name: the logger's ``name`` (``default``).
        exists: file test (for tests).

    Raises:
        CropScaleError: no such file; the message names the pattern it looked for.
    """
    runs = Path(save_dir) / name
    found = [p for p in runs.glob("version_*/checkpoints/last.ckpt") if exists(p)]
    if not found:
        raise CropScaleError(
            f"--ckpt_path last: no last.ckpt under {runs}/version_*/checkpoints/ (looked in {runs.resolve()});"
            " train first, or give a checkpoint file"
        )
    return max(found, key=lambda p: (p.stat().st_mtime_ns, p.parent.parent.name))
