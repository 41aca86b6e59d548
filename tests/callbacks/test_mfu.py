"""MFU against the attainable peak of the math that ran (issue 12, item 4).

Expected peaks are worked out by hand from NVIDIA's dense H100/H200 SXM figures, written here as numbers:
TF32 494.5, FP32 67, BF16 = FP16 989.5 TFLOP/s. A step with FLOPs ``f_c`` per operator class whose dtypes
have peaks ``P_c`` cannot run faster than ``sum f_c / P_c``: its attainable peak is
``sum f_c / sum (f_c / P_c)``. The device name and the TF32 switches are set per case (torch's real
switches, restored afterwards); no GPU is needed.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.plugins import MixedPrecision

from cropscale.callbacks import ThroughputCallback
from cropscale.callbacks import throughput as throughput_module
from cropscale.env import peaks
from cropscale.testing.toy import ToyTask

TF32, FP32, HALF = 494.5, 67.0, 989.5
SPLIT = {"convolution": 600.0, "matmul": 300.0, "attention": 100.0}  # FLOPs per sample (proportions)

CASES = [  # (precision, cuDNN TF32, matmul precision, expected dtypes conv/matmul/attention, expected peak)
    ("32-true", True, "highest", ("tf32", "fp32", "fp32"), 1000.0 / (600.0 / TF32 + 400.0 / FP32)),
    ("32-true", False, "highest", ("fp32", "fp32", "fp32"), FP32),
    ("32-true", True, "high", ("tf32", "tf32", "tf32"), TF32),
    ("bf16-mixed", True, "highest", ("bf16", "bf16", "bf16"), HALF),
    ("16-mixed", True, "highest", ("fp16", "fp16", "fp16"), HALF),
]


@pytest.fixture
def switches():
    """Set torch's TF32 switches for one case and restore them afterwards."""
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
             torch.get_float32_matmul_precision())

    def set_(cudnn: bool, matmul_precision: str) -> None:
        torch.backends.cudnn.allow_tf32 = cudnn
        torch.set_float32_matmul_precision(matmul_precision)

    yield set_
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved[0], saved[1]
    torch.set_float32_matmul_precision(saved[2])


@pytest.mark.parametrize(("precision", "cudnn", "matmul", "dtypes", "expected"), CASES)
def test_attainable_peak_on_an_h200(switches, monkeypatch, precision, cudnn, matmul, dtypes, expected):
    """The callback's hooks driven by hand on an 'NVIDIA H200' (a CUDA device faked for the name lookup)."""
    switches(cudnn, matmul)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "NVIDIA H200")
    cb = ThroughputCallback(flops_per_sample=1000.0, flops_by_class=SPLIT, warmup_steps=0,
                            sync_cuda_at_epoch_end=False)
    trainer = SimpleNamespace(precision=precision, log_every_n_steps=0, global_step=0, current_epoch=0,
                              world_size=1, loggers=[], sanity_checking=False)
    module = SimpleNamespace(device=torch.device("cuda", 0), flops_per_sample=None)
    cb.on_train_start(trainer, module)
    cb.on_train_epoch_start(trainer, module)
    cb.on_train_batch_start(trainer, module, None, 0)
    cb.on_before_optimizer_step(trainer, module, None)
    cb.on_train_batch_end(trainer, module, None, {"s2": torch.zeros(64, 1)}, 0)
    cb.on_train_epoch_end(trainer, module)
    ep = cb.epochs[0]
    assert ep.peak_tflops == pytest.approx(expected, rel=1e-12)
    assert ep.mfu == pytest.approx(ep.tflops_per_s_per_gpu / expected, rel=1e-12)
    s = cb.summary()
    assert tuple(s.dtypes_by_class[c] for c in ("convolution", "matmul", "attention")) == dtypes
    assert s.peak_tflops == ep.peak_tflops and s.flops_by_class == SPLIT
    assert s.tf32["cudnn_conv"] is cudnn


def test_the_default_32_true_case_by_hand():
    """Convolutions in TF32, matmuls and attention in FP32: 1000 / (600 / 494.5 + 400 / 67) = 139.208 TFLOP/s,
    about 2.1x the FP32 peak the MFU was divided by before."""
    dtypes = peaks.class_dtypes("32-true", matmul_tf32=False, conv_tf32=True)
    peak = peaks.attainable_peak_tflops("NVIDIA H200", SPLIT, dtypes)
    assert peak == pytest.approx(139.2080, abs=1e-4)
    assert peaks.attainable_peak_tflops("NVIDIA H200", {"convolution": 1.0}, dtypes) == TF32
    assert peaks.attainable_peak_tflops("cpu", SPLIT, dtypes) is None
    assert peaks.attainable_peak_tflops("NVIDIA H200", {"convolution": 0.0}, dtypes) is None


def test_operator_classes_of_flop_counter_ops():
    aten = torch.ops.aten
    assert peaks.flops_by_class({aten.convolution: 10, aten.convolution_backward: 20, aten.addmm: 5, aten.mm: 1,
                                 aten.bmm: 2, aten._scaled_dot_product_flash_attention_for_cpu: 3,
                                 aten._scaled_dot_product_efficient_attention_backward: 4}) == {
        "convolution": 30, "matmul": 8, "attention": 7}


def test_tf32_settings_follow_torch_switches(switches):
    switches(False, "highest")
    assert peaks.tf32_settings() == {"matmul": False, "cudnn_conv": False}
    switches(True, "medium")
    assert peaks.tf32_settings() == {"matmul": True, "cudnn_conv": True}


def test_without_a_split_mixed_dtypes_give_no_mfu_and_say_why(switches, monkeypatch):
    switches(True, "highest")
    monkeypatch.setattr(throughput_module, "device_name", lambda device: "NVIDIA H200")
    task = ToyTask()
    task.flops_by_class = None
    cb = ThroughputCallback(warmup_steps=0)
    Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[cb], logger=False, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0).fit(task)
    assert cb.epochs[0].mfu is None and "different dtypes" in cb.summary().mfu_reason


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_a_real_fit_records_dtypes_and_the_peak(switches, monkeypatch, precision):
    """A CPU fit of the tiny task (all of its FLOPs are matmul) reported as an H200: FP32 (matmul switch off)
    or FP16, whatever the cuDNN switch says."""
    switches(True, "highest")
    monkeypatch.setattr(throughput_module, "device_name", lambda device: "NVIDIA H200")
    cb = ThroughputCallback(warmup_steps=0)
    plugins = [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))] if precision == "16-mixed" else []
    Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[cb], logger=False, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0, plugins=plugins).fit(ToyTask())
    s = cb.summary()
    expected = FP32 if precision == "32-true" else HALF
    assert s.peak_tflops == expected and s.peak_source == "attainable"
    assert s.flops_by_class == {"convolution": 0.0, "matmul": 36.0, "attention": 0.0}
    ep = s.epochs[0]
    assert ep.mfu == pytest.approx(ep.tflops_per_s_per_gpu / expected, rel=1e-12)
