"""Predictions that state their error (issue 30, item 4): intervals of analytical rows, e outside [0, 1]
refused, the N = 1 -> N prediction check with the CPU-share model, and the evidence rule for fitted figures."""

from __future__ import annotations

import json

import pytest

from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN, derived_label
from cropscale.scaling.amdahl import karp_flatt
from cropscale.study import plan, runner
from cropscale.study import spec as study_spec
from cropscale.study.aggregate import StudyRow
from cropscale.study.check import prediction_checks, share_cores
from cropscale.study.predict import analytical_rows

SPEC = {
    "name": "t", "accelerator": "cpu", "devices": [1, 2, 4],
    "protocols": [{"name": "equal-global", "local_batch": 1, "global_batch": 4, "lr_scaling": "sqrt"}],
    "seeds": [0, 1], "warmup_epochs": 1, "measured_epochs": 2, "train_samples_per_epoch": 16,
    "num_params": 1_947_456, "allreduce": {"alpha_us": 0.0, "bandwidth_gb_s": 1e12},  # all-reduce ~ 0 s
}


def _setup(s2: float, s2_ci: tuple[float, float] | None, t1_ci=(90.0, 110.0)):
    spec = study_spec.parse_spec(json.loads(json.dumps(SPEC)), "t.yaml")
    configs = plan.plan_study(spec, 2, "test")
    rows = []
    for n, s in ((1, 1.0), (2, s2)):
        r = StudyRow(evidence=MEASURED_RUN, protocol="equal-global", precision="FP32", world_size=n, local_batch=1,
                     accumulation=4 // n, global_batch=4, lr=1e-3, lr_scaling="sqrt", updates_per_epoch=4,
                     figures={"train_epoch_s": 100.0 / s, "samples_per_s": 0.16 * s, "speedup_vs_1_device": s},
                     config_key=f"equal-global_fp32_n{n}")
        if n == 1:
            r.train_epoch_s_low, r.train_epoch_s_high = t1_ci
        else:
            r["karp_flatt"] = karp_flatt(s, 2)
            r["speedup_vs_1_device_low"], r["speedup_vs_1_device_high"] = s2_ci or (None, None)
        rows.append(r)
    return spec, configs, rows


def test_analytical_row_carries_the_propagated_interval():
    # S_2 = 1.6 (1.5 .. 1.7): e = (1/S - 1/2) / (1/2) = 0.25 (0.1765 .. 0.3333); all-reduce ~ 0
    spec, configs, rows = _setup(1.6, (1.5, 1.7))
    four = next(r for r in analytical_rows(spec, configs, rows) if r.world_size == 4)
    e_lo, e_hi = 2 / 1.7 - 1, 2 / 1.5 - 1
    assert four.evidence == ANALYTICAL_SCENARIO
    assert four["speedup_vs_1_device"] == pytest.approx(1 / (0.25 + 0.75 / 4), rel=1e-6)  # 2.2857
    assert four["speedup_vs_1_device_low"] == pytest.approx(1 / (e_hi + (1 - e_hi) / 4), rel=1e-6)  # 2.0
    assert four["speedup_vs_1_device_high"] == pytest.approx(1 / (e_lo + (1 - e_lo) / 4), rel=1e-6)  # 2.5185
    assert four.train_epoch_s_low == pytest.approx(90 * (e_lo + (1 - e_lo) / 4), rel=1e-6)
    assert four.train_epoch_s_high == pytest.approx(110 * (e_hi + (1 - e_hi) / 4), rel=1e-6)


@pytest.mark.parametrize(("s2", "e_text"), [(0.963, "1.077"), (2.2, "-0.091")])
def test_serial_fraction_outside_0_1_is_refused_with_the_reason(s2, e_text):
    spec, configs, rows = _setup(s2, None)
    four = next(r for r in analytical_rows(spec, configs, rows) if r.world_size == 4)
    assert four["speedup_vs_1_device"] is None and four["train_epoch_s"] is None
    assert four["speedup_vs_1_device_low"] is None
    assert f"e = {e_text}" in four.notes[-1] and "outside [0, 1]" in four.notes[-1]
    assert "not extrapolated" in four.notes[-1]


def test_share_cores_hand_worked():
    # 2 ranks x 1 thread on 2 cores with 1 core of other work: 2 x min(1, 2 / 3) = 1.333 cores
    assert share_cores(2, 1, 2.0, 1.0) == pytest.approx(4 / 3)
    assert share_cores(1, 1, 2.0, 1.0) == pytest.approx(1.0)  # 1 thread fits beside 1 busy core
    assert share_cores(2, 1, 2.0, 0.0) == pytest.approx(2.0)
    assert share_cores(4, 2, 4.0, 0.0) == pytest.approx(4.0)  # 8 threads on 4 idle cores


def test_prediction_check_prints_both_errors():
    # T_1 = 100 s, measured T_2 = 80 s; ideal T_1 / 2 = 50 s: error 50 / 80 - 1 = -37.5 %;
    # CPU share: other work 0.2 cores in the N = 1 run (1 core for it), 1.0 in the N = 2 run (4/3 cores for
    # both ranks): 100 x 1 / (4/3) = 75 s: error 75 / 80 - 1 = -6.25 %
    spec, _, rows = _setup(1.25, None)
    cpu = {"equal-global_fp32_n1": [{"cores": 2, "other_cores": 0.2, "own_cores": 1.0}],
           "equal-global_fp32_n2": [{"cores": 2, "other_cores": 1.0, "own_cores": 1.3}]}
    (check,) = prediction_checks(spec, rows, {}, cpu, "cpu")
    assert check.ideal_error == pytest.approx(-0.375, abs=1e-6)
    assert check.cpu_share == pytest.approx(75.0, abs=1e-6)
    assert check.cpu_share_error == pytest.approx(-0.0625, abs=1e-6)
    assert "error -37.5 %" in check.line() and "error -6.2 %" in check.line()
    (gpu,) = prediction_checks(spec, rows, {}, {}, "gpu")
    assert gpu.cpu_share is None and "CPU share" not in gpu.line()


def test_session_share_where_the_scheduler_groups_by_session():
    """Linux autogroup: the study's ranks share their session's cores. Measured here (issue 38): one 1-thread rank
    used 0.27 cores (the host saturated by other sessions), two ranks 0.26 together, and the N = 2 epoch was no
    faster. T_1 = 100 s, measured T_2 = 80 s: the session model says 100 x 0.27 / min(2, 0.27) = 100 s (+25.0 %);
    the fair-share model, counting other work by what it consumed (1.73 cores), 100 x 0.733 / 1.070 = 68.5 s."""
    spec, _, rows = _setup(1.25, None)
    one = {"cores": 2, "other_cores": 1.73, "own_cores": 0.27, "autogroup": True}
    two = {"cores": 2, "other_cores": 1.74, "own_cores": 0.26, "autogroup": True}
    cpu = {"equal-global_fp32_n1": [one], "equal-global_fp32_n2": [two]}
    (check,) = prediction_checks(spec, rows, {}, cpu, "cpu")
    assert check.session_share == pytest.approx(100.0) and check.session_share_error == pytest.approx(0.25)
    assert check.cpu_share == pytest.approx(100 * (2 / 2.73) / (2 * 2 / 3.74), rel=1e-6)
    assert "session share 100.00 s (error +25.0 %" in check.line() and "got 0.27 cores" in check.line()
    for changed in ({**one, "autogroup": False}, {**one, "autogroup": None}, {**one, "own_cores": 0.95}):
        cpu = {"equal-global_fp32_n1": [changed], "equal-global_fp32_n2": [two]}
        (other,) = prediction_checks(spec, rows, {}, cpu, "cpu")
        assert other.session_share is None and "session share" not in other.line()


def test_session_scheduling_is_read_from_the_kernel(tmp_path):
    from cropscale.study.launch import session_scheduling

    (tmp_path / "on").write_text("1\n")
    (tmp_path / "off").write_text("0\n")
    assert session_scheduling(tmp_path / "on") is True and session_scheduling(tmp_path / "off") is False
    assert session_scheduling(tmp_path / "missing") is None


def test_fitted_quantities_follow_one_rule():
    assert derived_label(MEASURED_RUN, MEASURED_RUN) == MEASURED_RUN  # a ratio, Karp-Flatt at a measured N
    assert derived_label(MEASURED_RUN, model=True) == ANALYTICAL_SCENARIO  # a fitted law's parameter
    assert derived_label(MEASURED_RUN, ANALYTICAL_SCENARIO) == ANALYTICAL_SCENARIO
    assert derived_label(MEASURED_RUN, "measured-microbenchmark") == "measured-run + measured-microbenchmark"


def test_report_labels_the_fitted_serial_fraction_analytical():
    from cropscale.report.comparison import amdahl_rows
    from cropscale.report.scaling import DevicePoint, DeviceSeries

    series = DeviceSeries("equal-global", 8, "FP32", [DevicePoint(1, ["a"], 1.0, 1.0), DevicePoint(2, ["b"], 0.9, 0.9)],
                          serial_fraction=karp_flatt(0.9, 2))
    (row,) = amdahl_rows([series])
    assert row.figures["serial_fraction"].evidence == ANALYTICAL_SCENARIO
    assert row.figures["amdahl_speedup_4"].value is None and "refused" in row.figures["amdahl_speedup_4"].why


def test_runner_records_the_cpu_share_of_each_run(tmp_path):
    from tests.study.test_runner import FakeLauncher

    spec = study_spec.parse_spec(json.loads(json.dumps({**SPEC, "devices": [1, 2]})), "t.yaml")
    doc = runner.run_study(spec, tmp_path / "s", launcher=FakeLauncher(), available=2, echo=lambda s: None)
    assert all({"cores", "own_cores", "other_cores"} <= set(r["cpu"]) for r in doc["runs"])
    assert len(doc["prediction_checks"]) == 1 and "N = 1 -> 2" in doc["prediction_checks"][0]
    assert "## Prediction check" in (tmp_path / "s" / "study_table.md").read_text()
