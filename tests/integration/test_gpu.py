"""GPU paths, each checked against something outside the code (marker ``gpu``; ``scripts/gpu_check.sh`` runs them).

- CUDA-event marks: recording does not block the host, and a mark behind a 0.1 s kernel is not ready;
- the step windows of a real fit: positive, forward and backward > 0, and their sum within 5 % + 0.3 ms of a
  step period bracketed by this test's own CUDA events (recorded at every ``on_train_batch_end``);
- no host sync per step: ``Event.synchronize``, ``Tensor.item``, ``Tensor.cpu`` and ``torch.cuda.synchronize``
  counted during the fit, at most 3 a log step plus 12 an epoch edge (a sync per step would be 128 or more);
- MFU: the benchmark's TFLOP/s against the same step timed by this test's CUDA events (within 20 %) and
  below a bf16 matrix product timed here (the ceiling the device reaches);
- energy: the NVML counter over a busy window against the integral of power sampled every 20 ms over the
  same window (within 30 %: NVML's power reading is a moving average over about a second);
- the peak table names this GPU's family, or the failure says it does not.

Skipped without CUDA. Default sizes keep the file under a minute on an H200.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from cropscale.bench.step import command as bm
from cropscale.callbacks import CallbackGroup, StepTimingCallback, ThroughputCallback, all_scaling_callbacks
from cropscale.callbacks._clock import CudaEventClock
from cropscale.env import nvml, peaks
from cropscale.testing.toy import ToyTask

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

STEP_REL_TOL, STEP_ABS_TOL_MS = 0.05, 0.3


def _busy(seconds: float) -> int:
    """Keep the GPU busy with matrix products for about ``seconds``; returns the number of products."""
    a = torch.randn(4096, 4096, device="cuda")
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
        n += 10
    return n


def test_cuda_event_marks_do_not_block_the_host():
    clock = CudaEventClock()
    a = clock.mark()
    torch.cuda._sleep(200_000_000)  # 2e8 clock cycles: about 0.1 s at 2 GHz
    t0 = time.perf_counter()
    b = clock.mark()
    host = time.perf_counter() - t0
    assert not clock.ready(b)  # the kernel in front of it still runs: recording did not wait for it
    assert host < 0.01
    clock.wait(b)
    assert clock.ready(b)
    device = clock.seconds(a, b)
    assert device > 0.04 and host < device / 4
    clock.release([a, b])
    assert clock.mark() in (a, b)  # events are recycled


class _EventBracket(Callback):
    """This test's own clock: a CUDA event at every ``on_train_batch_end``, keyed by the index of the step it ends
    (``global_step - 1``: the trace's step numbers)."""

    def __init__(self) -> None:
        self.events: dict[int, torch.cuda.Event] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.events[trainer.global_step - 1] = ev


class _SyncCounter:
    def __init__(self, monkeypatch) -> None:
        self.n = {"Event.synchronize": 0, "Tensor.item": 0, "Tensor.cpu": 0, "cuda.synchronize": 0}
        for owner, attr, key in ((torch.cuda.Event, "synchronize", "Event.synchronize"),
                                 (torch.Tensor, "item", "Tensor.item"), (torch.Tensor, "cpu", "Tensor.cpu"),
                                 (torch.cuda, "synchronize", "cuda.synchronize")):
            monkeypatch.setattr(owner, attr, self._wrap(getattr(owner, attr), key))

    def _wrap(self, fn, key):
        def counted(*a, **k):
            self.n[key] += 1
            return fn(*a, **k)
        return counted


def test_fit_windows_against_event_brackets_no_per_step_sync(tmp_path, monkeypatch):
    torch.manual_seed(0)
    cbs = all_scaling_callbacks()
    cbs[0] = StepTimingCallback(warmup_steps=2, trace_path="trace.jsonl")
    cbs[1] = ThroughputCallback(warmup_steps=2)
    bracket = _EventBracket()
    log_every, epochs = 8, 2
    trainer = Trainer(
        accelerator="gpu", devices=1, precision="16-mixed", max_epochs=epochs,
        callbacks=[CallbackGroup(cbs), bracket], logger=TensorBoardLogger(str(tmp_path), name="gpu"),
        log_every_n_steps=log_every, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, num_sanity_val_steps=0,
    )
    syncs = _SyncCounter(monkeypatch)
    trainer.fit(ToyTask(features=64, n_train=256, batch_size=4))  # 64 steps per epoch
    monkeypatch.undo()
    steps = trainer.global_step
    assert steps == 128
    total = sum(syncs.n.values())
    assert total <= 3 * (steps // log_every) + 12 * epochs, syncs.n  # none per step
    torch.cuda.synchronize()
    rec = json.loads(Path(trainer.log_dir, "run.json").read_text())
    st = rec["summary"]["step_timing"]
    assert st["clock"] == "cuda-events"
    trace: dict[int, dict[str, float]] = {}
    for line in Path(trainer.log_dir, "trace.jsonl").read_text().splitlines():
        row = json.loads(line)
        if not row["warmup"]:
            name = row["callpath"].removeprefix("train_step->").removeprefix("train_step")
            trace.setdefault(row["step"], {})[name or "step"] = row["value"]
    compared = 0
    for step, w in trace.items():
        if "remainder" not in w or step - 1 not in bracket.events:
            continue  # the first step of an epoch has no remainder: no period to compare
        assert w["forward"] > 0 and w["backward"] > 0, (step, w)
        assert all(w[k] >= 0 for k in ("data_wait", "transfer", "optimizer", "remainder")), (step, w)
        parts = sum(w[k] for k in ("data_wait", "transfer", "forward", "backward", "optimizer", "remainder"))
        period_ms = bracket.events[step - 1].elapsed_time(bracket.events[step])
        assert abs(parts * 1e3 - period_ms) <= STEP_REL_TOL * period_ms + STEP_ABS_TOL_MS, (step, parts, period_ms)
        compared += 1
    assert compared >= 100
    last = st["epochs"][-1]
    assert last["host_windows_ms"]["data_wait_host"]["median"] > 0  # the host clock's, named apart
    en = rec["summary"]["energy"]
    assert en["available"] is True, en.get("reason")
    assert all(e["energy_j"] is not None and e["energy_j"] > 0 for e in en["epochs"])
    assert en["devices"][0]["uuid"] == rec["devices"][0]["uuid"]
    mem = rec["summary"]["memory"]
    assert mem["gpu_available"] is True and mem["peak_allocated_gib"] > 0
    assert rec["summary"]["loss_scale"]["scaler_in_use"] is True


def _matmul_tflops(n: int = 8192, reps: int = 10) -> float:
    """A bf16 n x n x n matrix product timed with CUDA events: 2 n^3 FLOP per product (TFLOP/s)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    end.synchronize()
    return 2 * n**3 * reps / (start.elapsed_time(end) / 1e3) / 1e12


def test_benchmark_tflops_against_event_timed_steps_and_a_matmul_ceiling():
    config = bm.BenchmarkConfig(precision=["bf16-mixed"], batch_sizes=[16], warmup=5, iterations=20, device="cuda")
    row = bm.run_benchmark(config, argv=[])["results"][0]
    assert row["status"] == "ok", row["error"]
    # the same step, timed by this test's events over 20 steps (no per-step synchronize)
    device = torch.device("cuda")
    setup = bm.build_setup(config, "bf16-mixed", 16, device)
    for _ in range(5):
        bm.train_step(setup.step_model, setup.loss_fn, setup.optimizer, setup.scaler, setup.batch, "cuda",
                      torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        bm.train_step(setup.step_model, setup.loss_fn, setup.optimizer, setup.scaler, setup.batch, "cuda",
                      torch.bfloat16)
    end.record()
    end.synchronize()
    step_s = start.elapsed_time(end) / 1e3 / 20
    independent = row["flops_per_sample"] * 16 / step_s / 1e12
    assert row["achieved_tflops"] == pytest.approx(independent, rel=0.2)
    ceiling = _matmul_tflops()
    assert row["achieved_tflops"] < 1.05 * ceiling
    if row["mfu"] is not None:
        assert 0 < row["mfu"] <= 1.05 * ceiling / row["peak_tflops"]
    assert row["energy_j_per_sample"] is None or row["energy_j_per_sample"] > 0
    assert row["energy_reason"] is None or "window" in row["energy_reason"] or row["energy_j"] is None


def test_nvml_counter_energy_against_integrated_sampled_power():
    dev, reason = nvml.open_device_for(torch.device("cuda", 0))
    assert dev is not None, reason
    assert nvml.normalize_uuid(dev.uuid) == nvml.normalize_uuid(str(torch.cuda.get_device_properties(0).uuid))
    ok, why = dev.has_energy_counter()
    assert ok, why
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.perf_counter(), dev.power_w()))
            time.sleep(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    _busy(1.5)  # let the averaged power reading settle on the busy level first
    t0, e0 = time.perf_counter(), dev.energy_j()
    _busy(4.0)
    t1, e1 = time.perf_counter(), dev.energy_j()
    stop.set()
    thread.join()
    counter = nvml.counter_delta_j(e0, e1)
    integral = nvml.integrate_power(samples, t0, t1)
    assert counter is not None and integral is not None
    assert 10.0 < counter / (t1 - t0) < 2000.0  # plausible average watts
    assert counter == pytest.approx(integral, rel=0.3)


def test_peak_table_names_this_gpus_family():
    name = torch.cuda.get_device_name(0)
    family = peaks.device_family(name)
    assert family is not None, f"{name!r} is not in cropscale.env.peaks' table: MFU is None on it (add its family)"
    assert peaks.peak_tflops(name, "bf16") > peaks.peak_tflops(name, "fp32") > 0
    if "H200" in name:  # the datasheet figures (dense): SXM 989.5 bf16 / 67 fp32, NVL 835.5 / 60
        assert (family, peaks.peak_tflops(name, "bf16")) in (("H200 SXM", 989.5), ("H200 NVL", 835.5))
