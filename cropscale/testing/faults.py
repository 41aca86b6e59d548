"""Faults injected into a real ``python -m cropscale fit`` run from its configuration, for resilience tests.

Each is a Lightning plugin or callback named in a ``--config`` file or by ``--trainer.callbacks+=``, so the
run under test is the real CLI, data and model:

- :class:`FailAt`: at one training batch of one rank, raise, or send SIGKILL, SIGTERM, SIGUSR1 or SIGINT to the
  process (optionally in one torchrun attempt only).
- :class:`KillDuringSave`: a :class:`~cropscale.checkpointing.AtomicCheckpointIO` that SIGKILLs the process
  in the middle of its ``n``-th checkpoint write (the temporary file half written).
- :class:`FullDiskCheckpointIO`: the same, but the ``n``-th write fails with ``ENOSPC`` (or another
  ``errno``) after part of the bytes, as a full disk does.
- :class:`NonFiniteWeightsAt`: after optimizer step ``step`` on one rank, write NaN (or inf) into one parameter
  there: that rank's weights alone go non-finite, as after a bad update, a bit flip or a rank-local bug.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import sys
import time
from typing import IO, Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from cropscale.checkpointing import AtomicCheckpointIO


class FailAt(Callback):
    """At the end of training batch ``batch`` of epoch ``epoch`` on global rank ``rank``: fail as ``how`` says.

    Args:
        epoch: the epoch (0-based).
        batch: the batch index within the epoch.
        rank: the global rank that fails.
        how: ``raise`` (a ``RuntimeError`` naming the rank), ``sigkill``, ``sigterm``, ``sigusr1`` or ``sigint``
            (the signal sent to this process).
        attempt: fail only in this torchrun attempt (``TORCHELASTIC_RESTART_COUNT``, 0 = the first); None:
            in every attempt.
        at_setup: raise at ``setup`` instead (before the checkpoint is restored and before ``on_fit_start``).
    """

    def __init__(self, epoch: int = 0, batch: int = 0, rank: int = 0,
                 how: Literal["raise", "sigkill", "sigterm", "sigusr1", "sigint"] = "raise",
                 attempt: int | None = None, at_setup: bool = False) -> None:
        super().__init__()
        self.epoch, self.batch, self.rank, self.how = int(epoch), int(batch), int(rank), how
        self.attempt = None if attempt is None else int(attempt)
        self.at_setup = bool(at_setup)

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.at_setup and trainer.global_rank == self.rank:
            raise RuntimeError(f"injected failure on rank {self.rank} at setup")

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.at_setup or (trainer.current_epoch, batch_idx, trainer.global_rank) != (
                self.epoch, self.batch, self.rank):
            return
        if self.attempt is not None and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) != self.attempt:
            return
        if self.how == "raise":
            raise RuntimeError(f"injected failure on rank {self.rank} at epoch {self.epoch}, batch {self.batch}")
        print(f"FailAt: {self.how.upper()} to rank {self.rank} (pid {os.getpid()}) at epoch {self.epoch}, batch"
              f" {self.batch}, unix time {time.time():.3f}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), getattr(signal, self.how.upper()))


class _PartialWrite(AtomicCheckpointIO):
    """Counts saves; the ``on_save``-th writes ``fraction`` of the serialised checkpoint, then :meth:`_fault`."""

    def __init__(self, on_save: int = 1, fraction: float = 0.5) -> None:
        super().__init__()
        self.on_save, self.fraction, self.saves = int(on_save), float(fraction), 0

    @override
    def _write(self, checkpoint: dict[str, Any], f: IO[bytes]) -> None:
        self.saves += 1
        if self.saves != self.on_save:
            super()._write(checkpoint, f)
            return
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data = buffer.getvalue()
        f.write(data[: int(len(data) * self.fraction)])
        f.flush()
        os.fsync(f.fileno())
        self._fault()

    def _fault(self) -> None:
        raise NotImplementedError


class KillDuringSave(_PartialWrite):
    """SIGKILL the process in the middle of its ``on_save``-th checkpoint write.

    Args:
        on_save: which save (1 = the first of the run).
        fraction: part of the checkpoint's bytes written (and fsync-ed) before the kill.
    """

    def _fault(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class FullDiskCheckpointIO(_PartialWrite):
    """The ``on_save``-th checkpoint write fails after part of its bytes, as on a full (or read-only) disk.

    Args:
        on_save: which save (1 = the first of the run).
        fraction: part of the checkpoint's bytes written before the failure.
        error: the ``errno`` name raised (``ENOSPC``: no space left; ``EROFS``: read-only file system).
    """

    def __init__(self, on_save: int = 1, fraction: float = 0.5, error: str = "ENOSPC") -> None:
        super().__init__(on_save, fraction)
        self.errno = getattr(errno, error)

    def _fault(self) -> None:
        raise OSError(self.errno, os.strerror(self.errno))


class NonFiniteWeightsAt(Callback):
    """After the optimizer step that makes ``global_step == step``, write ``value`` into a parameter on ``rank``.

    Only that rank's copy changes (under DDP the ranks' weights then differ); the next forward there is
    non-finite, and DDP's gradient average carries it to every rank at the next step. Example (``--config``)::

        trainer:
          callbacks+:
            - class_path: cropscale.testing.faults.NonFiniteWeightsAt
              init_args: {step: 4, rank: 1}

    Args:
        step: the global step after which the value is written (1 = after the first optimizer step).
        rank: the global rank whose weights are written.
        parameter: the parameter's name (``named_parameters``); None: the first parameter.
        value: ``"nan"`` or ``"inf"``.
    """

    def __init__(self, step: int = 1, rank: int = 0, parameter: str | None = None,
                 value: Literal["nan", "inf"] = "nan") -> None:
        super().__init__()
        self.step, self.rank, self.parameter, self.value = int(step), int(rank), parameter, float(value)
        self.written_at: int | None = None

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.written_at is not None or trainer.global_step != self.step or trainer.global_rank != self.rank:
            return
        named = dict(pl_module.named_parameters())
        name = self.parameter or next(iter(named))
        with torch.no_grad():
            named[name].view(-1)[0] = self.value
        self.written_at = trainer.global_step
        print(f"NonFiniteWeightsAt: {self.value} written into {name} on rank {self.rank} after step {self.step}",
              file=sys.stderr, flush=True)
