"""Throughput: samples/s (global and per rank), step latency, epoch times, achieved TFLOP/s and MFU.

Step latency as median and p95; epoch times as train-only, validation-only and end-to-end wall time.

Definitions (host clock, ``time.perf_counter``):

- *step latency*: time between the ends (``on_train_batch_end``) of consecutive optimizer steps in
  the same epoch, leaving out warm-up steps and the first step after a validation run. On CUDA the
  host runs ahead of the device by at most the launch queue, so in steady state host and device step
  periods agree; the epoch edges are synchronised (``sync_cuda_at_epoch_end``).
- *epoch wall*: ``on_train_epoch_start`` -> ``on_train_epoch_end`` (Lightning 2.6 runs the epoch's
  validation before ``on_train_epoch_end``); *validation*: the sum of ``on_validation_start`` ->
  ``on_validation_end`` inside it (sanity check excluded).
- *train* (``train_s``, per rank): the time of the training loop's stretches. A stretch starts at the
  ``on_train_batch_start`` of the epoch's first micro-batch, or of the first one after a validation, and
  runs through every ``on_train_batch_end`` up to the last micro-batch before the next validation or the
  epoch end; within a stretch each micro-batch's data-loader wait, forward, backward (all-reduce waits
  included) and optimizer count. Left out: the DataLoader worker start-up and first fetch of the epoch
  (before its first ``on_train_batch_start``), validation with its loader set-up and metric gathers, what
  runs after ``on_validation_end`` (ModelCheckpoint's rank-0 write and its barrier, where the other ranks
  wait) and the fetch of the batch after it, and the epoch end. Under DDP every rank starts a stretch
  after a barrier (one per epoch and per validation, none per step), so a rank slow at its epoch end or
  after a validation (rank-0 logging, a checkpoint write) does not hold the others' first all-reduce
  inside their stretch. Before, ``train_s`` was wall -
  validation and held all of these: a 2-process run booked [6.35, 16.72] s for about 6.1 s of steps.
- *samples/s*, two of them, named apart: the **training-loop** samples/s (``samples_per_s``): a rank's samples /
  its train time; global = sum of samples over ranks / the slowest rank's train time; and the **epoch-clock**
  samples/s (``samples_per_s_epoch_clock``): global samples / the slowest rank's end-to-end epoch wall time, what the
  training loop leaves out included. On a short epoch they differ a lot (the loop's stretches leave out the loader
  start-up and first fetch, validation, barriers, checkpoint writes). ``samples_per_s_steady``: samples of the
  measured steps / their summed latency.
- *achieved TFLOP/s*: ``flops_per_sample`` (forward + backward FLOPs of one training sample, from the
  constructor or ``pl_module.flops_per_sample``) x samples / train time, per GPU; *MFU* = achieved
  per GPU / the **attainable** dense peak of the math that ran (``peak_tflops`` overrides it).
- *attainable peak* (:func:`cropscale.env.peaks.attainable_peak_tflops`): each operator class
  (convolution, matmul, attention) runs in the dtype its switches select, read at ``on_train_start``
  (:func:`cropscale.env.peaks.tf32_settings`: ``torch.backends.cudnn.allow_tf32`` for convolutions,
  ``torch.get_float32_matmul_precision()`` / ``torch.backends.cuda.matmul.allow_tf32`` for matmuls and
  attention under ``32-true``; the autocast dtype under ``*-mixed``), and the peak is
  ``sum f_c / sum (f_c / P_c)`` with ``f_c`` the FLOPs per class (``flops_by_class`` from the constructor
  or ``pl_module.flops_by_class``, counted by ``torch.utils.flop_counter``). Under ``32-true`` on an H200 a
  convolution-heavy model runs mostly in TF32 (494.5 TFLOP/s dense), so dividing by the FP32 peak (67)
  would overstate MFU up to about 7x. When every class runs in the same dtype the split is not needed.
  Without FLOPs or without a peak, MFU is not reported and the reason is recorded.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from cropscale.callbacks._batches import batch_size
from cropscale.callbacks._dist import gather_vectors
from cropscale.callbacks._logging import log_metrics
from cropscale.callbacks.base import ScalingCallback, resumed_epoch
from cropscale.env import peaks
from cropscale.env.peaks import OPERATOR_CLASSES
from cropscale.errors import CropScaleError
from cropscale.runs.schema import ThroughputEpoch, ThroughputSummary, WindowStats


class ThroughputCallback(ScalingCallback):
    """Samples/s, step latency, epoch times, achieved TFLOP/s and MFU.

    Args:
        flops_per_sample: forward + backward FLOPs of one training sample; ``None`` reads
            ``pl_module.flops_per_sample`` at each epoch end (absent or ``None``: no TFLOP/s, no MFU).
        flops_by_class: FLOPs of one training sample per operator class (``convolution``, ``matmul``,
            ``attention``; only the proportions matter) for the attainable peak; ``None`` reads
            ``pl_module.flops_by_class`` at each epoch end.
        peak_tflops: dense peak TFLOP/s of one device for the run, overriding the attainable peak.
        warmup_steps: optimizer steps at the start of ``fit`` left out of the latency statistics.
        sync_cuda_at_epoch_end: synchronise the device at epoch start and end (two syncs per epoch) so
            that epoch times include the queued GPU work.

    Logged (TensorBoard): at log steps ``perf/samples_per_s_rank`` (this rank, interval);
    at epoch end ``perf/epoch/samples_per_s`` (global), ``perf/epoch/samples_per_s_steady``,
    ``perf/epoch/step_latency_ms_median``, ``perf/epoch/step_latency_ms_p95``,
    ``perf/epoch/train_s``, ``perf/epoch/val_s``, ``perf/epoch/wall_s``, ``perf/epoch/samples_per_s_epoch_clock``,
    ``perf/epoch/tflops_per_s`` (per GPU), ``perf/epoch/mfu``.

    ``state_dict`` keeps the totals and per-epoch summaries, and inside an epoch the samples trained so far
    in it and their train, validation and wall time (s), so that an epoch resumed from a mid-epoch checkpoint
    counts each of its samples once and their time with them (run-level samples/s stays samples / train time).
    From a checkpoint at an epoch's last batch end Lightning goes on with the next epoch without that epoch's
    ``on_train_epoch_end`` or the next one's ``on_train_epoch_start``: ``on_train_start`` closes the resumed epoch's
    record with its figures up to the checkpoint and starts the next epoch's clocks.

    Example::

        from lightning.pytorch import Trainer
        from cropscale.callbacks import ThroughputCallback

        trainer = Trainer(callbacks=[ThroughputCallback(flops_per_sample=13.3e9, peak_tflops=989.0)])

        # command line: the preset's settings replace the member of configs/default.yaml's CallbackGroup
        #   python -m cropscale fit --config callbacks/throughput.yaml
    """

    summary_key = "throughput"

    def __init__(self, flops_per_sample: float | None = None, peak_tflops: float | None = None,
                 warmup_steps: int = 5, sync_cuda_at_epoch_end: bool = True,
                 flops_by_class: dict[str, float] | None = None) -> None:
        if flops_per_sample is not None and flops_per_sample <= 0:
            raise CropScaleError(f"ThroughputCallback(flops_per_sample={flops_per_sample}): must be > 0")
        if flops_by_class is not None and (
            set(flops_by_class) - set(OPERATOR_CLASSES) or any(not v >= 0 for v in flops_by_class.values())
        ):
            raise CropScaleError(f"ThroughputCallback(flops_by_class={flops_by_class}): give FLOPs >= 0 for "
                                 f"the classes {', '.join(OPERATOR_CLASSES)}")
        if peak_tflops is not None and peak_tflops <= 0:
            raise CropScaleError(f"ThroughputCallback(peak_tflops={peak_tflops}): must be > 0")
        if warmup_steps < 0:
            raise CropScaleError(f"ThroughputCallback(warmup_steps={warmup_steps}): must be >= 0")
        self.flops_per_sample = flops_per_sample
        self.flops_by_class = dict(flops_by_class) if flops_by_class is not None else None
        self.peak_tflops = peak_tflops
        self.warmup_steps = warmup_steps
        self.sync_cuda_at_epoch_end = sync_cuda_at_epoch_end
        self.total_samples = 0
        self.total_train_s = 0.0
        self.epochs: list[ThroughputEpoch] = []
        self._cuda: torch.device | None = None
        self._steps_this_fit = 0
        self._last_end: float | None = None
        self._step_samples = 0
        self._stepped = False
        self._lat: list[float] = []
        self._lat_samples = 0
        self._samples = 0
        self._epoch_now: int | None = None
        self._resumed_in_epoch: dict[str, Any] | None = None
        self._epoch_t0: float | None = None
        self._stretch_t: float | None = None  # last clock of the current training stretch (None: between them)
        self._train_s = 0.0
        self._val_t0: float | None = None
        self._val_s = 0.0
        self._log_t0: float | None = None
        self._log_samples = 0
        self._device_name: str | None = None  # None until on_train_start (a fit refused at setup ran nowhere)
        self._dtype: str | None = None
        self._tf32: dict[str, bool] = {}
        self._class_dtypes: dict[str, str] = {}
        self._split: dict[str, float] | None = None
        self._peak: float | None = None
        self._peak_source: str | None = None
        self._mfu_reason: str | None = None
        self._flops_source: str | None = None

    @override
    def state_dict(self) -> dict[str, Any]:
        state = {"total_samples": self.total_samples, "total_train_s": self.total_train_s,
                 "epochs": [e.to_json() for e in self.epochs]}
        if self._epoch_now is not None:  # a checkpoint inside an epoch: the samples and train time so far (rank 0's)
            state["in_epoch"] = {"epoch": self._epoch_now, "samples": self._samples, "train_s": self._train_s,
                                 "val_s": self._val_s,
                                 "wall_s": perf_counter() - self._epoch_t0 if self._epoch_t0 is not None else None}
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.total_samples = int(state_dict.get("total_samples", 0))
        self.total_train_s = float(state_dict.get("total_train_s", 0.0))
        self.epochs = [ThroughputEpoch.from_json(e) for e in state_dict.get("epochs", [])]
        self._resumed_in_epoch = resumed = state_dict.get("in_epoch")
        if resumed:  # Lightning does not call on_train_epoch_start again for an epoch resumed in its middle
            self._epoch_now = int(resumed["epoch"])
            self._resume_clocks(resumed)

    # ------------------------------------------------------------------ hooks
    def _sync(self) -> None:
        if self._cuda is not None and self.sync_cuda_at_epoch_end:
            torch.cuda.synchronize(self._cuda)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        dev = pl_module.device
        self._cuda = dev if (dev.type == "cuda" and torch.cuda.is_available()) else None
        self._device_name = device_name(dev)
        self._tf32 = peaks.tf32_settings()
        self._class_dtypes = peaks.class_dtypes(str(trainer.precision), self._tf32["matmul"], self._tf32["cudnn_conv"])
        self._dtype = self._class_dtypes["matmul"]
        self._steps_this_fit = 0
        self._start_log_schedule(trainer)
        resumed = self._resumed_in_epoch
        if resumed_epoch(resumed, trainer)[1]:
            # the resumed epoch is over (its last batch end): its record closes here with its figures up to the
            # checkpoint, and the next epoch starts now
            self._epoch_t0 = None if resumed.get("wall_s") is None else perf_counter()
            self._resume_clocks(resumed)
            self._close_epoch(trainer, pl_module, int(resumed["epoch"]))
            self._open_epoch(trainer)
        elif resumed and self._epoch_t0 is None:
            self._epoch_t0 = self._log_t0 = perf_counter()
            self._resume_clocks(resumed)

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._open_epoch(trainer)

    def _open_epoch(self, trainer: Trainer) -> None:
        """Start the clocks and counts of epoch ``trainer.current_epoch`` (with its saved part when resumed in it)."""
        self._sync()
        self._epoch_t0 = self._log_t0 = perf_counter()
        self._last_end = None
        self._lat, self._lat_samples = [], 0
        self._samples = self._step_samples = self._log_samples = 0
        self._val_s = 0.0
        self._stretch_t, self._train_s = None, 0.0
        self._epoch_now = trainer.current_epoch
        resumed, self._resumed_in_epoch = self._resumed_in_epoch, None
        if resumed and int(resumed.get("epoch", -1)) == trainer.current_epoch:
            self._resume_clocks(resumed)

    def _resume_clocks(self, resumed: dict[str, Any]) -> None:
        """Resumed inside an epoch: its samples and times before the checkpoint count once (rank 0's, on every rank).

        The epoch's clocks go on from the checkpoint's; the time between the stop and the restart is not counted.
        """
        self._samples = int(resumed.get("samples", 0))
        self._train_s = float(resumed.get("train_s") or 0.0)
        self._val_s = float(resumed.get("val_s") or 0.0)
        if self._epoch_t0 is not None and resumed.get("wall_s") is not None:
            self._epoch_t0 -= float(resumed["wall_s"])

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self._stretch_t is None:  # a training stretch starts (epoch start, after a validation)
            if trainer.world_size > 1:  # a rank still busy with its epoch end would hold the others' first step
                trainer.strategy.barrier("ThroughputCallback.training_stretch")
            self._stretch_t = perf_counter()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        n = batch_size(batch) or 0
        self._samples += n
        t = perf_counter()
        if self._stretch_t is not None:
            self._train_s += t - self._stretch_t
        self._stretch_t = t
        if not self._step_done():  # accumulating: the optimizer step spans more micro-batches
            self._step_samples += n
            return
        step_samples = self._step_samples + n
        self._step_samples = 0
        self._steps_this_fit += 1
        last = self._last_end
        if last is not None and self._steps_this_fit > self.warmup_steps:
            self._lat.append(t - last)
            self._lat_samples += step_samples
        self._last_end = t
        self._log_samples += step_samples
        if self._count_step() and self._log_t0 is not None and t > self._log_t0:
            log_metrics(trainer, {"perf/samples_per_s_rank": self._log_samples / (t - self._log_t0)})
            self._log_t0, self._log_samples = t, 0

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking and self._epoch_t0 is not None:
            self._sync()
            self._val_t0 = perf_counter()
            self._stretch_t = None  # the stretch ended at the last on_train_batch_end

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._val_t0 is not None:
            self._sync()
            t = perf_counter()
            self._val_s += t - self._val_t0
            self._val_t0 = None
            self._last_end = None  # the next step's latency would include validation
            self._log_t0 = t

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close_epoch(trainer, pl_module, trainer.current_epoch)

    def _close_epoch(self, trainer: Trainer, pl_module: LightningModule, epoch: int) -> None:
        """Gather every rank's figures of ``epoch`` (a collective), append its record and log it."""
        self._sync()
        self._epoch_now = None
        wall = perf_counter() - self._epoch_t0 if self._epoch_t0 is not None else None
        train_s = self._train_s if wall is not None else None
        self._stretch_t = None
        steady = sum(self._lat)
        rows = gather_vectors(trainer, pl_module, [
            float(self._samples), train_s, self._val_s, wall,
            float(self._lat_samples), steady if self._lat else None,
        ])
        samples_rank = [int(r[0] or 0) for r in rows]
        train_rank = [r[1] for r in rows]
        total_samples = sum(samples_rank)
        slowest_train = max((t for t in train_rank if t), default=None)
        sps = total_samples / slowest_train if slowest_train else None
        wall_s = max((r[3] for r in rows if r[3] is not None), default=None)
        steady_rows = [(r[4], r[5]) for r in rows if r[5]]
        sps_steady = (sum(n for n, _ in steady_rows) / max(s for _, s in steady_rows)) if steady_rows else None
        lat = WindowStats.of(self._lat, scale=1e3)
        flops, tflops, mfu, peak = self._flops_figures(pl_module, total_samples, slowest_train, trainer.world_size)
        record = ThroughputEpoch(
            epoch=epoch,
            samples=total_samples,
            samples_per_rank=samples_rank,
            samples_per_s=sps,
            samples_per_s_per_rank=[(n / t) if t else None for n, t in zip(samples_rank, train_rank, strict=False)],
            samples_per_s_steady=sps_steady,
            step_latency_ms=lat,
            train_s=slowest_train,
            train_s_per_rank=train_rank,
            val_s=max((r[2] for r in rows if r[2] is not None), default=None),
            wall_s=wall_s,
            flops_per_sample=flops,
            tflops_per_s_per_gpu=tflops,
            peak_tflops=peak,
            mfu=mfu,
            samples_per_s_epoch_clock=total_samples / wall_s if wall_s else None,
        )
        self.epochs.append(record)
        self.total_samples += total_samples
        self.total_train_s += slowest_train or 0.0
        log_metrics(trainer, {
            "perf/epoch/samples_per_s": sps, "perf/epoch/samples_per_s_steady": sps_steady,
            "perf/epoch/step_latency_ms_median": lat.median, "perf/epoch/step_latency_ms_p95": lat.p95,
            "perf/epoch/train_s": slowest_train, "perf/epoch/val_s": record.val_s,
            "perf/epoch/wall_s": record.wall_s,
            "perf/epoch/samples_per_s_epoch_clock": record.samples_per_s_epoch_clock,
            "perf/epoch/tflops_per_s": tflops, "perf/epoch/mfu": mfu,
        })

    # ------------------------------------------------------------------ FLOPs
    def _flops_figures(self, pl_module: LightningModule, samples: int, train_s: float | None,
                       world: int) -> tuple[float | None, float | None, float | None, float | None]:
        flops = self.flops_per_sample
        self._flops_source = "constructor" if flops is not None else None
        if flops is None:
            attr = getattr(pl_module, "flops_per_sample", None)
            if attr is not None:
                try:
                    flops = float(attr)
                    self._flops_source = "pl_module.flops_per_sample"
                except (TypeError, ValueError):
                    flops = None
        peak = self._peak_figure(pl_module)
        if flops is None or flops <= 0:
            self._mfu_reason = ("no FLOPs per sample: pass ThroughputCallback(flops_per_sample=...) or set "
                                "pl_module.flops_per_sample")
            return None, None, None, peak
        if not train_s or not samples:
            self._mfu_reason = "no training samples measured"
            return flops, None, None, peak
        tflops = flops * samples / train_s / max(world, 1) / 1e12
        if peak is None:
            return flops, tflops, None, None
        self._mfu_reason = None
        return flops, tflops, tflops / peak, peak

    def _peak_figure(self, pl_module: LightningModule) -> float | None:
        """The peak MFU divides by: the override, else the attainable peak of the operator classes' dtypes.

        Sets :attr:`_peak`, :attr:`_peak_source` (``"peak_tflops"``, ``"attainable"``, ``"table"``),
        :attr:`_split` and, when there is no peak, :attr:`_mfu_reason`.
        """
        split = self.flops_by_class if self.flops_by_class is not None else getattr(pl_module, "flops_by_class", None)
        self._split = {c: float(split.get(c, 0.0)) for c in OPERATOR_CLASSES} if split else None
        self._peak, self._peak_source = None, None
        if self.peak_tflops is not None:
            self._peak, self._peak_source = float(self.peak_tflops), "peak_tflops"
            return self._peak
        dtypes = self._class_dtypes
        if self._split is not None and any(self._split.values()):
            self._peak = peaks.attainable_peak_tflops(self._device_name, self._split, dtypes)
            used = {dtypes[c] for c, f in self._split.items() if f > 0}
            self._peak_source = "attainable" if self._peak is not None else None
        else:
            used = set(dtypes.values())
            if len(used) == 1:  # every class in one dtype: the split does not matter
                self._peak = peaks.peak_tflops(self._device_name, next(iter(used)))
                self._peak_source = "table" if self._peak is not None else None
            else:
                self._mfu_reason = (
                    "the operator classes run in different dtypes (" + ", ".join(f"{c} {d}" for c, d in dtypes.items())
                    + ") and their FLOPs split is unknown: pass ThroughputCallback(flops_by_class=...) or set "
                    "pl_module.flops_by_class"
                )
                return None
        if self._peak is None:
            self._mfu_reason = (f"no dense peak for device {self._device_name!r} and dtype(s) "
                                f"{', '.join(sorted(used))}: pass ThroughputCallback(peak_tflops=...)")
        return self._peak

    @override
    def summary(self) -> ThroughputSummary:
        total_wall = sum(e.wall_s for e in self.epochs if e.wall_s is not None)
        return ThroughputSummary(
            device=self._device_name,
            dtype=self._dtype,
            dtypes_by_class=dict(self._class_dtypes),
            tf32=dict(self._tf32),
            flops_by_class=None if self._split is None else dict(self._split),
            peak_tflops=self._peak,
            peak_source=self._peak_source,
            warmup_steps=self.warmup_steps,
            flops_source=self._flops_source,
            mfu_reason=self._mfu_reason,
            total_samples=self.total_samples,
            total_train_s=self.total_train_s,
            samples_per_s=(self.total_samples / self.total_train_s) if self.total_train_s else None,
            epochs=list(self.epochs),
            total_wall_s=total_wall or None,
            samples_per_s_epoch_clock=(self.total_samples / total_wall) if total_wall else None,
        )


def device_name(device: torch.device) -> str:
    """``torch.cuda.get_device_name`` of a CUDA ``device``, else its type (``"cpu"``)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return device.type
