"""The figure registry (cropscale.runs.figures): every run.json source resolves to a field the callbacks' records
write, every table column of a figure takes its format from the registry, and no module re-declares a figure's
column."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path

import pytest

from cropscale.report import columns as report_columns
from cropscale.runs import schema
from cropscale.runs.figures import FIGURES, TABLES, column, table_columns
from cropscale.runs.rules import Figure

PACKAGE = Path(__file__).resolve().parents[2] / "cropscale"
#: the names a dict of step windows may hold (StepTimingCallback's figures and its host-clock windows)
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
