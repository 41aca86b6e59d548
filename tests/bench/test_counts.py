"""Performance assertions on the project's own code that hold on a busy machine: exact counts, not
wall time (the timed ones are in test_perf.py, marked perf). Each count is also checked against an
independent computation, and a class below the truth is shown to fail (the assertion has teeth)."""

import math

import numpy as np
import pytest

from cropscale.bench.counts import (
    activation_bytes_vs_batch,
    allreduce_bytes_vs_world_size,
    flops_vs_batch,
    loader_bytes_vs_dates,
    ring_send_bytes,
    tile_count_vs_area,
)
from cropscale.model.flops import flops_per_sample
from cropscale.model.network import CropMappingNet
from cropscale.scaling.allreduce import gradient_payload
from cropscale.scaling.assertions import check_scaling

BATCHES = (1, 2, 4, 8, 16)


@pytest.fixture(scope="module")
def net():
    import torch

    torch.manual_seed(0)
    return CropMappingNet()


@pytest.mark.scaling("O(n)")
def test_training_step_flops_are_linear_in_the_batch(scaling, net):
    series = flops_vs_batch(BATCHES, net=net)
    assert series.evidence == "count"
    verdict = scaling(series)
    assert verdict.classes.within.term.order.i == 1
    one = flops_per_sample(net, t2=4, t1=2, height=8, width=8)["total"]  # cropscale.model.flops, batch of 1
    assert [r[0] for r in series.y] == [b * one for b in BATCHES]
    assert check_scaling(series, expected="O(n^(1/2))").failed


@pytest.mark.scaling("O(1)")
def test_flops_per_sample_do_not_grow_with_the_batch(scaling, net):
    series = flops_vs_batch(BATCHES, net=net, per_sample=True)
    scaling(series)
    assert len({r[0] for r in series.y}) == 1


@pytest.mark.scaling("O(n)")
def test_saved_activation_bytes_are_linear_in_the_batch(scaling, net):
    series = activation_bytes_vs_batch(BATCHES, net=net)
    scaling(series)
    y = [r[0] for r in series.y]
    per_sample = y[1] - y[0]
    assert per_sample > 0 and all(v - y[0] == (b - 1) * per_sample for b, v in zip(BATCHES, y, strict=True))
    assert check_scaling(series, expected="O(1)").failed


def _ring_by_steps(elements: int, size: int, n: int, rank: int = 0) -> int:
    """The ring all-reduce walked step by step (reduce-scatter, then all-gather)."""
    chunks = [len(c) for c in np.array_split(np.arange(elements), n)]
    sent = 0
    for s in range(n - 1):
        sent += chunks[(rank - s) % n]  # reduce-scatter
    for s in range(n - 1):
        sent += chunks[(rank + 1 - s) % n]  # all-gather
    return sent * size


@pytest.mark.parametrize("elements, n, rank", [(10, 3, 0), (10, 3, 2), (7, 4, 1), (1000, 8, 5), (5, 1, 0), (3, 5, 0)])
def test_ring_send_bytes_equals_the_step_by_step_ring(elements, n, rank):
    assert ring_send_bytes(elements, 4, n, rank) == _ring_by_steps(elements, 4, n, rank)


@pytest.mark.scaling("O(1)", negative_exponents=True)
def test_allreduce_bytes_per_rank_are_bounded_in_the_world_size(scaling, net):
    series = allreduce_bytes_vs_world_size((2, 4, 8, 16, 32, 64), module=net)
    assert series.evidence == "analytical-scenario"
    scaling(series)
    m = gradient_payload(net).payload_bytes
    buckets = series.settings["buckets"]
    for n, (v,) in zip(series.x, series.y, strict=True):
        assert abs(v - 2 * (n - 1) / n * m) <= 2 * 4 * buckets  # chunk rounding: < 1 element per chunk sent
    assert max(r[0] for r in series.y) < 2 * m


@pytest.mark.scaling("O(n)", variable="area")
def test_tiled_validation_tile_count_is_linear_in_the_patch_area(scaling):
    sides, window = (16, 32, 64, 128, 256), 8
    series = tile_count_vs_area(sides, window=window)
    scaling(series)
    per_side = [1 + math.ceil((s - window) / (window // 2)) for s in sides]
    assert [r[0] for r in series.y] == [k * k for k in per_side]
    assert check_scaling(series, expected="O(n^(1/2))").failed


@pytest.mark.scaling("O(n)", variable="t2")
def test_loader_bytes_read_are_linear_in_the_dates(scaling, flanders_root):
    dates, batch_size, crop = (4, 8, 16, 32, 64), 2, 16
    series = loader_bytes_vs_dates(dates, root=flanders_root, batch_size=batch_size, crop_size=crop)
    scaling(series)
    s2 = np.load(next((flanders_root / "DATA_S2").glob("*.npy")), mmap_mode="r")
    per_date = batch_size * s2.shape[1] * crop * crop * s2.dtype.itemsize  # bands x window x item size
    y = [r[0] for r in series.y]
    assert all(v - y[0] == (t - dates[0]) * per_date for t, v in zip(dates, y, strict=True))
    assert check_scaling(series, expected="O(1)").failed
