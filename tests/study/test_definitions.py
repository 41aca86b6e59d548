"""One definition per figure across report and study (issue 23, item 3): speed-up, efficiency, precision labels."""

from __future__ import annotations

import pytest

from cropscale.evidence import MEASURED_RUN
from cropscale.numbers import speedup
from cropscale.precision import LABELS, STUDY_CONFIGS
from cropscale.runs.figures import MEAN_SD, MEDIAN, over_seeds
from cropscale.runs.record import RunRecord
from cropscale.runs.rules import Figure
from cropscale.study.aggregate import StudyRow, add_speedups, run_notes
from cropscale.study.spec import PRECISION_LABELS


def _row(n: int, samples_per_s: float, train_epoch_s: float) -> StudyRow:
    return StudyRow(evidence=MEASURED_RUN, protocol="equal-global", precision="FP32", world_size=n, local_batch=1,
                    accumulation=8 // n, global_batch=8, lr=1e-3, lr_scaling="sqrt", updates_per_epoch=4,
                    figures={"samples_per_s": samples_per_s, "train_epoch_s": train_epoch_s})


def test_study_speedup_is_the_samples_per_s_ratio_as_in_the_report():
    # the epoch times say 10 / 6 = 1.667x, the training samples/s say 4.0 / 3.2 = 1.25x: the protocol's
    # speed-up is the samples/s ratio at equal work, in the study as in the report
    rows = [_row(1, 3.2, 10.0), _row(2, 4.0, 6.0)]
    add_speedups(rows)
    assert rows[1]["speedup_vs_1_device"] == pytest.approx(1.25)
    assert rows[1]["efficiency"] == pytest.approx(0.625)
    assert rows[1]["karp_flatt"] == pytest.approx((1 / 1.25 - 1 / 2) / (1 - 1 / 2))  # 0.6


def test_the_one_speedup_definition():
    assert speedup(4.0, 3.2) == pytest.approx(1.25)
    with pytest.raises(ValueError, match="positive"):
        speedup(4.0, 0.0)


def test_one_precision_label_table():
    for lightning, study in STUDY_CONFIGS.items():
        assert PRECISION_LABELS[study] == LABELS[lightning]
    assert PRECISION_LABELS["bf16"] == "AMP BF16"  # bf16-mixed, not pure bf16 ("BF16" = bf16-true)


def test_a_figure_no_seed_measured_keeps_the_runs_reason():
    """The study row keeps each run figure's reason for n/a (one name: the record's key is the row's field)."""
    figures = {k: Figure(1.0) for k in (*over_seeds(MEDIAN), *over_seeds(MEAN_SD))}
    figures["p95_step_ms"] = Figure(None, why="p95 not recorded")
    figures["val_epoch_s"] = Figure(None, why="no val_s in the measured epochs")
    record = RunRecord(name="r", kind="run", path="runs/r", evidence=MEASURED_RUN, figures=figures)
    _, why = run_notes(record)
    assert why == {"p95_step_ms": "p95 not recorded", "val_epoch_s": "no val_s in the measured epochs"}
