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
  epoch end by default) and when the run is stopped by a signal (:class:`StopOnSignal`).
- :class:`StopOnSignal` (formerly ``StopOnSigterm``), a callback: SIGTERM, SIGUSR1 (SLURM's warning signal)
  and Ctrl-C stop training at the next optimiser-step boundary, on every rank at the same step, raising
  Lightning's ``SIGTERMException``; :class:`ResumableCheckpoint` then saves ``last.ckpt`` and the CLI exits
  with status 0 and :func:`stop_line` (after ``scontrol requeue`` for SIGUSR1 under SLURM). Lightning's own
  SIGTERM and SLURM handlers are replaced while training runs: they run collectives from inside the signal
  handler and let each rank stop at its own step, which can leave the ranks in different collectives (a
  hang or a gloo error instead of a checkpoint).

:func:`find_resume_state` resolves ``--ckpt_path auto`` and ``last`` to the most advanced resumable state of
the logger's run (``<save_dir>/<name>/version_N/checkpoints/``), by training progress; :func:`check_fit_start`
ends a run that is already complete and refuses another run's ``hpc_ckpt_N.ckpt``.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from cropscale.distributed import launcher_name
from cropscale.errors import CheckpointError, CropScaleError
from cropscale.files import atomic_write

__all__ = ["RESUME_AUTO", "STOP_SIGNALS", "AtomicCheckpointIO", "ResumableCheckpoint", "StopOnSignal", "StopOnSigterm",
           "TrainingState", "check_fit_start", "completed_run", "find_last_checkpoint", "find_resume_state",
           "hpc_checkpoints_in", "launch_resume_command", "nonfinite_parameters", "requeue_slurm_job",
           "resume_command", "run_version", "stop_line", "training_state"]


def nonfinite_parameters(trainer: Trainer, module: torch.nn.Module) -> tuple[int, int]:
    """Parameter tensors of ``module`` that hold a NaN or inf, summed over ranks, and the tensors on this rank.

    One device reduction per tensor, one device-to-host read; under DDP one all-reduce (sum), so every rank must
    call it at the same point (an epoch end, a checkpoint save, the end of training) and every rank gets the same
    count: a model that is non-finite on one rank only (its weights written there alone) counts on all.

    Returns:
        ``(non-finite tensors over all ranks, tensors on this rank)``.
    """
    params = [p.detach() for p in module.parameters()]
    device = params[0].device if params else torch.device("cpu")
    flags = [~torch.isfinite(p).all() for p in params if p.numel()]
    bad = torch.stack(flags).sum().float() if flags else torch.zeros((), device=device)
    if trainer.world_size > 1:
        bad = trainer.strategy.reduce(bad, reduce_op="sum")
    return int(bad.item()), len(params)


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
    files that a kill in the middle of a save left in its folder (``.<name>.ckpt.*.tmp``). Weights that hold
    a NaN or inf on some rank are never saved as a top-k (best) checkpoint nor named ``best_model_path``
    (:meth:`_save_topk_checkpoint`).

    Example (``configs/default.yaml``)::

        - class_path: cropscale.checkpointing.ResumableCheckpoint
          init_args: {monitor: val/mIoU, mode: max, filename: best-epoch{epoch:02d}, save_last: true}
    """

    def __init__(self, *args: Any, save_last: bool | None = True, **kwargs: Any) -> None:
        super().__init__(*args, save_last=save_last, **kwargs)
        self.nonfinite_refusals = 0

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
            rank_zero_info(f"cropscale: stop signal: resumable checkpoint saved to {self.last_model_path}"
                           f" (epoch {trainer.current_epoch}, global step {trainer.global_step})")
        elif isinstance(exception, KeyboardInterrupt) and trainer.is_global_zero:
            state = training_state(self.last_model_path) if self.last_model_path else None
            saved = (f"the newest checkpoint is {os.path.relpath(state.path)} (epoch {state.epoch}, global step"
                     f" {state.global_step})" if state is not None else "no checkpoint was saved")
            print(f"cropscale: interrupted at epoch {trainer.current_epoch}, global step {trainer.global_step},"
                  f" without a save; {saved}; resume with{launch_resume_command(sys.argv[1:])}", file=sys.stderr,
                  flush=True)

    @override
    def _save_topk_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, torch.Tensor]) -> None:
        """ModelCheckpoint's top-k save, refused while a parameter holds NaN or inf on some rank.

        A non-finite model's validation score (a constant prediction's) would otherwise become the best checkpoint
        and ``best_model_path``: it is never saved as a top-k file nor named as best (the decision is summed over
        ranks, :func:`nonfinite_parameters`, so every rank takes it alike). ``last.ckpt`` is still written.
        """
        if self.save_top_k == 0:
            return
        bad, total = nonfinite_parameters(trainer, trainer.lightning_module)
        if bad:
            self.nonfinite_refusals += 1
            rank_zero_warn(f"ResumableCheckpoint: no best checkpoint at epoch {trainer.current_epoch}, global step"
                           f" {trainer.global_step}: {bad} parameter tensor(s) hold NaN or inf (summed over ranks, of"
                           f" {total} per rank); the best stays {self.best_model_path or 'unset'}")
            return
        super()._save_topk_checkpoint(trainer, monitor_candidates)

    def _save_last_if_behind(self, trainer: Trainer) -> None:
        """Write ``last.ckpt`` unless a checkpoint of this very step was just written (then it is current)."""
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


#: Signals that stop training at the next optimiser step with a resumable checkpoint: SIGTERM (pre-emption,
#: ``scancel``, torchrun's stop), SIGUSR1 (SLURM's ``#SBATCH --signal=USR1@<s>`` warning before the time limit)
#: and SIGINT (Ctrl-C; a second Ctrl-C stops at once, without a save).
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class StopOnSignal(Callback):
    """Stop training at the next optimiser-step boundary after SIGTERM, SIGUSR1 or SIGINT, on every rank at once.

    While training runs (``on_train_start`` to ``on_train_end``) the signals of :data:`STOP_SIGNALS` only
    set a flag (the signal's number) on the rank that received it. These handlers replace Lightning's:
    its SLURM SIGUSR1 handler saves ``hpc_ckpt_N.ckpt`` into the working directory (not the run folder)
    and, like its SIGTERM handler, runs a collective from inside the signal handler, which leaves the
    ranks in different collectives (a hang). The CLI also gives the Trainer
    ``SLURMEnvironment(auto_requeue=False)`` under SLURM, so that Lightning's SLURM handler is never
    installed, not even before training starts.

    At each optimiser-step boundary (``on_train_batch_end`` of the last micro-batch of an accumulation
    window) every rank starts a non-blocking all-reduce (max) of its flag on a CPU tensor (the default
    group under gloo, a gloo side group under NCCL) and waits for the one it started at the previous
    boundary, which has long completed: the decision costs no host-device synchronisation and is the same
    on every rank, one step after the signal. With one process the flag is read directly. When set,
    Lightning's ``SIGTERMException`` is raised on every rank (:attr:`stopped_by` names the signal); a
    :class:`ResumableCheckpoint` saves ``last.ckpt`` in the run folder from its ``on_exception``, and the
    CLI exits with status 0 (after ``scontrol requeue`` for SIGUSR1 under SLURM) and one line saying
    where the checkpoint is and the command that resumes it.

    A signal at the last step of an epoch stops training after that epoch's validation (at
    ``on_train_epoch_end``), so that a resumed run validates every epoch as scheduled.
    """

    def __init__(self) -> None:
        super().__init__()
        self._flag = 0
        self._at_epoch_end = 0
        self._previous: dict[int, Any] = {}
        self._group: Any = None
        self._pending: tuple[Any, torch.Tensor] | None = None
        self.stopped_at_step: int | None = None
        self.stopped_by: str | None = None

    def _handler(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self._flag == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C twice: stop now
        if signum == signal.SIGINT:
            print("cropscale: Ctrl-C: stopping at the next step with a resumable checkpoint (Ctrl-C again to stop"
                  " now, without a save)", file=sys.stderr, flush=True)
        self._flag = max(self._flag, int(signum))

    def _install(self, signals: tuple[signal.Signals, ...]) -> None:
        for signum in signals:
            try:
                previous = signal.signal(signum, self._handler)
            except ValueError:  # not the main thread: leave the signals alone
                return
            self._previous.setdefault(int(signum), previous)

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._flag, self._pending, self.stopped_by, self.stopped_at_step, self._at_epoch_end = 0, None, None, None, 0
        if trainer.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return
        # every rank runs setup at the same point: creating the group is a collective
        self._group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._pending = None
        self._install(STOP_SIGNALS)  # over Lightning's own handlers, registered before training starts

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
        signum = self._decide(trainer)
        if signum and last:
            self._at_epoch_end = signum  # the epoch's validation runs first, as scheduled
        elif signum:
            self._stop(trainer, signum)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._at_epoch_end:
            self._stop(trainer, self._at_epoch_end)

    def _stop(self, trainer: Trainer, signum: int) -> None:
        self.stopped_at_step = trainer.global_step
        self.stopped_by = signal.Signals(signum).name
        self._at_epoch_end = 0
        raise SIGTERMException()

    def _decide(self, trainer: Trainer) -> int:
        if trainer.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return self._flag
        decided = self._finish_pending()
        flag = torch.tensor([self._flag], dtype=torch.int32)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        self._pending = (work, flag)
        return decided

    def _finish_pending(self) -> int:
        if self._pending is None:
            return 0
        work, flag = self._pending
        self._pending = None
        work.wait()
        return int(flag.item())

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}


#: The former name (``configs`` and ``trainer_defaults`` that name it keep working).
StopOnSigterm = StopOnSignal


def run_version(ckpt_path: str | os.PathLike, save_dir: str | os.PathLike, name: str) -> int | None:
    """The ``N`` of ``<save_dir>/<name>/version_N/checkpoints/<file>`` when ``ckpt_path`` lies there, else None."""
    path, runs = Path(ckpt_path).resolve(), (Path(save_dir) / name).resolve()
    if path.parent.name != "checkpoints" or path.parent.parent.parent != runs:
        return None
    match = re.fullmatch(r"version_(\d+)", path.parent.parent.name)
    return int(match.group(1)) if match else None


def next_eval_folder(run_folder: str | os.PathLike, subcommand: str) -> str:
    """``<subcommand>_K``, the first such name not yet in ``run_folder``: where an evaluation of that run logs.

    Every rank finds the same K: they list the folder before rank 0 writes into it (the ranks parse their
    arguments before the process group forms, and rank 0 writes only after it has).
    """
    k = 0
    while (Path(run_folder) / f"{subcommand}_{k}").exists():
        k += 1
    return f"{subcommand}_{k}"


def find_last_checkpoint(save_dir: str | os.PathLike, name: str, exists: Callable[[Path], bool] = Path.is_file,
                         ) -> Path:
    """The newest ``last.ckpt`` (modification time) under ``<save_dir>/<name>/version_*/checkpoints/``.

    Args:
        save_dir: the logger's ``save_dir`` (``runs`` in ``configs/default.yaml``).
        name: the logger's ``name`` (``default``).
        exists: file test (for tests).

    Raises:
        CheckpointError: no such file; the message names the pattern it looked for.
    """
    runs = Path(save_dir) / name
    found = [p for p in runs.glob("version_*/checkpoints/last.ckpt") if exists(p)]
    if not found:
        raise CheckpointError(
            f"--ckpt_path last: no last.ckpt under {runs}/version_*/checkpoints/ (looked in {runs.resolve()});"
            " train first, or give a checkpoint file"
        )
    return max(found, key=lambda p: (p.stat().st_mtime_ns, _version_number(p.parent.parent.name)))


def _version_number(folder: str) -> int:
    """N of ``version_N`` (-1 for another name): equal times go to the higher-numbered run, ``version_10`` after 9."""
    match = re.fullmatch(r"version_(\d+)", folder)
    return int(match.group(1)) if match else -1


# ----------------------------------------------------------------------------------- one resume mode: auto
#: ``--ckpt_path auto``: resume this run's newest complete state, or start fresh when it has none.
RESUME_AUTO = "auto"
#: The resumable checkpoints of a run folder's ``checkpoints/``: ``last.ckpt`` (and ``last-vN.ckpt``) and
#: Lightning's SLURM requeue checkpoints ``hpc_ckpt_N.ckpt``; best-by-metric files are not a latest state.
RESUMABLE_PATTERNS = ("last*.ckpt", "hpc_ckpt_*.ckpt")


@dataclass(frozen=True)
class TrainingState:
    """A resumable checkpoint and how far its training got.

    Attributes:
        path: the ``.ckpt`` file.
        global_step: optimiser steps done.
        epoch: the epoch being trained (0-based).
        epochs_done: epochs trained to their end (Lightning's ``epoch_progress.current.processed``).
    """

    path: Path
    global_step: int
    epoch: int
    epochs_done: int

    def progress(self) -> tuple[int, int]:
        """The order of training progress: optimiser steps, then finished epochs (a save after the epoch end)."""
        return self.global_step, self.epochs_done


def training_state(path: str | os.PathLike) -> TrainingState | None:
    """How far the checkpoint ``path`` got, read memory-mapped (its tensors are not loaded); None if unreadable."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # an unreadable or foreign file is not a state to resume
        return None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "global_step" not in ckpt:
        return None
    loop = ckpt.get("loops", {}).get("fit_loop", {})
    done = loop.get("epoch_progress", {}).get("current", {}).get("processed", ckpt.get("epoch", 0))
    return TrainingState(Path(path), int(ckpt["global_step"]), int(ckpt.get("epoch", 0)), int(done))


def _version_folders(runs: Path, version: int | str | None) -> list[Path]:
    if version is not None:
        return [runs / (f"version_{version}" if isinstance(version, int) else str(version))]
    numbered = [(int(m.group(1)), p) for p in runs.glob("version_*") if (m := re.fullmatch(r"version_(\d+)", p.name))]
    return [p for _, p in sorted(numbered, reverse=True)]


def find_resume_state(save_dir: str | os.PathLike, name: str, version: int | str | None = None,
                      ) -> TrainingState | None:
    """The newest complete training state of the run ``<save_dir>/<name>`` (``--ckpt_path auto``), or None.

    The run folder is ``version`` when the logger names one, else the highest-numbered ``version_N`` that
    holds a resumable checkpoint (an attempt that failed before its first save leaves a folder without
    one). In its ``checkpoints/``, the files of :data:`RESUMABLE_PATTERNS` that load are compared by
    training progress (:meth:`TrainingState.progress`), never by name or modification time; the
    newest file wins only between equal progress. Checkpoints of other logger names, and Lightning's
    ``hpc_ckpt_N.ckpt`` in the working directory, are never considered.

    Args:
        save_dir: the logger's ``save_dir``.
        name: the logger's ``name``.
        version: the logger's ``version`` (None: the newest numbered one).
    """
    for folder in _version_folders(Path(save_dir) / name, version):
        files = {f for pattern in RESUMABLE_PATTERNS for f in (folder / "checkpoints").glob(pattern) if f.is_file()}
        states = [s for s in map(training_state, sorted(files)) if s is not None]
        if states:
            return max(states, key=lambda s: (*s.progress(), s.path.stat().st_mtime_ns))
    return None


def completed_run(state: TrainingState, max_epochs: int | None, max_steps: int | None) -> str | None:
    """Why the run whose newest state is ``state`` has nothing left to train, or None when it has.

    Args:
        state: the checkpoint's training state.
        max_epochs: ``trainer.max_epochs`` of the command (None or -1: no epoch limit).
        max_steps: ``trainer.max_steps`` (None or -1: no step limit).
    """
    if max_steps is not None and max_steps > 0 and state.global_step >= max_steps:
        return f"global step {state.global_step} of trainer.max_steps={max_steps}"
    if max_epochs is not None and max_epochs >= 0 and state.epochs_done >= max_epochs:
        return f"{state.epochs_done} of trainer.max_epochs={max_epochs} epochs done (global step {state.global_step})"
    return None


def hpc_checkpoints_in(folder: str | os.PathLike) -> list[Path]:
    """Lightning's SLURM requeue checkpoints ``hpc_ckpt_N.ckpt`` directly in ``folder`` (the working directory), by N.

    Lightning restores the highest-numbered of them (the last of this list: ``hpc_ckpt_10`` after ``hpc_ckpt_9``)
    into *any* ``fit`` started under SLURM without ``ckpt_path``, whatever run wrote it; the CLI refuses to start
    a fresh run then.
    """
    numbered = [(int(m.group(1)), p) for p in Path(folder).glob("hpc_ckpt_*.ckpt")
                if (m := re.fullmatch(r"hpc_ckpt_(\d+)\.ckpt", p.name))]
    return [p for _, p in sorted(numbered)]


def resume_command(argv: list[str], program: str = "python -m cropscale") -> str:
    """The command that resumes this run: ``argv`` with any ``--ckpt_path`` replaced by ``--ckpt_path auto``.

    Args:
        argv: the command's arguments after the program (``sys.argv[1:]``: ``fit --data.root ...``).
        program: how the program is started.
    """
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--ckpt_path":
            skip = True
        elif not arg.startswith("--ckpt_path="):
            out.append(arg)
    return " ".join([program, *map(shlex.quote, out), "--ckpt_path", RESUME_AUTO])


def _parent_cmdline() -> list[str]:
    """The command line of this process's parent (``/proc/<ppid>/cmdline``; empty where it cannot be read)."""
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _torchrun_program(cmdline: list[str]) -> tuple[str, list[str]] | None:
    """``(program, its arguments)`` for a torchrun agent's ``cmdline`` (``torchrun``, ``-m torch.distributed.run``)."""
    for i, arg in enumerate(cmdline[:3]):
        if Path(arg).name == "torchrun":
            return "torchrun", cmdline[i + 1:]
        if arg == "-m" and cmdline[i + 1:i + 2] == ["torch.distributed.run"]:
            return "python -m torch.distributed.run", cmdline[i + 2:]
    return None


def launch_resume_command(argv: list[str], env: dict[str, str] | None = None,
                          parent_cmdline: list[str] | None = None) -> str:
    """What follows ``resume with`` for the launcher that started this process: the command, ``--ckpt_path auto``.

    - torchrun (``TORCHELASTIC_RUN_ID`` set): the agent's own command (this process's parent), e.g. ``: torchrun
      --nnodes=2 ... -m cropscale fit ... --ckpt_path auto``; on several nodes it says that each node reruns its
      own. When the agent's command cannot be read: the same torchrun command with these script arguments.
    - SLURM (``SLURM_JOB_ID`` set): the job script's command, ``srun`` in front for more than one task.
    - otherwise ``: python -m cropscale ... --ckpt_path auto`` (:func:`resume_command`).

    Args:
        argv: this process's arguments (``sys.argv[1:]``: ``fit --data.root ...``).
        env: the environment (default ``os.environ``).
        parent_cmdline: the parent's command line (default: read from ``/proc``).

    Returns:
        E.g. ``" (the job script's command, then sbatch it): srun python -m cropscale fit ... --ckpt_path auto"``.
    """
    env = os.environ if env is None else env
    launcher = launcher_name(env)
    if launcher == "torchrun":
        agent = _torchrun_program(_parent_cmdline() if parent_cmdline is None else parent_cmdline)
        nodes = int(env.get("WORLD_SIZE", "1") or 1) > int(env.get("LOCAL_WORLD_SIZE", "1") or 1)
        each = "; every node reruns its own torchrun command so" if nodes else ""
        if agent is None:
            script = resume_command(argv, program="python -m cropscale")
            return f": the same torchrun command{each}, with the script arguments of {script}"
        note = f" (this node's torchrun command{each})" if nodes else ""
        return f"{note}: {resume_command(agent[1], program=agent[0])}"
    if launcher == "srun":
        tasks = int(env.get("SLURM_NTASKS", "1") or 1)
        program = "srun python -m cropscale" if tasks > 1 else "python -m cropscale"
        return f" (the job script's command, then sbatch it): {resume_command(argv, program=program)}"
    return f": {resume_command(argv)}"


def requeue_slurm_job(timeout_s: float = 60.0) -> str:
    """``scontrol requeue`` this SLURM job (array task included); a few words saying what happened.

    Call on global rank 0 only, after the checkpoint is saved. Where SLURM is not detected
    (``SLURM_JOB_ID`` unset) or ``scontrol`` is not on ``PATH``, nothing is run.
    """
    job = os.environ.get("SLURM_JOB_ID")
    if os.environ.get("SLURM_ARRAY_JOB_ID") and os.environ.get("SLURM_ARRAY_TASK_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    if not job:
        return "not under SLURM: not requeued"
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return f"SLURM job {job} not requeued (no scontrol on PATH)"
    try:
        done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"scontrol requeue {job} failed ({type(err).__name__})"
    if done.returncode != 0:
        why = " ".join((done.stderr or done.stdout).split())[:200]
        return f"scontrol requeue {job} failed with status {done.returncode} ({why})"
    return f"SLURM job {job} requeued"


def check_fit_start(ckpt_path: str | None, max_epochs: int | None, max_steps: int | None,
                    default_root_dir: str | os.PathLike) -> str | None:
    """Before ``fit`` starts: refuse another run's SLURM checkpoint; the line to end with when nothing is left to train.

    Args:
        ckpt_path: the resolved ``--ckpt_path`` (None: a fresh start).
        max_epochs: ``trainer.max_epochs``.
        max_steps: ``trainer.max_steps``.
        default_root_dir: ``trainer.default_root_dir`` (where Lightning looks for ``hpc_ckpt_N.ckpt``).

    Returns:
        ``cropscale: <path> is a complete run (...)`` when the checkpoint has reached ``max_epochs`` or
        ``max_steps`` (the caller prints it and exits with status 0 before anything starts), else None.

    Raises:
        CheckpointError: a fresh start under SLURM with ``hpc_ckpt_N.ckpt`` in ``default_root_dir``, which
            Lightning would restore whatever run wrote it.
    """
    if not ckpt_path and SLURMEnvironment.detect():
        found = hpc_checkpoints_in(default_root_dir)
        if found:
            raise CheckpointError(
                f"{found[-1]} is a SLURM requeue checkpoint that Lightning would restore into this fresh run"
                " whatever run wrote it; resume this run with --ckpt_path auto, give that file as --ckpt_path,"
                " or move it away")
    state = training_state(ckpt_path) if ckpt_path and Path(ckpt_path).is_file() else None
    done = completed_run(state, max_epochs, max_steps) if state is not None else None
    if done is None:
        return None
    return (f"cropscale: {ckpt_path} is a complete run ({done}): nothing to train; to train further, raise"
            " --trainer.max_epochs (or max_steps)")


def stop_line(trainer: Trainer, argv: list[str]) -> str:
    """The last line of a run that :class:`StopOnSignal` stopped (global rank 0, after every rank saved).

    After SIGUSR1 under SLURM (``SLURM_JOB_ID`` set) the job is requeued first (:func:`requeue_slurm_job`).
    E.g. ``cropscale: stopped by SIGUSR1 at epoch 1, global step 5; resumable checkpoint
    runs/default/version_0/checkpoints/last.ckpt; SLURM job 4242 requeued; resume with (the job script's
    command, then sbatch it): srun python -m cropscale fit ... --ckpt_path auto``; the command follows the
    launcher (:func:`launch_resume_command`). A requeued job whose command lacks ``--ckpt_path auto`` is
    said to start afresh.

    Args:
        trainer: the stopped Trainer.
        argv: the command's arguments (``sys.argv[1:]``), for the resume command.
    """
    stop = next((cb for cb in trainer.callbacks if isinstance(cb, StopOnSignal)), None)
    name = (stop.stopped_by if stop is not None else None) or "SIGTERM"
    last = [cb.last_model_path for cb in trainer.checkpoint_callbacks if getattr(cb, "last_model_path", "")]
    where = f"resumable checkpoint {last[0]}" if last else "no checkpoint saved (no ModelCheckpoint with save_last)"
    requeued = f"; {requeue_slurm_job()}" if name == "SIGUSR1" and os.environ.get("SLURM_JOB_ID") else ""
    auto = any(a == f"--ckpt_path={RESUME_AUTO}" or (a, b) == ("--ckpt_path", RESUME_AUTO)
               for a, b in zip(argv, [*argv[1:], ""], strict=True))
    if requeued.endswith(" requeued") and not auto:
        requeued += " (it reruns the job script as it is: without --ckpt_path auto a fresh run)"
    return (f"cropscale: stopped by {name} at epoch {trainer.current_epoch}, global step {trainer.global_step};"
            f" {where}{requeued}; resume with{launch_resume_command(argv)}")
