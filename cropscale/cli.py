"""Command line: ``python -m cropscale <subcommand> ...`` (also installed as ``cropscale``).

Lightning subcommands (``fit``, ``validate``, ``test``, ``predict``) go through
:class:`CropScaleCLI`, a :class:`~lightning.pytorch.cli.LightningCLI` over
:class:`~cropscale.model.task.CropMappingTask` and
:class:`~cropscale.data.datamodule.PastisHDDataModule`. ``configs/default.yaml`` is always read
first, so ``python -m cropscale fit`` with no other argument trains on the bundled sample; further
``--config`` files and dotted overrides (``--trainer.devices=2``) apply on top, as in any
LightningCLI. Lightning's DDP launcher re-executes ``python -m cropscale ...`` on each rank, which
lands here again with the same arguments.

The other subcommands are plain functions ``main(argv) -> int`` listed in :data:`EXTRA_COMMANDS`.

User errors (:class:`cropscale.CropScaleError`, Lightning's ``MisconfigurationException``) are
printed as one paragraph naming the argument or path, and the process exits with status 2; an error
re-raised from a DataLoader worker prints the worker's own message (:func:`user_error_text`).

Parsing is exact: no option prefixes (``--trainer.max_epoch`` is an error, not ``max_epochs``), and the
Trainer's ``int | float`` limits keep an integer as an integer (``--trainer.limit_train_batches=1`` is one
batch, ``=1.0`` all of them), as in the Trainer's own API (:func:`integers_stay_integers`).
"""

from __future__ import annotations

import functools
import importlib
import operator
import os
import re
import sys
import typing
from pathlib import Path

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from typing_extensions import override

from cropscale.data.datamodule import PastisHDDataModule
from cropscale.distributed import finish_distributed
from cropscale.errors import CropScaleError
from cropscale.model.task import CropMappingTask

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
}


LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")

#: ``ckpt_path`` values that Lightning resolves itself (not file paths).
_CKPT_KEYWORDS = ("best", "last", "hpc")


def check_checkpoint(path: str | None) -> None:
    """Refuse a ``--ckpt_path`` that is not a Lightning checkpoint, before Lightning opens it.

    Lightning's own failures for such files surface deep inside ``torch.load`` or its checkpoint
    migration (a truncated zip, a plain ``torch.save`` file, any non-torch file). Lightning's keywords
    (``best``, ``last``, ``hpc``, ``registry...``) and remote URLs are left to Lightning. The file is
    opened memory-mapped (``mmap=True``): its tensors are not read here.

    Raises:
        CropScaleError: naming the path: not found, not readable by ``torch.load(weights_only=True)``,
            or readable but without the keys of a Lightning checkpoint (``state_dict``,
            ``pytorch-lightning_version``).
    """
    import pickle
    import zipfile

    import torch

    if not path or path in _CKPT_KEYWORDS or path.startswith("registry") or "://" in path:
        return
    if not Path(path).is_file():
        raise CropScaleError(f"--ckpt_path: checkpoint file not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except (RuntimeError, pickle.UnpicklingError, EOFError, OSError, ValueError) as err:
        reason = " ".join(str(err).split())
        reason = reason.split(". ")[0] if "Weights only load failed" not in reason else "not a torch checkpoint file"
        raise CropScaleError(f"--ckpt_path {path} is not a readable Lightning checkpoint ({reason[:160]})") from err
    missing = [k for k in ("state_dict", "pytorch-lightning_version") if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CropScaleError(
            f"--ckpt_path {path} is a torch file but not a Lightning checkpoint (no {' / '.join(map(repr, missing))}:"
            " use a .ckpt written by ModelCheckpoint or trainer.save_checkpoint)"
        )


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


class CropScaleCLI(LightningCLI):
    """LightningCLI that links the data module's class count and names into the task and checks ``--ckpt_path``.

    The checkpoint path is checked before Lightning opens it (:func:`check_checkpoint`); the Trainer's
    ``int | float`` options parse integers as integers (:func:`integers_stay_integers`).
    """

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        integers_stay_integers(parser)
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")
        parser.link_arguments("data.ignore_index", "model.ignore_index")

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        super().parse_arguments(parser, args)
        sub = self.config.get("subcommand")
        if sub:
            check_checkpoint(self.config[sub].get("ckpt_path"))


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
        args=args,
    )


def _print_overview() -> None:
    print("usage: python -m cropscale <subcommand> [options]   (or: cropscale <subcommand> ...)\n")
    print("Lightning subcommands (LightningCLI; configs/default.yaml is read first):")
    print("  fit | validate | test | predict   e.g. python -m cropscale fit --trainer.devices=2")
    print("\nAnalysis subcommands (each has --help):")
    for name, (_, what) in EXTRA_COMMANDS.items():
        print(f"  {name:<15} {what}")
    print("\nLightningCLI's own help follows.\n")


def _fail(message: str) -> None:
    text = " ".join(str(message).split())
    print(f"cropscale: error: {text}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m cropscale`` and the ``cropscale`` console script."""
    from jsonargparse import ArgumentError
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in EXTRA_COMMANDS:
            module = importlib.import_module(EXTRA_COMMANDS[args[0]][0])
            status = module.main(args[1:])
            sys.exit(int(status or 0))
        if not args or args[0] in ("-h", "--help"):
            _print_overview()
        elif not args[0].startswith("-") and args[0] not in LIGHTNING_COMMANDS:
            _fail(f"unknown subcommand {args[0]!r}: choose from {', '.join((*LIGHTNING_COMMANDS, *EXTRA_COMMANDS))}"
                  " (see: python -m cropscale --help)")
        cli = _lightning_cli(None if argv is None else args)
        failed = finish_distributed(getattr(cli, "trainer", None))
        if failed:
            ranks = ", ".join(f"local rank {r} exited with status {s}" for r, s in failed)
            print(f"cropscale: error: rank 0 finished but {ranks} (see that rank's output above)", file=sys.stderr)
            sys.exit(1)
    except (CropScaleError, MisconfigurationException, ArgumentError) as err:
        if isinstance(err, ArgumentError):
            sub = args[0] if args and args[0] in LIGHTNING_COMMANDS else ""
            _fail(f"{err} (see: python -m cropscale {sub} --help)".replace("  ", " "))
        _fail(_name_trainer_argument(str(err)) if isinstance(err, MisconfigurationException) else user_error_text(err))
    except Exception as err:
        message = _user_error(err)
        if message is None or os.environ.get("CROPSCALE_TRACEBACK"):
            raise
        _fail(f"{message} (set CROPSCALE_TRACEBACK=1 for the traceback)")


_WORKER_WRAPPER = re.compile(r"^Caught \w+ in DataLoader worker process \d+\.\s+Original Traceback", re.S)


def user_error_text(err: BaseException) -> str:
    """The one-line text of a user error, unwrapped when a DataLoader worker raised it.

    PyTorch re-raises a worker's exception in the main process as the same type with the message
    ``Caught <Type> in DataLoader worker process <n>. Original Traceback ...`` followed by the worker's
    whole traceback; the worker's own message is what follows ``<module>.<Type>: `` on the traceback's
    last such line. Whitespace runs (newlines included) become one space.
    """
    text = str(err)
    if _WORKER_WRAPPER.match(text):
        name = re.escape(type(err).__name__)
        found = list(re.finditer(rf"^(?:[\w.]+\.)?{name}: ", text, re.M))
        if found:
            text = text[found[-1].end():]
    return " ".join(text.split())


def _user_error(err: Exception) -> str | None:
    """Return a one-paragraph text for an error that comes from the user's arguments rather than from a bug.

    User errors are Lightning's checks of Trainer arguments (ValueError; TypeError from its accelerator and
    connector checks, e.g. ``devices=-5``) and a checkpoint that is missing, not a checkpoint, or of another
    model configuration. Returns None for anything else (the traceback is kept).
    """
    import pickle

    text = " ".join(str(err).split())
    if isinstance(err, FileNotFoundError):
        return f"file not found: {err.filename or text}" if "heckpoint" not in text else text
    if isinstance(err, pickle.UnpicklingError) or "Weights only load failed" in text:
        return f"--ckpt_path is not a readable Lightning checkpoint ({text[:200]})"
    if isinstance(err, RuntimeError) and "Error(s) in loading state_dict" in text:
        return ("--ckpt_path holds weights of another model configuration (e.g. another class count or"
                f" net_kwargs): {text[:300]}")
    if type(err) in (ValueError, TypeError):
        tb = err.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        origin = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
        # TypeError only from Lightning's checks of Trainer arguments (a TypeError elsewhere is a bug)
        checks = ("lightning/fabric/accelerators/", "lightning/pytorch/accelerators/",
                  "lightning/fabric/utilities/device_parser", "/connectors/")
        if (type(err) is ValueError and ("lightning" in origin or "torch/optim" in origin)) or (
                "lightning" in origin and any(c in origin for c in checks)):
            return _name_trainer_argument(text)
    return None


def _name_trainer_argument(text: str) -> str:
    """Prefix Lightning's message with the ``--trainer.<name>`` it is about, when it names one in backquotes.

    Lightning names the argument as in ``Trainer(devices='0')`` or ``devices`` ... should be an int > 0.
    """
    import re

    for name in ("devices", "num_nodes", "accelerator", "strategy", "precision"):
        if re.search(rf"`(Trainer\()?{name}\b", text):
            return f"--trainer.{name}: {text}"
    return text
