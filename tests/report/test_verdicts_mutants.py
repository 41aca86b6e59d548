"""The verdict table's cells, the time-to-target detail and which configurations :func:`comparisons` pairs (issue 36:
the survivors of a mutation sample of cropscale/report/verdicts.py).

Records are built in memory (``RunRecord`` with its ``run.json`` summary), so every figure is set by hand: best and
final macro IoU per seed, training-loop rate per epoch, best-so-far macro IoU per epoch, wall seconds, optimizer
steps and GPU energy per epoch. t quantile: t_{0.95,2} = 2.919986 (the 90 % interval of 3 paired seeds).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from cropscale.evidence import MEASURED_RUN
from cropscale.precision import BY_CONFIGURATION, PrecisionDecision
from cropscale.report.verdicts import compare_runs, comparisons, verdict_row
from cropscale.runs.record import RunRecord
from cropscale.runs.rules import Figure
from cropscale.runs.schema import (
    EnergyEpoch,
    EnergySummary,
    RunJson,
    RunSummary,
    ThroughputEpoch,
    ThroughputSummary,
)

T_95_DF2 = 2.919986
RISING = (0.8, 0.9, 1.0)  # best-so-far macro IoU per epoch as a fraction of the run's best: +20 % over 2 epochs
FLAT = (1.0, 1.0, 1.0)


def _rec(name: str, precision: str = "32-true", seed: object = 0, best: float | None = 0.5, *, devices: int = 1,
         config_devices: object = None, global_batch: int = 8, local: int = 8, lr: float = 0.001, width: int = 8,
         rate: float = 10.0, rise=RISING, wall=(4.0, 5.0, 6.0), energy=None, updates: float | None = None
         ) -> RunRecord:
    """A finished 3-epoch run: best = final macro IoU ``best``, ``best x rise[e]`` best so far at epoch e, 32 samples
    per epoch at ``rate`` samples/s in every epoch, end-to-end ``wall[e]`` s, GPU ``energy[e]`` J (None: no NVML)."""
    config = {"seed_everything": seed,
              "trainer": {"devices": devices if config_devices is None else config_devices, "precision": precision,
                          "accumulate_grad_batches": 1, "max_epochs": 3},
              "model": {"lr": lr, "width": width}, "data": {"batch_size": local}}
    epochs = [ThroughputEpoch(epoch=e, samples=32, train_s=32 / rate, wall_s=w) for e, w in enumerate(wall)]
    power = (EnergySummary(available=True, epochs=[EnergyEpoch(epoch=e, energy_j=j) for e, j in enumerate(energy)])
             if energy is not None else None)
    run_json = RunJson(status="finished", precision=precision, config=config,
                       summary=RunSummary(throughput=ThroughputSummary(epochs=epochs), energy=power))
    figures = {"best_miou": Figure(best, MEASURED_RUN), "final_miou": Figure(best, MEASURED_RUN)}
    return RunRecord(name=name, kind="run", path=f"/nowhere/{name}", evidence=MEASURED_RUN, status="finished",
                     precision_decision=PrecisionDecision(precision, precision, BY_CONFIGURATION), devices=devices,
                     global_batch=global_batch, figures=figures, updates_per_epoch=updates, run_json=run_json,
                     config=config, iou_by_epoch=[(e, best * f) for e, f in enumerate(rise)] if best else [])


def _side(precision: str, values: dict, prefix: str, **kw) -> list[tuple[object, RunRecord]]:
    return [(s, _rec(f"{prefix}{s}", precision, s, v, **kw)) for s, v in values.items()]


# ------------------------------------------------------------------------------------ the verdict row
def _worse(rise=RISING):
    """FP32 seeds 0-2 at 0.50 / 0.52 / 0.54, AMP BF16 at 0.44 / 0.47 / 0.47: paired differences -0.06, -0.05, -0.07."""
    return compare_runs("precision", "FP32", "AMP BF16", _side("32-true", {0: 0.50, 1: 0.52, 2: 0.54}, "f", rise=rise),
                        _side("bf16-mixed", {0: 0.44, 1: 0.47, 2: 0.47}, "b", rate=15.0, rise=rise))


def test_verdict_row_cells_by_hand():
    row = verdict_row(_worse())
    half = T_95_DF2 * 0.01 / math.sqrt(3)  # sd of the paired differences 0.01: half-width 0.016859
    assert f"{-0.06 - half:+.4f}..{-0.06 + half:+.4f}" == "-0.0769..-0.0431"
    v = row.values
    assert set(v) == {"label", "compared", "seeds", "best_ci", "best_verdict", "final_verdict", "speedup_vs_base_ci",
                      "convergence", "to_target_verdict", "runs_needed", "classes"}
    assert (v["label"], v["compared"], v["seeds"]) == ("AMP BF16 vs FP32", "precision", "3 / 3")
    assert (v["best_ci"], v["best_verdict"], v["final_verdict"]) == ("-0.0769..-0.0431", "worse", "worse")
    # 15 / 10 samples/s in every run: the log rates have no spread, so no interval (and none to include 1)
    assert v["speedup_vs_base_ci"] == "n/a (no spread observed in 3 / 3 runs)"
    assert v["convergence"] == "at this budget (3 epochs)"  # every run's best so far rose 20 % over 2 epochs
    # target 0.95 x 0.52 = 0.494: FP32 reaches it at epoch 2 in every seed, AMP BF16 never (best 0.47)
    assert v["to_target_verdict"].startswith("not reached") and v["runs_needed"].startswith("CV 0 %")
    assert v["classes"] == "none"
    f = row.figures
    assert set(f) == {"best_diff", "final_diff", "speedup_vs_base", "efficiency", "samples_to_target_ratio",
                      "time_ratio"}
    assert {f[k].evidence for k in f} == {MEASURED_RUN} and row.evidence == MEASURED_RUN
    assert f["best_diff"].value == pytest.approx(-0.06)
    assert f["best_diff"].note == "paired t over 3 seeds (df 2); margin 0.02"
    assert f["speedup_vs_base"].value == pytest.approx(1.5)
    assert (f["efficiency"].value, f["efficiency"].why) == (None, "not a device comparison")


def test_verdict_row_says_plateaued_or_n_a_for_the_convergence():
    flat = _worse(rise=FLAT)  # no run's best so far rose over its last 2 epochs
    assert not flat.convergence.at_budget and verdict_row(flat).values["convergence"] == "plateaued"
    assert verdict_row(dataclasses.replace(flat, convergence=None)).values["convergence"] == "n/a"


def test_verdict_row_without_a_target_says_so():
    """A base without a best macro IoU has no target: no samples to target and no runs needed."""
    # FP32 with no training-loop second recorded either (train_s 0 in every epoch): no rate, no speed-up
    c = compare_runs("precision", "FP32", "AMP BF16", _side("32-true", {0: None, 1: None}, "f", rate=math.inf),
                     _side("bf16-mixed", {0: 0.5, 1: 0.52}, "b"))
    assert c.target is None and c.samples_to_target is None
    row = verdict_row(c)
    v = row.values
    assert (v["to_target_verdict"], v["runs_needed"]) == ("n/a (no target)", "n/a (no target)")
    assert (v["best_ci"], v["best_verdict"], v["seeds"]) == ("n/a (no value on one side)", "inconclusive", "0 / 2")
    f = row.figures
    assert (f["best_diff"].value, f["best_diff"].why) == (None, "no value on one side")
    assert (f["speedup_vs_base"].value, f["speedup_vs_base"].why) == (None, "no rate on one side")
    assert (f["time_ratio"].value, f["time_ratio"].why) == (None, "no target: the base has no best macro IoU")


# ----------------------------------------------------------------------------------- time to target
def _to_target(base_kw: list[dict], other_kw: list[dict]):
    """FP32 best 0.5 per run (target 0.95 x 0.5 = 0.475: reached at epoch 1, 0.5 x 0.96 = 0.48), against AMP."""
    base = [(i, _rec(f"f{i}", "32-true", i, 0.5, rise=(0.6, 0.96, 1.0), **kw)) for i, kw in enumerate(base_kw)]
    other = [(i, _rec(f"b{i}", "bf16-mixed", i, **kw)) for i, kw in enumerate(other_kw)]
    return compare_runs("precision", "FP32", "AMP", base, other)


def test_target_detail_means_each_figure_over_the_runs_that_reached():
    base = [dict(wall=(4.0, 5.0, 6.0), energy=(100.0, 50.0, 1.0), updates=8.0),
            dict(wall=(4.0, 5.6, 6.0), energy=(100.0, 70.0, 1.0), updates=8.0)]
    # AMP: best 0.5 and 0.49 reach 0.475 at epoch 2 (x 1.0), best 0.4 never: 1 of 3 runs does not reach it
    other = [dict(best=0.5), dict(best=0.49), dict(best=0.4)]
    c = _to_target(base, other)
    assert c.target == pytest.approx(0.475)
    # epochs 0 and 1: 9.0 and 9.6 s (mean 9.3), 2 x 8 steps, 2 x 32 samples, 150 and 170 J (mean 160)
    assert c.target_detail() == ("target macro IoU 0.4750; FP32: 9.3 s end-to-end, 16 steps, 64 samples,"
                                 " 160 J GPU board energy (NVML) (mean of 2 run(s)); AMP: not reached by 1 of 3 run(s)")


def test_target_detail_says_n_a_for_a_figure_a_run_lacks():
    """No optimizer step count and no NVML energy: those two are n/a, seconds and samples are still the means."""
    c = _to_target([dict(wall=(4.0, 5.0, 6.0)), dict(wall=(4.0, 5.6, 6.0))], [dict(best=0.5)])
    assert c.target_detail() == ("target macro IoU 0.4750; FP32: 9.3 s end-to-end, steps n/a, 64 samples, J n/a"
                                 " (mean of 2 run(s)); AMP: 15.0 s end-to-end, steps n/a, 96 samples, J n/a"
                                 " (mean of 1 run(s))")  # AMP reaches 0.475 at epoch 2: 4 + 5 + 6 s, 3 x 32


def test_target_detail_prints_an_infinite_wall_time_as_inf():
    """A run.json epoch wall time of Infinity (JSON allows it; the reader keeps it) is summed as given: ``inf``."""
    c = _to_target([dict(wall=(4.0, math.inf, 6.0))], [dict(best=0.5)])
    assert c.target_detail().startswith("target macro IoU 0.4750; FP32: inf s end-to-end, steps n/a, 64 samples")


# ------------------------------------------------------------------------------ which runs are paired
def _kinds(records, kind: str, **kw) -> list:
    return [c for c in comparisons(records, **kw) if c.kind == kind]


def test_precision_comparisons_per_configuration_in_precision_order():
    """Two configurations (width 8 and 16) each with FP32, AMP BF16 and AMP FP16; first a width without FP32."""
    records = [_rec("w32_bf16", "bf16-mixed", 0, width=32)]  # no FP32 at width 32: no comparison, the rest go on
    for width in (8, 16):
        for precision in ("bf16-mixed", "16-mixed", "32-true"):  # bf16 first: the order must come from sorting
            records += [_rec(f"w{width}_{precision}_{s}", precision, s, 0.5 + 0.01 * s, width=width) for s in (0, 1)]
    found = _kinds(records, "precision")
    assert [(c.label, c.base_runs) for c in found] == [
        ("AMP FP16 vs FP32 (G 8, N 1)", ["w8_32-true_0", "w8_32-true_1"]),
        ("AMP BF16 vs FP32 (G 8, N 1)", ["w8_32-true_0", "w8_32-true_1"]),
        ("AMP FP16 vs FP32 (G 8, N 1)", ["w16_32-true_0", "w16_32-true_1"]),
        ("AMP BF16 vs FP32 (G 8, N 1)", ["w16_32-true_0", "w16_32-true_1"])]
    assert found[1].other_runs == ["w8_bf16-mixed_0", "w8_bf16-mixed_1"]


def test_precision_comparisons_keep_device_counts_apart_when_the_config_says_auto():
    """``trainer.devices: auto`` on 1 and on 2 devices: the same configuration text, two comparisons."""
    records = [_rec(f"{p}_n{n}_{s}", p, s, devices=n, config_devices="auto", global_batch=8 * n)
               for n in (1, 2) for p in ("32-true", "bf16-mixed") for s in (0, 1)]
    found = _kinds(records, "precision")
    assert [(c.label, len(c.base_runs), len(c.other_runs)) for c in found] == [
        ("AMP BF16 vs FP32 (G 8, N 1)", 2, 2), ("AMP BF16 vs FP32 (G 16, N 2)", 2, 2)]


def test_sides_pair_by_seed_and_fall_back_to_welch_when_the_seeds_differ():
    """FP32 seeds 0, 1, 2; AMP BF16 seeds 1, 2, 3: not the same seeds, so Welch over 3 / 3, never paired by position."""
    records = [_rec(f"f{s}", "32-true", s, v) for s, v in {0: 0.50, 1: 0.52, 2: 0.55}.items()]
    records += [_rec(f"b{s}", "bf16-mixed", s, v) for s, v in {3: 0.46, 1: 0.49, 2: 0.47}.items()]
    (c,) = _kinds(records, "precision")
    assert not c.best.interval.paired and c.best.interval.method.startswith("Welch t over 3 / 3 seeds")
    assert c.best.interval.estimate == pytest.approx(1.42 / 3 - 1.57 / 3)  # the difference of the means: -0.05
    assert c.base_runs == ["f0", "f1", "f2"] and c.other_runs == ["b1", "b2", "b3"]  # sorted by seed


def test_device_comparisons_equal_global_and_equal_local():
    """FP32 on 1 device (G 8, L 8), 2 (G 8, L 4), 4 (G 8, L 2) and 2 (G 16, L 8); the G 16 runs first, so the
    first equal-global group has no 1-device run."""
    spec = [(2, 16, 8), (1, 8, 8), (2, 8, 4), (4, 8, 2)]  # (devices, global, local)
    records = [_rec(f"n{n}_g{g}_{s}", "32-true", s, 0.5 + 0.01 * s, devices=n, global_batch=g, local=loc)
               for n, g, loc in spec for s in (0, 1)]
    found = _kinds(records, "devices", margin=0.05, target_fraction=0.9)
    assert [(c.label, c.devices, c.other_runs[0]) for c in found] == [
        ("2 devices vs FP32 equal-global (G 8, L 8) on 1", 2, "n2_g8_0"),
        ("4 devices vs FP32 equal-global (G 8, L 8) on 1", 4, "n4_g8_0"),
        ("2 devices vs FP32 equal-local (G 8, L 8) on 1", 2, "n2_g16_0")]
    assert all(c.base_runs == ["n1_g8_0", "n1_g8_1"] for c in found)
    assert [(c.best.margin, c.final.margin, c.target_fraction) for c in found] == [(0.05, 0.05, 0.9)] * 3
    assert found[1].efficiency.estimate == pytest.approx(0.25)  # same rate on 4 devices: speed-up 1, / 4


def test_the_same_runs_under_both_protocols_are_compared_once():
    """Runs whose global and local batch are both those of the 1-device runs (the logged global batch, 8 on 2
    devices) fall in one equal-global and one equal-local group of the same runs: one comparison."""
    records = [_rec(f"n{n}_{s}", "32-true", s, devices=n, global_batch=8, local=8) for n in (1, 2) for s in (0, 1)]
    assert [c.label for c in _kinds(records, "devices")] == ["2 devices vs FP32 equal-global (G 8, L 8) on 1"]


def test_global_batch_comparisons_per_precision_and_devices():
    """G 4 against G 8 for FP32 and AMP BF16 apart; first a width with a single global batch (no comparison)."""
    records = [_rec("w32", "32-true", 0, width=32, global_batch=4, local=4)]
    for p in ("32-true", "bf16-mixed"):
        for g in (4, 8):
            records += [_rec(f"{p}_g{g}_{s}", p, s, global_batch=g, local=g, lr=0.001 * g) for s in (0, 1)]
    found = _kinds(records, "global batch", margin=0.05)
    assert [(c.label, c.base_runs[0], c.other_runs[0]) for c in found] == [
        ("G 8 vs FP32 G 4 (N 1)", "32-true_g4_0", "32-true_g8_0"),
        ("G 8 vs AMP BF16 G 4 (N 1)", "bf16-mixed_g4_0", "bf16-mixed_g8_0")]
    assert [c.best.margin for c in found] == [0.05, 0.05]


def test_verdict_row_samples_to_target_figure_and_the_texts():
    """FP32 reaches 0.475 at epoch 1 (64 samples per run), AMP at epoch 2 (96): ratio 1.5."""
    c = _to_target([dict(), dict()], [dict(best=0.5), dict(best=0.49)])
    f = verdict_row(c).figures["samples_to_target_ratio"]
    assert (f.value, f.evidence) == (pytest.approx(1.5), MEASURED_RUN)
    assert f.note == "olympic means 64 / 96 samples over 2 / 2 runs (none trimmed)"
    assert f.why is None and c.target_text().startswith("samples to 0.95 of FP32's best (0.4750): 1.50x, ")
    none = compare_runs("precision", "FP32", "AMP", _side("32-true", {0: None}, "f"),
                        _side("bf16-mixed", {0: 0.5}, "b"))
    assert none.target_text() == "samples to 0.95 of FP32's best: n/a (no best macro IoU of the base)"
    assert (c.best.figure, c.final.figure) == ("best macro IoU", "final macro IoU")
    # end-to-end seconds to the target: FP32 4 + 5 s (epochs 0, 1), AMP 4 + 5 + 6 s in each run
    assert c.time_to_target.figure == "seconds" and c.time_ratio == pytest.approx(15.0 / 9.0)
    assert verdict_row(c).figures["time_ratio"].value == pytest.approx(15.0 / 9.0)


def test_final_verdict_reads_the_final_macro_iou_of_both_sides():
    """Best and final macro IoU apart: best equal on both sides (+0.00x), final 0.05 lower on AMP's side."""
    base = [(s, _rec(f"f{s}", "32-true", s, v)) for s, v in {0: 0.50, 1: 0.52, 2: 0.54}.items()]
    other = [(s, _rec(f"b{s}", "bf16-mixed", s, v)) for s, v in {0: 0.501, 1: 0.522, 2: 0.543}.items()]
    for (_, r), final in zip(other, (0.45, 0.46, 0.50), strict=True):
        r.figures["final_miou"] = Figure(final, MEASURED_RUN)
    c = compare_runs("precision", "FP32", "AMP BF16", base, other)
    assert c.best.interval.estimate == pytest.approx(0.002) and c.best.verdict == "equivalent"
    # paired final differences -0.05, -0.06, -0.04: mean -0.05, sd 0.01, 90 % CI -0.0669..-0.0331: worse
    assert c.final.interval.estimate == pytest.approx(-0.05) and c.final.verdict == "worse"
    assert c.final.interval.high == pytest.approx(-0.05 + T_95_DF2 * 0.01 / math.sqrt(3))


def test_a_device_comparison_of_one_run_per_side_gives_the_efficiency_without_interval():
    records = [_rec(f"n{n}", "32-true", 0, devices=n, global_batch=8, local=8 // n, rate=5.0 + 5.0 * n)
               for n in (1, 2)]
    (c,) = _kinds(records, "devices")
    # 15 / 10 samples/s: speed-up 1.5 on 2 devices, efficiency 0.75; one run per side: no interval for either
    assert ("speed-up 1.50x training-loop samples/s (no interval: one run per side), efficiency 0.75, within-run"
            in c.line())


def _class_run(folder, name: str, precision: str, seed: int, by_class: dict[str, tuple[float, ...]]) -> RunRecord:
    """A run whose TensorBoard events hold ``val_class/IoU_<class>`` per epoch (with Lightning's ``epoch``)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for epoch in range(3):
        writer.add_scalar("epoch", float(epoch), epoch + 1)
        for cls, values in by_class.items():
            writer.add_scalar(f"val_class/IoU_{cls}", values[epoch], epoch + 1)
    writer.close()
    record = _rec(name, precision, seed, 0.5)
    record.path, record.scalar_tags = str(folder), ["epoch", *(f"val_class/IoU_{c}" for c in by_class)]
    return record


def test_classes_moving_beyond_the_margin_by_their_last_epoch(tmp_path):
    """Wheat's last-epoch IoU falls 0.10 on AMP's side (its epoch-1 peak of 0.9 is no final value); maize moves
    +0.005, inside the margin: only wheat is listed."""
    base, other = [], []
    for s, (w_base, w_other) in enumerate(((0.60, 0.50), (0.62, 0.53), (0.64, 0.53))):
        base.append((s, _class_run(tmp_path / f"f{s}", f"f{s}", "32-true", s,
                                   {"1_wheat": (0.3, 0.9, w_base), "2_maize": (0.2, 0.3, 0.40 + 0.01 * s)})))
        other.append((s, _class_run(tmp_path / f"b{s}", f"b{s}", "bf16-mixed", s,
                                    {"1_wheat": (0.3, 0.9, w_other), "2_maize": (0.2, 0.3, 0.405 + 0.01 * s)})))
    c = compare_runs("precision", "FP32", "AMP BF16", base, other)
    assert [name for name, _ in c.classes] == ["1_wheat"]
    (_, wheat), = c.classes
    assert wheat.interval.estimate == pytest.approx(-0.10, abs=1e-6) and wheat.figure == "final IoU of class 1_wheat"
    assert verdict_row(c).values["classes"] == "1_wheat: -0.100 worse"  # 90 % CI -0.1169..-0.0831
