"""Which checkpoint ``--ckpt_path`` names and which run folder a Lightning subcommand logs into.

Used by :class:`~cropscale.cli.main.CropScaleCLI` on the parsed configuration, before any class is built:

- :func:`check_checkpoint`: a ``--ckpt_path`` that is not a Lightning checkpoint is refused before Lightning opens it;
- :func:`resolve_last`: ``--ckpt_path last`` is the newest ``last.ckpt`` of the runs of the logger's name,
  ``--ckpt_path auto`` this run's most advanced state or a fresh start
  (:func:`~cropscale.checkpointing.find_resume_state`);
- :func:`continue_in_run_folder`: ``fit`` from a checkpoint of ``<save_dir>/<name>/version_N`` continues in that
  folder (its TensorBoard events from after the checkpoint's step are dropped);
- :func:`eval_run_folder`: ``validate`` / ``test`` / ``predict`` log apart from the training runs, under the
  checkpoint's ``version_N/<sub>_K`` (else ``<name>/<sub>/version_K``);
- :class:`FolderGuard`: a command refused before it started (a user error at set-up or when the checkpoint is
  restored) writes nothing: what it wrote into its run folder (a new folder, ``config.yaml``, an events file, a
  ``run.json``) is undone.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from cropscale.checkpointing import RESUME_AUTO, find_last_checkpoint, find_resume_state, next_eval_folder, run_version
from cropscale.errors import CheckpointError

#: ``ckpt_path`` values that Lightning resolves itself (not file paths); ``last`` is resolved here, ``best`` refused.
CKPT_KEYWORDS = ("last", "hpc")


def check_checkpoint(path: str | None) -> dict | None:
    """Refuse a ``--ckpt_path`` that is not a Lightning checkpoint, before Lightning opens it.

    Lightning's own failures for such files surface deep inside ``torch.load`` or its checkpoint
    migration (a truncated zip, a plain ``torch.save`` file, any non-torch file). Lightning's keywords
    (``best``, ``last``, ``hpc``, ``registry...``) and remote URLs are left to Lightning. The file is
    opened memory-mapped (``mmap=True``): its tensors are not read here. ``best`` is refused: it names the
    best checkpoint that this process's ``ModelCheckpoint`` saved, and a new command has saved none.

    Returns:
        The checkpoint, memory-mapped (None for keywords and remote URLs).

    Raises:
        CheckpointError: naming the path: ``best``, not found, not readable by ``torch.load(weights_only=True)``
            (the unpickler's errors: not a torch checkpoint file), or readable but without the keys of a
            Lightning checkpoint (``state_dict``, ``pytorch-lightning_version``).
    """
    import zipfile

    if not path or path in CKPT_KEYWORDS or path.startswith("registry") or "://" in path:
        return None
    if path == "best":
        raise CheckpointError("--ckpt_path best: Lightning's 'best' is the best checkpoint that ModelCheckpoint saved"
                              " in this same process, and a new command has saved none; give a checkpoint file, or"
                              " --ckpt_path last")
    if not Path(path).is_file():
        raise CheckpointError(f"--ckpt_path: checkpoint file not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except (RuntimeError, EOFError, OSError, ValueError) as err:  # the zip reader, the file, mmap
        reason = " ".join(str(err).split()).split(". ")[0]
        raise CheckpointError(f"--ckpt_path {path} is not a readable Lightning checkpoint ({reason[:160]})") from err
    except Exception as err:  # torch's weights-only unpickler on bytes that are no torch pickle (UnpicklingError,
        # KeyError, IndexError, ... depending on the bytes)
        raise CheckpointError(f"--ckpt_path {path} is not a readable Lightning checkpoint (not a torch checkpoint"
                              " file)") from err
    missing = [k for k in ("state_dict", "pytorch-lightning_version") if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(
            f"--ckpt_path {path} is a torch file but not a Lightning checkpoint (no {' / '.join(map(repr, missing))}:"
            " use a .ckpt written by ModelCheckpoint or trainer.save_checkpoint)"
        )
    return ckpt


def logger_location(logger: Any, default_root_dir: str | None = None) -> tuple[str, str] | None:
    """``(save_dir, name)`` of the first logger of a ``trainer.logger`` configuration, or None without a logger.

    Args:
        logger: the parsed ``trainer.logger`` value: a ``class_path``/``init_args`` namespace or dict, a list
            of them, True/None (Lightning's default TensorBoard logger) or False.
        default_root_dir: ``trainer.default_root_dir`` (the default logger's ``save_dir``).
    """
    if isinstance(logger, list):
        logger = logger[0] if logger else False
    if logger is False:
        return None
    if logger is None or logger is True:
        return (default_root_dir or "."), "lightning_logs"
    init = (logger.get("init_args") if hasattr(logger, "get") else None) or {}
    save_dir = init.get("save_dir") or init.get("root_dir")
    if save_dir is None:
        return None
    return str(save_dir), str(init.get("name") or "lightning_logs")


def resolve_last(cfg: Any) -> str | None:
    """``--ckpt_path last|auto``: this run's newest state by training progress (auto: None when there is none).

    Args:
        cfg: the subcommand's parsed configuration (``ckpt_path`` is ``last`` or ``auto``).

    Returns:
        The checkpoint file, or None for ``auto`` without a checkpoint under the logger's folder.

    Raises:
        CheckpointError: the run has no logger; ``last`` and no ``last.ckpt`` there
            (:func:`~cropscale.checkpointing.find_last_checkpoint`).
    """
    keyword, logger = cfg.ckpt_path, cfg.trainer.get("logger")
    where = logger_location(logger, cfg.trainer.get("default_root_dir"))
    if where is None:
        raise CheckpointError(f"--ckpt_path {keyword}: the run has no logger (trainer.logger), so there is no run"
                             " folder to look in; give a checkpoint file")
    init = logger.get("init_args") if hasattr(logger, "get") else None
    state = find_resume_state(*where, version=init.get("version") if init is not None else None)
    if state is None and keyword == RESUME_AUTO:
        rank_zero_info(f"cropscale: --ckpt_path auto: no checkpoint under {Path(*where)}: a fresh start")
        return None
    found = state.path if state is not None else find_last_checkpoint(*where)  # raises: none there
    progress = f" (epoch {state.epoch}, global step {state.global_step})" if state is not None else ""
    rank_zero_info(f"cropscale: --ckpt_path {keyword} -> {found}{progress}")
    return str(found)


def continue_in_run_folder(cfg: Any, ckpt: dict) -> None:
    """Make ``fit`` from ``<save_dir>/<name>/version_N/checkpoints/x.ckpt`` log into ``version_N`` again."""
    logger = cfg.trainer.get("logger")
    where = logger_location(logger, cfg.trainer.get("default_root_dir"))
    init = logger.get("init_args") if where is not None and hasattr(logger, "get") else None
    if init is None or "version" not in init or init.get("version") is not None:
        return
    version = run_version(cfg.ckpt_path, *where)
    if version is None:
        return
    init.version = version
    if "purge_step" in init and init.get("purge_step") is None:
        # TensorBoard drops the interrupted run's events after the checkpoint's step
        init.purge_step = int(ckpt.get("global_step", 0)) + 1
    rank_zero_info(f"cropscale: resuming in {Path(*where) / f'version_{version}'}")


def eval_run_folder(cfg: Any, sub: str) -> None:
    """Log ``validate`` / ``test`` / ``predict`` apart from the training runs of the logger's name.

    From a checkpoint of ``<save_dir>/<name>/version_N``: into ``version_N/<sub>_K`` (the logger's ``sub_dir``,
    :func:`~cropscale.checkpointing.next_eval_folder`); else into ``<save_dir>/<name>/<sub>/version_K``. A logger
    whose ``version`` or ``sub_dir`` is configured is left as it is.
    """
    logger = cfg.trainer.get("logger")
    where = logger_location(logger, cfg.trainer.get("default_root_dir"))
    init = logger.get("init_args") if where is not None and hasattr(logger, "get") else None
    if init is None or "sub_dir" not in init or init.get("version") is not None or init.get("sub_dir") is not None:
        return
    version = run_version(cfg.ckpt_path, *where) if cfg.get("ckpt_path") else None
    if version is None:
        init.name = f"{where[1]}/{sub}"
        rank_zero_info(f"cropscale: {sub} logs under {Path(where[0]) / init.name} (no checkpoint of a run there)")
    else:
        init.version, init.sub_dir = version, next_eval_folder(Path(*where) / f"version_{version}", sub)
        rank_zero_info(f"cropscale: {sub} logs into {Path(*where) / f'version_{version}' / init.sub_dir}")


#: Files up to this size are kept whole by :class:`FolderGuard` (``config.yaml``, ``hparams.yaml``, ``run.json``);
#: larger ones (checkpoints, events) are only listed: a command refused before it started never rewrites them.
SNAPSHOT_BYTES = 1 << 20


def rank_zero_env(env: dict[str, str] | None = None) -> bool:
    """True in the process that writes the run folder: global rank 0 by the launchers' variables.

    They are known before the process group forms: ``RANK``, ``LOCAL_RANK`` and ``NODE_RANK`` / ``GROUP_RANK`` of
    Lightning and torchrun, ``SLURM_PROCID``.
    """
    env = dict(os.environ) if env is None else env
    return all(int(env.get(key, "0") or 0) == 0 for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK",
                                                                 "SLURM_PROCID"))


class FolderGuard(Callback):
    """Undo what a refused command wrote into its run folder, so that a refused command writes nothing.

    :meth:`take` records the run folder before the command runs: whether it and its parents existed, its files
    (the bytes of those up to :data:`SNAPSHOT_BYTES`) and folders. Lightning writes into it before the checks at
    set-up and at the checkpoint's restore can refuse the command (the logger's events file, LightningCLI's
    ``config.yaml``, a ``failed`` ``run.json``); :meth:`undo` then removes the new files and folders and puts back
    the bytes of the changed ones, unless the run had started (training, or an evaluation past its sanity check),
    when what it wrote is a record of a run that failed.

    Example::

        guard = FolderGuard()
        guard.take(trainer.logger.log_dir)
        trainer.callbacks.append(guard)
        try:
            trainer.fit(model)
        except CropScaleError:
            guard.undo()
            raise
    """

    def __init__(self) -> None:
        self.root: Path | None = None
        self.created: list[Path] = []  # the root and the parents it needs that did not exist, deepest first
        self.files: dict[Path, bytes | None] = {}
        self.folders: set[Path] = set()
        self.started = False

    def take(self, folder: str | os.PathLike | None) -> None:
        """Record ``folder`` (the run folder the command will write; None: nothing to guard)."""
        self.root = Path(folder) if folder else None
        self.created, self.files, self.folders, self.started = [], {}, set(), False
        if self.root is None:
            return
        probe = self.root
        while not probe.exists() and probe.parent != probe:
            self.created.append(probe)
            probe = probe.parent
        if self.created:
            return
        for path in self.root.rglob("*"):
            if path.is_dir():
                self.folders.add(path)
            elif path.is_file():
                self.files[path] = path.read_bytes() if path.stat().st_size <= SNAPSHOT_BYTES else None

    def _started(self, trainer: Trainer) -> None:
        if not trainer.sanity_checking:
            self.started = True

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.started = True

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._started(trainer)

    @override
    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.started = True

    @override
    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.started = True

    def undo(self) -> list[str]:
        """Put the run folder back as :meth:`take` found it, unless the run had started; what was undone, one a line."""
        if self.root is None or self.started:
            return []
        if self.created:  # the command made the folder: all of it is its own
            gone = [str(p) for p in self.created if p.exists()]
            shutil.rmtree(self.created[0], ignore_errors=True)
            for parent in self.created[1:]:
                if parent.is_dir() and not any(parent.iterdir()):
                    parent.rmdir()
            return [f"removed {gone[-1]}"] if gone else []
        done = []
        for path in sorted(self.root.rglob("*"), reverse=True):  # files before their folders
            if path.is_file() and path not in self.files:
                path.unlink()
                done.append(f"removed {path}")
            elif path.is_dir() and path not in self.folders and not any(path.iterdir()):
                path.rmdir()
                done.append(f"removed {path}")
        for path, data in self.files.items():
            if data is not None and (not path.is_file() or path.read_bytes() != data):
                path.write_bytes(data)
                done.append(f"restored {path}")
        return done
