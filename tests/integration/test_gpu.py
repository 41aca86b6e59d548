"""GPU paths of the scaling callbacks: CUDA events resolved lazily, NVML matched by UUID, energy
counter, CUDA allocator peaks, MFU against the peak table. Marker ``gpu``: run where a GPU exists
(``pytest -m gpu``); skipped without CUDA."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from cropscale.callbacks import (
    CallbackGroup,
    StepTimingCallback,
    ThroughputCallback,
    all_scaling_callbacks,
)
from cropscale.callbacks._clock import CudaEventClock
from cropscale.env import nvml, peaks
from cropscale.testing.toy import ToyTask

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


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
    torch.cuda._sleep(200_000_000)  # ~0.1 s of device time (clock cycles)
    t0 = time.perf_counter()
    b = clock.mark()
    host = time.perf_counter() - t0
    assert not clock.ready(b) or host < 0.01
    clock.wait(b)
    assert clock.ready(b)
    device = clock.seconds(a, b)
    assert device > 0.01 and host < device  # recording the end mark did not wait for the kernel
    clock.release([a, b])
    assert clock.mark() in (a, b)  # events are recycled


def test_nvml_device_found_by_uuid_and_energy_counter_moves():
    dev, reason = nvml.open_device_for(torch.device("cuda", 0))
    assert dev is not None, reason
    assert nvml.normalize_uuid(dev.uuid) == nvml.normalize_uuid(str(torch.cuda.get_device_properties(0).uuid))
    info = dev.info()
    assert info["name"] and info["driver"] and info["power_limit_w"] > 0
    ok, why = dev.has_energy_counter()
    t0, e0 = time.perf_counter(), dev.energy_j() if ok else None
    _busy(1.0)
    t1 = time.perf_counter()
    if ok:
        joules = nvml.counter_delta_j(e0, dev.energy_j())
        assert joules is not None and 10.0 < joules / (t1 - t0) < 2000.0  # plausible average watts
    else:
        assert 10.0 < dev.power_w() < 2000.0, why


def test_peak_table_knows_this_gpu_or_says_so():
    name = torch.cuda.get_device_name(0)
    family = peaks.device_family(name)
    if "H200" in name:
        assert family == "H200 SXM" or family == "H200 NVL"
        assert peaks.peak_tflops(name, "bf16") in (989.5, 835.5)


def test_fit_on_gpu_all_callbacks(tmp_path, monkeypatch):
    syncs = {"n": 0}
    real_sync = torch.cuda.synchronize

    def counting_sync(*a, **k):
        syncs["n"] += 1
        return real_sync(*a, **k)

    monkeypatch.setattr(torch.cuda, "synchronize", counting_sync)
    torch.manual_seed(0)
    cbs = all_scaling_callbacks()
    cbs[0] = StepTimingCallback(warmup_steps=2, trace_path="trace.jsonl")
    cbs[1] = ThroughputCallback(warmup_steps=2)
    trainer = Trainer(
        accelerator="gpu", devices=1, precision="16-mixed", max_epochs=2, callbacks=[CallbackGroup(cbs)],
        logger=TensorBoardLogger(str(tmp_path), name="gpu"), log_every_n_steps=8, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
    )
    trainer.fit(ToyTask(features=64, n_train=256, batch_size=4))  # 64 steps per epoch
    steps = trainer.global_step
    assert steps == 128
    assert syncs["n"] < 20  # epoch edges only (energy, throughput), never per step
    rec = json.loads(Path(trainer.log_dir, "run.json").read_text())
    s = rec["summary"]
    st = s["step_timing"]
    assert st["clock"] == "cuda-events"
    for name in ("data_wait", "transfer", "forward", "backward", "optimizer", "remainder", "step"):
        assert st["epochs"][-1]["windows_ms"][name]["median"] is not None, name
    assert s["loss_scale"]["scaler_in_use"] is True and s["loss_scale"]["steps"] == 128
    en = s["energy"]
    assert en["available"] is True, en.get("reason")
    assert en["method"] in ("counter", "sampled-power")
    assert all(e["energy_j"] is not None and e["energy_j"] > 0 for e in en["epochs"])
    assert en["devices"][0]["uuid"] == rec["devices"][0]["uuid"]
    mem = s["memory"]
    assert mem["gpu_available"] is True and mem["peak_allocated_gib"] > 0
    th = s["throughput"]
    assert th["dtype"] == "fp16" and th["device"] == torch.cuda.get_device_name(0)
    peak = peaks.peak_tflops(th["device"], "fp16")
    last = th["epochs"][-1]
    if peak is not None:
        assert last["mfu"] == pytest.approx(last["tflops_per_s_per_gpu"] / peak)
    assert rec["devices"][0]["nvml"]["power_limit_w"] > 0
