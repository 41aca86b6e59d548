"""Memory: peak allocated and reserved GPU memory per epoch (reset at each epoch start), host RSS.

GPU figures come from the PyTorch caching allocator (``torch.cuda.max_memory_allocated`` /
``max_memory_reserved``, GiB = 2^30 bytes); they are host-side counters, read without a device sync.
The epoch peak covers the training epoch and the validation run inside it. Host RSS is the resident
set size of the process (``/proc/self/statm``; peak: ``getrusage(RUSAGE_SELF).ru_maxrss``, the peak
since the process started, not reset per epoch). DataLoader worker processes are not included.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from cropscale.callbacks._dist import gather_vectors
from cropscale.callbacks._logging import log_metrics
from cropscale.callbacks.base import ScalingCallback, resumed_epoch
from cropscale.runs.schema import MemoryEpoch, MemorySummary

GIB = float(1 << 30)
"""Bytes per GiB."""
_FIGURES = ("peak_allocated_gib", "peak_reserved_gib", "host_rss_gib", "host_peak_rss_gib")
"""An epoch's figures of one rank, in the order they are gathered."""
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def host_rss_gib() -> float | None:
    """Current resident set size of this process (GiB), ``None`` where ``/proc`` is unavailable."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE / GIB
    except (OSError, ValueError, IndexError):
        return None


def host_peak_rss_gib() -> float:
    """Peak resident set size of this process since it started (GiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / GIB if sys.platform == "darwin" else peak * 1024 / GIB  # bytes on macOS, KiB on Linux


class MemoryCallback(ScalingCallback):
    """Peak GPU memory (allocated, reserved) per epoch and host RSS, per rank.

    Logged (TensorBoard): at log steps ``memory/host_rss_gib`` and, on CUDA, ``memory/allocated_gib``
    and ``memory/reserved_gib`` (current); at epoch end ``memory/peak_allocated_gib`` and
    ``memory/peak_reserved_gib`` (max over ranks), ``memory/host_peak_rss_gib`` (max over ranks).

    ``state_dict`` keeps the per-epoch summaries, and inside an epoch this rank's figures so far (rank 0's in the
    checkpoint); rank 0 resumed inside an epoch takes the larger of them and the figures after the restart. From a
    checkpoint at an epoch's last batch end Lightning goes on with the next epoch without the resumed one's
    ``on_train_epoch_end``: ``on_train_start`` closes its record there with the saved figures (rank 0's only).

    No arguments.

    Example::

        from lightning.pytorch import Trainer
        from cropscale.callbacks import MemoryCallback

        trainer = Trainer(callbacks=[MemoryCallback()])

        # command line: the preset's settings replace the member of configs/default.yaml's CallbackGroup
        #   python -m cropscale fit --config callbacks/memory.yaml
    """

    summary_key = "memory"

    def __init__(self) -> None:
        self.epochs: list[MemoryEpoch] = []
        self._device: torch.device | None = None
        self._reason: str | None = None
        self._stepped = False
        self._epoch: int | None = None  # the epoch under way (None between epochs)
        self._saved: list[float | None] = [None] * 4  # the epoch's figures before the restart (rank 0's)
        self._resumed_in_epoch: dict[str, Any] | None = None

    @override
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"epochs": [e.to_json() for e in self.epochs]}
        if self._epoch is not None:  # a checkpoint inside an epoch: its figures so far
            state["in_epoch"] = {"epoch": self._epoch, **dict(zip(_FIGURES, self._figures(), strict=True))}
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epochs = [MemoryEpoch.from_json(e) for e in state_dict.get("epochs", [])]
        self._resumed_in_epoch = state_dict.get("in_epoch")

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        dev = pl_module.device
        if dev.type == "cuda" and torch.cuda.is_available():
            self._device, self._reason = dev, None
        else:
            self._device = None
            self._reason = f"the model runs on {dev.type!r}: no CUDA allocator statistics"
        self._start_log_schedule(trainer)
        self._open_epoch(trainer)  # Lightning calls no on_train_epoch_start for an epoch resumed inside
        resumed, over = resumed_epoch(self._resumed_in_epoch, trainer)
        self._resumed_in_epoch = None
        if resumed is None:
            return
        if trainer.global_rank == 0:  # the saved figures are rank 0's
            self._saved = [resumed.get(name) for name in _FIGURES]
        if over:  # its record closes here (every rank joins the gather of _close_epoch), the next epoch starts
            self._close_epoch(trainer, pl_module, int(resumed["epoch"]), self._saved)
            self._open_epoch(trainer)

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._open_epoch(trainer)

    def _open_epoch(self, trainer: Trainer) -> None:
        self._epoch = trainer.current_epoch
        self._saved = [None] * 4
        if self._device is not None:
            torch.cuda.reset_peak_memory_stats(self._device)

    def _figures(self) -> list[float | None]:
        """This rank's figures of the epoch so far, in :data:`_FIGURES` order (GiB), with the saved part."""
        if self._device is not None:
            alloc = torch.cuda.max_memory_allocated(self._device) / GIB
            reserved = torch.cuda.max_memory_reserved(self._device) / GIB
        else:
            alloc = reserved = None
        peaks = [max((v for v in pair if v is not None), default=None)  # the larger of before and after the restart
                 for pair in zip((alloc, reserved, host_peak_rss_gib()), (self._saved[0], self._saved[1],
                                                                         self._saved[3]), strict=True)]
        return [peaks[0], peaks[1], host_rss_gib(), peaks[2]]

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._step_done() or not self._count_step():
            return
        metrics: dict[str, float | None] = {"memory/host_rss_gib": host_rss_gib()}
        if self._device is not None:
            metrics["memory/allocated_gib"] = torch.cuda.memory_allocated(self._device) / GIB
            metrics["memory/reserved_gib"] = torch.cuda.memory_reserved(self._device) / GIB
        log_metrics(trainer, metrics)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close_epoch(trainer, pl_module, trainer.current_epoch, self._figures())

    def _close_epoch(self, trainer: Trainer, pl_module: LightningModule, epoch: int,
                     mine: list[float | None]) -> None:
        """Append ``epoch``'s record from every rank's ``mine`` (:data:`_FIGURES`, GiB) and log it; a collective."""
        self._epoch = None
        rows = gather_vectors(trainer, pl_module, mine)
        cols = list(zip(*rows, strict=False))

        def vmax(col: tuple) -> float | None:
            vals = [v for v in col if v is not None]
            return max(vals) if vals else None

        record = MemoryEpoch(
            epoch=epoch,
            peak_allocated_gib=vmax(cols[0]),
            peak_reserved_gib=vmax(cols[1]),
            host_rss_gib=vmax(cols[2]),
            host_peak_rss_gib=vmax(cols[3]),
            per_rank={
                "peak_allocated_gib": list(cols[0]), "peak_reserved_gib": list(cols[1]),
                "host_rss_gib": list(cols[2]), "host_peak_rss_gib": list(cols[3]),
            },
        )
        self.epochs.append(record)
        log_metrics(trainer, {
            "memory/peak_allocated_gib": record.peak_allocated_gib,
            "memory/peak_reserved_gib": record.peak_reserved_gib,
            "memory/host_peak_rss_gib": record.host_peak_rss_gib,
        })

    @override
    def summary(self) -> MemorySummary:
        peaks = [e.peak_allocated_gib for e in self.epochs if e.peak_allocated_gib is not None]
        reserved = [e.peak_reserved_gib for e in self.epochs if e.peak_reserved_gib is not None]
        host = [e.host_peak_rss_gib for e in self.epochs if e.host_peak_rss_gib is not None]
        return MemorySummary(
            gpu_available=self._device is not None,
            gpu_reason=self._reason,
            peak_allocated_gib=max(peaks) if peaks else None,
            peak_reserved_gib=max(reserved) if reserved else None,
            host_peak_rss_gib=max(host) if host else None,
            epochs=list(self.epochs),
        )
