"""Tests of cropscale.tiling.sliding_window_inference with tiny stand-in networks."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cropscale import CropScaleError
from cropscale.tiling import (
    Tile,
    TilingStats,
    _pad_index,
    blend_window_1d,
    plan_tiles,
    sliding_window_inference,
    tile_starts,
)

torch.set_num_threads(1)


def _inputs(b=2, t=3, h=16, w=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "s2": torch.randn(b, t, 10, h, w, generator=g),
        "s2_doy": torch.randint(1, 367, (b, t), generator=g),
        "s2_mask": torch.rand(b, t, h, w, generator=g) > 0.2,
        "s1a": torch.randn(b, 2, 2, h, w, generator=g),
        "s1a_doy": torch.randint(1, 367, (b, 2), generator=g),
        "s1a_mask": torch.ones(b, 2, dtype=torch.bool),
    }


def _ramp_net(hr_scale):
    """Elementwise in the input plus a ramp over tile coordinates: NOT translation-equivariant, so the
    stitched map shows exactly which tile each pixel came from."""

    def net(s2, s2_doy, s2_mask, s1a, s1a_doy, s1a_mask):
        n, _, _, h, w = s2.shape
        ramp = torch.arange(h * w, dtype=torch.float32).reshape(h, w)
        sem = s2[:, 0, :4] * 2.0 + s1a[:, 1, :1] + ramp
        hr = sem[:, :3].repeat_interleave(hr_scale, -2).repeat_interleave(hr_scale, -1)
        hr = hr + torch.arange((h * hr_scale) * (w * hr_scale), dtype=torch.float32).reshape(h * hr_scale, -1)
        return {"semantic": sem, "parcel": s2[:, 1, :3] - 1.0, "hr": hr}

    return net


@pytest.mark.parametrize("blend", ["hann", "uniform"])
def test_stride_equal_window_stitches_tiles_exactly(blend):
    window, hr = 8, 3
    inputs = _inputs(b=2, h=16, w=24)
    net = _ramp_net(hr)
    stats = TilingStats()
    out = sliding_window_inference(net, inputs, window=window, stride=window, hr_scale=hr, blend=blend,
                                   tile_batch_size=5, stats=stats)
    assert stats.tiles_per_patch == 6 and stats.num_tiles == 12 and stats.num_net_calls == 3
    assert stats.padded_size == (16, 24) and stats.pad_before == (0, 0)
    expected = {k: torch.zeros_like(v) for k, v in out.items()}
    for b in range(2):
        for y in range(0, 16, window):
            for x in range(0, 24, window):
                tile = {k: (v[b:b + 1, ..., y:y + window, x:x + window] if v.dim() >= 3 else v[b:b + 1])
                        for k, v in inputs.items()}
                o = net(**tile)
                for k in ("semantic", "parcel"):
                    expected[k][b, :, y:y + window, x:x + window] = o[k][0]
                expected["hr"][b, :, y * hr:(y + window) * hr, x * hr:(x + window) * hr] = o["hr"][0]
    assert out["semantic"].shape == (2, 4, 16, 24) and out["hr"].shape == (2, 3, 48, 72)
    for k in out:
        assert torch.equal(out[k], expected[k]), k


@pytest.mark.parametrize("padding", ["reflect", "replicate", "zeros", "shift"])
@pytest.mark.parametrize("blend", ["hann", "uniform"])
def test_constant_model_gives_the_constant_everywhere_on_odd_sizes(padding, blend):
    h, w, window, hr = 50, 37, 16, 10

    def net(s2, **_):
        n = s2.shape[0]
        return {"semantic": torch.full((n, 5, window, window), 2.5),
                "parcel": torch.full((n, 3, window, window), -1.25),
                "hr": torch.full((n, 3, window * hr, window * hr), 0.375)}

    stats = TilingStats()
    out = sliding_window_inference(net, _inputs(b=1, h=h, w=w), window=window, stride=5, hr_scale=hr,
                                   blend=blend, padding=padding, stats=stats)
    assert out["semantic"].shape == (1, 5, h, w) and out["parcel"].shape == (1, 3, h, w)
    assert out["hr"].shape == (1, 3, h * hr, w * hr)
    # every pixel of both grids is covered (a pixel with zero weight would raise) and the weights normalise
    torch.testing.assert_close(out["semantic"], torch.full_like(out["semantic"], 2.5), rtol=1e-6, atol=0)
    torch.testing.assert_close(out["parcel"], torch.full_like(out["parcel"], -1.25), rtol=1e-6, atol=0)
    torch.testing.assert_close(out["hr"], torch.full_like(out["hr"], 0.375), rtol=1e-6, atol=0)
    if padding == "shift":
        assert stats.starts_y[-1] + window == h and stats.starts_x[-1] + window == w
    else:
        assert stats.starts_y[-1] + window == stats.padded_size[0] >= h
        assert stats.starts_x[-1] + window == stats.padded_size[1] >= w


class _PointwiseNet(torch.nn.Module):
    """One 1x1 convolution (translation-equivariant, no padding effects) on the time means of S2 and S1;
    the high grid is its nearest-neighbour x hr_scale upsampling (equivariant to shifts by whole 10 m pixels)."""

    def __init__(self, hr_scale):
        super().__init__()
        torch.manual_seed(3)
        self.conv = torch.nn.Conv2d(12, 8, kernel_size=1)
        self.hr_scale = hr_scale

    def forward(self, s2, s2_doy, s2_mask, s1a, s1a_doy, s1a_mask):
        x = torch.cat([(s2 * s2_mask[:, :, None]).mean(1), s1a.mean(1)], dim=1)
        y = self.conv(x)
        return {"semantic": y[:, :5], "parcel": y[:, 5:], "hr": torch.sigmoid(
            F.interpolate(y[:, :3], scale_factor=self.hr_scale, mode="nearest"))}


@pytest.mark.parametrize("padding", ["reflect", "zeros", "shift"])
def test_translation_equivariant_model_tiled_equals_untiled(padding):
    net = _PointwiseNet(hr_scale=10)
    inputs = _inputs(b=2, h=50, w=37, seed=1)
    with torch.no_grad():
        tiled = sliding_window_inference(net, inputs, window=16, padding=padding)
        whole = net(**inputs)
    for k in whole:
        assert tiled[k].shape == whole[k].shape
        # the 1x1 conv has no padding effects, so the whole patch (borders included) must agree
        torch.testing.assert_close(tiled[k], whole[k], rtol=0, atol=1e-5)


def test_tiles_of_all_patches_are_batched_and_non_spatial_inputs_repeated():
    b, h, w, window = 3, 16, 16, 8
    inputs = _inputs(b=b, h=h, w=w)
    for i in range(b):
        inputs["s2"][i] = float(i + 1)
        inputs["s2_doy"][i] = 100 * (i + 1)
    calls = []

    def net(s2, s2_doy, s2_mask, s1a, s1a_doy, s1a_mask):
        calls.append(s2.shape[0])
        assert s2.shape[-2:] == (window, window) and s2_mask.shape[-2:] == (window, window)
        assert s2_doy.shape == (s2.shape[0], 3) and s1a_mask.shape == (s2.shape[0], 2)
        # each tile's non-spatial inputs are those of its own patch
        assert torch.equal(s2_doy[:, 0].float(), 100 * s2[:, 0, 0, 0, 0])
        n = s2.shape[0]
        return {"semantic": s2[:, 0, :2], "hr": torch.zeros(n, 3, 2 * window, 2 * window)}

    stats = TilingStats()
    out = sliding_window_inference(net, inputs, window=window, hr_scale=2, tile_batch_size=16, stats=stats)
    assert stats.tiles_per_patch == 9 and stats.num_tiles == 27
    assert calls == [16, 11] and stats.num_net_calls == 2
    for i in range(b):
        torch.testing.assert_close(out["semantic"][i], torch.full((2, h, w), float(i + 1)), rtol=1e-6, atol=0)


def test_uncovered_pixels_raise_before_the_network_runs():
    def net(**_):
        raise AssertionError("the network must not run")

    with pytest.raises(CropScaleError, match="covered by no tile"):
        sliding_window_inference(net, _inputs(b=1, h=30, w=30), window=8, stride=10)
    with pytest.raises(CropScaleError, match="covered by no tile"):
        sliding_window_inference(net, _inputs(b=1, h=30, w=30), window=8, stride=10, padding="shift")


def test_bad_arguments_and_outputs_raise_clear_errors():
    inputs = _inputs(b=1, h=12, w=12)
    ok = _ramp_net(2)
    with pytest.raises(CropScaleError, match="padding"):
        sliding_window_inference(ok, inputs, window=8, padding="mirror")
    with pytest.raises(CropScaleError, match="blend"):
        sliding_window_inference(ok, inputs, window=8, blend="gauss")
    with pytest.raises(CropScaleError, match="window"):
        sliding_window_inference(ok, inputs, window=0)
    with pytest.raises(CropScaleError, match="padding='shift'"):
        sliding_window_inference(ok, _inputs(b=1, h=6, w=12), window=8, padding="shift")
    with pytest.raises(CropScaleError, match="'s2'"):
        sliding_window_inference(ok, {"s1a": inputs["s1a"]}, window=8)
    bad = dict(inputs, s2_doy=torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(CropScaleError, match="s2_doy"):
        sliding_window_inference(ok, bad, window=8)

    def wrong_size(s2, **_):
        return {"semantic": torch.zeros(s2.shape[0], 2, 7, 7)}

    with pytest.raises(CropScaleError, match="'semantic' has spatial size"):
        sliding_window_inference(wrong_size, inputs, window=8)


def test_patch_smaller_than_window_is_reflect_padded():
    out = sliding_window_inference(_PointwiseNet(hr_scale=2), _inputs(b=1, h=5, w=3), window=8, hr_scale=2)
    assert out["semantic"].shape == (1, 5, 5, 3) and out["hr"].shape == (1, 3, 10, 6)


def test_reflect_padding_matches_numpy_for_any_pad_width():
    for size, before, after in [(5, 2, 3), (5, 7, 9), (2, 5, 4), (1, 3, 3)]:
        idx = _pad_index(size, before, after, "reflect", torch.device("cpu")).numpy()
        ref = np.pad(np.arange(size), (before, after), mode="reflect" if size > 1 else "edge")
        np.testing.assert_array_equal(idx, ref)
    idx = _pad_index(4, 2, 1, "zeros", torch.device("cpu")).tolist()
    assert idx == [-1, -1, 0, 1, 2, 3, -1]


def test_tile_grid_and_hann_window():
    assert tile_starts(128, 32, 16) == (0, 0, [0, 16, 32, 48, 64, 80, 96])
    assert tile_starts(50, 16, 8) == (3, 3, [0, 8, 16, 24, 32, 40])
    assert tile_starts(50, 16, 8, "shift") == (0, 0, [0, 8, 16, 24, 32, 34])
    assert tile_starts(5, 8, 4) == (1, 2, [0])
    # unfloored Hann sampled at pixel centres: overlapping windows at stride L/2 sum to exactly 1
    w = blend_window_1d(32, "hann", floor=0.0).double()
    torch.testing.assert_close(w[:16] + w[16:], torch.ones(16, dtype=torch.float64), rtol=0, atol=1e-7)
    assert float(w.min()) == pytest.approx(math.sin(math.pi * 0.5 / 32) ** 2, rel=1e-6)
    wf = blend_window_1d(32, "hann", floor=0.1)
    assert float(wf.min()) >= 0.1 and float(wf.max()) <= 1.0


def test_plan_is_data_decided_before_the_network():
    # H = 5, window 4, stride 4, reflect: 1 + ceil(1 / 4) = 2 rows of tiles covering 8 pixels, 3 extra
    # split 1 before / 2 after; W = 12: 1 + ceil(8 / 4) = 3 columns, no padding
    plan = plan_tiles(2, (5, 12), window=4, stride=4, hr_scale=2, blend="uniform", tile_batch_size=5)
    assert (plan.starts_y, plan.starts_x, plan.pad, plan.padded_size) == ([0, 4], [0, 4, 8], (1, 2, 0, 0), (8, 12))
    assert len(plan.tiles) == 2 * 2 * 3 and [len(b) for b in plan.batches] == [5, 5, 2]
    assert plan.tiles[5] == Tile(0, 4, 8) and plan.tiles[6] == Tile(1, 0, 0)  # patch-major, then row-major
    # stride == window: every pixel of both grids has exactly one tile, the weights are all 1
    assert torch.equal(plan.weight_sums[1], torch.ones(8, 12)) and torch.equal(plan.weight_sums[2], torch.ones(16, 24))
    assert torch.equal(plan.tile_weight(Tile(1, 4, 8), 2), torch.ones(8, 8))
    assert plan.crop(torch.zeros(3, 16, 24), 2).shape == (3, 10, 24)  # rows 2..12 of the high grid
    stats = TilingStats()
    plan.fill_stats(stats, net_calls=3)
    assert (stats.num_tiles, stats.tiles_per_patch, stats.pad_before, stats.num_net_calls) == (12, 6, (1, 0), 3)


def test_plan_weights_normalise_over_overlapping_tiles():
    # W = H = 8, window 4, stride 2: starts 0, 2, 4; tiles per pixel along an axis: 1, 1, 2, 2, 2, 2, 1, 1
    plan = plan_tiles(1, (8, 8), window=4, stride=2, hr_scale=1, blend="uniform")
    per_axis = torch.tensor([1.0, 1, 2, 2, 2, 2, 1, 1])
    assert torch.equal(plan.weight_sums[1], per_axis[:, None] * per_axis[None, :])
    assert torch.equal(plan.tile_weight(Tile(0, 2, 2), 1), torch.full((4, 4), 0.25))
    corner = 1.0 / (per_axis[:4, None] * per_axis[None, :4])  # rows / columns 0..3
    assert torch.equal(plan.tile_weight(Tile(0, 0, 0), 1), corner)
    with pytest.raises(CropScaleError, match="covered by no tile"):
        plan_tiles(1, (8, 8), window=2, stride=3, hr_scale=1)


def test_tiling_bench_runs_with_a_stand_in_model(capsys):
    from cropscale.bench.tiling import main

    assert main(["--model", "conv", "--height", "16", "--width", "24", "--window", "8", "--patches", "2",
                 "--t2", "2", "--t1", "2", "--repeats", "1", "--warmup", "0", "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "measured-microbenchmark" in text and "ratio" in text
    assert "15 tiles/patch" in text


# ------------------------------------------------------------------ brute-force reference (issue 36)
# Written from the module docstring only, in numpy float64: the grid by stepping a window along each axis,
# np.pad for the border, every window run through the network alone, the outputs weighted by the outer
# product of two floored Hann windows and averaged per pixel on the padded canvas, then cropped. The network
# below is NOT pointwise: a 5x5 conv then a 3x3 conv (receptive field 7x7, radius 3) with zero 'same' padding
# at the tile edge, so the padded band's content (up to 3 pixels wide here) reaches output pixels near the
# patch border, and tile outputs disagree near tile edges, so the blending weights matter.

_NP_PAD_MODES = {"reflect": "reflect", "replicate": "edge", "zeros": "constant"}


def _ref_grid(size, window, stride, padding):
    """``(pad_before, pad_after, starts)`` along one axis: windows step by ``stride`` from 0 until one reaches
    the border; with a padding mode the last one may run past it and the excess is split evenly (the odd
    pixel after); with "shift" the last one is pulled back to end on the border."""
    starts = [0]
    while starts[-1] + window < size:
        nxt = starts[-1] + stride
        starts.append(min(nxt, size - window) if padding == "shift" else nxt)
    extra = starts[-1] + window - size
    return extra // 2, extra - extra // 2, starts


def _ref_hann(length, floor):
    i = np.arange(length, dtype=np.float64)
    return floor + (1.0 - floor) * np.sin(np.pi * (i + 0.5) / length) ** 2


def _brute_force(net, inputs, window, stride, hr_scale, padding="reflect", blend="hann", floor=1e-3):
    """The tiled result computed window by window (dict of float64 numpy arrays ``[B, ..., H*s, W*s]``)."""
    b, h, w = inputs["s2"].shape[0], *inputs["s2"].shape[-2:]
    top, bottom, starts_y = _ref_grid(h, window, stride, padding)
    left, right, starts_x = _ref_grid(w, window, stride, padding)
    padded = {}
    for k, v in inputs.items():
        a = v.numpy()
        if v.dim() >= 3 and tuple(v.shape[-2:]) == (h, w) and padding != "shift":
            a = np.pad(a, [(0, 0)] * (a.ndim - 2) + [(top, bottom), (left, right)], mode=_NP_PAD_MODES[padding])
        padded[k] = a
    spatial = {k for k, v in inputs.items() if v.dim() >= 3 and tuple(v.shape[-2:]) == (h, w)}
    num, den = {}, {}
    for i in range(b):
        for y in starts_y:
            for x in starts_x:
                tile = {k: torch.from_numpy(np.ascontiguousarray(
                    a[i:i + 1, ..., y:y + window, x:x + window] if k in spatial else a[i:i + 1]))
                    for k, a in padded.items()}
                with torch.no_grad():
                    out = net(**tile)
                for k, o in out.items():
                    o = o[0].numpy().astype(np.float64)
                    s = o.shape[-1] // window
                    win = _ref_hann(window * s, floor) if blend == "hann" else np.ones(window * s)
                    weight = np.outer(win, win)
                    if k not in num:
                        hp, wp = starts_y[-1] + window, starts_x[-1] + window
                        num[k] = np.zeros((b, *o.shape[:-2], hp * s, wp * s))
                        den[k] = np.zeros((b, hp * s, wp * s))
                    ys, xs = slice(y * s, (y + window) * s), slice(x * s, (x + window) * s)
                    num[k][i, ..., ys, xs] += weight * o
                    den[k][i, ys, xs] += weight
    result = {}
    for k in num:
        s = num[k].shape[-1] // (starts_x[-1] + window)
        blended = num[k] / den[k][:, None]
        result[k] = blended[..., top * s:(top + h) * s, left * s:(left + w) * s]
    return result


class _ConvNet(torch.nn.Module):
    """Fixed random 5x5 then 3x3 convolutions (float64) on the masked S2 time mean (scaled by the mean
    day of year, so the per-tile non-spatial inputs matter), the observed fraction of the S2 mask and the S1
    time mean; the high grid is the bilinear x ``hr_scale`` upsampling of three output channels."""

    def __init__(self, hr_scale):
        super().__init__()
        g = torch.Generator().manual_seed(11)
        self.conv1 = torch.nn.Conv2d(13, 6, 5, padding=2, dtype=torch.float64)
        self.conv2 = torch.nn.Conv2d(6, 7, 3, padding=1, dtype=torch.float64)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64))
        self.hr_scale = hr_scale

    def forward(self, s2, s2_doy, s2_mask, s1a, s1a_doy, s1a_mask):
        m = s2_mask[:, :, None].to(s2.dtype)
        s2_mean = (s2 * m).sum(1) / m.sum(1).clamp(min=1.0)
        s2_mean = s2_mean * (1.0 + s2_doy.to(s2.dtype).mean(1) / 366.0)[:, None, None, None]
        x = torch.cat([s2_mean, m.mean(1), s1a.mean(1)], dim=1)
        y = self.conv2(torch.tanh(self.conv1(x)))
        hr = F.interpolate(y[:, :3], scale_factor=self.hr_scale, mode="bilinear", align_corners=False)
        return {"semantic": y[:, :4], "parcel": y[:, 4:], "hr": hr}


def _inputs64(b, h, w, seed):
    return {k: (v.double() if v.is_floating_point() else v) for k, v in _inputs(b=b, h=h, w=w, seed=seed).items()}


def _assert_matches_brute_force(inputs, window, stride, hr_scale, padding, blend="hann", floor=1e-3,
                                tile_batch_size=3):
    net = _ConvNet(hr_scale)
    stats = TilingStats()
    with torch.no_grad():
        tiled = sliding_window_inference(net, inputs, window=window, stride=stride, hr_scale=hr_scale,
                                         blend=blend, blend_floor=floor, tile_batch_size=tile_batch_size,
                                         padding=padding, stats=stats)
    ref = _brute_force(net, inputs, window, window // 2 if stride is None else stride, hr_scale, padding, blend,
                       floor)
    assert set(tiled) == set(ref)
    for k in ref:
        assert tiled[k].dtype == torch.float64 and tuple(tiled[k].shape) == ref[k].shape, k
        # the plan's window weights are float32: up to ~5e-7 of error on outputs of magnitude up to ~8
        np.testing.assert_allclose(tiled[k].numpy(), ref[k], rtol=1e-6, atol=1e-6, err_msg=k)
    return stats


@pytest.mark.parametrize("padding", ["reflect", "replicate", "zeros", "shift"])
def test_tiled_equals_brute_force_with_uneven_padding_and_a_wide_receptive_field(padding):
    # H = 15, window 8, stride 5: starts 0, 5, 10 cover 18 rows, 3 extra -> 1 before / 2 after (uneven);
    # W = 24: starts 0, 5, 10, 15, 20 cover 28 columns, 4 extra -> 2 / 2; the 7x7 receptive field spans the
    # band. The floor 0.1 makes the tile-edge weights large enough that a missing floor shows.
    stats = _assert_matches_brute_force(_inputs64(2, 15, 24, seed=5), window=8, stride=5, hr_scale=2,
                                        padding=padding, floor=0.1)
    if padding == "shift":
        assert (stats.starts_y, stats.starts_x, stats.pad_before) == ((0, 5, 7), (0, 5, 10, 15, 16), (0, 0))
    else:
        assert (stats.starts_y, stats.starts_x, stats.pad_before) == ((0, 5, 10), (0, 5, 10, 15, 20), (1, 2))


@pytest.mark.parametrize("blend", ["hann", "uniform"])
def test_tiled_equals_brute_force_at_the_default_stride_and_floor(blend):
    # window 6, default stride 3; H = 11 -> starts 0, 3, 6 (12 rows, 1 extra: 0 before / 1 after),
    # W = 13 -> starts 0, 3, 6, 9 (15 columns, 2 extra: 1 / 1)
    _assert_matches_brute_force(_inputs64(1, 11, 13, seed=6), window=6, stride=None, hr_scale=3,
                                padding="reflect", blend=blend)


@pytest.mark.parametrize("padding", ["reflect", "replicate", "zeros"])
def test_tiled_equals_brute_force_on_a_patch_smaller_than_the_window(padding):
    # H = 3, W = 5, window 8: one tile; 5 extra rows -> 2 / 3 (wider than the patch: reflect folds twice),
    # 3 extra columns -> 1 / 2; every output pixel sees padded pixels
    stats = _assert_matches_brute_force(_inputs64(2, 3, 5, seed=7), window=8, stride=4, hr_scale=2,
                                        padding=padding, floor=0.1)
    assert (stats.tiles_per_patch, stats.padded_size, stats.pad_before) == (1, (8, 8), (2, 1))


@pytest.mark.parametrize("padding", ["reflect", "replicate", "zeros", "shift"])
def test_tiled_equals_brute_force_when_the_grid_fits_the_patch_exactly(padding):
    # H = 13, W = 18, window 8, stride 5: starts 0, 5 and 0, 5, 10 end exactly on the border, no padding,
    # so every padding mode gives the same (unpadded) result
    stats = _assert_matches_brute_force(_inputs64(1, 13, 18, seed=8), window=8, stride=5, hr_scale=2,
                                        padding=padding, floor=0.1)
    assert (stats.starts_y, stats.starts_x, stats.padded_size, stats.pad_before) == ((0, 5), (0, 5, 10),
                                                                                     (13, 18), (0, 0))


def test_brute_force_reference_grid_matches_the_worked_examples():
    # the reference's own grid rule against hand-worked cases (so the reference is not trusted blindly)
    assert _ref_grid(50, 16, 8, "reflect") == (3, 3, [0, 8, 16, 24, 32, 40])
    assert _ref_grid(50, 16, 8, "shift") == (0, 0, [0, 8, 16, 24, 32, 34])
    assert _ref_grid(5, 8, 4, "zeros") == (1, 2, [0])
    assert _ref_grid(13, 8, 5, "reflect") == (0, 0, [0, 5])
    np.testing.assert_allclose(_ref_hann(4, 0.0), [0.1464466, 0.8535534, 0.8535534, 0.1464466], atol=1e-7)
