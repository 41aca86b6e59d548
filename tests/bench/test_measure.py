"""Measurement helpers with small stand-ins (and one smoke run against the real modules each),
and the all-reduce volume series of a real module (the Extra-P export: tests/scaling/test_extrap.py)."""


import numpy as np
import pytest
import torch
from torch import nn

from cropscale import CropScaleError
from cropscale.bench.measure import (
    allreduce_volume_vs_world_size,
    loader_time_vs_dates,
    speedup_and_karp_flatt,
    step_time_vs_batch,
    tiled_validation_time_vs_area,
    time_round_robin,
)
from cropscale.model.network import CropMappingNet
from cropscale.scaling.allreduce import MIB
from cropscale.scaling.assertions import check_scaling
from cropscale.scaling.series import ScalingSeries


class TinyNet(nn.Module):
    """Stand-in for CropMappingNet: same call convention, dict output."""

    num_classes = 3
    hr_scale = 2

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 3, 1)

    def forward(self, s2, s2_doy=None, s2_mask=None, **_):
        x = s2.mean(dim=1)  # [B, 4, H, W]
        return {"semantic": self.conv(x)}


def tiny_batch(b: int) -> dict:
    g = torch.Generator().manual_seed(b)
    return {"s2": torch.randn(b, 2, 4, 4, 4, generator=g), "s2_doy": torch.ones(b, 2, dtype=torch.int64),
            "target": torch.randn(b, 3, 4, 4, generator=g)}


def tiny_loss(outputs, batch):
    total = ((outputs["semantic"] - batch["target"]) ** 2).mean()
    return total, {"mse": total}


def test_time_round_robin_warms_up_then_interleaves():
    order = []
    calls = [lambda k=k: order.append(k) for k in range(3)]
    times = time_round_robin(calls, repetitions=2, warmup=1)
    assert order == [0, 1, 2, 0, 1, 2, 0, 1, 2]
    assert [len(t) for t in times] == [2, 2, 2] and all(v >= 0 for row in times for v in row)
    with pytest.raises(CropScaleError, match="repetitions"):
        time_round_robin(calls, repetitions=0)


def test_step_time_vs_batch_with_stand_ins_trains_and_times():
    torch.manual_seed(0)
    net = TinyNet()
    before = net.conv.weight.detach().clone()
    s = step_time_vs_batch((1, 2, 4), repetitions=3, warmup=1, net=net, loss=tiny_loss, make_batch=tiny_batch)
    assert s.x == [1.0, 2.0, 4.0] and [len(r) for r in s.y] == [3, 3, 3]
    assert all(v > 0 for r in s.y for v in r)
    assert (s.parameter, s.metric, s.unit, s.evidence, s.callpath) == (
        "batch_size", "step_time_s", "s", "measured-microbenchmark", "train_step")
    assert not torch.equal(before, net.conv.weight)  # 3 x (1 + 3) AdamW steps ran
    assert torch.get_num_threads() >= 1


def test_tiled_validation_vs_area_with_stand_ins():
    seen = []

    def infer(net, inputs, window, stride, hr_scale, tile_batch_size):
        seen.append((inputs["s2"].shape[-1], window, stride, hr_scale, tile_batch_size, net.training))
        return {}

    s = tiled_validation_time_vs_area((8, 16), window=4, repetitions=2, warmup=1, net=TinyNet(),
                                      make_inputs=lambda n: {"s2": torch.zeros(1, 1, 4, n, n)}, infer=infer)
    assert s.x == [64.0, 256.0] and [len(r) for r in s.y] == [2, 2]
    assert seen[0] == (8, 4, None, 2, 16, False)  # eval mode, the net's hr_scale
    assert len(seen) == 2 * (1 + 2)
    assert s.settings["stride"] == 2 and s.evidence == "measured-microbenchmark"


def test_loader_time_vs_dates_with_stand_in():
    pulled = {}

    def make_loader(t):
        class Loader:
            def __iter__(self):
                for _ in range(5):
                    pulled[t] = pulled.get(t, 0) + 1
                    yield t

        return Loader()

    s = loader_time_vs_dates((4, 8, 16), batches=3, repetitions=2, warmup=1, make_loader=make_loader)
    assert s.x == [4.0, 8.0, 16.0] and s.parameter == "t2" and s.unit == "s"
    assert pulled == {4: 9, 8: 9, 16: 9}  # (1 warm-up + 2 timed) passes x 3 batches
    with pytest.raises(CropScaleError, match="only 2 batches"):
        loader_time_vs_dates((4,), batches=3, repetitions=1, make_loader=lambda t: [1, 2])


def test_allreduce_volume_series_from_a_module_is_bounded():
    m = nn.Sequential(nn.Linear(100, 100), nn.Linear(100, 10))
    p = sum(q.numel() for q in m.parameters())
    s = allreduce_volume_vs_world_size((2, 4, 8, 16, 32, 64), module=m)
    assert s.evidence == "analytical-scenario" and s.settings["num_params"] == p
    for n, row in zip(s.x, s.y, strict=True):
        assert row == [pytest.approx(2 * (n - 1) / n * p * 4 / MIB)]
    verdict = check_scaling(s, expected="O(1)", negative_exponents=True)
    assert verdict.passed and verdict.order_ok, verdict.message()


def test_allreduce_volume_of_the_real_network():
    s = allreduce_volume_vs_world_size((2, 4, 8), module=CropMappingNet())
    # The study's model: 7.43 / 11.14 / 13.00 MiB for N = 2 / 4 / 8 at FP32 (+-0.01 MiB: the
    # implemented network has a few hundred parameters more or less than the study's 1,947,456).
    assert [round(r[0], 2) for r in s.y] == pytest.approx([7.43, 11.14, 13.00], abs=0.011)
    assert s.settings["grad_dtypes"] == ["float32"]


def test_helpers_run_against_the_real_modules():
    s = step_time_vs_batch((1, 2), repetitions=1, warmup=0, crop_size=4, t2=2, t1=1)
    assert s.settings["net"] == "CropMappingNet" and [len(r) for r in s.y] == [1, 1]
    t = tiled_validation_time_vs_area((8, 12), window=4, repetitions=1, warmup=0, t2=2, t1=1)
    assert t.x == [64.0, 144.0] and all(v[0] > 0 for v in t.y)


def test_speedup_and_karp_flatt():
    r = speedup_and_karp_flatt(10.0, 6.0, 2)
    assert r["speedup_vs_1_device"] == pytest.approx(10 / 6) and r["efficiency"] == pytest.approx(10 / 12)
    assert r["karp_flatt"] == pytest.approx((0.6 - 0.5) / 0.5)
    with pytest.raises(CropScaleError, match="t1_s"):
        speedup_and_karp_flatt(0.0, 1.0, 2)


def test_series_validation_and_table():
    with pytest.raises(CropScaleError, match="evidence"):
        ScalingSeries("x", "m", "s", [1.0], [[1.0]], "measured")
    with pytest.raises(CropScaleError, match="rows of y"):
        ScalingSeries("x", "m", "s", [1.0, 2.0], [[1.0]], "measured-run")
    s = ScalingSeries("batch_size", "step_time_s", "s", [1.0, 2.0], [[1.0, 3.0, 2.0], [4.0]], "measured-run")
    assert s.medians == [2.0, 4.0]
    assert s.table().splitlines()[2] == "| 1 | 2 | 1 | 3 | 3 | measured-run |"


def _series():
    return ScalingSeries("batch_size", "step_time_s", "s", [1.0, 2.0, 4.0, 8.0, 16.0],
                         [[0.1 * x + 0.01 * k for k in range(3)] for x in (1, 2, 4, 8, 16)],
                         "measured-microbenchmark", "train_step")


def test_series_fit_uses_the_parameter_name():
    m = _series().fit()
    assert m.variable == "batch_size" and m.lead_order.i == 1 and np.isfinite(m.smape)
