"""The diagnosis in the end-of-fit summary, in the report (after the verdicts) and across device counts."""

from __future__ import annotations

from cropscale.report.command import write_report
from cropscale.report.limits import diagnosis_section, limit_changes
from cropscale.report.scaling import DevicePoint, DeviceSeries
from cropscale.report.summary import fit_summary
from cropscale.runs.record import RunRecord
from cropscale.runs.schema import Diagnosis, Finding, RankScore, RunJson
from tests.report.test_summary import _run


def test_the_summary_prints_the_limit_computed_from_an_older_run_json(tmp_path):
    # measured epochs 1, 2: validation 4 and 6 s of 24 and 28 s epochs -> 5 / 26 = 19 % (warning), bound 26 / 21;
    # the fake run's step timing counts no measured step, so no step rule speaks
    lines = fit_summary(_run(tmp_path, [2.0, 1.5, 1.2]), "make report").splitlines()
    limit = next(line for line in lines if line.startswith("limit"))
    assert limit == ("limit       validation (warning): 5.00 s of the 26.00 s epoch (19 %, medians over 2 measured"
                     " epoch(s)); without it an epoch could be at best 1.24x faster [figures measured-run, bounds"
                     " analytical-scenario]")
    assert lines[lines.index(limit) + 1].startswith("            try: trainer.check_val_every_n_epoch: 2")
    assert lines.index(limit) < next(i for i, line in enumerate(lines) if line.startswith("run folder"))


def test_the_report_leads_with_the_verdicts_then_what_limits_each_run(tmp_path):
    record = _run(tmp_path, [2.0, 1.5, 1.2])
    text = write_report([record], tmp_path / "out")["markdown"].read_text()
    verdicts, limits, comparison = (text.index(h) for h in ("## Verdicts", "## What limits each run", "## Comparison"))
    assert verdicts < limits < comparison
    section = text[limits:comparison]
    assert f"### {record.name}" in section and "- **Limit**: validation (warning)" in section
    assert "  - try trainer.check_val_every_n_epoch: 2" in section
    assert "computed when run.json was read" in section


def _record(name: str, devices: int, diag: Diagnosis | None) -> RunRecord:
    return RunRecord(name=name, kind="run", path=name, evidence="measured-run", devices=devices,
                     run_json=RunJson(diagnosis=diag) if diag is not None else None)


def test_what_changed_the_limit_across_device_counts():
    # the step's limit is the first finding about the step: the validation finding (the epoch) is passed over
    one = Diagnosis(limit="validation", shares={"data_wait": 0.03, "compute": 0.92, "comm_exposed": 0.0},
                    findings=[Finding(kind="validation", base="epoch"), Finding(kind="compute", line="compute ...")])
    two = Diagnosis(limit="input", shares={"data_wait": 0.31, "compute": 0.6, "comm_exposed": 0.04},
                    findings=[Finding(kind="input", base="step")])
    four = Diagnosis(limit="straggler", shares={"straggler": 0.4, "data_wait": 0.05, "comm_exposed": 0.12},
                     findings=[Finding(kind="straggler", base="step", rank=3, part="backward_own")])
    same = Diagnosis(limit="compute", shares={"compute": 0.85, "comm_exposed": 0.05, "remainder": 0.07},
                     findings=[Finding(kind="compute")], step_ms=720.0,
                     ranks=[RankScore(rank=r, own_ms=v) for r, v in enumerate([600.0, 640.0, 610.0, 620.0])])
    one.step_ms, one.ranks = 400.0, [RankScore(rank=0, own_ms=360.0)]
    series = [DeviceSeries("equal-global", 8, "FP32", [
        DevicePoint(1, ["a"], 10.0, 1.0, 1.0), DevicePoint(2, ["b"], 12.0, 1.2, 0.6),
        DevicePoint(4, ["c"], 14.0, 1.4, 0.35), DevicePoint(8, ["d"], 16.0, 1.6, 0.2)])]
    records = [_record("a", 1, one), _record("b", 2, two), _record("c", 4, four), _record("d", 8, same)]
    assert limit_changes(series, records).splitlines()[2:] == [
        # comm_exposed grew by 4 points only (< 5): not said
        "- FP32, equal-global (global batch 8): at 2 devices input pipeline becomes the step's limit (was compute)"
        " (data wait 3 % -> 31 %); efficiency 0.60",
        "- FP32, equal-global (global batch 8): at 4 devices a straggler rank (rank 3, backward) becomes the step's"
        " limit (was compute) (straggler excess n/a -> 40 %); grew most: exposed communication 0 % -> 12 %;"
        " efficiency 0.35",
        # own work: the median of 600, 610, 620, 640 = 615
        "- FP32, equal-global (global batch 8): at 8 devices the step's limit stays compute (compute 92 % -> 85 %);"
        " grew most: loop remainder n/a -> 7 %; step 400 -> 720 ms, own work 360 -> 615 ms a rank; efficiency 0.20",
    ]
    assert limit_changes(series, [_record("a", 1, None), *records[1:]]) == ""   # no base diagnosis: no line


def test_a_run_without_run_json_has_no_diagnosis_and_says_why():
    assert "n/a: no run.json" in diagnosis_section([_record("x", 1, None)])
