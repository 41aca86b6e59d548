"""Which checkpoint ``--ckpt_path`` names and which run folder a Lightning subcommand logs into.

Used by :class:`~cropscale.cli.main.CropScaleCLI` on the parsed configuration, before any class is built:

- :func:`check_checkpoint`: a ``--ckpt_path`` that is not a Lightning checkpoint is refused before Lightning opens it;
- :func:`resolve_last`: ``--ckpt_path last`` is the newest ``last.ckpt`` of the runs of the logger's name,
  ``--ckpt_path auto`` this run's most advanced state or a fresh start
  (:func:`~cropscale.checkpointing.find_resume_state`);
- :func:`continue_in_run_folder`: ``fit`` from a checkpoint of ``<save_dir>/<name>/version_N`` continues in that
  folder (its TensorBoard events from after the checkpoint's step are dropped);
- :func:`eval_run_folder`: ``validate`` / ``test`` / ``predict`` log apart from the training runs, under the
  checkpoint's ``version_N/<sub>_K`` (else ``<name>/<sub>/version_K``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

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
