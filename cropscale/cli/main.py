"""Command line: ``python -m cropscale <subcommand> ...`` (also installed as ``cropscale``).

Lightning subcommands (``fit``, ``validate``, ``test``, ``predict``) go through
:class:`CropScaleCLI`, a :class:`~lightning.pytorch.cli.LightningCLI` over
:class:`~cropscale.model.task.CropMappingTask` and
:class:`~cropscale.data.datamodule.PastisHDDataModule`. ``configs/default.yaml`` is always read
first, so ``python -m cropscale fit`` with no other argument trains on the bundled sample; further
``--config`` files and dotted overrides (``--trainer.devices=2``) apply on top, as in any
LightningCLI. Lightning's DDP launcher re-executes ``python -m cropscale ...`` on each rank, which
lands here again with the same arguments.

After ``fit``, global rank 0 prints the end-of-fit summary (:func:`cropscale.report.summary.fit_summary`
of the run folder, the same rules as the report). A fit that is no valid result (:mod:`cropscale.runs.validity`:
it did not train, diverged, or never validated although validation was configured) ends on every rank with one
line, ``cropscale: error: the run did not train: ...`` / ``training diverged: ...`` / ``the run never validated:
...``, and exit status 1; every rank reaches the same verdict.

``predict --output DIR`` adds a :class:`~cropscale.predictions.PredictionWriter`: one class map per patch
(GeoTIFF where the data is georeferenced, else ``.npz``) and ``predictions.json``; a non-empty or unwritable
``DIR`` is refused before the checkpoint is read.

The other subcommands are plain functions ``main(argv) -> int`` listed in :data:`EXTRA_COMMANDS`.

User errors are told apart by type, never by message text (:mod:`cropscale.cli.exits`):
:class:`cropscale.CropScaleError` and its family (:mod:`cropscale.errors`), raised where the problem is found,
end with one line and the class's ``exit_status`` (2); so do Lightning's ``MisconfigurationException``,
jsonargparse's ``ArgumentError`` and a ``FileNotFoundError``. Third-party errors about the user's input are
typed at the one place the project calls the library: the Trainer's argument checks in
:meth:`CropScaleCLI.instantiate_trainer`, ``torch.load`` in :func:`~cropscale.cli.folders.check_checkpoint`,
the weights in :meth:`~cropscale.model.task.CropMappingTask.load_state_dict`. Any other exception keeps its
traceback.

Parsing is exact: no option prefixes (``--trainer.max_epoch`` is an error, not ``max_epochs``), and the
Trainer's ``int | float`` limits keep an integer as an integer (``--trainer.limit_train_batches=1`` is one
batch, ``=1.0`` all of them), as in the Trainer's own API
(:func:`~cropscale.cli.config.integers_stay_integers`, with the other fix-ups of the parsed configuration).

Checkpoints (:mod:`cropscale.checkpointing`): every save goes through
:class:`~cropscale.checkpointing.AtomicCheckpointIO` unless the configuration names another
``CheckpointIO``. Run folders and ``--ckpt_path`` (:mod:`cropscale.cli.folders`): ``--ckpt_path last`` is
the newest ``last.ckpt`` of the runs of the logger's name, and ``fit`` from a checkpoint of
``<save_dir>/<name>/version_N`` continues in that same folder (its TensorBoard events from after the
checkpoint's step are dropped), so the best-checkpoint tracking continues; ``validate`` / ``test`` /
``predict`` log under the checkpoint's ``version_N/<sub>_K``. Model settings given on the command line or in
a ``--config`` file win over the checkpoint's hyperparameters (Lightning re-applies the latter): evaluation
settings apply, an architecture that differs from the checkpoint's is refused by the task, and optimiser
settings that the checkpoint's optimiser state would override are refused when resuming ``fit``.

``--ckpt_path auto`` resumes this run's most advanced state, or starts fresh when it has none
(:func:`~cropscale.checkpointing.find_resume_state`); a complete run ends at once with status 0.

Ending (:mod:`cropscale.distributed`): SIGTERM, SIGUSR1 or Ctrl-C during ``fit`` stops every rank at the same
step, saves ``last.ckpt`` and exits with status 0 after one line with the resume command (SIGUSR1 under SLURM
requeues the job first; :class:`~cropscale.checkpointing.StopOnSignal`). When a DDP rank
fails, the launching rank stops the others and prints one last line naming the failed rank, its exit
status and its own error; the other ranks' collective errors are reduced to one line each
(:mod:`cropscale.cli.exits`). When a DDP rank hangs, :class:`~cropscale.hangs.HangWatch` (added to every run;
a configured one replaces it) names it on rank 0 within its bound, with every rank's last step, and ends the
run with status 1 and the resume command; on NCCL the Flight Recorder is on (:mod:`cropscale.hangs.recorder`).
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from typing_extensions import override

from cropscale.callbacks import DivergenceCallback, ProvenanceCallback, QualityCallback, TrainedCallback
from cropscale.callbacks.base import fit_validity, iter_callbacks
from cropscale.checkpointing import RESUME_AUTO, AtomicCheckpointIO, StopOnSignal, check_fit_start
from cropscale.cli.config import explicit_model_settings, integers_stay_integers, merge_callbacks
from cropscale.cli.exits import (
    ACTIVE,
    end_progress_bars,
    error_ending,
    fail,
    is_refusal,
    name_trainer_argument,
    stopped_by_signal,
)
from cropscale.cli.folders import (
    FolderGuard,
    check_checkpoint,
    continue_in_run_folder,
    eval_run_folder,
    rank_zero_env,
    resolve_last,
)
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.distributed import (
    ChildRankWatch,
    child_rank_processes,
    elastic_restart_hazard,
    finish_distributed,
    prepare_rank_reports,
)
from cropscale.env.host import choose_torch_threads, set_torch_threads, usable_cores
from cropscale.errors import ConfigError, CropScaleError, TrainerArgumentError, format_warning
from cropscale.files import DEFAULT_CONFIG, check_writable_folder
from cropscale.hangs import HangWatch, prepare_flight_recorder
from cropscale.model.settings import RESUME_FIXED_SETTINGS
from cropscale.model.task import CropMappingTask
from cropscale.precision import cpu_precision_line
from cropscale.predictions import PredictionWriter, check_output_folder, written_line
from cropscale.report.summary import fit_summary
from cropscale.runs.record import is_run_folder, load_run
from cropscale.runs.schema import ValidityRecord
from cropscale.runs.validity import DIVERGED, NOT_TRAINED, NOT_VALIDATED

EXTRA_COMMANDS: dict[str, tuple[str, str]] = {
    "summary": ("cropscale.bench.summary", "parameters and FLOPs per sample of the configured model"),
    "benchmark": ("cropscale.bench.step.command", "compute-only training-step microbenchmark (FP32 vs AMP)"),
    "report": ("cropscale.report.command", "quality-and-speed report (Markdown, CSV, PNG) of runs"),
    "study": ("cropscale.study.runner", "scaling study runner (1-8 devices, both batch protocols)"),
    "scaling": ("cropscale.study.analytical", "analytical Amdahl and ring all-reduce tables"),
    "loader-bench": ("cropscale.bench.loader", "data-pipeline throughput (samples/s) by worker count"),
    "tiling-bench": ("cropscale.bench.tiling", "tiled validation time vs tiles x one-tile forward"),
    "callback-bench": ("cropscale.bench.callbacks", "per-step overhead of the scaling callbacks"),
    "lever-bench": ("cropscale.bench.levers", "speed levers (compile, fused AdamW, channels_last, pinned) vs eager"),
    "pipeline-bench": ("cropscale.bench.pipeline", "end-to-end / compute-only training samples/s (input pipeline)"),
    "tensorboard": ("cropscale.cli.tensorboard", "serve the runs with TensorBoard; ends with the address to open"),
}


LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
#: What each Lightning subcommand does, for the overview of ``python -m cropscale`` (and ``--help``).
LIGHTNING_HELP = {
    "fit": "train the model on data.train_folds, validating each epoch (e.g. --trainer.devices=2)",
    "validate": "one validation pass (tiled, val/mIoU) of a --ckpt_path on data.val_folds",
    "test": "one test pass of a --ckpt_path on data.test_folds",
    "predict": "predictions of a --ckpt_path on data.test_folds",
}

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


#: How the last line of ``fit`` begins for each invalid status (:mod:`cropscale.runs.validity`).
INVALID_ERRORS = {NOT_TRAINED: "the run did not train", DIVERGED: "training diverged",
                  NOT_VALIDATED: "the run never validated"}


def fit_verdict(trainer: Trainer) -> ValidityRecord:
    """The validity of the fit ``trainer`` ran; every rank gets the same verdict (its inputs are reduced over ranks).

    The :class:`~cropscale.callbacks.ProvenanceCallback`'s verdict (the one ``run.json`` holds), else the same rule
    over the trainer's callbacks (:func:`~cropscale.callbacks.base.fit_validity`).
    """
    recorded = next((cb.validity for cb in iter_callbacks(trainer) if isinstance(cb, ProvenanceCallback)), None)
    return recorded if recorded is not None else fit_validity(trainer)


def validity_error(verdict: ValidityRecord | None, folder: str | None) -> str | None:
    """The one-line error of a fit that is no valid result (``cropscale: error:`` follows), else None."""
    if verdict is None or verdict.valid:
        return None
    start = INVALID_ERRORS.get(verdict.status or "", f"the run is not valid ({verdict.status})")
    return f"{start}: {verdict.reason} (run folder {folder})"


def end_of_fit(trainer: Trainer, folder: str | None) -> str:
    """The end-of-fit summary of the run folder ``folder`` (global rank 0).

    Its first line is the run's validity when the run is no valid result
    (:func:`~cropscale.report.summary.fit_summary`).
    """
    if folder and is_run_folder(Path(folder)):
        return fit_summary(load_run(folder), report_command(trainer))
    verdict = fit_verdict(trainer)
    first = f"{verdict.status}: {verdict.reason}\n" if not verdict.valid else ""
    return (f"{first}cropscale fit summary: no run folder to read ({folder} holds no run.json and no TensorBoard"
            " events)")


def add_validity_callbacks(trainer: Trainer) -> list[str]:
    """Give a fit the callbacks whose records the validity rule reads, where its configuration has none.

    :class:`~cropscale.callbacks.TrainedCallback` (weights changed and finite),
    :class:`~cropscale.callbacks.QualityCallback` (the validations) and
    :class:`~cropscale.callbacks.DivergenceCallback` (``action="log"``: it judges, never stops),
    inserted before the checkpoint callbacks (so that their state is saved with each checkpoint).

    Returns:
        The class names added.
    """
    present = {type(cb) for cb in iter_callbacks(trainer)}
    missing = [cls() if cls is not DivergenceCallback else DivergenceCallback(action="log")
               for cls in (TrainedCallback, QualityCallback, DivergenceCallback)
               if not any(issubclass(p, cls) for p in present)]
    at = next((i for i, cb in enumerate(trainer.callbacks) if isinstance(cb, Checkpoint)), len(trainer.callbacks))
    trainer.callbacks[at:at] = missing
    return [type(cb).__name__ for cb in missing]


class CropScaleCLI(LightningCLI):
    """LightningCLI that links the data's settings into the task and checks ``--ckpt_path``.

    Linked: the class count and names, ``ignore_index``, ``t2``, ``t1`` and ``crop_size``.

    The checkpoint path is checked before Lightning opens it (:func:`~cropscale.cli.folders.check_checkpoint`);
    ``last`` is resolved to the newest ``last.ckpt`` of the runs of the logger's name
    (:func:`~cropscale.cli.folders.resolve_last`); model settings given by the user win over
    the checkpoint's (module docstring); output folders are checked for writing before the run starts.
    The Trainer's ``int | float`` options parse integers as integers
    (:func:`~cropscale.cli.config.integers_stay_integers`).
    After ``fit``, global rank 0 prints the end-of-fit summary; every rank keeps the error of a fit that is no
    valid result in :attr:`fit_error`.
    """

    _explicit_model: dict[str, Any] = {}
    _ckpt: dict | None = None
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
        for name in ("ignore_index", "t2", "t1", "crop_size"):  # the model's settings that depend on the data
            parser.link_arguments(f"data.{name}", f"model.{name}")

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
            cfg.ckpt_path = resolve_last(cfg)
        if sub == "fit":
            self._check_fit_start(cfg)
        if sub == "predict" and cfg.get("output"):
            check_output_folder(cfg.output)  # before the checkpoint and the data are read
            if cfg.get("return_predictions") is None:  # the writer has them: Lightning need not keep every patch
                cfg.return_predictions = False
        ckpt = self._ckpt = check_checkpoint(cfg.get("ckpt_path"))
        if sub == "fit" and ckpt is not None:
            continue_in_run_folder(cfg, ckpt)
        if sub != "fit":
            eval_run_folder(cfg, sub)

    def _check_fit_start(self, cfg: Any) -> None:
        """:func:`~cropscale.checkpointing.check_fit_start`; a complete run ends here with its line and status 0."""
        done = check_fit_start(cfg.get("ckpt_path"), cfg.trainer.get("max_epochs"), cfg.trainer.get("max_steps"),
                               cfg.trainer.get("default_root_dir") or os.getcwd())
        if done:
            print(done, file=sys.stderr, flush=True)
            sys.exit(0)

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
        ACTIVE["trainer"] = trainer
        prepare_flight_recorder(trainer)  # NCCL: before the process group exists (cropscale.hangs.recorder)
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
        set_torch_threads(choice.threads)
        rank_zero_info(choice.line())

    @override
    def _run_subcommand(self, subcommand: str) -> None:
        """Run the subcommand; a refused one writes nothing (:class:`~cropscale.cli.folders.FolderGuard`).

        The checkpoint's architecture is checked before anything is written (:meth:`_check_checkpoint_fits`); a user
        error raised before the run started (the data checks at set-up, the checkpoint's restore) undoes what
        Lightning wrote into the run folder by then (its events file, ``config.yaml``, a ``run.json``).
        """
        logger = self.trainer.logger
        guard = FolderGuard()
        guard.take(getattr(logger, "log_dir", None) if logger is not None and rank_zero_env() else None)
        self.trainer.callbacks.append(guard)
        try:
            self._check_checkpoint_fits()
            super()._run_subcommand(subcommand)
        except Exception as err:
            if is_refusal(err):
                for line in guard.undo():
                    rank_zero_info(f"cropscale: refused, so {line}")
            raise

    def _check_checkpoint_fits(self) -> None:
        """Refuse a ``--ckpt_path`` whose network differs from the configured one, before anything is written.

        Raises:
            CheckpointError: :meth:`~cropscale.model.task.CropMappingTask.check_architecture`.
        """
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        check = getattr(self.model, "check_architecture", None)
        if self._ckpt is not None and callable(check):
            check(self._ckpt.get("hyper_parameters"), cfg.get("ckpt_path"))

    def _check_outputs(self) -> None:
        """Refuse, before the run starts, a run folder or checkpoint folder that cannot be written."""
        logger = self.trainer.logger
        folders = [getattr(logger, "log_dir", None) if logger is not None else None]
        folders += [cb.dirpath for cb in self.trainer.callbacks if isinstance(cb, ModelCheckpoint)]
        for folder in folders:
            if folder:
                check_writable_folder(folder, what="run folder")

    def before_fit(self) -> None:
        """Check the output folders before training; add the callbacks whose records the validity rule reads.

        :meth:`_check_outputs`; :func:`add_validity_callbacks` where the configuration has none of them.
        """
        self._check_outputs()
        added = add_validity_callbacks(self.trainer)
        if added:
            rank_zero_info(f"cropscale: added {', '.join(added)}: the run's validity reads their records")

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

    def after_predict(self) -> None:
        """End with one line on rank 0: what was written and where (:func:`~cropscale.predictions.written_line`).

        Without ``--output``: that nothing was written.
        """
        if not self.trainer.is_global_zero:
            return
        writer = next((cb for cb in self.trainer.callbacks if isinstance(cb, PredictionWriter)), None)
        if writer is None:
            print("cropscale predict: wrote nothing (no --output folder given)", flush=True)
        else:
            print(written_line(writer.index, writer.output_dir.resolve()), flush=True)

    def after_fit(self) -> None:
        """Print the end-of-fit summary on global rank 0 (:func:`end_of_fit`); keep the verdict's error on every rank.

        A fit that is no valid result (:func:`fit_verdict`) leaves its one-line error in ``fit_error`` (exit status 1).
        """
        folder = self.trainer.log_dir or self.trainer.default_root_dir  # a collective under DDP: every rank
        self.fit_error = validity_error(fit_verdict(self.trainer), folder)
        if self.trainer.is_global_zero:
            print("\n" + end_of_fit(self.trainer, folder), flush=True)


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
        trainer_defaults={"callbacks": [StopOnSignal(), ChildRankWatch(), HangWatch()]},
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


def _before_lightning() -> None:
    """Before a Lightning subcommand: the rank-report folder (the other ranks inherit it), the torchrun warning."""
    prepare_rank_reports()
    hazard = elastic_restart_hazard()
    if hazard and os.environ.get("RANK", "0") == "0":
        print(hazard, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m cropscale`` and the ``cropscale`` console script.

    Ends as :mod:`cropscale.cli.exits` says: a stop signal with status 0, a user error with one line and its
    status (:func:`~cropscale.cli.exits.error_ending`); any other exception keeps its traceback.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    warnings.formatwarning = format_warning  # a data warning is one line: cropscale: warning: ...
    if not args or args[0] in ("-h", "--help"):
        print_overview()
        return
    if args[0] in LIGHTNING_COMMANDS:
        _before_lightning()
    try:
        _run(args, argv)
    except SIGTERMException:
        stopped_by_signal()
    except Exception as err:
        end_progress_bars(ACTIVE.get("trainer"))  # the error's first line starts a line of its own
        sub = args[0] if args[0] in LIGHTNING_COMMANDS else ""
        ending = error_ending(err, args, sub, str(DEFAULT_CONFIG) if DEFAULT_CONFIG.is_file() else None)
        if ending is None:
            raise
        fail(*ending)


def _run(args: list[str], argv: list[str] | None) -> None:
    """Run subcommand ``args[0]``: an analysis command's ``main``, or a Lightning subcommand and its ending."""
    if args[0] in EXTRA_COMMANDS:
        module = importlib.import_module(EXTRA_COMMANDS[args[0]][0])
        status = module.main(args[1:])
        sys.exit(int(status or 0))
    if not args[0].startswith("-") and args[0] not in LIGHTNING_COMMANDS:
        fail(f"unknown subcommand {args[0]!r}: choose from {', '.join((*LIGHTNING_COMMANDS, *EXTRA_COMMANDS))}"
             " (see: python -m cropscale --help)")
    cli = _lightning_cli(None if argv is None else args)
    trainer = getattr(cli, "trainer", None)
    children = len(child_rank_processes(trainer))
    failed = finish_distributed(trainer)
    error = getattr(cli, "fit_error", None)
    if failed and not error:
        ranks = ", ".join(f"local rank {r} exited with status {s}" for r, s in failed)
        print(f"cropscale: error: rank 0 finished but {ranks} (see that rank's output above)", file=sys.stderr)
        sys.exit(1)
    if error:  # every rank reached the same verdict and ends with it: each child rank with status 1
        rank = getattr(trainer, "global_rank", 0)
        others = [f"local rank {r} with status {s}" for r, s in failed if s != 1]
        others += [f"{children - len(failed)} child rank(s) with status 0"] if len(failed) < children else []
        disagree = f" (but {', '.join(others)})" if others else ""
        print(f"cropscale: error: {f'rank {rank}: ' if rank else ''}{error}{disagree}", file=sys.stderr, flush=True)
        sys.exit(1)
