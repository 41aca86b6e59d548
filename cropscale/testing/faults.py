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
- :class:`HangAt`: at one training batch of one rank, hang for ever in its own code or in a collective that the
  other ranks never enter (for :class:`cropscale.hangs.HangWatch`).

Slow-downs that the run's diagnosis (:mod:`cropscale.diagnosis`) must name, with the right kind and rank
(``docs/measuring.md``, "Checking the diagnosis on your cluster"); each sleeps where the real fault would
cost time, so the step windows see it where they would see the real one:

- :class:`SlowDataLoader`: one rank's training batches take longer to load (its collate function sleeps).
- :class:`SlowBackward`: one rank's backward pass takes longer (a hook on the loss sleeps when autograd starts).
- :class:`HeavyValidation`: every validation batch takes longer.
- :class:`SlowCheckpointWrite`: every checkpoint write takes longer (an :class:`AtomicCheckpointIO`).
- :class:`RankSlowsDown`: one rank's forward pass takes longer from a given epoch on (a throttling GPU, a
  neighbour on the node).

Example (a ``--config`` file; ``rank`` is the global rank)::

    trainer:
      callbacks+:
        - class_path: cropscale.testing.faults.SlowDataLoader
          init_args: {rank: 1, seconds: 0.2}
      plugins:
        - class_path: cropscale.testing.faults.SlowCheckpointWrite
          init_args: {seconds: 2.0}
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
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from cropscale.checkpointing import AtomicCheckpointIO
from cropscale.errors import ConfigError, CropScaleError


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


class HangAt(Callback):
    """At the end of training batch ``batch`` of epoch ``epoch`` on global rank ``rank``: hang, as ``where`` says.

    - ``own-code``: sleep for ever in this hook (a rank stuck in its own code: a deadlock, a dead file system);
    - ``collective``: enter an all-reduce that the other ranks never enter, on a gloo group of all ranks made
      at ``setup`` for it (a rank that took a branch the others did not). A collective on the default group
      would not do: gloo matches collectives by order, so the others' next all-reduce would pair with it and
      fail, not hang.

    Before hanging it prints ``HangAt: rank <r> hangs ... unix time <t>`` to stderr (the time the hang began, for
    measuring how soon it is named). The run ends only when something stops the process (the hang watch, the
    collective's timeout).

    Args:
        epoch: the epoch (0-based).
        batch: the batch index within the epoch.
        rank: the global rank that hangs.
        where: ``own-code`` or ``collective``.

    Example (``--config`` file)::

        trainer:
          callbacks:
            - class_path: cropscale.testing.faults.HangAt
              init_args: {epoch: 1, batch: 0, rank: 1, where: collective}
    """

    def __init__(self, epoch: int = 0, batch: int = 0, rank: int = 0,
                 where: Literal["own-code", "collective"] = "own-code") -> None:
        super().__init__()
        if where not in ("own-code", "collective"):
            raise ConfigError(f"HangAt(where={where!r}): use 'own-code' or 'collective'")
        self.epoch, self.batch, self.rank, self.where = int(epoch), int(batch), int(rank), where
        self._group: Any = None

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.where == "collective" and dist.is_available() and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")  # every rank calls setup: creating a group is a collective

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx, trainer.global_rank) != (self.epoch, self.batch, self.rank):
            return
        how = "its own code" if self.where == "own-code" else "a collective the others never enter"
        print(f"HangAt: rank {self.rank} (pid {os.getpid()}) hangs in {how} at epoch {self.epoch}, batch {self.batch},"
              f" unix time {time.time():.3f}", file=sys.stderr, flush=True)
        if self._group is not None:
            dist.all_reduce(torch.zeros(1), group=self._group)  # returns only at the group's timeout
        while True:
            time.sleep(3600)


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


# ------------------------------------------------------------------------------ slow-downs for the diagnosis
def _seconds(name: str, seconds: float) -> float:
    """``seconds`` as a float >= 0.

    Raises:
        CropScaleError: a negative or non-numeric delay (the injector named).
    """
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = -1.0
    if not value >= 0.0:
        raise CropScaleError(f"{name}(seconds={seconds!r}): give a delay >= 0 in seconds")
    return value


class _SleepingCollate:
    """A collate function that sleeps ``seconds`` and then collates with ``inner`` (picklable for workers)."""

    def __init__(self, inner: Any, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def __call__(self, samples: Any) -> Any:
        time.sleep(self.seconds)
        return self.inner(samples)


class SlowDataLoader(Callback):
    """Global rank ``rank``'s training batches each take ``seconds`` longer to load.

    At ``setup`` the training DataLoader's source (the datamodule's ``train_dataloader``, else the
    LightningModule's) is wrapped, so that the DataLoader it returns collates with a function that sleeps first
    (before Lightning builds the first epoch's iterator, which copies the collate function). With
    ``data.num_workers: 0`` the delay falls inside the main process's fetch (``data_wait``); with workers it
    slows each worker, as a slow disk or decoder does. Under DDP the other ranks wait for this one in the
    gradient all-reduce: the diagnosis must name this rank and its data wait, not the waiting ranks.

    Args:
        rank: the global rank whose loader is slow.
        seconds: the delay per training batch (s).
    """

    def __init__(self, rank: int = 0, seconds: float = 0.2) -> None:
        super().__init__()
        self.rank, self.seconds = int(rank), _seconds("SlowDataLoader", seconds)
        self._source: Any = None

    def _slow(self, loader: Any) -> Any:
        if loader is not None and not isinstance(loader.collate_fn, _SleepingCollate):
            loader.collate_fn = _SleepingCollate(loader.collate_fn, self.seconds)
        return loader

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit" or trainer.global_rank != self.rank or self._source is not None:
            return
        source = trainer.datamodule if trainer.datamodule is not None else pl_module
        original = source.train_dataloader
        source.train_dataloader = lambda: self._slow(original())
        self._source = source

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._source is not None:
            del self._source.train_dataloader  # the instance attribute: the class's method again
            self._source = None


class SlowBackward(Callback):
    """Global rank ``rank``'s backward pass takes ``seconds`` longer in every training micro-batch.

    In ``on_before_backward`` a hook is registered on the loss that autograd is about to differentiate; it
    sleeps when autograd calls it, i.e. at the start of the backward pass, before any gradient bucket is
    ready, so the other ranks' all-reduce waits for this rank (their exposed communication grows, this rank's
    backward does).

    Args:
        rank: the global rank whose backward is slow.
        seconds: the delay per micro-batch (s).
    """

    def __init__(self, rank: int = 0, seconds: float = 0.2) -> None:
        super().__init__()
        self.rank, self.seconds = int(rank), _seconds("SlowBackward", seconds)

    def _sleep(self, grad: torch.Tensor) -> None:
        time.sleep(self.seconds)

    @override
    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        if trainer.global_rank == self.rank and loss.requires_grad:
            loss.register_hook(self._sleep)


class HeavyValidation(Callback):
    """Every validation batch takes ``seconds`` longer (on every rank, or on ``rank`` only).

    The sleep runs at ``on_validation_batch_end`` (not during the sanity check), inside the validation time
    that :class:`~cropscale.callbacks.ThroughputCallback` records (``val_s``).

    Args:
        seconds: the delay per validation batch (s).
        rank: the global rank that is slow; None: every rank.
    """

    def __init__(self, seconds: float = 0.5, rank: int | None = None) -> None:
        super().__init__()
        self.seconds = _seconds("HeavyValidation", seconds)
        self.rank = None if rank is None else int(rank)

    @override
    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if trainer.sanity_checking or (self.rank is not None and trainer.global_rank != self.rank):
            return
        time.sleep(self.seconds)


class SlowCheckpointWrite(AtomicCheckpointIO):
    """An :class:`~cropscale.checkpointing.AtomicCheckpointIO` whose every write takes ``seconds`` longer.

    The sleep comes after the bytes are written, before the file is renamed into place, as on a slow or
    remote file system. Named in ``trainer.plugins`` (it replaces the CLI's own atomic writer).

    Args:
        seconds: the delay per checkpoint file (s).
    """

    def __init__(self, seconds: float = 1.0) -> None:
        super().__init__()
        self.seconds = _seconds("SlowCheckpointWrite", seconds)

    @override
    def _write(self, checkpoint: dict[str, Any], f: IO[bytes]) -> None:
        super()._write(checkpoint, f)
        time.sleep(self.seconds)


class RankSlowsDown(Callback):
    """From epoch ``from_epoch`` on, global rank ``rank``'s forward pass takes ``seconds`` longer per micro-batch.

    Forward pre-hooks on the LightningModule's child modules sleep once per training micro-batch, when
    ``training_step`` calls its first module, from that epoch on and on that rank only: as a GPU that starts
    to throttle or a neighbour that takes the node's CPU would slow it. The diagnosis must name the rank
    against its own best epoch (and, under DDP, as the culprit of the others' waits).

    Args:
        rank: the global rank that slows down.
        from_epoch: the first slow epoch (0-based).
        seconds: the delay per training micro-batch from then on (s).
    """

    def __init__(self, rank: int = 0, from_epoch: int = 1, seconds: float = 0.2) -> None:
        super().__init__()
        self.rank, self.from_epoch = int(rank), int(from_epoch)
        self.seconds = _seconds("RankSlowsDown", seconds)
        self._handles: list[Any] = []
        self._due = False

    def _sleep(self, module: torch.nn.Module, args: Any) -> None:
        if self._due:
            self._due = False
            time.sleep(self.seconds)

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._handles and trainer.global_rank == self.rank and trainer.current_epoch >= self.from_epoch:
            self._handles = [m.register_forward_pre_hook(self._sleep) for m in pl_module.children()]

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._due = bool(self._handles)

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
