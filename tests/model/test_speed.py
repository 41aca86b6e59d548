"""Speed levers: torch.compile (mode, a clear error without a compiler), fused AdamW, channels_last."""

import pytest
import torch
from lightning.pytorch import Trainer

from cropscale.data.datamodule import PastisHDDataModule
from cropscale.errors import CropScaleError
from cropscale.model import speed
from cropscale.model.optim import build_optimizer
from cropscale.model.task import CropMappingTask

SMALL_NET = {"s2_dim": 16, "s2_heads": 2, "s1_dim": 8, "width": 8, "fpn_dim": 16, "head_dim": 8,
             "decoder_dim": 8, "hr_dim": 4}


def test_compile_without_a_cpu_compiler_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(speed.shutil, "which", lambda name: None)
    reason = speed.compile_unavailable_reason("cpu")
    assert reason is not None and "C++ compiler" in reason and "g++" in reason
    with pytest.raises(CropScaleError, match=r"model.compile=true: torch.compile is unavailable on cpu: no C\+\+"):
        speed.compile_network(torch.nn.Linear(2, 2), "default", "cpu")


def test_compile_without_triton_on_cuda(monkeypatch):
    monkeypatch.setattr(speed.importlib.util, "find_spec", lambda name: None)
    assert "triton" in speed.compile_unavailable_reason("cuda")


def test_compile_mode_is_checked_and_passed(monkeypatch):
    with pytest.raises(CropScaleError, match="model.compile_mode must be one of default, reduce-overhead"):
        speed.compile_network(torch.nn.Linear(2, 2), "fastest", "cpu")
    seen = {}
    monkeypatch.setattr(speed, "compile_unavailable_reason", lambda device_type: None)
    monkeypatch.setattr(torch, "compile", lambda net, mode: seen.setdefault("call", (net, mode)) and net)
    net = torch.nn.Linear(2, 2)
    assert speed.compile_network(net, "max-autotune", "cuda") is net
    assert seen["call"] == (net, "max-autotune")


@pytest.mark.parametrize("requested,device,precision,clip,expected", [
    (None, "cpu", "32-true", True, True),          # auto: the CPU has the kernel in torch >= 2.4
    (None, "cuda", "bf16-mixed", True, False),     # Lightning's AMP plugin refuses to clip with a fused step
    (None, "cuda", "bf16-mixed", False, True),
    (None, "cuda", "16-mixed", True, False),       # Lightning would refuse to clip unscaled-inside gradients
    (None, "cuda", "16-mixed", False, True),
    (False, "cuda", "32-true", True, False),
    (None, "tpu-like", "32-true", False, False),   # no kernel for this device type
])
def test_choose_fused(requested, device, precision, clip, expected):
    fused, reason = speed.choose_fused(requested, device, precision, clip)
    assert fused is expected and reason


@pytest.mark.parametrize("device,precision,clip,needle", [
    ("tpu-like", "32-true", False, "no fused AdamW kernel for 'tpu-like'"),
    ("cuda", "16-mixed", True, "16-mixed with gradient clipping"),
    ("cpu", "bf16-mixed", True, "bf16-mixed with gradient clipping"),
])
def test_forced_fused_where_it_cannot_work_is_an_error(device, precision, clip, needle):
    with pytest.raises(CropScaleError, match="model.fused_optimizer=true: .*" + needle):
        speed.choose_fused(True, device, precision, clip)


def test_fused_adamw_gives_the_same_update_as_the_foreach_one():
    torch.manual_seed(0)
    a = torch.nn.Linear(8, 3)
    b = torch.nn.Linear(8, 3)
    b.load_state_dict(a.state_dict())
    opt_a = build_optimizer(a.named_parameters(), "adamw", 1e-2, 0.01)
    opt_b = build_optimizer(b.named_parameters(), "adamw", 1e-2, 0.01, fused=True)
    assert opt_b.defaults["fused"] is True and not opt_a.defaults.get("fused")
    x = torch.randn(16, 8)
    for _ in range(3):
        for net, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _fit_one_step(root, tmp_path, **task_kwargs):
    dm = PastisHDDataModule(str(root), batch_size=2, t2=4, t1=2, crop_size=16, samples_per_patch=1)
    task = CropMappingTask(num_classes=dm.num_classes, net_kwargs=SMALL_NET,
                           val_window=16, **task_kwargs)
    trainer = Trainer(accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, gradient_clip_val=1.0,
                      default_root_dir=tmp_path)
    trainer.fit(task, datamodule=dm)
    return task, trainer


def test_task_fused_auto_on_cpu_and_off_by_option(flanders_root, tmp_path):
    task, trainer = _fit_one_step(flanders_root, tmp_path)
    assert trainer.optimizers[0].defaults["fused"] is True and task.fused_optimizer_used[0] is True
    task, trainer = _fit_one_step(flanders_root, tmp_path, fused_optimizer=False)
    assert not trainer.optimizers[0].defaults.get("fused")


def test_task_compile_trains_through_the_compiled_network_and_keeps_the_checkpoint_keys(
        flanders_root, tmp_path, monkeypatch):
    calls = []

    class Recorder(torch.nn.Module):  # stands in for torch.compile's wrapper: counts the calls it serves
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, **inputs):
            calls.append(sorted(inputs))
            return self.net(**inputs)

    monkeypatch.setattr(speed, "compile_unavailable_reason", lambda device_type: None)
    monkeypatch.setattr(torch, "compile", lambda net, mode: Recorder(net))
    eager_keys = set(CropMappingTask(net_kwargs=SMALL_NET, num_classes=10).state_dict())
    task, _ = _fit_one_step(flanders_root, tmp_path, compile=True, compile_mode="reduce-overhead")
    assert len(calls) == 1 and "s2" in calls[0]  # the one training step went through the compiled callable
    assert set(task.state_dict()) == eager_keys  # no "_orig_mod." keys: checkpoints stay interchangeable


def test_task_compile_error_names_the_option(flanders_root, tmp_path, monkeypatch):
    monkeypatch.setattr(speed, "compile_unavailable_reason", lambda device_type: "no C++ compiler (test)")
    with pytest.raises(CropScaleError, match="model.compile=true: torch.compile is unavailable on cpu"):
        _fit_one_step(flanders_root, tmp_path, compile=True)


def test_task_refuses_an_unknown_compile_mode_at_construction():
    with pytest.raises(CropScaleError, match="model.compile_mode must be one of default"):
        CropMappingTask(net_kwargs=SMALL_NET, compile_mode="fastest")
