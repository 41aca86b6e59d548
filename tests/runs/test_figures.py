"""The figure registry (cropscale.runs.figures): every run.json source resolves to a field the callbacks' records
write, every table column of a figure takes its format from the registry, no module re-declares a figure's
column, every table's columns are its members in registry order (paired and mean-and-sd places derived), the
speed-up is one figure per base, and a new figure is one registry entry plus its producer (report, CSV, study)."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import types
import typing
from pathlib import Path

import numpy as np
import pytest

from cropscale.evidence import MEASURED_RUN
from cropscale.report import columns as report_columns
from cropscale.report import command as rp
from cropscale.runs import schema
from cropscale.runs.figures import (
    COMPARISON,
    FIGURES,
    MEDIAN,
    PAIRS,
    QUALITY,
    RUNS,
    SCALING,
    SPEED,
    STUDY,
    TABLES,
    FigureSpec,
    column,
    table_columns,
)
from cropscale.runs.record import load_run
from cropscale.runs.rules import Figure, RunInputs, measured
from cropscale.study import plan
from cropscale.study import spec as study_spec
from cropscale.study.aggregate import StudyRow, measured_row
from cropscale.study.outputs import write_outputs
from tests.report.test_report import _fake_run, _md_row
from tests.study.test_predictions import SPEC as STUDY_SPEC

PACKAGE = Path(__file__).resolve().parents[2] / "cropscale"
#: the names a dict of step windows may hold (StepTimingCallback's figures and its host-clock windows)
_THROUGHPUT = "summary.throughput.epochs[]"
WINDOW_KEYS = (*schema.STEP_WINDOWS, "step", *schema.COMM_FIGURES, "data_wait_host", "transfer_host")


def _unwrap(hint):
    """``X | None`` -> X; ``list[X]`` -> ("list", X); ``dict[str, X]`` -> ("dict", X)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (list, dict):
        return origin.__name__, typing.get_args(hint)[-1]
    return None, hint


def resolve(path: str):
    """The type at a ``summary.<section>.<field>[]...`` path of run.json, walking the record classes' type hints.

    Raises AssertionError naming the first segment that is no field.
    """
    hint = schema.RunJson
    for segment in path.split("."):
        is_list = segment.endswith("[]")
        name = segment.removesuffix("[]")
        kind, inner = _unwrap(hint)
        if kind == "dict":  # a key of a dict of records: a step window's name
            assert name in WINDOW_KEYS, f"{path}: {name!r} is no step window"
            hint = inner
        else:
            fields = {f.name for f in dataclasses.fields(inner)}
            assert name in fields, f"{path}: {inner.__name__} has no field {name!r}"
            hint = typing.get_type_hints(inner)[name]
        if is_list:
            kind, hint = _unwrap(hint)
            assert kind == "list", f"{path}: {name!r} is not a list"
    return hint


def test_resolve_refuses_a_field_no_record_has():
    with pytest.raises(AssertionError, match="StepTimingEpoch has no field 'windows'"):
        resolve("summary.step_timing.epochs[].windows.step.median")
    with pytest.raises(AssertionError, match="'stepp' is no step window"):
        resolve("summary.step_timing.epochs[].windows_ms.stepp.median")
    assert resolve("summary.step_timing.epochs[].windows_ms.step.median") == float | None


@pytest.mark.parametrize("key", [k for k, s in FIGURES.items() if s.source.startswith("summary.")])
def test_every_run_json_source_is_a_field_the_callbacks_write(key):
    resolve(FIGURES[key].source)


def _tables():
    yield from ((table, table_columns(table)) for table in TABLES)
    yield "report.columns.NONFINITE_COLUMNS", report_columns.NONFINITE_COLUMNS


def test_every_figure_column_takes_its_format_from_the_registry():
    for table, cols in _tables():
        for col in cols:
            if not col.figure:
                continue
            specs = [s for k, s in FIGURES.items() if k in col.key]  # base_samples_per_s holds samples_per_s
            assert specs, f"{table}: column {col.key!r} is not in cropscale.runs.figures.FIGURES"
            assert col.fmt in {s.fmt for s in specs}, f"{table}: {col.key!r} formatted {col.fmt!r}"


def test_no_module_re_declares_a_registered_column():
    pattern = re.compile(r'Column\(\s*"(' + "|".join(map(re.escape, FIGURES)) + r')"')
    found = [f"{p.relative_to(PACKAGE)}: {m.group(0)}" for p in PACKAGE.rglob("*.py")
             for m in pattern.finditer(p.read_text(encoding="utf-8"))]
    assert found == []


def test_median_step_is_one_name_one_header_one_format():
    spec = FIGURES["median_step_ms"]
    headers = {c.header for _, cols in _tables() for c in cols if c.key == "median_step_ms"}
    formats = {c.fmt for _, cols in _tables() for c in cols if c.key == "median_step_ms"}
    assert formats == {",.1f"} and headers == {"Median step (ms)", "Median step (ms) = 100 %"}
    assert spec.text(Figure(81_612.345)) == "81,612.3 ms"  # worked by hand: ",.1f" then the unit
    assert spec.text(Figure(None, why="no step")) == "n/a (no step)"
    assert FIGURES["nonfinite"].text(Figure(3)) == "3"


def test_an_undeclared_figure_is_named():
    with pytest.raises(KeyError, match="'median_step' is not declared"):
        column("median_step")


# ------------------------------------------------------------------ tables and seeds come from the registry
def test_a_table_is_its_members_in_registry_order():
    keys = [c.key for c in table_columns(COMPARISON)]
    assert keys == ["name", "status", "precision", "devices", "global_batch", "best_miou", "iou_difference",
                    "samples_per_s", "speedup_vs_fp32", "efficiency", "peak_memory_gib", "energy_j_per_sample"]
    member = [k for k, s in FIGURES.items() if s.place(COMPARISON) is not None]
    assert keys == member  # nothing listed by hand: the members, in the registry's order


def test_paired_and_mean_sd_places_derive_their_columns():
    pairs = {c.key: c.header for c in table_columns(PAIRS)}
    assert pairs["base_samples_per_s"] == "FP32 training-loop samples/s"
    assert pairs["other_samples_per_s"] == "Mixed training-loop samples/s"
    assert pairs["base_best_miou"] == "FP32 best mIoU" and "samples_per_s" not in pairs
    study = [(c.key, c.header, c.fmt) for c in table_columns(STUDY)]
    i = [k for k, _, _ in study].index("best_miou")
    assert study[i + 1] == ("best_miou_sd", "Best val/mIoU sd", ".4f")  # right after its mean, same format
    assert "best_miou_sd" not in {c.key for c in table_columns(QUALITY)}  # a run's table: no sd
    assert ("world_size", "N", "d") in study  # the study row's key, the table's header


def test_speedup_is_two_figures_with_their_own_base():
    assert FIGURES["speedup_vs_fp32"].header == "Speed-up vs FP32"
    assert FIGURES["speedup_vs_1_device"].header == "Speed-up vs 1 device"
    assert "speedup" not in FIGURES
    assert {c.key for c in table_columns(PAIRS)} >= {"speedup_vs_fp32"}
    assert {c.key for c in table_columns(SCALING)} >= {"speedup_vs_1_device", "efficiency", "karp_flatt"}
    assert [c.header for c in table_columns(STUDY) if c.key.startswith("speedup")] == [
        "S_N", "S_N low (95 %)", "S_N high (95 %)"]


def test_every_table_names_which_throughput_and_which_energy_it_shows():
    """Two throughputs (training loop, epoch clock) and GPU board energy: every column header says which."""
    from cropscale.runs.figures import TABLES

    seen = set()
    for table in TABLES:
        for c in table_columns(table):
            key = c.key.removeprefix("base_").removeprefix("other_")
            if key == "samples_per_s":
                assert "training loop" in c.header or "training-loop" in c.header, (table, c.header)
            elif key == "samples_per_s_epoch_clock":
                assert "epoch clock" in c.header, (table, c.header)
            elif key.startswith("energy_j"):
                assert c.header.startswith("GPU board"), (table, c.header)
            else:
                continue
            seen.add((table, key))
    assert {("speed", "samples_per_s"), ("speed", "samples_per_s_epoch_clock"), ("study", "samples_per_s_epoch_clock"),
            ("sweep", "samples_per_s_epoch_clock"), ("resources", "energy_j"), ("study", "energy_j_per_sample")} <= seen


def test_a_study_row_refuses_a_key_no_figure_has():
    row = StudyRow(evidence=MEASURED_RUN, protocol="equal-global", precision="FP32", world_size=1, local_batch=1,
                   accumulation=1, global_batch=1, lr=1e-3, lr_scaling="none", updates_per_epoch=None)
    row["best_miou_sd"] = 0.01
    assert row["best_miou_sd"] == 0.01 and row["speedup_vs_1_device"] is None
    with pytest.raises(KeyError, match="'speedup' is no figure"):
        row["speedup"] = 1.2
    with pytest.raises(KeyError, match="'median_step_ms_sd' is no figure"):
        row["median_step_ms_sd"]  # noqa: B018 (median over seeds: no sd)


# ------------------------------------------------------------------ a new figure: one entry plus its producer
def _val_wall_share(inputs: RunInputs) -> Figure:
    """The producer of the new figure: validation seconds / wall seconds over the measured epochs."""
    epochs = measured(inputs.summary.throughput.epochs, inputs.warmup) if inputs.summary.throughput else []
    wall = sum(e.wall_s for e in epochs if e.wall_s)
    return Figure(sum(e.val_s for e in epochs if e.val_s) / wall if wall else None, why="no wall_s")


NEW = FigureSpec("val_wall_share", "Validation share of wall", fmt=".2%", source=f"{_THROUGHPUT}.val_s",
                 tables=(RUNS, SPEED, STUDY), over_seeds=MEDIAN, producer=_val_wall_share)


def _by_hand(folder: Path, warmup: int) -> float:
    """The figure from run.json's fields, with numpy: sum of val_s / sum of wall_s of the epochs after warm-up."""
    epochs = json.loads((folder / "run.json").read_text())["summary"]["throughput"]["epochs"][warmup:]
    return float(np.sum([e["val_s"] for e in epochs]) / np.sum([e["wall_s"] for e in epochs]))


def test_a_new_figure_is_one_registry_entry_plus_its_producer(tmp_path, monkeypatch):
    monkeypatch.setitem(FIGURES, NEW.key, NEW)  # the one entry; nothing else of the package is touched
    runs = []
    for i, (train_s, val_s) in enumerate((([30.0, 20.0, 22.0], [5.0, 4.0, 6.0]), ([25.0, 15.0, 14.0], [5.0, 9.0, 4.0]),
                                          ([40.0, 30.0, 10.0], [5.0, 2.0, 2.0]))):
        runs.append(_fake_run(tmp_path / "runs" / f"seed{i}" / "version_0", "32-true", [0.2, 0.3, 0.35],
                              samples=200, step_ms=100.0, train_s=train_s, val_s=val_s, name=f"seed{i}"))
    expected = [_by_hand(f, warmup=1) for f in runs]  # 10/52, 13/42, 4/44
    assert expected == pytest.approx([10 / 52, 13 / 42, 4 / 44])
    # the report: the Speed table (a member) shows it formatted ".2%", report.csv holds it unrounded
    out = tmp_path / "report"
    assert rp.main([str(tmp_path / "runs"), "--output", str(out), "--verdicts-only"]) == 0
    md = (out / "report.md").read_text()
    speed = md.split("### Speed")[1].split("###")[0]
    header = next(line for line in speed.splitlines() if line.startswith("| Run |"))
    assert header.endswith("| Validation share of wall | Evidence |")
    assert _md_row(speed, "seed1/version_0")[-2] == "30.95%"  # 13 / 42 by hand
    assert "Validation share of wall" not in md.split("### Quality")[1].split("###")[0]  # not a member there
    with open(out / "report.csv", newline="") as f:
        got = {row["name"]: row for row in csv.DictReader(f)}
    assert float(got["seed2/version_0"]["val_wall_share"]) == pytest.approx(4 / 44)
    assert got["seed2/version_0"]["val_wall_share_evidence"] == MEASURED_RUN
    # the study: one configuration over the three seeds, aggregated by the entry's rule (the median)
    spec = study_spec.parse_spec(json.loads(json.dumps(STUDY_SPEC)), "t.yaml")
    config = next(c for c in plan.plan_study(spec, 1, "test") if c.world_size == 1)
    row = measured_row(config, [load_run(f, warmup_epochs=1) for f in runs], 200)
    assert row["val_wall_share"] == pytest.approx(float(np.median(expected)))  # 10/52, not the mean
    assert float(np.median(expected)) != pytest.approx(float(np.mean(expected)))
    paths = write_outputs([row], tmp_path / "study", spec)
    with open(paths["csv"], newline="") as f:
        (study_row,) = list(csv.DictReader(f))
    assert float(study_row["val_wall_share"]) == pytest.approx(10 / 52)
    table = paths["markdown"].read_text()
    header = next(line for line in table.splitlines() if line.startswith("| Protocol |")).split(" | ")
    cells = next(line for line in table.splitlines() if line.startswith("| equal-global |")).split(" | ")
    assert cells[header.index("Validation share of wall")] == "19.23%"  # 10 / 52 formatted ".2%"


def test_a_rule_of_several_figures_runs_once_per_run():
    """The producers of one rule's figures (median and p95 step, best/final mIoU ...) share one computation: a count."""
    calls = []

    def rule(summary, warmup, no_json):
        calls.append(warmup)
        return Figure(1.0), Figure(2.0)

    inputs = RunInputs(schema.RunSummary(), {}, 1)
    got = [inputs.once(rule, inputs.summary, inputs.warmup, inputs.no_json)[n].value for n in (0, 1, 0)]
    assert got == [1.0, 2.0, 1.0] and calls == [1]
    assert RunInputs(schema.RunSummary(), {}, 1).once(rule, None, 2, None)[1].value == 2.0 and calls == [1, 2]
