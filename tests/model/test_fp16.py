"""AMP FP16 trains the real network on the bundled data (issue 23, item 1).

Under ``16-mixed`` with a real ``torch.amp.GradScaler`` (on CPU through Lightning's ``MixedPrecision`` plugin),
every optimizer step used to be skipped whenever a sample had a date or an orbit with no valid pixel: the
bundled Flanders sample has no descending orbit, ``pastis-r-mini`` with ``t2=16`` has 13 padding dates. The
masked GroupNorm of the per-date stem took ``rsqrt(var + eps)`` of an all-masked image in fp16 (variance 0);
its backward, ``-0.5 (var + eps)^-1.5`` ~ 1.6e7 at eps 1e-5, is beyond fp16's largest value 65,504, and
``inf x 0`` gave NaN in the first convolution's gradient.

Each step here is checked against an independent FP32 computation: a copy of the same weights, the same
batch, the same loss, autocast off. Tolerance: fp16 rounds every convolution and matmul input to a unit
roundoff of u = 2^-11 = 4.9e-4; the relative error of a gradient grows with the depth of the forward and
backward chain (about 30 rounded products here), so the global gradient must agree with FP32 within
``64 u`` = 3.1 % in relative L2 norm, and every parameter tensor's gradient within ``64 u`` of its own
norm plus ``64 u`` of the global norm (a norm bias sums thousands of pixel terms that cancel, so its own norm
can be far below the rounding of its terms). FP32 gradients that are exactly 0 (the descending-orbit
encoder of a batch without that orbit) must be 0 in FP16 too: masked values must not leak, as NaN or
otherwise.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.plugins import MixedPrecision

from cropscale.batch import model_inputs
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.model.network import masked_group_norm
from cropscale.model.task import CropMappingTask

SMALL = dict(s2_dim=16, s2_depth=1, s2_heads=2, s1_dim=8, s1_depth=1, s1_heads=2, width=8, fpn_dim=16,
             head_dim=8, decoder_dim=8, hr_dim=4)
U16 = 2.0 ** -11   # fp16 unit roundoff
TOL = 64 * U16


class Fp16Probe(Callback):
    """Per optimizer step: the unscaled FP16 gradients, the FP32 gradients of the same weights and batch,
    the scaler's scale, and whether the weights changed."""

    def __init__(self) -> None:
        self.steps: list[dict] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch = batch
        self.before = {n: p.detach().clone() for n, p in pl_module.named_parameters()}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        # Lightning has unscaled the gradients here (MixedPrecision.optimizer_step: unscale_, then this hook)
        g16 = {n.removeprefix("net."): p.grad.detach().clone() for n, p in pl_module.named_parameters()
               if p.grad is not None}
        ref = copy.deepcopy(pl_module.net).float()
        with torch.autocast("cpu", enabled=False):
            loss, _ = pl_module.loss_fn(ref(**model_inputs(self.batch)), self.batch)
            loss.backward()
        g32 = {n: p.grad.detach() for n, p in ref.named_parameters() if p.grad is not None}
        self.steps.append({"g16": g16, "g32": g32, "scale": float(trainer.precision_plugin.scaler.get_scale())})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps[-1]["changed"] = any(not torch.equal(p, self.before[n]) for n, p in pl_module.named_parameters())


def _datamodule(which: str, flanders_root, pastis_mini_root) -> PastisHDDataModule:
    if which == "flanders":  # no descending orbit: s1d is zeros with an all-False date mask
        return PastisHDDataModule(str(flanders_root), batch_size=2, t2=16, t1=4, samples_per_patch=4)
    # 3 real dates padded to 16: 13 all-masked Sentinel-2 images per sample
    return PastisHDDataModule(str(pastis_mini_root), train_folds=[1], val_folds=[2], ignore_index=19, batch_size=2,
                              t2=16, t1=4, samples_per_patch=3)


def _fit_fp16(dm: PastisHDDataModule, steps: int) -> Fp16Probe:
    torch.manual_seed(0)
    task = CropMappingTask(num_classes=dm.num_classes, ignore_index=dm.ignore_index, net_kwargs=SMALL)
    probe = Fp16Probe()
    Trainer(accelerator="cpu", precision=None, plugins=[MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))],
            max_steps=steps, limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, gradient_clip_val=1.0, callbacks=[probe]).fit(task, datamodule=dm)
    return probe


def _calibration(steps: list[dict]) -> int:
    """Steps the scaler spent finding its scale: the leading run of steps after which it backed off."""
    n = 0
    for i, s in enumerate(steps[:-1]):
        if steps[i + 1]["scale"] < s["scale"] and not s["changed"]:
            n = i + 1
        else:
            break
    return n


@pytest.mark.parametrize("which", ["flanders", "pastis-padded"])
def test_fp16_gradients_are_finite_agree_with_fp32_and_every_step_trains(which, flanders_root, pastis_mini_root):
    probe = _fit_fp16(_datamodule(which, flanders_root, pastis_mini_root), steps=5)
    steps = probe.steps
    assert len(steps) == 5
    calib = _calibration(steps)
    assert calib <= 2, f"the scaler skipped {calib} leading steps (scales {[s['scale'] for s in steps]})"
    for i, s in enumerate(steps[calib:], start=calib):
        nonfinite = [n for n, g in s["g16"].items() if not torch.isfinite(g).all()]
        assert nonfinite == [], f"step {i}: non-finite FP16 gradient in {nonfinite[:4]}"
        assert s["changed"], f"step {i}: the weights did not change"
        g16, g32 = s["g16"], s["g32"]
        assert set(g16) == set(g32)
        total = math.sqrt(sum(float(g.double().norm()) ** 2 for g in g32.values()))
        diff = math.sqrt(sum(float((g16[n].double() - g.double()).norm()) ** 2 for n, g in g32.items()))
        assert diff <= TOL * total, f"step {i}: FP16 vs FP32 gradient relative L2 error {diff / total:.3g}"
        for n, g in g32.items():
            err = float((g16[n].double() - g.double()).norm())
            assert err <= TOL * float(g.double().norm()) + TOL * total, f"step {i}: {n} error {err:.3g}"
            if not g.any():
                assert not g16[n].any(), f"step {i}: {n} has an FP16 gradient where FP32's is exactly 0"


def test_masked_group_norm_matches_a_per_image_brute_force_in_fp32_and_fp16():
    """Mean and population variance over the valid pixels of each sample and group, by a Python loop in float64;
    an all-masked image included (mean 0, variance 0). FP16 input under autocast: finite gradients, the same
    values within fp16's resolution."""
    torch.manual_seed(1)
    norm = torch.nn.GroupNorm(2, 4)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(3, 4, 5, 6) * 3 + 1
    valid = torch.rand(3, 1, 5, 6) > 0.4
    valid[1] = False                               # an image without a valid pixel
    expected = torch.empty(3, 4, 5, 6, dtype=torch.float64)
    for b in range(3):
        for gi in range(2):
            xs = x[b, 2 * gi:2 * gi + 2].double()
            vals = xs[:, valid[b, 0]]
            mean = vals.mean() if vals.numel() else torch.tensor(0.0, dtype=torch.float64)
            var = ((vals - mean) ** 2).mean() if vals.numel() else torch.tensor(0.0, dtype=torch.float64)
            expected[b, 2 * gi:2 * gi + 2] = (xs - mean) / torch.sqrt(var + norm.eps)
    expected = expected * norm.weight.double()[None, :, None, None] + norm.bias.double()[None, :, None, None]
    got = masked_group_norm(x, valid, norm)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-5)

    xh = x.half().requires_grad_()
    with torch.autocast("cpu", dtype=torch.float16):
        y = masked_group_norm(xh, valid, norm)
    assert y.dtype == torch.float16
    (y.float() * valid).sum().mul(1024.0).backward()   # a loss-scaled upstream gradient
    assert torch.isfinite(xh.grad).all()
    assert not xh.grad[1].any()                          # the all-masked image gets no gradient
    assert torch.allclose(y.double(), expected, rtol=4 * U16, atol=8 * U16 * float(expected.abs().max()))
