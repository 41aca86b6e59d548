"""Scalar logging for the callbacks: which steps log, and writes through the trainer's loggers, now or deferred.

A deferred write waits for the end of its block (:func:`deferred_logging`), e.g. the end of one hook.

Loggers write on global rank 0 only (Lightning's ``rank_zero_only`` loggers); nothing here is a
collective. A Lightning ``TensorBoardLogger`` gets the scalars of one step as one event (one ``Summary`` of
``n`` values, as ``tf.summary.merge`` writes them) instead of ``n`` events of one value each
(``SummaryWriter.add_scalar``): the same tags, steps and ``float32`` values in the events file, one
serialisation and one hand-over to the writer thread per step instead of one per scalar.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from lightning.fabric.loggers.tensorboard import TensorBoardLogger
from lightning.pytorch import Trainer

_DEFERRED: list[dict[int, dict[str, float]]] = []  # open deferred_logging() blocks, innermost last


def is_log_step(trainer: Trainer) -> bool:
    """True at the steps where Lightning writes step metrics (``trainer.log_every_n_steps``).

    Evaluated in ``on_train_batch_end`` (after the optimizer step, so ``global_step`` already counts
    it). Also true on the last step before the trainer stops.
    """
    n = trainer.log_every_n_steps
    if n <= 0:
        return False
    return trainer.global_step % n == 0 or bool(trainer.should_stop)


def log_metrics(trainer: Trainer, metrics: Mapping[str, float | int | None], step: int | None = None) -> None:
    """Write scalars through every logger of ``trainer`` (loggers write on global rank 0 only).

    ``None`` and non-finite values are dropped. ``step`` defaults to ``trainer.global_step``.
    Inside :func:`deferred_logging` the scalars are collected and written when the block ends.
    """
    if not trainer.loggers:
        return
    clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
    if not clean:
        return
    step = trainer.global_step if step is None else step
    if _DEFERRED:
        _DEFERRED[-1].setdefault(step, {}).update(clean)
        return
    _write(trainer, clean, step)


def _write(trainer: Trainer, clean: dict[str, float], step: int) -> None:
    """Write ``clean`` (finite floats) at ``step`` through every logger of ``trainer``: one event for TensorBoard."""
    for logger in trainer.loggers:
        writer = _event_writer(logger)
        if writer is None:
            logger.log_metrics(clean, step=step)
        else:
            summary = _SUMMARY[0]
            writer.add_summary(summary(value=[summary.Value(tag=k, simple_value=v) for k, v in clean.items()]), step)


_SUMMARY: list[Any] = []  # tensorboard's Summary message class, imported with the first TensorBoard write


def _event_writer(logger: Any) -> Any:
    """The events-file writer behind ``logger`` when it is Lightning's ``TensorBoardLogger`` as shipped, else ``None``.

    ``None`` (the logger's own ``log_metrics``, one event per scalar) for any other logger, a subclass that
    writes its own way, a name ``prefix``, a ``SummaryWriter`` other than ``torch.utils.tensorboard``'s
    (``tensorboardX``) and on ranks other than 0 (where the logger's experiment is a dummy and its
    ``log_metrics`` does nothing).
    """
    if type(logger).log_metrics is not TensorBoardLogger.log_metrics or getattr(logger, "_prefix", ""):
        return None
    experiment = logger.experiment
    if type(experiment).__module__ != "torch.utils.tensorboard.writer":
        return None
    if not _SUMMARY:
        from tensorboard.compat.proto.summary_pb2 import Summary

        _SUMMARY.append(Summary)
    return experiment._get_file_writer()  # what add_scalar writes through (re-opened after a close)


def open_deferred() -> None:
    """Start collecting :func:`log_metrics` calls (the start of a :func:`deferred_logging` block)."""
    _DEFERRED.append({})


def close_deferred(trainer: Trainer) -> None:
    """Write what was collected since the matching :func:`open_deferred`: per step, one write per logger."""
    collected = _DEFERRED.pop()
    if collected:
        for step, clean in collected.items():
            _write(trainer, clean, step)


@contextmanager
def deferred_logging(trainer: Trainer) -> Iterator[None]:
    """Collect the :func:`log_metrics` calls made inside the block and write them at its end.

    One write per logger and step.

    Why: TensorBoard's writer is a background thread that wakes on every event. Torch ops release the
    GIL, and each one that runs while the writer is busy waits to get it back, so a callback that
    reads device values after another one has logged pays for it: about 1.1 ms per log step for the
    non-finite check's reads in callback-bench's tiny-model run, against 0.35 ms when they come
    first. :class:`~cropscale.callbacks.CallbackGroup` does the same around ``on_train_batch_end``
    (with :func:`open_deferred` / :func:`close_deferred` directly, two calls per step), so its members do
    their reads first and the writes come last. Scalars are still written if the block raises.
    """
    open_deferred()
    try:
        yield
    finally:
        close_deferred(trainer)
