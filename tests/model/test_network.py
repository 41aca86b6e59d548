"""CropMappingNet: size, shapes, missing modalities, masks, channels_last, gradients, FLOPs, synthetic
batches, the summary command, and overfitting one real batch of the bundled sample."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import numpy as np
import pytest
import torch

from cropscale import CropScaleError
from cropscale.batch import HR_SCALE, ID_KEYS, MODEL_INPUT_KEYS, TARGET_KEYS, model_inputs
from cropscale.model.flops import flops_per_sample
from cropscale.model.losses import MultiTaskLoss
from cropscale.model.network import CropMappingNet, count_parameters
from cropscale.model.synthetic import synthetic_batch

STUDY_PARAMETERS = 1_947_456


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def net() -> CropMappingNet:
    torch.manual_seed(0)
    return CropMappingNet().eval()


def _run(net: CropMappingNet, batch: dict) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return net(**model_inputs(batch))


# ----------------------------------------------------------------------------- size


def test_parameter_count_within_one_percent_of_the_study():
    n = count_parameters(CropMappingNet(num_classes=10))
    assert abs(n - STUDY_PARAMETERS) / STUDY_PARAMETERS <= 0.01
    assert n == 1_947_936  # the count printed in docs/package.md
    # 20 classes (PASTIS): only the 1x1 semantic classifier grows, by (head_dim + 1) per class.
    net20 = CropMappingNet(num_classes=20)
    assert count_parameters(net20) == n + 10 * (net20.semantic_head[1].in_channels + 1)
    assert abs(count_parameters(net20) - STUDY_PARAMETERS) / STUDY_PARAMETERS <= 0.01


def test_no_batchnorm_anywhere():
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in CropMappingNet().modules())


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("b", [1, 4])
def test_output_shapes_for_the_seed_tensors(net, b):
    batch = synthetic_batch(b, t2=16, t1=4, height=32, width=32)
    assert batch["s2"].shape == (b, 16, 10, 32, 32) and batch["s1a"].shape == (b, 4, 2, 32, 32)
    out = _run(net, batch)
    assert set(out) == {"semantic", "parcel", "hr"}
    assert out["semantic"].shape == (b, 10, 32, 32)
    assert out["parcel"].shape == (b, 3, 32, 32)
    assert out["hr"].shape == (b, 3, 320, 320)
    assert all(torch.isfinite(v).all() for v in out.values())
    assert 0.0 <= out["hr"].min() and out["hr"].max() <= 1.0


@pytest.mark.parametrize(("t2", "t1", "h", "w"), [(7, 4, 32, 32), (1, 1, 8, 12), (3, 2, 20, 16)])
def test_other_dates_and_sizes(net, t2, t1, h, w):
    out = _run(net, synthetic_batch(2, t2=t2, t1=t1, height=h, width=w))
    assert out["semantic"].shape == (2, 10, h, w)
    assert out["parcel"].shape == (2, 3, h, w)
    assert out["hr"].shape == (2, 3, HR_SCALE * h, HR_SCALE * w)


def test_hr_scale_is_configurable():
    out = _run(CropMappingNet(hr_scale=3).eval(), synthetic_batch(1, t2=2, t1=1, height=8, width=8))
    assert out["hr"].shape == (1, 3, 24, 24)


@pytest.mark.parametrize(("h", "w"), [(30, 32), (32, 18), (2, 32)])
def test_size_not_a_multiple_of_the_stride_raises(net, h, w):
    batch = synthetic_batch(1, t2=2, t1=1, height=h, width=w)
    with pytest.raises(CropScaleError, match="multiples of the FPN stride 4"):
        _run(net, batch)


def test_bad_inputs_raise_clear_errors(net):
    batch = synthetic_batch(1, t2=2, t1=1, height=8, width=8)
    with pytest.raises(CropScaleError, match="s2 must be"):
        net(**{**model_inputs(batch), "s2": batch["s2"][:, :, :4]})
    with pytest.raises(CropScaleError, match="s2_mask"):
        net(**{**model_inputs(batch), "s2_mask": batch["s2_mask"][:, :, :4]})
    with pytest.raises(CropScaleError, match="s1a_doy"):
        net(**{**model_inputs(batch), "s1a_doy": None})
    with pytest.raises(CropScaleError, match="floating-point"):
        net(**{**model_inputs(batch), "s2": batch["s2"].to(torch.int16)})


# ----------------------------------------------------------------------------- missing modalities


def test_orbit_missing_for_the_batch_uses_the_missing_embedding(net):
    batch = synthetic_batch(2, t2=4, t1=3, height=16, width=16)
    full = _run(net, batch)
    none = _run(net, {**batch, "s1d": None, "s1d_doy": None, "s1d_mask": None})
    # None for the batch == present with an all-False mask: both use the learned embedding.
    off = _run(net, {**batch, "s1d_mask": torch.zeros_like(batch["s1d_mask"])})
    for k in full:
        torch.testing.assert_close(none[k], off[k], rtol=1e-5, atol=1e-5)
        assert (none[k] - full[k]).abs().max() > 1e-4  # the orbit did carry information


def test_orbit_absent_for_one_sample(net):
    batch = synthetic_batch(2, t2=4, t1=3, height=16, width=16)
    full = _run(net, batch)
    mask = batch["s1a_mask"].clone()
    mask[1] = False
    part = _run(net, {**batch, "s1a_mask": mask})
    # Sample 0 is unchanged (GroupNorm/LayerNorm are per sample), sample 1 changed ...
    for k in full:
        torch.testing.assert_close(part[k][0], full[k][0], rtol=1e-5, atol=1e-5)
        assert (part[k][1] - full[k][1]).abs().max() > 1e-4
    # ... and its absent orbit's values are ignored (not zeros pretending to be data).
    junk = batch["s1a"].clone()
    junk[1] = 1e3 * torch.randn_like(junk[1])
    again = _run(net, {**batch, "s1a": junk, "s1a_mask": mask})
    alone = _run(net, {k: (v[1:] if v is not None else None) for k, v in
                       {**batch, "s1a": None, "s1a_doy": None, "s1a_mask": None}.items()})
    for k in full:
        torch.testing.assert_close(again[k], part[k], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(alone[k][0], part[k][1], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- masks


def test_masked_dates_do_not_influence_the_output(net):
    batch = synthetic_batch(2, t2=6, t1=2, height=16, width=16)
    date_mask = torch.ones(2, 6, dtype=torch.bool)
    date_mask[:, 2] = False
    ref = _run(net, {**batch, "s2_mask": date_mask})
    s2 = batch["s2"].clone()
    s2[:, 2] = 50.0 * torch.randn_like(s2[:, 2])
    out = _run(net, {**batch, "s2": s2, "s2_mask": date_mask})
    for k in ref:
        torch.testing.assert_close(out[k], ref[k], rtol=1e-5, atol=1e-5)
    # Without the mask the same perturbation does change the output.
    unmasked = _run(net, {**batch, "s2": s2, "s2_mask": None})
    assert (unmasked["semantic"] - ref["semantic"]).abs().max() > 1e-3


def _garbage_under(x: torch.Tensor, masked: torch.Tensor, seed: int) -> torch.Tensor:
    """``x`` with random values, NaN, +Inf and -Inf written where ``masked`` ([B, T, H, W] bool) is True."""
    g = torch.Generator().manual_seed(seed)
    noise = 50.0 * torch.randn(x.shape, generator=g)
    pick = torch.randint(0, 4, x.shape, generator=g)
    noise = torch.where(pick == 1, torch.nan, torch.where(pick == 2, torch.inf, torch.where(pick == 3, -torch.inf,
                                                                                             noise)))
    return torch.where(masked[:, :, None], noise, x).contiguous()


@pytest.mark.parametrize("seed", [0, 1])
def test_values_under_a_per_pixel_mask_change_no_output(net, seed):
    """Random values, NaN and Inf under a per-pixel cloud mask (a 5 x 5 cloud on three dates, scattered
    cloudy pixels, one pixel never clear) change no output at any pixel: not the cloudy pixels' own,
    not their neighbours' (3 x 3 stem, GroupNorm statistics, FPN)."""
    batch = synthetic_batch(2, t2=6, t1=2, height=16, width=16, seed=seed)
    # the same memory layout for both runs (the convolution's summation order depends on it)
    batch["s2"] = batch["s2"].contiguous()
    g = torch.Generator().manual_seed(100 + seed)
    mask = torch.rand(2, 6, 16, 16, generator=g) > 0.2  # ~20 % scattered cloudy pixels
    mask[:, 1:4, 4:9, 6:11] = False                     # a 5 x 5 cloud on three dates
    mask[1, :, 12, 3] = False                           # a pixel never clear
    ref = _run(net, {**batch, "s2_mask": mask})
    out = _run(net, {**batch, "s2": _garbage_under(batch["s2"], ~mask, seed), "s2_mask": mask})
    for k in ref:
        assert torch.isfinite(out[k]).all(), k
        assert (out[k] - ref[k]).abs().max() == 0.0, (k, float((out[k] - ref[k]).abs().max()))
    # the same garbage without the mask does reach the outputs (the check can fail)
    leaked = _run(net, {**batch, "s2": _garbage_under(batch["s2"], ~mask, seed).nan_to_num(0.0, 0.0, 0.0),
                        "s2_mask": None})
    assert (leaked["semantic"] - ref["semantic"]).abs().max() > 1e-3


def test_values_under_a_per_date_mask_change_no_output_sentinel1_included(net):
    """Per-date masks: NaN and random values on masked S2 dates and masked S1 dates change nothing."""
    batch = synthetic_batch(2, t2=5, t1=3, height=16, width=16)
    batch["s2"], batch["s1a"] = batch["s2"].contiguous(), batch["s1a"].contiguous()
    s2_mask = torch.ones(2, 5, dtype=torch.bool)
    s2_mask[0, 1] = s2_mask[1, 4] = False
    s1a_mask = torch.tensor([[True, False, True], [True, True, False]])
    ref = _run(net, {**batch, "s2_mask": s2_mask, "s1a_mask": s1a_mask})
    per_pixel_s2 = (~s2_mask)[:, :, None, None].expand(2, 5, 16, 16)
    per_pixel_s1 = (~s1a_mask)[:, :, None, None].expand(2, 3, 16, 16)
    out = _run(net, {**batch, "s2_mask": s2_mask, "s1a_mask": s1a_mask,
                     "s2": _garbage_under(batch["s2"], per_pixel_s2, 3),
                     "s1a": _garbage_under(batch["s1a"], per_pixel_s1, 4)})
    for k in ref:
        assert (out[k] - ref[k]).abs().max() == 0.0, k


def test_pixel_with_no_valid_date_gives_finite_outputs(net):
    batch = synthetic_batch(2, t2=5, t1=2, height=16, width=16)
    mask = batch["s2_mask"].clone()
    mask[0, :, 3, 7] = False      # one pixel never observed
    mask[1] = False               # a whole sample never observed
    out = _run(net, {**batch, "s2_mask": mask})
    assert all(torch.isfinite(v).all() for v in out.values())
    per_date = torch.zeros(2, 5, dtype=torch.bool)
    out = _run(net, {**batch, "s2_mask": per_date})
    assert all(torch.isfinite(v).all() for v in out.values())


# ----------------------------------------------------------------------------- memory format


def test_channels_last_gives_the_same_outputs():
    torch.manual_seed(1)
    ref_net = CropMappingNet().eval()
    cl_net = CropMappingNet().eval()
    cl_net.load_state_dict(ref_net.state_dict())
    cl_net = cl_net.to(memory_format=torch.channels_last)
    batch = synthetic_batch(2, t2=4, t1=2, height=16, width=16)
    ref, out = _run(ref_net, batch), _run(cl_net, batch)
    assert out["hr"].is_contiguous(memory_format=torch.channels_last)
    for k in ref:
        torch.testing.assert_close(out[k], ref[k], rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- one optimisation step


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_one_step_gives_every_parameter_a_finite_gradient(precision):
    torch.manual_seed(0)
    net = CropMappingNet().train()
    batch = synthetic_batch(2, t2=5, t1=3, height=16, width=16, seed=3)
    batch["s1a_mask"][0] = False  # each orbit absent in one sample: the missing embeddings learn too,
    batch["s1d_mask"][1] = False  # and each encoder still sees one sample
    loss_fn = MultiTaskLoss()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
        outputs = net(**model_inputs(batch))
        loss, terms = loss_fn(outputs, batch)
    if precision == "bf16-mixed":
        assert outputs["semantic"].dtype == torch.bfloat16
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    opt.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    assert torch.isfinite(norm)
    for name, p in net.named_parameters():
        assert p.grad is not None, f"{name} received no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().max() > 0, f"{name} has an all-zero gradient (dead branch)"
    opt.step()
    for prefix in ("s1a_encoder.", "s1d_encoder.", "decoder_hr.", "decoder_mid.", "s1a_missing", "s1d_missing"):
        assert any(not torch.equal(p, before[n]) for n, p in net.named_parameters() if n.startswith(prefix))


# ----------------------------------------------------------------------------- FLOPs


def test_flops_per_sample_is_positive_and_linear_in_pixels():
    torch.manual_seed(0)
    net = CropMappingNet()
    f = flops_per_sample(net, t2=4, t1=2, height=16, width=16)
    assert set(f) == {"forward", "backward", "total"}
    assert all(isinstance(v, int) and v > 0 for v in f.values())
    assert f["total"] == f["forward"] + f["backward"]
    assert 1.5 * f["forward"] < f["backward"] < 2.5 * f["forward"]
    # Every counted op (convolutions, per-pixel attention and MLPs) is linear in H x W.
    g = flops_per_sample(net, t2=4, t1=2, height=32, width=16)
    assert g["forward"] == 2 * f["forward"] and g["backward"] == 2 * f["backward"]
    assert all(p.grad is None for p in net.parameters())  # .grad untouched


# ----------------------------------------------------------------------------- synthetic batches


def test_synthetic_batch_follows_the_contract():
    b = synthetic_batch(3, t2=5, t1=2, height=16, width=24, num_classes=7, s1d=False, seed=4)
    assert set(b) == set(MODEL_INPUT_KEYS) | set(TARGET_KEYS) | set(ID_KEYS)
    shapes = {"s2": (3, 5, 10, 16, 24), "s2_doy": (3, 5), "s2_mask": (3, 5, 16, 24),
              "s1a": (3, 2, 2, 16, 24), "s1a_doy": (3, 2), "s1a_mask": (3, 2),
              "s1d": (3, 2, 2, 16, 24), "s1d_doy": (3, 2), "s1d_mask": (3, 2),
              "semantic": (3, 16, 24), "parcel": (3, 3, 16, 24), "parcel_present": (3,),
              "hr": (3, 3, 160, 240), "hr_present": (3,), "patch_id": (3,), "crop_yx": (3, 2)}
    for k, s in shapes.items():
        assert tuple(b[k].shape) == s, k
    for k in ("s2", "s1a", "s1d", "parcel", "hr"):
        assert b[k].dtype == torch.float32, k
    for k in ("s2_doy", "s1a_doy", "semantic", "patch_id", "crop_yx"):
        assert b[k].dtype == torch.int64, k
    for k in ("s2_mask", "s1a_mask", "s1d_mask", "parcel_present", "hr_present"):
        assert b[k].dtype == torch.bool, k
    assert b["s1a_mask"].all() and not b["s1d_mask"].any() and (b["s1d"] == 0).all()
    assert ((b["s2_doy"] >= 1) & (b["s2_doy"] <= 366)).all() and (b["s2_doy"].diff(dim=1) >= 0).all()
    assert ((b["semantic"] >= 0) & (b["semantic"] < 7)).all()
    extent, boundary, dist = b["parcel"].unbind(1)
    torch.testing.assert_close(extent, (b["semantic"] > 0).float())
    assert (boundary <= extent).all() and (dist[extent == 0] == 0).all()
    assert dist.min() >= 0 and dist.max() <= 1 and (dist[boundary == 1] == 0).all()
    assert b["hr"].min() >= 0 and b["hr"].max() <= 1
    again = synthetic_batch(3, t2=5, t1=2, height=16, width=24, num_classes=7, s1d=False, seed=4)
    assert all(torch.equal(b[k], again[k]) for k in b)
    assert not torch.equal(b["s2"], synthetic_batch(3, t2=5, t1=2, height=16, width=24, seed=5)["s2"])
    with pytest.raises(CropScaleError, match="t2"):
        synthetic_batch(1, t2=0)


# ----------------------------------------------------------------------------- summary command


def test_summary_prints_parameters_and_flops(capsys):
    from cropscale.bench.summary import main

    assert main(["--num-classes", "20", "--t2", "2", "--t1", "1", "--height", "8", "--width", "8"]) == 0
    out = capsys.readouterr().out
    assert f"{count_parameters(CropMappingNet(num_classes=20)):,}" in out
    f = flops_per_sample(CropMappingNet(num_classes=20), t2=2, t1=1, height=8, width=8)
    assert f"{f['total'] / 1e9:10.3f} GFLOP" in out
    assert "[count: " in out and "measured-microbenchmark" not in out  # counts, not timings
    with pytest.raises(CropScaleError):
        main(["--height", "0"])


# ----------------------------------------------------------------------------- numerics on real data


def _doy(yyyymmdd: int | str) -> int:
    s = str(yyyymmdd)
    return date(int(s[:4]), int(s[4:6]), int(s[6:8])).timetuple().tm_yday


def real_batch(root: Path, patch: int = 1001, rows: tuple[int, ...] = (0, 11, 21, 32), t2: int = 16,
               t1: int = 4, size: int = 32) -> dict[str, torch.Tensor]:
    """Four 32x32 crops (top rows ``rows``, column 0) of a worldcereal-flanders patch: 16 evenly
    spaced S2 dates (per-band z-score over the patch's clear pixels, its cloud mask), VV/VH of 4
    evenly spaced S1A dates (per-channel z-score), S1D absent (zeros, all-False mask), TARGET
    channel 0, no parcel target, and the aligned x10 crop of DATA_SPOT/SPOT_<id>.tif / 255."""
    import rasterio
    from rasterio.windows import Window

    meta = json.loads((root / "metadata.geojson").read_text())
    props = next(f["properties"] for f in meta["features"] if f["properties"]["ID_PATCH"] == patch)
    s2 = np.load(root / "DATA_S2" / f"S2_{patch}.npy").astype(np.float32)
    clear = np.load(root / "DATA_S2_MASK" / f"MASK_{patch}.npy").astype(bool)
    s1 = np.load(root / "DATA_S1A" / f"S1A_{patch}.npy")[:, :2].astype(np.float32)
    target = np.load(root / "ANNOTATIONS" / f"TARGET_{patch}.npy")[0].astype(np.int64)
    doy2 = np.array([_doy(props["dates-S2"][str(i)]) for i in range(len(s2))])
    doy1 = np.array([_doy(props["dates-S1A"][str(i)]) for i in range(len(s1))])
    i2 = np.linspace(0, len(s2) - 1, t2).round().astype(int)
    i1 = np.linspace(0, len(s1) - 1, t1).round().astype(int)
    w = np.broadcast_to(clear[:, None], s2.shape)
    mean = (s2 * w).sum(axis=(0, 2, 3)) / w.sum(axis=(0, 2, 3))
    std = np.sqrt((((s2 - mean[:, None, None]) ** 2) * w).sum(axis=(0, 2, 3)) / w.sum(axis=(0, 2, 3)))
    s2 = ((s2 - mean[:, None, None]) / std[:, None, None]).astype(np.float32)
    s1 = (s1 - s1.mean(axis=(0, 2, 3), keepdims=True)) / s1.std(axis=(0, 2, 3), keepdims=True)
    with rasterio.open(root / "DATA_SPOT" / f"SPOT_{patch}.tif") as src:
        hr = np.stack([src.read(window=Window(0, HR_SCALE * y, HR_SCALE * size, HR_SCALE * size)) for y in rows])
    b = len(rows)

    def crop(a: np.ndarray) -> np.ndarray:
        return np.stack([a[..., y:y + size, :size] for y in rows])

    batch = {
        "s2": crop(s2[i2]), "s2_doy": np.tile(doy2[i2], (b, 1)), "s2_mask": crop(clear[i2]),
        "s1a": crop(s1[i1]), "s1a_doy": np.tile(doy1[i1], (b, 1)), "s1a_mask": np.ones((b, t1), bool),
        "s1d": np.zeros((b, t1, 2, size, size), np.float32), "s1d_doy": np.ones((b, t1), np.int64),
        "s1d_mask": np.zeros((b, t1), bool),
        "semantic": crop(target), "parcel": np.zeros((b, 3, size, size), np.float32),
        "parcel_present": np.zeros(b, bool),
        "hr": hr.astype(np.float32) / 255.0, "hr_present": np.ones(b, bool),
        "patch_id": np.full(b, patch), "crop_yx": np.array([[y, 0] for y in rows]),
    }
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}


def test_overfits_one_real_batch(flanders_root):
    batch = real_batch(flanders_root)
    assert batch["s2"].shape == (4, 16, 10, 32, 32) and batch["hr"].shape == (4, 3, 320, 320)
    assert batch["s2"].dtype == torch.float32 and batch["s2_mask"].any()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    net = CropMappingNet(num_classes=10).train()
    loss_fn = MultiTaskLoss()
    opt = torch.optim.AdamW(net.parameters(), lr=5e-3)
    losses = []
    for _ in range(12):  # bound; measured: halved after 6 steps
        loss, terms = loss_fn(net(**model_inputs(batch)), batch)
        assert torch.isfinite(loss) and terms["parcel"] == 0
        losses.append(loss.item())
        if loss.item() <= 0.5 * losses[0]:
            break
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
    assert losses[-1] <= 0.5 * losses[0], losses
