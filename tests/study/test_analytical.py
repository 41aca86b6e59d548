"""``python -m cropscale scaling``: both tables, every row labelled analytical-scenario."""

import json

import pytest

from cropscale import CropScaleError
from cropscale.cli import main as cli
from cropscale.study.analytical import main

AMDAHL_ROWS = [
    "| 2 | 1.82x / 90.9 % | 1.67x / 83.3 % | 1.48x / 74.1 % | analytical-scenario |",
    "| 4 | 3.08x / 76.9 % | 2.50x / 62.5 % | 1.95x / 48.8 % | analytical-scenario |",
    "| 8 | 4.71x / 58.8 % | 3.33x / 41.7 % | 2.32x / 29.0 % | analytical-scenario |",
]


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]


def test_tables_for_the_study_model(capsys):
    assert main(["--params", "1947456"]) == 0
    out = capsys.readouterr().out
    for row in AMDAHL_ROWS:
        assert row in out
    rows = _table_rows(out)
    assert len(rows) == 6 and all(r.endswith("| analytical-scenario |") for r in rows)
    ring = [r.split(" | ")[2] for r in rows[3:]]
    assert ring == ["7.43 MiB", "11.14 MiB", "13.00 MiB"]
    assert "P = 1,947,456 parameters x b = 4 B/element" in out


def test_half_precision_gradients_halve_the_volume(capsys):
    main(["--params", "1947456", "--bytes-per-element", "2", "--devices", "2"])
    rows = _table_rows(capsys.readouterr().out)
    assert rows[-1].split(" | ")[1:3] == ["3.71 MiB", "3.71 MiB"]


def test_several_bandwidths_json_and_karp_flatt(tmp_path, capsys):
    out_json = tmp_path / "rows.json"
    main(["--params", "1000000", "--bandwidth-gbs", "10", "100", "--speedup", "2:1.6",
          "--speedup-evidence", "measured-run", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert "| 2 | 1.60x | 80.0 % | 0.250 | measured-run |" in out
    data = json.loads(out_json.read_text())
    assert len(data["amdahl"]) == 9 and len(data["allreduce"]) == 6
    assert {r["evidence"] for r in data["amdahl"] + data["allreduce"]} == {"analytical-scenario"}
    assert data["karp_flatt"][0]["karp_flatt"] == pytest.approx(0.25)
    assert data["karp_flatt"][0]["speedup_vs_1_device"] == 1.6  # the registry's name of S_N, as given


def test_from_model_uses_the_real_network(capsys):
    main(["--from-model", "--devices", "2"])
    out = capsys.readouterr().out
    assert "CropMappingNet: P = " in out and "exact DDP buckets" in out
    assert _table_rows(out)[-1].split(" | ")[4] == "2"  # 1 MiB first bucket + the rest


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--params", "0"], "--params"),
        (["--params", "10", "--speedup", "2:1.5"], "--speedup-evidence"),
        (["--params", "10", "--speedup", "two", "--speedup-evidence", "measured-run"], "N:S"),
        (["--params", "10", "--serial-fractions", "1.5"], "serial_fraction"),
    ],
)
def test_user_errors(argv, match):
    with pytest.raises(CropScaleError, match=match):
        main(argv)


def test_dispatch_through_python_m_cropscale(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["scaling", "--params", "1947456"])
    assert info.value.code == 0
    assert AMDAHL_ROWS[2] in capsys.readouterr().out
