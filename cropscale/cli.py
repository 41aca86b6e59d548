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
printed as one paragraph naming the argument or path, and the process exits with status 2.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from cropscale import CropScaleError
from cropscale.distributed import finish_distributed

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"

EXTRA_COMMANDS: dict[str, tuple[str, str]] = {
    "summary": ("cropscale.model.summary", "parameters and FLOPs per sample of the configured model"),
    "benchmark": ("cropscale.bench.benchmark", "compute-only training-step microbenchmark (FP32 vs AMP)"),
    "report": ("cropscale.bench.report", "quality-and-speed report (Markdown, CSV, PNG) of runs"),
    "study": ("cropscale.bench.study", "scaling study runner (1-8 devices, both batch protocols)"),
    "scaling": ("cropscale.scaling.cli", "analytical Amdahl and ring all-reduce tables"),
    "loader-bench": ("cropscale.data.bench", "data-pipeline throughput (samples/s) by worker count"),
    "tiling-bench": ("cropscale.bench.tiling", "tiled validation time vs tiles x one-tile forward"),
    "callback-bench": ("cropscale.bench.callback_overhead", "per-step overhead of the scaling callbacks"),
}


class CropScaleCLI(LightningCLI):
    """LightningCLI with the data module's class count and names linked into the task."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")
        parser.link_arguments("data.ignore_index", "model.ignore_index")


def _lightning_cli(args: list[str] | None) -> LightningCLI:
    from cropscale.data.datamodule import PastisHDDataModule
    from cropscale.model.task import CropMappingTask

    # exit_on_error=False: jsonargparse raises ArgumentError instead of printing the whole usage, and
    # main() prints one paragraph naming the argument.
    parser_kwargs: dict = {"exit_on_error": False, "prog": "python -m cropscale"}
    for sub in ("fit", "validate", "test", "predict"):
        parser_kwargs[sub] = {"exit_on_error": False}
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
        cli = _lightning_cli(None if argv is None else args)
        failed = finish_distributed(getattr(cli, "trainer", None))
        if failed:
            ranks = ", ".join(f"local rank {r} exited with status {s}" for r, s in failed)
            print(f"cropscale: error: rank 0 finished but {ranks} (see that rank's output above)", file=sys.stderr)
            sys.exit(1)
    except (CropScaleError, MisconfigurationException, ArgumentError) as err:
        if isinstance(err, ArgumentError):
            sub = args[0] if args and args[0] in ("fit", "validate", "test", "predict") else ""
            _fail(f"{err} (see: python -m cropscale {sub} --help)".replace("  ", " "))
        _fail(str(err))
    except Exception as err:
        message = _user_error(err)
        if message is None or os.environ.get("CROPSCALE_TRACEBACK"):
            raise
        _fail(f"{message} (set CROPSCALE_TRACEBACK=1 for the traceback)")


def _user_error(err: Exception) -> str | None:
    """One-paragraph text for errors that come from the user's arguments rather than from a bug:
    Lightning's checks of Trainer arguments (ValueError), a checkpoint that is missing, not a
    checkpoint, or of another model configuration. None for anything else (the traceback is kept)."""
    import pickle

    text = " ".join(str(err).split())
    if isinstance(err, FileNotFoundError):
        return f"file not found: {err.filename or text}" if "heckpoint" not in text else text
    if isinstance(err, pickle.UnpicklingError) or "Weights only load failed" in text:
        return f"--ckpt_path is not a readable Lightning checkpoint ({text[:200]})"
    if isinstance(err, RuntimeError) and "Error(s) in loading state_dict" in text:
        return ("--ckpt_path holds weights of another model configuration (e.g. another class count or"
                f" net_kwargs): {text[:300]}")
    if isinstance(err, ValueError) and type(err) is ValueError:
        tb = err.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        origin = tb.tb_frame.f_code.co_filename
        if "lightning" in origin or "torch/optim" in origin:
            return text
    return None
