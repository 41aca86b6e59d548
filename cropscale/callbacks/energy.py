"""GPU power and energy per epoch from NVML (``nvidia-ml-py``), each rank measuring its own GPU.

Each rank finds its GPU by UUID (see :mod:`cropscale.env.nvml`) and reads the NVML
total-energy counter (mJ) at the window edges: epoch (``on_train_epoch_start`` ->
``on_train_epoch_end``, so the validation run inside the epoch is included), the whole training
(``on_train_start`` -> ``on_train_end``) and, for the power scalar, the interval between log steps.
Where the counter is not supported it falls back to sampling ``nvmlDeviceGetPowerUsage`` on a
background thread every ``sample_interval_s`` and integrating over the window (trapezoidal rule).
Keep windows at least a few hundred ms long: the counter updates about every 10 ms and the power
reading is an average on recent GPUs.

An epoch resumed from a checkpoint (written inside it, or at the previous epoch's last batch end, after which
Lightning 2.6 calls no ``on_train_epoch_start``) has its window from the restart (``on_train_start``) to its end:
its energy, seconds and samples are those after the restart, so its J/sample stays energy / the samples of the
window; the part of it before the checkpoint is in no record.

Every figure is **GPU board energy**: what NVML reports for the GPU board, no CPU, memory, network or cooling
(MLPerf's power rules measure the node at the wall). A sampled-power run records how many readings each rank took
over the training window and their mean period (``power_samples``, ``power_sample_period_s``): the report refuses a
sampled-power figure from fewer than 60 readings or read less than once a second
(:func:`cropscale.runs.rules.sampled_power_refusal`).

Per epoch: joules (all GPUs), average watts, J/sample, and with ``price_per_gpu_hour`` a cost
estimate (price x GPU-hours of the epoch). Power limit, persistence mode, clocks and clock-event
(throttle) reasons are recorded once at the start; throttle reasons again at each epoch end.

Without a GPU or NVML the callback logs once that power is unavailable and why, records the reason
in ``run.json``, and does nothing else. A measured 0 is never reported for a reading that failed: when the
energy counter cannot be read at a window edge (or the sampler got no reading in a window), that window's
joules are None and the summary says ``available: false`` with the reason (the epochs measured before stay
in ``epochs``); failed power-sampler readings are counted and named. On a MIG instance NVML's energy and
power are those of the whole physical GPU (every instance on it): they are withheld (``available: false``,
the reason says so) rather than charged to each rank.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from cropscale.callbacks._batches import batch_size
from cropscale.callbacks._dist import gather_objects, gather_vectors
from cropscale.callbacks._logging import log_metrics
from cropscale.callbacks.base import ScalingCallback
from cropscale.env import nvml
from cropscale.errors import CropScaleError
from cropscale.runs.schema import EnergyEpoch, EnergySummary, EnergyWindow


class _PowerSampler:
    """Background thread sampling power (W) every ``interval`` s into ``samples`` ``[(t, W)]``."""

    def __init__(self, device: nvml.NvmlDevice, interval: float) -> None:
        self.device = device
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self.failures = 0
        self.first_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cropscale-power-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.perf_counter(), self.device.power_w()))
            except Exception as err:  # NVMLError (GPU lost, driver reset): counted and named in the summary
                self.failures += 1
                if self.first_error is None:
                    self.first_error = f"{type(err).__name__}: {err}"
            self._stop.wait(self.interval)

    def problem(self) -> str | None:
        """The failed readings as one line (``None`` when every reading succeeded)."""
        if not self.failures:
            return None
        return (f"power sampler: {self.failures} of {self.failures + len(self.samples)} nvmlDeviceGetPowerUsage "
                f"readings failed (first: {self.first_error})")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * self.interval + 1.0)


class EnergyCallback(ScalingCallback):
    """Energy (J), average power (W), J/sample and cost per epoch of every rank's GPU, via NVML.

    Args:
        price_per_gpu_hour: price of one GPU-hour for the cost estimate (``None``: no cost).
        currency: label of the price (e.g. ``"EUR"``).
        sample_interval_s: power sampling period (s) of the fallback when the energy counter is
            unsupported.

    Logged (TensorBoard): at log steps ``energy/power_w`` (rank 0's GPU,
    interval average); at epoch end ``energy/epoch_j`` and ``energy/epoch_avg_w`` (sums over all
    GPUs), ``energy/j_per_sample``, ``energy/epoch_cost``. Whether power is measured is ``run.json``
    ``summary.energy.available`` and a setting of the HPARAMS tab, not a scalar.

    ``state_dict`` keeps the totals and per-epoch summaries.

    Example::

        from lightning.pytorch import Trainer
        from cropscale.callbacks import EnergyCallback

        trainer = Trainer(callbacks=[EnergyCallback(price_per_gpu_hour=2.5, currency="EUR")])

        # command line: the preset's settings replace the member of configs/default.yaml's CallbackGroup
        #   python -m cropscale fit --config callbacks/energy.yaml
    """

    summary_key = "energy"

    def __init__(self, price_per_gpu_hour: float | None = None, currency: str = "USD",
                 sample_interval_s: float = 0.1) -> None:
        if price_per_gpu_hour is not None and price_per_gpu_hour < 0:
            raise CropScaleError(f"EnergyCallback(price_per_gpu_hour={price_per_gpu_hour}): must be >= 0")
        if sample_interval_s <= 0:
            raise CropScaleError(f"EnergyCallback(sample_interval_s={sample_interval_s}): must be > 0")
        self.price_per_gpu_hour = price_per_gpu_hour
        self.currency = currency
        self.sample_interval_s = sample_interval_s
        self.total_j = 0.0
        self.total_gpu_s = 0.0
        self.total_samples = 0
        self.epochs: list[EnergyEpoch] = []
        self._dev: nvml.NvmlDevice | None = None
        self._reason: str | None = "not started"
        self._method: str | None = None
        self._sampler: _PowerSampler | None = None
        self._device_info: list[dict[str, Any]] = []
        self._epoch_t0: float | None = None
        self._epoch_e0: float | None = None
        self._log_t0: float | None = None
        self._log_e0: float | None = None
        self._fit_t0: float | None = None
        self._fit_e0: float | None = None
        self._samples = 0
        self._fit: EnergyWindow | None = None
        self._readings: tuple[int | None, float | None] = (None, None)
        self._cuda_device: torch.device | None = None
        self._participate = False
        self._stepped = False
        self._problems: list[str] = []

    # ------------------------------------------------------------------ state
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"total_j": self.total_j, "total_gpu_s": self.total_gpu_s, "total_samples": self.total_samples,
                "epochs": [e.to_json() for e in self.epochs]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.total_j = float(state_dict.get("total_j", 0.0))
        self.total_gpu_s = float(state_dict.get("total_gpu_s", 0.0))
        self.total_samples = int(state_dict.get("total_samples", 0))
        self.epochs = [EnergyEpoch.from_json(e) for e in state_dict.get("epochs", [])]

    @property
    def available(self) -> bool:
        """True when this rank's GPU was found in NVML at ``on_train_start`` (power is measured)."""
        return self._dev is not None

    @override
    def wants_hook(self, hook: str) -> bool:
        return self._dev is not None  # no GPU / NVML: nothing per step

    # ------------------------------------------------------------------ readings
    def _now(self, where: str = "a window edge") -> tuple[float, float | None]:
        """``(perf_counter s, energy counter J or None)``; the sampler path returns ``None`` energy."""
        if self._cuda_device is not None:
            torch.cuda.synchronize(self._cuda_device)
        t = time.perf_counter()
        if self._method == "counter" and self._dev is not None:
            return t, self._read_counter(where)
        return t, None

    def _read_counter(self, where: str) -> float | None:
        """The energy counter (J), or None with the failure recorded (first failure per place)."""
        try:
            return self._dev.energy_j()
        except Exception as err:  # NVMLError mid-run: the window has no energy, never a measured 0
            if not any(p.startswith(f"energy counter read failed at {where}") for p in self._problems):
                self._problems.append(f"energy counter read failed at {where}: {type(err).__name__}: {err}")
            return None

    def _window_j(self, t0: float | None, e0: float | None, t1: float, e1: float | None) -> float | None:
        if t0 is None or self._dev is None:
            return None
        if self._method == "counter":
            return nvml.counter_delta_j(e0, e1)
        if self._sampler is not None:
            return nvml.integrate_power(list(self._sampler.samples), t0, t1)
        return None

    # ------------------------------------------------------------------ hooks
    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._dev, self._reason = nvml.open_device_for(pl_module.device)
        mig_info: dict[str, Any] = {}
        if self._dev is not None and self._dev.is_mig:
            mig_info = self._dev.info()
            self._dev, self._reason = None, (
                f"MIG instance {mig_info.get('uuid')}: NVML's energy counter and power reading are those of the whole "
                "physical GPU (every MIG instance on it), not of this rank's slice: withheld")
        local_info: dict[str, Any] = {"rank": trainer.global_rank, "available": self._dev is not None, **mig_info}
        if self._dev is not None:
            self._cuda_device = pl_module.device if pl_module.device.type == "cuda" else None
            ok, why = self._dev.has_energy_counter()
            if ok:
                self._method = "counter"
            else:
                self._method = "sampled-power"
                self._sampler = _PowerSampler(self._dev, self.sample_interval_s)
                self._sampler.start()
                local_info["counter_unavailable"] = why
            local_info.update(self._dev.info())
            local_info["method"] = self._method
        else:
            local_info["reason"] = self._reason
            rank_zero_info(f"EnergyCallback: power unavailable: {self._reason}")
        self._device_info = gather_objects(trainer, local_info)
        # every rank joins the epoch-end gathers when any rank measures (no rank may skip a collective)
        self._participate = any(info.get("available") for info in self._device_info)
        self._start_log_schedule(trainer)
        if not self._participate:
            return
        self._fit_t0, self._fit_e0 = self._now("the start of training")
        self._log_t0, self._log_e0 = self._fit_t0, self._fit_e0
        # an epoch resumed from a checkpoint written inside it or at the previous epoch's last batch end gets no
        # on_train_epoch_start (Lightning 2.6): its window runs from the restart (on_train_epoch_start moves it)
        self._epoch_t0, self._epoch_e0 = self._fit_t0, self._fit_e0

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._participate:
            return
        self._epoch_t0, self._epoch_e0 = self._now(f"the start of epoch {trainer.current_epoch}")
        self._samples = 0

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._dev is None:
            return
        self._samples += batch_size(batch) or 0
        if self._step_done() and self._count_step():
            t = time.perf_counter()
            e = self._read_counter("a log step") if self._method == "counter" else None
            joules = self._window_j(self._log_t0, self._log_e0, t, e)
            if joules is not None and self._log_t0 is not None and t > self._log_t0:
                log_metrics(trainer, {"energy/power_w": joules / (t - self._log_t0)})
            self._log_t0, self._log_e0 = t, e

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._participate:
            return
        t1, e1 = self._now(f"the end of epoch {trainer.current_epoch}")
        joules = self._window_j(self._epoch_t0, self._epoch_e0, t1, e1)
        seconds = t1 - self._epoch_t0 if (self._epoch_t0 is not None and self._dev is not None) else None
        rows = gather_vectors(trainer, pl_module, [joules, seconds, float(self._samples)])
        j_rank = [r[0] for r in rows]
        s_rank = [r[1] for r in rows]
        n_rank = [r[2] for r in rows]
        total_j = sum(j for j in j_rank if j is not None) if all(j is not None for j in j_rank) else None
        if total_j is None:
            missing = [r for r, j in enumerate(j_rank) if j is None]
            self._problems.append(f"epoch {trainer.current_epoch}: no energy from rank(s) {missing}")
        gpu_s = sum(s for s in s_rank if s is not None)
        samples = int(sum(n for n in n_rank if n is not None))
        avg_w = (total_j / max(s for s in s_rank if s is not None)) if (total_j is not None and gpu_s > 0) else None
        cost = self.price_per_gpu_hour * gpu_s / 3600.0 if self.price_per_gpu_hour is not None else None
        record = EnergyEpoch(
            epoch=trainer.current_epoch,
            energy_j=total_j,
            energy_j_per_rank=j_rank,
            seconds_per_rank=s_rank,
            avg_power_w=avg_w,
            avg_power_w_per_rank=[
                None if (j is None or not s) else j / s for j, s in zip(j_rank, s_rank, strict=False)
            ],
            samples=samples,
            j_per_sample=(total_j / samples) if (total_j is not None and samples) else None,
            gpu_hours=gpu_s / 3600.0,
            cost=cost,
            throttle_reasons_rank0_end=self._dev.throttle_reasons() if self._dev is not None else None,
        )
        self.epochs.append(record)
        if total_j is not None:
            self.total_j += total_j
        self.total_gpu_s += gpu_s
        self.total_samples += samples
        log_metrics(trainer, {"energy/epoch_j": total_j, "energy/epoch_avg_w": avg_w,
                              "energy/j_per_sample": record.j_per_sample, "energy/epoch_cost": cost})

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._participate:
            return
        t1, e1 = self._now("the end of training")
        joules = self._window_j(self._fit_t0, self._fit_e0, t1, e1)
        seconds = t1 - self._fit_t0 if (self._fit_t0 is not None and self._dev is not None) else None
        count, period = self._sampler_readings(t1)
        rows = gather_vectors(trainer, pl_module, [joules, seconds, count, period])
        j_rank = [r[0] for r in rows]
        if self._method == "sampled-power":
            counts = [r[2] for r in rows]
            self._readings = (int(min(counts)) if all(c is not None for c in counts) else None,
                              max((r[3] for r in rows if r[3] is not None), default=None))
        self._fit = EnergyWindow(
            energy_j=sum(j_rank) if all(j is not None for j in j_rank) else None,
            energy_j_per_rank=j_rank,
            seconds_per_rank=[r[1] for r in rows],
        )
        self._stop_sampler()

    def _sampler_readings(self, t1: float) -> tuple[float | None, float | None]:
        """Power readings of this rank's sampler inside the training window, and their mean period (s)."""
        if self._sampler is None or self._fit_t0 is None:
            return None, None
        times = [t for t, _ in list(self._sampler.samples) if self._fit_t0 <= t <= t1]
        period = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        return float(len(times)), period

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._stop_sampler()

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop_sampler()

    def _stop_sampler(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
            problem = self._sampler.problem()
            if problem and problem not in self._problems:
                self._problems.append(problem)
            self._sampler = None

    # ------------------------------------------------------------------ summary
    @override
    def summary(self) -> EnergySummary:
        if self._dev is None:
            return EnergySummary(available=False, reason=self._reason, devices=list(self._device_info))
        failed = [e.epoch for e in self.epochs if e.energy_j is None]
        if failed or (self._fit is not None and self._fit.energy_j is None):
            # a window without energy: no total (a sum over the measured epochs would read as the run's)
            reason = "; ".join(self._problems) or f"no energy for epoch(s) {failed}"
            return EnergySummary(available=False, reason=f"energy not measured over the whole run: {reason}",
                                 method=self._method, devices=list(self._device_info), training=self._fit,
                                 epochs=list(self.epochs))
        return EnergySummary(
            reason="; ".join(self._problems) or None,
            available=True,
            method=self._method,
            devices=list(self._device_info),
            price_per_gpu_hour=self.price_per_gpu_hour,
            currency=self.currency,
            total_energy_j=self.total_j,
            total_gpu_hours=self.total_gpu_s / 3600.0,
            total_samples=self.total_samples,
            j_per_sample=(self.total_j / self.total_samples) if self.total_samples else None,
            total_cost=(self.price_per_gpu_hour * self.total_gpu_s / 3600.0)
            if self.price_per_gpu_hour is not None else None,
            training=self._fit,
            epochs=list(self.epochs),
            power_samples=self._readings[0],
            power_sample_period_s=self._readings[1],
        )
