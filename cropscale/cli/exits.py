"""How ``python -m cropscale`` ends: exception types mapped to one last line and an exit status, ranks stopped.

User errors are told apart by type, never by message text (:func:`error_ending`):
:class:`cropscale.CropScaleError` and its family (:mod:`cropscale.errors`), raised where the problem is found,
end with the class's ``exit_status`` (2); so do Lightning's ``MisconfigurationException``, jsonargparse's
``ArgumentError`` (:func:`~cropscale.cli.config_errors.describe_config_error`) and a ``FileNotFoundError``. Each
prints one paragraph naming the argument or path; an error re-raised from a DataLoader worker prints the
worker's own message (:func:`cropscale.errors.user_error_text`). Any other exception keeps its traceback
(``CROPSCALE_TRACEBACK=1``: every one but the typed ones).

Under DDP (:mod:`cropscale.distributed`): when a rank fails, the launching rank stops the others and prints
one last line naming the failed rank, its exit status and its own error (:func:`fail`); the other ranks'
collective errors are reduced to one line each (:func:`rank_error_line`). A stop signal ends with status 0
after one line with the resume command (:func:`stopped_by_signal`). While :class:`~cropscale.hangs.HangWatch`
ends a run after naming a hanging rank, the main thread's own ending waits: the watch prints the last line.
"""

from __future__ import annotations

import os
import re
import sys
import traceback

from jsonargparse import ArgumentError
from lightning.pytorch import Trainer
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from cropscale.checkpointing import stop_line
from cropscale.cli.config_errors import describe_config_error
from cropscale.distributed import (
    ChildRankWatch,
    child_failures,
    child_rank_processes,
    cleanup_rank_reports,
    finish_distributed,
    peer_line,
    report_rank_error,
    stop_child_ranks,
)
from cropscale.errors import CropScaleError, user_error_text
from cropscale.hangs import wait_while_ending

#: The Trainer of the running Lightning subcommand, for the error and stop endings (set by the CLI).
ACTIVE: dict[str, Trainer] = {}


def error_ending(err: Exception, args: list[str], subcommand: str, config_file: str | None) -> tuple[str, int] | None:
    """The last line and exit status for ``err`` raised by a subcommand, or None: not a user error (keep its traceback).

    Args:
        err: the exception.
        args: the command-line arguments (for a configuration error's message).
        subcommand: the Lightning subcommand run (``""`` for none), named in the ``--help`` hint.
        config_file: the defaults file read first (``configs/default.yaml``), or None.

    Returns:
        ``(message, status)``: 2 for a user error (or the ``CropScaleError``'s ``exit_status``), 1 for an unexpected
        error in a rank of a multi-process run (its traceback printed first, unless another rank left).
    """
    wait_while_ending()  # the hang watch is ending the run: this error is the other ranks' end
    if isinstance(err, ArgumentError):  # jsonargparse: an unknown or ill-typed option
        text = describe_config_error(str(err), args, config_file)
        return f"{text} (see: python -m cropscale {subcommand} --help)".replace("  ", " "), 2
    if isinstance(err, MisconfigurationException):  # Lightning's checks during a run (e.g. no validation data)
        return name_trainer_argument(" ".join(str(err).split())), 2
    if isinstance(err, CropScaleError):
        return user_error_text(err), err.exit_status
    message = missing_file(err)
    if os.environ.get("CROPSCALE_TRACEBACK"):
        return None
    if message is None and in_distributed_run():
        return rank_error_line(err), 1
    if message is None:
        return None
    return f"{message} (set CROPSCALE_TRACEBACK=1 for the traceback)", 2


def end_progress_bars(trainer: Trainer | None) -> None:
    """Close the progress bars ``trainer`` still draws, so that what is printed next starts a line of its own.

    Lightning's ``TQDMProgressBar`` leaves its bars open when a run ends with an exception: the bar's line on
    stdout has no newline yet, and an error printed on stderr lands at its end on a terminal. Closing a bar
    prints what tqdm prints at a bar's end (the bar and a newline; a bar that does not stay clears its line),
    inner bars first. Lightning's ``RichProgressBar`` stops itself in ``on_exception`` (its last line ends with a
    newline on a terminal) and is left alone. Nothing happens without a trainer or with the bar off.
    """
    bar = getattr(trainer, "progress_bar_callback", None)
    for name in ("_val_progress_bar", "_test_progress_bar", "_predict_progress_bar", "_train_progress_bar"):
        drawn = getattr(bar, name, None)  # TQDMProgressBar's bars (its properties raise while unset)
        if drawn is not None and not getattr(drawn, "disable", True):  # tqdm sets disable when closed
            drawn.close()
def is_refusal(err: BaseException) -> bool:
    """True for a user error, which refuses the command (:func:`error_ending` ends it with one line, status 2)."""
    return isinstance(err, ArgumentError | MisconfigurationException | CropScaleError | FileNotFoundError)


def fail(message: str, status: int = 2) -> None:
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

    wait_while_ending()  # the hang watch prints the last line and exits
    text = " ".join(str(message).split())
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    trainer = ACTIVE.get("trainer")
    if local_rank > 0:
        report_rank_error(local_rank, text)
        text = peer_line(f"rank {getattr(trainer, 'global_rank', local_rank)}: {text}", trainer)
    elif child_rank_processes(trainer):
        for cb in getattr(trainer, "callbacks", []):
            if isinstance(cb, ChildRankWatch):
                cb.stop()
        failed = child_failures(trainer, wait_s=PEER_WAIT_S if PEER_ERROR.search(text) else 0.0)
        stop_child_ranks(trainer)
        if failed:
            text, status = " ".join(failed[0].describe().split()), 1
        cleanup_rank_reports()
    else:  # ranks started by torchrun or srun: the store tells rank 0 which rank left
        text = peer_line(text, trainer, wait_s=PEER_WAIT_S)
    print(f"cropscale: error: {text}", file=sys.stderr, flush=True)
    if dist.is_available() and dist.is_initialized():
        sys.stdout.flush()
        os._exit(status)
    sys.exit(status)


#: Text of a collective that failed because another rank left (gloo, NCCL, the TCP store).
PEER_ERROR = re.compile(r"Connection (closed|reset) by peer|Broken pipe|[Gg]loo|NCCL|TCPStore|DistBackendError"
                        r"|ProcessGroup|Socket Timeout|recvValue|Connection refused")
#: How long the launching rank waits for a dead child to be reaped after a collective error (s).
PEER_WAIT_S = 10.0


def stopped_by_signal() -> None:
    """End after :class:`~cropscale.checkpointing.StopOnSignal` stopped training: status 0, one line on rank 0."""
    trainer = ACTIVE.get("trainer")
    finish_distributed(trainer)
    if trainer is not None and trainer.global_rank == 0:
        print(stop_line(trainer, sys.argv[1:]), file=sys.stderr, flush=True)
    sys.exit(0)


def rank_error_line(err: Exception) -> str:
    """One line for an unexpected error in a rank of a DDP run.

    A collective that failed because a peer left is not this rank's error; a bug of this rank keeps its
    traceback above the line.
    """
    first = " ".join(str(err).split())[:300]
    if PEER_ERROR.search(f"{type(err).__name__} {first}"):
        return f"stopped: another rank left the run ({type(err).__name__}: {first})"
    traceback.print_exc()
    return f"{type(err).__name__}: {first}"


def in_distributed_run() -> bool:
    """True in a rank of a multi-process run (a child rank, or the launching rank of child ranks)."""
    import torch.distributed as dist

    return (int(os.environ.get("LOCAL_RANK", "0") or 0) > 0 or bool(child_rank_processes(ACTIVE.get("trainer")))
            or (dist.is_available() and dist.is_initialized()))


def missing_file(err: Exception) -> str | None:
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
