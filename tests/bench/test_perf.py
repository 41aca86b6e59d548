"""Performance assertions on the real code (``make test-perf``; marked ``perf``, not in the default run).

Each test measures a series with :mod:`cropscale.bench.measure`, prints its table (every row
labelled with its evidence) and states its asymptotic trend through the ``scaling`` fixture of the
pytest plugin (cropscale.scaling.pytest_plugin, loaded through its pytest11 entry point). An
inconclusive verdict fails, with what would decide it (more repetitions, a wider range): green means the
trend was shown. These need an idle machine; on a busy one (a shared 2-core CI machine) the timings are
too noisy to decide and the tests fail saying so. They were marked ``inconclusive="skip"``, which on this
project's machines turned every timing test into a skip: a check that could not fail (issue 36). What holds
on a busy machine is asserted in the default suite by counts (tests/bench/test_counts.py: step FLOPs,
tiles, loader bytes, all-reduce bytes). Sizes are kept small for a 2-core CPU machine: crops of 8 x 8
pixels (high grid 80 x 80), 4 x 4 tiles, one torch thread, 5 repetitions (median), warm-up excluded.
"""

import math
import os

import pytest

from cropscale.bench.measure import (
    allreduce_volume_vs_world_size,
    loader_time_vs_dates,
    speedup_and_karp_flatt,
    step_time_vs_batch,
    tiled_validation_time_vs_area,
)
from cropscale.model.network import CropMappingNet

pytestmark = [pytest.mark.perf, pytest.mark.scaling("O(n)", inconclusive="fail")]


def _show(series, sizes) -> None:
    """Print the table and assert what holds whatever the verdict: the sizes asked for, one positive finite
    value per repetition."""
    print(f"\n{series.metric} vs {series.parameter}  settings={series.settings}")
    print(series.table())
    assert series.x == [float(v) for v in sizes]
    assert all(row and all(math.isfinite(v) and v > 0 for v in row) for row in series.y), series.y


def test_training_step_time_is_linear_in_batch_size(scaling):
    sizes = (1, 2, 4, 8, 12, 16)
    series = step_time_vs_batch(sizes, repetitions=5, warmup=1, crop_size=8, t2=16, t1=4)
    _show(series, sizes)
    verdict = scaling(series)  # fail and inconclusive fail the test
    print(verdict.message())
    assert verdict.passed and verdict.order_ok


def test_tiled_validation_time_is_linear_in_patch_area(scaling):
    # Tiles per patch side = 2 S / window - 1: the tile count approaches area x 4 / window^2 only for
    # S >> window (at S = 2 windows it is 25 % below), so the patches here are 4 to 12 windows wide.
    sides = (16, 24, 32, 40, 48)
    series = tiled_validation_time_vs_area(sides, window=4, repetitions=5, warmup=1, t2=16, t1=4)
    _show(series, [side * side for side in sides])
    verdict = scaling(series)
    print(verdict.message())
    assert verdict.passed and verdict.order_ok


def test_loader_time_is_at_most_linear_in_dates(scaling):
    sizes = (4, 8, 16, 24, 32, 48)
    series = loader_time_vs_dates(sizes, batches=4, repetitions=5, warmup=1)
    _show(series, sizes)
    verdict = scaling(series)
    print(verdict.message())
    assert verdict.passed and verdict.order_ok


def test_allreduce_volume_is_bounded_in_world_size(scaling):
    series = allreduce_volume_vs_world_size((2, 4, 8, 16, 32, 64, 128), module=CropMappingNet())
    _show(series, (2, 4, 8, 16, 32, 64, 128))
    verdict = scaling(series, expected="O(1)", negative_exponents=True)
    assert verdict.passed and verdict.order_ok  # V(N) = 2 M - 2 M / N exactly: bounded
    print(verdict.message())


def test_karp_flatt_from_measured_cpu_ddp_runs(tmp_path, record_property):
    """1 and 2 processes (Lightning DDP over gloo, its subprocess launcher), equal global batch."""
    from cropscale.bench.ddp_probe import run_probe

    options = {"global_batch": 4, "steps": 6, "warmup": 2, "crop_size": 16, "threads": 1}
    one = run_probe(1, tmp_path / "ddp1.json", **options)
    two = run_probe(2, tmp_path / "ddp2.json", **options)
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert one["evidence"] == two["evidence"] == "measured-microbenchmark"  # compute-only, synthetic batches
    assert (one["local_batch"], two["local_batch"]) == (4, 2)
    assert len(two["per_rank"]) == 2 and all(len(r["step_times_s"]) == 6 for r in two["per_rank"])
    r = speedup_and_karp_flatt(one["median_step_s"], two["median_step_s"], 2)
    speedup = one["median_step_s"] / two["median_step_s"]
    assert r["speedup_vs_1_device"] == pytest.approx(speedup) and r["efficiency"] == pytest.approx(speedup / 2)
    assert r["karp_flatt"] == pytest.approx((1 / speedup - 1 / 2) / (1 - 1 / 2))  # e = (1/S - 1/N) / (1 - 1/N)
    line = (
        f"Karp-Flatt [measured-microbenchmark; CPU, gloo, {os.cpu_count()} cores, 1 torch thread per process, "
        f"load average {two['host']['load_average_1m']:.1f}]: global batch 4, "
        f"median step T1 = {one['median_step_s'] * 1e3:.1f} ms "
        f"(1 process), T2 = {two['median_step_s'] * 1e3:.1f} ms (2 processes, slowest rank {two['slowest_rank']}); "
        f"speed-up S = {r['speedup']:.2f}, efficiency {100 * r['efficiency']:.1f} %, "
        f"serial fraction e = {r['karp_flatt']:.3f}"
    )
    print("\n" + line)
    record_property("karp_flatt", line)
