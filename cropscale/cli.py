"""Command line: ``python -m cropscale <subcommand> ...`` (also installed as ``cropscale``).

Lightning subcommands (``fit``, ``validate``, ``test``, ``predict``) go through
:class:`CropScaleCLI`, a :class:`~lightning.pytorch.cli.LightningCLI` over
:class:`~cropscale.model.task.CropMappingTask` and
:class:`~cropscale.data.datamodule.PastisHDDataModule`. ``configs/default.yaml`` is always read
first, so ``python -m cropscale fit`` with no other argument trains on the bundled sample; further
``--config`` files and dotted overrides (``--trainer.devices=2``) apply on top, as in any
LightningCLI. Lightning's DDP launcher re-executes ``python -m cropscale ...`` on each rank, which
lands here again with the same arguments.

After ``fit``, global rank 0 prints the end-of-fit summary (:func:`cropscale.runs.summary.fit_summary`
of the run folder, the same rules as the report). A run that diverged (:func:`cropscale.runs.rules.divergence`)
ends with ``cropscale: error: training diverged ...`` and exit status 1; so does a run that did not train
(:func:`cropscale.runs.rules.trained`: ``cropscale: error: the run did not train: ...``).

``predict --output DIR`` adds a :class:`~cropscale.predictions.PredictionWriter`: one class map per patch
(GeoTIFF where the data is georeferenced, else ``.npz``) and ``predictions.json``; a non-empty or unwritable
``DIR`` is refused before the checkpoint is read.

The other subcommands are plain functions ``main(argv) -> int`` listed in :data:`EXTRA_COMMANDS`.

User errors are told apart by type, never by message text: :class:`cropscale.CropScaleError` and its
family (:mod:`cropscale.errors`: :class:`~cropscale.errors.ConfigError`,
:class:`~cropscale.errors.TrainerArgumentError`, :class:`~cropscale.errors.CheckpointError`), raised where
the problem is found, end with the class's ``exit_status`` (2); so do Lightning's
``MisconfigurationException``, jsonargparse's ``ArgumentError`` and a ``FileNotFoundError``. Third-party
errors about the user's input are typed at the one place the project calls the library: the Trainer's
argument checks in :meth:`CropScaleCLI.instantiate_trainer`, ``torch.load`` in :func:`check_checkpoint`,
the weights in :meth:`~cropscale.model.task.CropMappingTask.load_state_dict`. Each prints one paragraph
naming the argument or path; an error re-raised from a DataLoader worker prints the worker's own message
(:func:`cropscale.errors.user_error_text`). Any other exception keeps its traceback.

Parsing is exact: no option prefixes (``--trainer.max_epoch`` is an error, not ``max_epochs``), and the
Trainer's ``int | float`` limits keep an integer as an integer (``--trainer.limit_train_batches=1`` is one
batch, ``=1.0`` all of them), as in the Trainer's own API (:func:`integers_stay_integers`).

Checkpoints (:mod:`cropscale.checkpointing`): every save goes through
:class:`~cropscale.checkpointing.AtomicCheckpointIO` unless the configuration names another
``CheckpointIO``; ``--ckpt_path last`` is the newest ``last.ckpt`` of the runs of the logger's name, and
``fit`` from a checkpoint of ``<save_dir>/<name>/version_N`` continues in that same folder (its
TensorBoard events from after the checkpoint's step are dropped), so the best-checkpoint tracking
continues. Model settings given on the command line or in a ``--config`` file win over the
checkpoint's hyperparameters (Lightning re-applies the latter): evaluation settings apply, an
architecture that differs from the checkpoint's is refused by the task, and optimiser settings that the
checkpoint's optimiser state would override are refused when resuming ``fit``.

``--ckpt_path auto`` resumes this run's most advanced state, or starts fresh when it has none
(:func:`~cropscale.checkpointing.find_resume_state`); a complete run ends at once with status 0.

Ending (:mod:`cropscale.distributed`): SIGTERM, SIGUSR1 or Ctrl-C during ``fit`` stops every rank at the same
step, saves ``last.ckpt`` and exits with status 0 after one line with the resume command (SIGUSR1 under SLURM
requeues the job first; :class:`~cropscale.checkpointing.StopOnSignal`). When a DDP rank
fails, the launching rank stops the others and prints one last line naming the failed rank, its exit
status and its own error; the other ranks' collective errors are reduced to one line each.
"""

from __future__ import annotations

import copy
import functools
import importlib
import operator
import os
import re
import sys
import traceback
import typing
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from typing_extensions import override

from cropscale.callbacks.divergence import DivergenceCallback
from cropscale.checkpointing import (
    RESUME_AUTO,
    AtomicCheckpointIO,
    StopOnSignal,
    check_fit_start,
    find_last_checkpoint,
    find_resume_state,
    next_eval_folder,
    run_version,
    stop_line,
)
from cropscale.config_errors import describe_config_error
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.distributed import (
    ChildRankWatch,
    child_failures,
    child_rank_processes,
    cleanup_rank_reports,
    elastic_restart_hazard,
    finish_distributed,
    peer_line,
    prepare_rank_reports,
    report_rank_error,
    stop_child_ranks,
)
from cropscale.env.host import choose_torch_threads, usable_cores
from cropscale.errors import CheckpointError, ConfigError, CropScaleError, TrainerArgumentError, user_error_text
from cropscale.files import check_writable_folder
from cropscale.model.task import RESUME_FIXED_SETTINGS, CropMappingTask
from cropscale.precision import cpu_precision_line
from cropscale.predictions import PredictionWriter, check_output_folder
from cropscale.runs.record import is_run_folder, load_run
from cropscale.runs.summary import fit_summary, not_trained_reason

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"

EXTRA_COMMANDS: dict[str, tuple[str, str]] = {
    "summary": ("cropscale.bench.summary", "parameters and FLOPs per sample of the configured model"),
    "benchmark": ("cropscale.bench.step", "compute-only training-step microbenchmark (FP32 vs AMP)"),
    "report": ("cropscale.report.cli", "quality-and-speed report (Markdown, CSV, PNG) of runs"),
    "study": ("cropscale.study.runner", "scaling study runner (1-8 devices, both batch protocols)"),
    "scaling": ("cropscale.study.analytical", "analytical Amdahl and ring all-reduce tables"),
    "loader-bench": ("cropscale.bench.loader", "data-pipeline throughput (samples/s) by worker count"),
    "tiling-bench": ("cropscale.bench.tiling", "tiled validation time vs tiles x one-tile forward"),
    "callback-bench": ("cropscale.bench.callbacks", "per-step overhead of the scaling callbacks"),
    "lever-bench": ("cropscale.bench.levers", "speed levers (compile, fused AdamW, channels_last, pinned) vs eager"),
    "pipeline-bench": ("cropscale.bench.pipeline", "end-to-end / compute-only training samples/s (input pipeline)"),
}


LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
#: What each Lightning subcommand does, for the overview of ``python -m cropscale`` (and ``--help``).
LIGHTNING_HELP = {
    "fit": "train the model on data.train_folds, validating each epoch (e.g. --trainer.devices=2)",
    "validate": "one validation pass (tiled, val/mIoU) of a --ckpt_path on data.val_folds",
    "test": "one test pass of a --ckpt_path on data.test_folds",
    "predict": "predictions of a --ckpt_path on data.test_folds",
}

#: ``ckpt_path`` values that Lightning resolves itself (not file paths); ``last`` is resolved here, ``best`` refused.
_CKPT_KEYWORDS = ("last", "hpc")

#: The Trainer of the running Lightning subcommand, for the error and SIGTERM endings of :func:`main`.
_ACTIVE: dict[str, Trainer] = {}


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

    if not path or path in _CKPT_KEYWORDS or path.startswith("registry") or "://" in path:
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


def explicit_model_settings(given: dict[str, Any], defaults: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """The ``model.*`` settings the user gave: named on the command line, or different from ``configs/default.yaml``.

    Args:
        given: the parsed ``model`` section (defaults, ``--config`` files and command line).
        defaults: the same section from the defaults alone (``configs/default.yaml`` and class defaults).
        argv: the command-line arguments.

    Returns:
        ``{key: value}`` of the settings that a checkpoint's hyperparameters must not override.
    """
    named = {tok.split("=", 1)[0][len("--model."):].split(".", 1)[0] for tok in argv if tok.startswith("--model.")}
    return {k: copy.deepcopy(v) for k, v in given.items() if k in named or defaults.get(k, object()) != v}


def integers_stay_integers(parser: LightningArgumentParser, prefix: str = "trainer.") -> list[str]:
    """Make the ``int | float`` options under ``prefix`` try ``int`` first, as the Trainer's API means them.

    Lightning declares ``limit_train_batches: Optional[Union[int, float]]`` (an int: that many batches; a
    float: that fraction), but ``typing`` caches unions by equality, so the hint can come out as
    ``Union[float, int, None]`` (whichever equal union was built first) and jsonargparse, which tries the
    members in order, parses ``1`` as ``1.0`` (all batches). The options' type hints are rebuilt as
    ``int | float | ...`` (``types.UnionType``, which ``typing`` does not cache); ``1.0`` stays a float.

    Returns:
        The destinations changed (``trainer.limit_train_batches`` ...).
    """
    changed = []
    for action in parser._actions:
        hint = getattr(action, "_typehint", None)  # jsonargparse's ActionTypeHint keeps its hint here
        if not action.dest.startswith(prefix) or typing.get_origin(hint) is not typing.Union:
            continue
        args = typing.get_args(hint)
        if int in args and float in args and args.index(float) < args.index(int):
            ordered = (int, *[a for a in args if a is not int])
            action._typehint = functools.reduce(operator.or_, ordered)  # int | float | None, not cached
            changed.append(action.dest)
    return changed
GROUP_CLASS = "cropscale.callbacks.CallbackGroup"
PROVENANCE_CLASS = "cropscale.callbacks.ProvenanceCallback"


def _class_path(entry: Any) -> str | None:
    value = entry.get("class_path") if isinstance(entry, dict) else getattr(entry, "class_path", None)
    return value.replace("cropscale.callbacks.group.", "cropscale.callbacks.") if isinstance(value, str) else value


def _members(group: Any) -> list[Any]:
    args = group.get("init_args") if isinstance(group, dict) else getattr(group, "init_args", None)
    members = args.get("callbacks") if isinstance(args, dict) else getattr(args, "callbacks", None)
    return members if isinstance(members, list) else []


def _merge_member(members: list[Any], entry: Any) -> str:
    """Put ``entry`` into a group's ``members``: over the member of its class, else before provenance."""
    path = _class_path(entry)
    for i, member in enumerate(members):
        if _class_path(member) == path:
            if member == entry:
                return "kept once"
            members[i] = entry
            return "its later settings replace the group member's"
    last = len(members)
    if members and _class_path(members[-1]) == PROVENANCE_CLASS:
        last -= 1  # ProvenanceCallback stays last: run.json holds every other member's summary
    members.insert(last, entry)
    return "added to the group"


def merge_callbacks(entries: list[Any]) -> tuple[list[Any], list[str]]:
    """The ``trainer.callbacks`` entries of the parsed configuration with repeats merged.

    ``configs/default.yaml`` already holds the scaling callbacks' :class:`~cropscale.callbacks.CallbackGroup`,
    so a later ``--config callbacks/scaling.yaml`` or ``callbacks/<name>.yaml`` (they append) would run
    a callback twice. Instead: an entry equal to an earlier one is dropped; a later group's members
    and a later single entry of a class that a group already holds go into that group, replacing the
    member of the same class (later files win, as for any option); other entries stay as they are.

    Returns:
        ``(entries, notes)``: the merged list (groups changed in place) and one note per merge.
    """
    out: list[Any] = []
    notes: list[str] = []
    for entry in entries:
        path = _class_path(entry)
        group = next((e for e in out if _class_path(e) == GROUP_CLASS), None)
        if path is None:
            out.append(entry)
        elif any(entry == e for e in out):
            notes.append(f"{path} is configured twice: kept once")
        elif path == GROUP_CLASS and group is not None:
            for member in _members(entry):
                merged = _merge_member(_members(group), member)
                notes.append(f"{_class_path(member)} of a later CallbackGroup: {merged}")
        elif group is not None and any(_class_path(m) == path for m in _members(group)):
            notes.append(f"{path} is already in the CallbackGroup: {_merge_member(_members(group), entry)}")
        else:
            out.append(entry)
    return out, notes


def report_command(trainer: Trainer) -> str:
    """The command that turns the runs under the trainer's logger folder into a report.

    ``make report`` where that folder is ``runs`` in the working directory beside the Makefile.
    """
    save_dir = getattr(trainer.logger, "save_dir", None) or trainer.default_root_dir
    try:
        shown = os.path.relpath(save_dir)
    except ValueError:  # another drive (Windows)
        shown = str(save_dir)
    command = f"python -m cropscale report {shown} --output reports"
    if shown == "runs" and Path("Makefile").is_file():
        return f"make report   (= {command})"
    return command


def end_of_fit(trainer: Trainer, folder: str | None) -> tuple[str, str | None]:
    """The end-of-fit summary of the run folder ``folder`` and, for a run that diverged, the one-line error.

    The verdict is the divergence rule's on the run folder's logged loss, or a
    :class:`~cropscale.callbacks.DivergenceCallback`'s where the run left no folder to read.

    Returns:
        ``(summary text, error or None)``.
    """
    watcher = next((cb for cb in trainer.callbacks if isinstance(cb, DivergenceCallback)), None)
    stopped = watcher.stopped_at_step if watcher is not None else None
    untrained = None
    if folder and is_run_folder(Path(folder)):
        record = load_run(folder)
        text = fit_summary(record, report_command(trainer), stopped)
        verdict = record.divergence
        untrained = not_trained_reason(record)
    else:
        text = f"cropscale fit summary: no run folder to read ({folder} holds no run.json and no TensorBoard events)"
        verdict = watcher.verdict if watcher is not None else None
    if untrained and (verdict is None or not verdict.diverged):
        return text, f"the run did not train: {untrained} (run folder {folder})"
    if verdict is None or not verdict.diverged:
        return text, None
    where = f"; stopped at step {stopped}" if stopped is not None else ""
    return text, f"training diverged: {verdict.why}{where} (run folder {folder})"


class CropScaleCLI(LightningCLI):
    """LightningCLI that links the data module's class count and names into the task and checks ``--ckpt_path``.

    The checkpoint path is checked before Lightning opens it (:func:`check_checkpoint`); ``last`` is
    resolved to the newest ``last.ckpt`` of the runs of the logger's name
    (:func:`~cropscale.checkpointing.find_last_checkpoint`); model settings given by the user win over
    the checkpoint's (module docstring); output folders are checked for writing before the run starts.
    The Trainer's ``int | float`` options parse integers as integers (:func:`integers_stay_integers`).
    After ``fit``, global rank 0 prints the end-of-fit summary and keeps the divergence error in
    :attr:`fit_error`.
    """

    _explicit_model: dict[str, Any] = {}
    fit_error: str | None = None

    @override
    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Lightning's ``--seed_everything`` and ``--threads`` (torch threads per process on CPU)."""
        super().add_default_arguments_to_parser(parser)
        parser.add_argument("--threads", type=int | None, default=None,
                            help="torch threads per process on CPU (default: OMP_NUM_THREADS when set, else the"
                                 " usable cores // the processes on this machine)")

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        integers_stay_integers(parser)
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")
        parser.link_arguments("data.ignore_index", "model.ignore_index")

    @override
    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand == "predict":
            parser.add_argument("--output", type=str | None, default=None,
                                help="new or empty folder for the per-patch class maps (GeoTIFF where the patch is"
                                     " georeferenced, else .npz) and predictions.json (cropscale.predictions)")
        return parser

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        super().parse_arguments(parser, args)
        sub = self.config.get("subcommand")
        trainer = (self.config[sub] if sub else self.config).get("trainer")
        entries = trainer.get("callbacks") if trainer is not None else None
        if isinstance(entries, list):
            trainer["callbacks"], notes = merge_callbacks(entries)
            for note in notes:
                rank_zero_info(f"cropscale: trainer.callbacks: {note}")
        if not sub:
            return
        cfg = self.config[sub]
        argv = list(sys.argv[1:] if args is None else args)
        defaults = self._parser(sub).get_defaults()
        self._explicit_model = explicit_model_settings(cfg.model.as_dict(), defaults.model.as_dict(), argv)
        if cfg.get("ckpt_path") in ("last", RESUME_AUTO):
            cfg.ckpt_path = self._find_last(cfg)
        if sub == "fit":
            self._check_fit_start(cfg)
        if sub == "predict" and cfg.get("output"):
            check_output_folder(cfg.output)  # before the checkpoint and the data are read
            if cfg.get("return_predictions") is None:  # the writer has them: Lightning need not keep every patch
                cfg.return_predictions = False
        ckpt = check_checkpoint(cfg.get("ckpt_path"))
        if sub == "fit" and ckpt is not None:
            self._continue_in_run_folder(cfg, ckpt)
        if sub != "fit":
            self._eval_run_folder(cfg, sub)

    def _find_last(self, cfg: Any) -> str | None:
        """``--ckpt_path last|auto``: this run's newest state by training progress (auto: None when there is none)."""
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

    def _check_fit_start(self, cfg: Any) -> None:
        """:func:`~cropscale.checkpointing.check_fit_start`; a complete run ends here with its line and status 0."""
        done = check_fit_start(cfg.get("ckpt_path"), cfg.trainer.get("max_epochs"), cfg.trainer.get("max_steps"),
                               cfg.trainer.get("default_root_dir") or os.getcwd())
        if done:
            print(done, file=sys.stderr, flush=True)
            sys.exit(0)

    def _continue_in_run_folder(self, cfg: Any, ckpt: dict) -> None:
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

    def _eval_run_folder(self, cfg: Any, sub: str) -> None:
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

    @override
    def before_instantiate_classes(self) -> None:
        if not self.subcommand:  # run=False: the configuration has no subcommand level and no ckpt_path
            return
        cfg = self.config[self.subcommand]
        if not cfg.get("ckpt_path"):
            return
        # Lightning has put the checkpoint's hyperparameters over the command line (LightningCLI._parse_ckpt_path):
        # the settings the user gave win again; those the checkpoint would silently override are refused.
        for key, value in self._explicit_model.items():
            kept = cfg.model.get(key)
            if self.subcommand == "fit" and key in RESUME_FIXED_SETTINGS and value != kept:
                raise ConfigError(
                    f"--model.{key}={value} cannot apply when resuming from {cfg.ckpt_path}: the optimiser and LR"
                    f" schedule state come from the checkpoint ({key}={kept}); drop it, or start a new run"
                )
            cfg.model[key] = value

    @override
    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Lightning's Trainer with :class:`~cropscale.checkpointing.AtomicCheckpointIO` (unless another
        ``CheckpointIO`` is configured) and, under SLURM, Lightning's requeue handler off.

        Raises:
            TrainerArgumentError: Lightning refused a ``--trainer.*`` value (its ``ValueError``, ``TypeError``
                or ``MisconfigurationException`` from the Trainer's argument checks), the option named.
            ConfigError: a precision this CPU cannot run.
        """
        trainer_config = self._get(self.config_init, "trainer", default={})
        plugins = kwargs.get("plugins", trainer_config.get("plugins"))
        plugins = [] if plugins is None else list(plugins) if isinstance(plugins, list | tuple) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins = kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]
        if SLURMEnvironment.detect() and not any(isinstance(p, ClusterEnvironment) for p in plugins):
            # SIGUSR1 is StopOnSignal's: Lightning's SLURM handler would save into the working directory and hang
            kwargs["plugins"] = [*plugins, SLURMEnvironment(auto_requeue=False)]
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except CropScaleError:
            raise
        except (ValueError, TypeError, MisconfigurationException) as err:  # the Trainer's own argument checks
            raise TrainerArgumentError(name_trainer_argument(" ".join(str(err).split()))) from err
        _ACTIVE["trainer"] = trainer
        line = cpu_precision_line(trainer.precision) if isinstance(trainer.accelerator, CPUAccelerator) else None
        if line and line[0] == "error":
            raise ConfigError(line[1])
        if line:
            rank_zero_warn(line[1])
        if isinstance(trainer.accelerator, CPUAccelerator):
            self._set_threads(trainer)
        return trainer

    def _set_threads(self, trainer: Trainer) -> None:
        """On CPU: torch threads per process (:func:`~cropscale.env.host.choose_torch_threads`), set, printed on rank 0.

        The processes on this machine are ``LOCAL_WORLD_SIZE`` (torchrun) or the Trainer's devices (Lightning
        starts one process per CPU device under DDP).
        """
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        processes = int(local) if local.isdigit() and int(local) > 0 else int(trainer.num_devices)
        choice = choose_torch_threads(usable_cores(), processes, cfg.get("threads"), os.environ.get("OMP_NUM_THREADS"))
        torch.set_num_threads(choice.threads)
        rank_zero_info(choice.line())

    def _check_outputs(self) -> None:
        """Refuse, before the run starts, a run folder or checkpoint folder that cannot be written."""
        logger = self.trainer.logger
        folders = [getattr(logger, "log_dir", None) if logger is not None else None]
        folders += [cb.dirpath for cb in self.trainer.callbacks if isinstance(cb, ModelCheckpoint)]
        for folder in folders:
            if folder:
                check_writable_folder(folder, what="run folder")

    def before_fit(self) -> None:
        """Check the output folders before training (:meth:`_check_outputs`)."""
        self._check_outputs()

    def before_validate(self) -> None:
        """Check the output folders before validating."""
        self._check_outputs()

    def before_test(self) -> None:
        """Check the output folders before testing."""
        self._check_outputs()

    def before_predict(self) -> None:
        """Check the output folders before predicting; ``--output``: add the :class:`PredictionWriter`."""
        self._check_outputs()
        output = self.config_init[self.subcommand].get("output")
        if output:
            self.trainer.callbacks.append(PredictionWriter(output))
        else:
            rank_zero_warn("cropscale predict: no --output folder given, so no prediction is written")

    def after_fit(self) -> None:
        """Print the end-of-fit summary on global rank 0 (:func:`end_of_fit`); a divergence goes to ``fit_error``."""
        folder = self.trainer.log_dir or self.trainer.default_root_dir  # a collective under DDP: every rank
        if not self.trainer.is_global_zero:
            return
        text, self.fit_error = end_of_fit(self.trainer, folder)
        print("\n" + text, flush=True)


def _lightning_cli(args: list[str] | None) -> LightningCLI:
    # exit_on_error=False: jsonargparse raises ArgumentError instead of printing the whole usage, and
    # main() prints one paragraph naming the argument.
    # allow_abbrev=False: an option prefix (--trainer.max_epoch) is an error, not the option it abbreviates.
    parser_kwargs: dict = {"exit_on_error": False, "prog": "python -m cropscale", "allow_abbrev": False}
    for sub in LIGHTNING_COMMANDS:
        parser_kwargs[sub] = {"exit_on_error": False, "allow_abbrev": False}
        if DEFAULT_CONFIG.is_file():
            parser_kwargs[sub]["default_config_files"] = [str(DEFAULT_CONFIG)]
    return CropScaleCLI(
        CropMappingTask,
        PastisHDDataModule,
        parser_kwargs=parser_kwargs,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"callbacks": [StopOnSignal(), ChildRankWatch()]},
        args=args,
    )


def print_overview() -> None:
    """Print every subcommand, one a line with what it does (``python -m cropscale`` alone, or ``--help``)."""
    print("usage: python -m cropscale <subcommand> [options]   (or: cropscale <subcommand> ...)\n")
    print("Lightning subcommands (LightningCLI; configs/default.yaml is read first):")
    for name, what in LIGHTNING_HELP.items():
        print(f"  {name:<15} {what}")
    print("\nAnalysis subcommands:")
    for name, (_, what) in EXTRA_COMMANDS.items():
        print(f"  {name:<15} {what}")
    print("\nEach subcommand has --help: python -m cropscale fit --help")


def _fail(message: str, status: int = 2) -> None:
    """Print ``cropscale: error: <message>`` as the last line and exit; under DDP, end the other ranks first.

    On a child rank (``LOCAL_RANK`` > 0) the line names the rank and is also left for the launching rank
    (:func:`~cropscale.distributed.report_rank_error`). On the launching rank with child ranks, a child
    that failed first is what the line names (:class:`~cropscale.distributed.RankFailure`); the children
    still running are stopped before the line is printed. Under torchrun or srun the ranks meet in the run's
    store instead (:func:`~cropscale.distributed.peer_line`): rank 0's line names the rank that left. With a
    process group alive the process ends with ``os._exit`` (gloo's threads can abort an orderly interpreter
    exit after the line).
    """
    import torch.distributed as dist

    text = " ".join(str(message).split())
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    trainer = _ACTIVE.get("trainer")
    if local_rank > 0:
        report_rank_error(local_rank, text)
        text = peer_line(f"rank {getattr(trainer, 'global_rank', local_rank)}: {text}", trainer)
    elif child_rank_processes(trainer):
        for cb in getattr(trainer, "callbacks", []):
            if isinstance(cb, ChildRankWatch):
                cb.stop()
        failed = child_failures(trainer, wait_s=_PEER_WAIT_S if _PEER_ERROR.search(text) else 0.0)
        stop_child_ranks(trainer)
        if failed:
            text, status = " ".join(failed[0].describe().split()), 1
        cleanup_rank_reports()
    else:  # ranks started by torchrun or srun: the store tells rank 0 which rank left
        text = peer_line(text, trainer, wait_s=_PEER_WAIT_S)
    print(f"cropscale: error: {text}", file=sys.stderr, flush=True)
    if dist.is_available() and dist.is_initialized():
        sys.stdout.flush()
        os._exit(status)
    sys.exit(status)


#: Text of a collective that failed because another rank left (gloo, NCCL, the TCP store).
_PEER_ERROR = re.compile(r"Connection (closed|reset) by peer|Broken pipe|[Gg]loo|NCCL|TCPStore|DistBackendError"
                         r"|ProcessGroup|Socket Timeout|recvValue|Connection refused")
#: How long the launching rank waits for a dead child to be reaped after a collective error (s).
_PEER_WAIT_S = 10.0


def _stopped_by_signal() -> None:
    """End after :class:`~cropscale.checkpointing.StopOnSignal` stopped training: status 0, one line on rank 0."""
    trainer = _ACTIVE.get("trainer")
    finish_distributed(trainer)
    if trainer is not None and trainer.global_rank == 0:
        print(stop_line(trainer, sys.argv[1:]), file=sys.stderr, flush=True)
    sys.exit(0)


def _before_lightning() -> None:
    """Before a Lightning subcommand: the rank-report folder (the other ranks inherit it), the torchrun warning."""
    prepare_rank_reports()
    hazard = elastic_restart_hazard()
    if hazard and os.environ.get("RANK", "0") == "0":
        print(hazard, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m cropscale`` and the ``cropscale`` console script."""
    from jsonargparse import ArgumentError

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print_overview()
        return
    if args[0] in LIGHTNING_COMMANDS:
        _before_lightning()
    try:
        _run(args, argv)
    except SIGTERMException:
        _stopped_by_signal()
    except ArgumentError as err:  # jsonargparse: an unknown or ill-typed option
        sub = args[0] if args and args[0] in LIGHTNING_COMMANDS else ""
        text = describe_config_error(str(err), args, str(DEFAULT_CONFIG) if DEFAULT_CONFIG.is_file() else None)
        _fail(f"{text} (see: python -m cropscale {sub} --help)".replace("  ", " "))
    except MisconfigurationException as err:  # Lightning's checks during a run (e.g. no validation data)
        _fail(name_trainer_argument(" ".join(str(err).split())))
    except CropScaleError as err:
        _fail(user_error_text(err), err.exit_status)
    except Exception as err:
        message = _missing_file(err)
        if os.environ.get("CROPSCALE_TRACEBACK"):
            raise
        if message is None and _in_distributed_run():
            _fail(_rank_error_line(err), status=1)
        if message is None:
            raise
        _fail(f"{message} (set CROPSCALE_TRACEBACK=1 for the traceback)")


def _run(args: list[str], argv: list[str] | None) -> None:
    """Run subcommand ``args[0]``: an analysis command's ``main``, or a Lightning subcommand and its ending."""
    if args[0] in EXTRA_COMMANDS:
        module = importlib.import_module(EXTRA_COMMANDS[args[0]][0])
        status = module.main(args[1:])
        sys.exit(int(status or 0))
    if not args[0].startswith("-") and args[0] not in LIGHTNING_COMMANDS:
        _fail(f"unknown subcommand {args[0]!r}: choose from {', '.join((*LIGHTNING_COMMANDS, *EXTRA_COMMANDS))}"
              " (see: python -m cropscale --help)")
    cli = _lightning_cli(None if argv is None else args)
    failed = finish_distributed(getattr(cli, "trainer", None))
    if failed:
        ranks = ", ".join(f"local rank {r} exited with status {s}" for r, s in failed)
        print(f"cropscale: error: rank 0 finished but {ranks} (see that rank's output above)", file=sys.stderr)
        sys.exit(1)
    if getattr(cli, "fit_error", None):
        print(f"cropscale: error: {cli.fit_error}", file=sys.stderr)
        sys.exit(1)


def _rank_error_line(err: Exception) -> str:
    """One line for an unexpected error in a rank of a DDP run.

    A collective that failed because a peer left is not this rank's error; a bug of this rank keeps its
    traceback above the line.
    """
    first = " ".join(str(err).split())[:300]
    if _PEER_ERROR.search(f"{type(err).__name__} {first}"):
        return f"stopped: another rank left the run ({type(err).__name__}: {first})"
    traceback.print_exc()
    return f"{type(err).__name__}: {first}"


def _in_distributed_run() -> bool:
    """True in a rank of a multi-process run (a child rank, or the launching rank of child ranks)."""
    import torch.distributed as dist

    return (int(os.environ.get("LOCAL_RANK", "0") or 0) > 0 or bool(child_rank_processes(_ACTIVE.get("trainer")))
            or (dist.is_available() and dist.is_initialized()))


def _missing_file(err: Exception) -> str | None:
    """``file not found: <path>`` for a ``FileNotFoundError`` (a path the user gave); None for any other error."""
    if isinstance(err, FileNotFoundError):
        return f"file not found: {err.filename}" if err.filename else " ".join(str(err).split())
    return None


def name_trainer_argument(text: str) -> str:
    """Prefix Lightning's message with the ``--trainer.<name>`` it is about, when it names one in backquotes.

    Lightning names the argument as in ``Trainer(devices='0')`` or ``devices`` ... should be an int > 0.
    """
    for name in ("devices", "num_nodes", "accelerator", "strategy", "precision"):
        if re.search(rf"`(Trainer\()?{name}\b", text):
            return f"--trainer.{name}: {text}"
    return text
