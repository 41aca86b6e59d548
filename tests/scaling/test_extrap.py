"""Extra-P interchange: the JSON Lines export obeys Extra-P's rules (one point set per file), the text
format import reads hand-written files of Extra-P's documented grammar; both checked against
expectations written by hand and, when the ``extrap`` package is installed, against Extra-P itself."""

import json
from pathlib import Path

import numpy as np
import pytest

from cropscale import CropScaleError
from cropscale.scaling.assertions import check_scaling
from cropscale.scaling.extrap import (
    extrap_records,
    read_extrap_jsonl,
    read_extrap_jsonl_series,
    read_extrap_text,
    write_extrap_jsonl,
    write_extrap_jsonl_by_points,
)
from cropscale.scaling.series import ScalingSeries


def _series(metric, xs, reps=2, callpath="train_step", parameter="batch_size"):
    return ScalingSeries(parameter, metric, "s", [float(x) for x in xs],
                         [[float(x) + 0.5 * k for k in range(reps)] for x in xs], "measured-microbenchmark", callpath)


def _coordinates_by_key(path: Path) -> dict:
    """Plain-json view of a JSON Lines file: {(callpath, metric): set of params tuples} (Extra-P's defaults)."""
    out: dict = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            key = (rec.get("callpath", "<root>"), rec.get("metric", "<default>"))
            out.setdefault(key, set()).add(tuple(sorted(rec["params"].items())))
    return out


# ------------------------------------------------------------------------------ JSON Lines export


def test_jsonl_lines_are_the_documented_objects(tmp_path):
    s = ScalingSeries("batch_size", "step_time_s", "s", [1.0, 2.5], [[0.25, 0.5], [1.0]], "measured-run", "a->b")
    path = write_extrap_jsonl(tmp_path / "deep" / "t.jsonl", s)
    assert path.read_text().splitlines() == [
        '{"params": {"batch_size": 1}, "metric": "step_time_s", "callpath": "a->b", "value": 0.25}',
        '{"params": {"batch_size": 1}, "metric": "step_time_s", "callpath": "a->b", "value": 0.5}',
        '{"params": {"batch_size": 2.5}, "metric": "step_time_s", "callpath": "a->b", "value": 1.0}',
    ]
    assert [p.name for p in path.parent.iterdir()] == ["t.jsonl"]  # atomic: no temp file left


def test_series_with_different_point_sets_are_refused_in_one_file(tmp_path):
    a, b = _series("step_time_s", [1, 2, 4, 8, 16]), _series("peak_mem_gib", [1, 2, 4])
    with pytest.raises(CropScaleError, match="different point sets") as info:
        write_extrap_jsonl(tmp_path / "x.jsonl", [a, b])
    assert "peak_mem_gib" in str(info.value) and "write_extrap_jsonl_by_points" in str(info.value)
    assert not (tmp_path / "x.jsonl").exists()


def test_appending_a_different_point_set_is_refused_and_leaves_the_file(tmp_path):
    path = write_extrap_jsonl(tmp_path / "x.jsonl", _series("step_time_s", [1, 2, 4, 8, 16]))
    before = path.read_text()
    with pytest.raises(CropScaleError, match="x.jsonl.*point set"):
        write_extrap_jsonl(path, _series("peak_mem_gib", [1.0]), append=True)
    assert path.read_text() == before
    write_extrap_jsonl(path, _series("peak_mem_gib", [1, 2, 4, 8, 16]), append=True)
    keys = _coordinates_by_key(path)
    assert set(keys) == {("train_step", "step_time_s"), ("train_step", "peak_mem_gib")}
    assert len({frozenset(v) for v in keys.values()}) == 1


def test_one_file_per_point_set(tmp_path):
    a, b, c = (_series("step_time_s", [1, 2, 4, 8, 16]), _series("peak_mem_gib", [1, 2, 4]),
               _series("loader_s", [1, 2, 4], callpath="loader"))
    paths = write_extrap_jsonl_by_points(tmp_path / "all.jsonl", [a, b, c])
    assert [p.name for p in paths] == ["all.1.jsonl", "all.2.jsonl"]
    first, second = (_coordinates_by_key(p) for p in paths)
    assert set(first) == {("train_step", "step_time_s")}
    assert set(second) == {("train_step", "peak_mem_gib"), ("loader", "loader_s")}
    for keys in (first, second):  # Extra-P's rule: every (callpath, metric) at every coordinate of the file
        assert len({frozenset(v) for v in keys.values()}) == 1
    only = write_extrap_jsonl_by_points(tmp_path / "one.jsonl", [a])
    assert only == [tmp_path / "one.jsonl"]


def test_round_trip_append_and_reader_defaults(tmp_path):
    s = _series("step_time_s", [1, 2, 4, 8, 16], reps=3)
    path = write_extrap_jsonl(tmp_path / "out" / "steps.jsonl", s)
    assert len(path.read_text().splitlines()) == 15 == len(extrap_records(s))
    data = read_extrap_jsonl(path)
    assert data == {("train_step", "step_time_s"): {x: [x, x + 0.5, x + 1.0] for x in (1.0, 2.0, 4.0, 8.0, 16.0)}}
    write_extrap_jsonl(path, _series("peak_mem_gib", [1, 2, 4, 8, 16]), append=True)
    assert len(read_extrap_jsonl(path)) == 2
    [again] = [t for t in read_extrap_jsonl_series(path, evidence="measured-run") if t.metric == "step_time_s"]
    assert (again.parameter, again.x, again.y) == ("batch_size", s.x, s.y)
    other = tmp_path / "x.jsonl"
    other.write_text('{"params": {"p": 2}, "value": [1.0, 2.0]}\n\n{"params": {"p": 4}, "value": 3}\n')
    assert read_extrap_jsonl(other) == {("<root>", "<default>"): {2.0: [1.0, 2.0], 4.0: [3.0]}}


def test_jsonl_errors(tmp_path):
    a = _series("t", [1, 2])
    b = _series("v", [1, 2], parameter="world_size")
    with pytest.raises(CropScaleError, match="one parameter per file"):
        write_extrap_jsonl(tmp_path / "x.jsonl", [a, b])
    with pytest.raises(CropScaleError, match="no series"):
        write_extrap_jsonl(tmp_path / "x.jsonl", [])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"params": {"p": 1}}\n')
    with pytest.raises(CropScaleError, match="bad.jsonl:1: not an Extra-P JSON Lines record"):
        read_extrap_jsonl(bad)
    bad.write_text('{"params": {"p": 1}, "value": 1}\n{"params": {"q": 1}, "value": 1}\n')
    with pytest.raises(CropScaleError, match="bad.jsonl:2: parameters \\['q'\\] differ"):
        read_extrap_jsonl(bad)
    nan = ScalingSeries("p", "m", "s", [1.0], [[float("nan")]], "measured-run")
    with pytest.raises(CropScaleError, match="non-finite"):
        extrap_records(nan)


def test_jsonl_reader_refuses_what_extrap_refuses(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"params": {"p": 1}, "metric": "a", "value": 1}\n{"params": {"p": 2}, "metric": "a", "value": 2}\n'
                    '{"params": {"p": 1}, "metric": "b", "value": 3}\n')
    with pytest.raises(CropScaleError, match="mixed.jsonl: .*'b'.* 1 of the file's 2 points"):
        read_extrap_jsonl(path)


# ------------------------------------------------------------------------------ text import

TEXT = """\
# hand-written in Extra-P's text format: two metrics, regions in both orders
PARAMETER n

POINTS ( 2 ) ( 4 ) ( 8 )
POINTS (16) (32)

METRIC time
REGION main->solve
DATA 2.1 2.0 2.2
DATA 4.1 4.0
DATA 8.0
DATA 16.2 15.8 16.0
DATA 32.0 32.4
REGION main->io
DATA 1 1 1
DATA 1 1
DATA 1.0
DATA 1
DATA 1e0
METRIC bytes
REGION main->solve
DATA 20
DATA 40
DATA 80
DATA 160
DATA 320
"""


def test_text_import_reads_the_documented_grammar(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text(TEXT)
    series = read_extrap_text(path, evidence="measured-run")
    got = {(s.callpath, s.metric): (s.x, s.y) for s in series}
    assert set(got) == {("main->solve", "time"), ("main->io", "time"), ("main->solve", "bytes")}
    assert got[("main->solve", "time")] == ([2.0, 4.0, 8.0, 16.0, 32.0],
                                           [[2.1, 2.0, 2.2], [4.1, 4.0], [8.0], [16.2, 15.8, 16.0], [32.0, 32.4]])
    assert got[("main->solve", "bytes")][1] == [[20.0], [40.0], [80.0], [160.0], [320.0]]
    assert all(s.parameter == "n" and s.evidence == "measured-run" for s in series)
    # measurements taken elsewhere, asserted on
    solve = next(s for s in series if s.metric == "time" and s.callpath == "main->solve")
    assert check_scaling(solve, expected="O(n)").passed
    assert check_scaling(solve, expected="O(1)").failed


def test_text_import_region_before_metric_and_plain_points(tmp_path):
    path = tmp_path / "b.txt"
    path.write_text("PARAMETER p\nPOINTS 1 2 3\nREGION r\nMETRIC m1\nDATA 1\nDATA 2\nDATA 3\nMETRIC m2\n"
                    "DATA 5\nDATA 5\nDATA 5\n")
    series = read_extrap_text(path, evidence="measured-microbenchmark")
    assert [(s.callpath, s.metric, s.x, s.y) for s in series] == [
        ("r", "m1", [1.0, 2.0, 3.0], [[1.0], [2.0], [3.0]]),
        ("r", "m2", [1.0, 2.0, 3.0], [[5.0], [5.0], [5.0]]),
    ]


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "no data"),
        ("PARAMETER p q\nPOINTS (1 2) (3 4)\nREGION r\nDATA 1\nDATA 2\n", "one parameter"),
        ("PARAMETER p\nPOINTS 1 2\nDATA 1\nDATA 2\n", "line 3: DATA before any REGION"),
        ("PARAMETER p\nREGION r\nDATA 1\n", "line 3: DATA before POINTS"),
        ("POINTS 1 2\n", "line 1: POINTS before PARAMETER"),
        ("PARAMETER p\nPOINTS 1 2\nREGION r\nDATA 1\n", "REGION 'r', METRIC '<default>': 1 DATA lines for 2 POINTS"),
        ("PARAMETER p\nPOINTS 1 2\nREGION r\nDATA 1\nDATA 2\nDATA 3\n", "line 6: more DATA lines than the 2 POINTS"),
        ("PARAMETER p\nPOINTS 1 x\n", "line 2: 'x' is not a number"),
        ("PARAMETER p\nPOINTS 1 2\nREGION r\nDATA 1\nDATA two\n", "line 5: 'two' is not a number"),
        ("PARAMETER p\nPOINTS 1 2\nREGION r\nDATA 1\nDATA\n", "line 5: DATA without values"),
        ("PARAMETER p\nPOINTS 1 2\nVALUES 3\n", "line 3: unknown section 'VALUES'"),
        ("PARAMETER p\nPOINTS 1 1\n", "line 2: point 1 is given twice"),
        ("PARAMETER p\nPOINTS 1 2\nREGION r\nDATA 1\nDATA 2\nREGION s\nDATA 1\nDATA 2\nREGION r\nDATA 1\nDATA 2\n",
         "line 9: REGION 'r', METRIC '<default>' is given twice"),
    ],
)
def test_text_import_errors_name_the_file_and_line(tmp_path, text, match):
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(CropScaleError, match=f"bad.txt: .*{match}" if match != "no data" else "bad.txt: no data"):
        read_extrap_text(path, evidence="measured-run")


def test_text_import_needs_an_evidence_label(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("PARAMETER p\nPOINTS 1 2 3\nREGION r\nDATA 1\nDATA 2\nDATA 3\n")
    with pytest.raises(CropScaleError, match="evidence must be one of"):
        read_extrap_text(path, evidence="guess")
    with pytest.raises(CropScaleError, match="missing.txt"):
        read_extrap_text(tmp_path / "missing.txt", evidence="measured-run")


# ------------------------------------------------------------------------------ Extra-P itself


def _extrap_readers():
    pytest.importorskip("extrap", reason="the extrap package is not installed (pip install extrap)")
    from extrap.fileio.file_reader.jsonlines_file_reader import read_jsonlines_file
    from extrap.fileio.file_reader.text_file_reader import TextFileReader
    from extrap.util.exceptions import InvalidExperimentError

    return read_jsonlines_file, TextFileReader().read_experiment, InvalidExperimentError


def test_extrap_loads_the_export_and_refuses_a_mixed_file(tmp_path):
    read_jsonl, _, invalid = _extrap_readers()
    a, b = _series("step_time_s", [1, 2, 4, 8, 16], reps=3), _series("peak_mem_gib", [1, 2, 4])
    paths = write_extrap_jsonl_by_points(tmp_path / "all.jsonl", [a, b])
    exp = read_jsonl(str(paths[0]))
    assert [p.name for p in exp.parameters] == ["batch_size"]
    assert sorted(c[0] for c in exp.coordinates) == [1.0, 2.0, 4.0, 8.0, 16.0]
    (measurements,) = exp.measurements.values()
    assert sorted((m.coordinate[0], m.median) for m in measurements) == [(x, x + 0.5) for x in (1, 2, 4, 8, 16)]
    read_jsonl(str(paths[1]))
    mixed = tmp_path / "mixed.jsonl"  # what the old writer produced for these two series
    mixed.write_text(paths[0].read_text() + paths[1].read_text())
    with pytest.raises(invalid, match="does not match the number of coordinates"):
        read_jsonl(str(mixed))


def test_extrap_reads_the_hand_written_text_file_as_we_do(tmp_path):
    _, read_text, _ = _extrap_readers()
    path = tmp_path / "input.txt"
    path.write_text(TEXT)
    exp = read_text(str(path))
    theirs = {}
    for (callpath, metric), ms in exp.measurements.items():
        for m in ms:
            theirs[(callpath.name, metric.name, m.coordinate[0])] = float(np.median(m.values)) if m.values is not None \
                else float(m.median)
    ours = {(s.callpath, s.metric, x): float(np.median(r)) for s in read_extrap_text(path, evidence="measured-run")
            for x, r in zip(s.x, s.y, strict=True)}
    assert theirs.keys() == ours.keys()
    assert all(theirs[k] == pytest.approx(ours[k]) for k in ours)
