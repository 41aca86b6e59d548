"""Amdahl, Gustafson, Karp-Flatt: the study's table reproduced exactly, formulas checked by hand."""

import math

import pytest

from cropscale import CropScaleError
from cropscale.scaling.amdahl import (
    amdahl_efficiency,
    amdahl_speedup,
    amdahl_table,
    efficiency,
    fit_serial_fraction,
    format_amdahl_table,
    gustafson_speedup,
    karp_flatt,
)

# STUDY.md, "Analytical layer": Amdahl speed-up / efficiency for N = 2, 4, 8 and 10/20/35 % serial.
STUDY_TABLE = """\
| GPUs | 10 % serial | 20 % serial | 35 % serial |
| --- | --- | --- | --- |
| 2 | 1.82x / 90.9 % | 1.67x / 83.3 % | 1.48x / 74.1 % |
| 4 | 3.08x / 76.9 % | 2.50x / 62.5 % | 1.95x / 48.8 % |
| 8 | 4.71x / 58.8 % | 3.33x / 41.7 % | 2.32x / 29.0 % |"""


def test_amdahl_table_reproduces_the_study_exactly():
    assert format_amdahl_table(amdahl_table((2, 4, 8), (0.10, 0.20, 0.35))) == STUDY_TABLE


def test_amdahl_table_with_evidence_column_labels_every_row():
    lines = format_amdahl_table(amdahl_table(), evidence_column=True).splitlines()
    assert lines[0].endswith("| Evidence |")
    assert all(line.endswith("| analytical-scenario |") for line in lines[2:])
    assert len(lines) == 5


def test_amdahl_values_by_hand():
    # S(2, 0.1) = 1 / (0.1 + 0.45) = 1/0.55
    assert amdahl_speedup(2, 0.1) == pytest.approx(1 / 0.55, rel=1e-12)
    # S(8, 0.35) = 1 / (0.35 + 0.08125)
    assert amdahl_speedup(8, 0.35) == pytest.approx(1 / 0.43125, rel=1e-12)
    assert amdahl_efficiency(8, 0.35) == pytest.approx(1 / 0.43125 / 8, rel=1e-12)
    assert amdahl_speedup(1, 0.5) == 1.0
    assert amdahl_speedup(64, 0.0) == 64.0
    assert amdahl_speedup(64, 1.0) == 1.0
    # Limit N -> infinity is 1/s.
    assert amdahl_speedup(1e12, 0.2) == pytest.approx(5.0, rel=1e-9)
    rows = amdahl_table((4,), (0.2,))
    assert (rows[0].n, rows[0].speedup, rows[0].efficiency) == (4, 2.5, 0.625)
    assert rows[0].evidence == "analytical-scenario"


def test_gustafson_scaled_speedup():
    assert gustafson_speedup(8, 0.1) == pytest.approx(0.1 + 0.9 * 8)
    assert gustafson_speedup(1, 0.3) == pytest.approx(1.0)
    assert gustafson_speedup(4, 0.0) == 4.0
    assert gustafson_speedup(4, 1.0) == 1.0


def test_karp_flatt_recovers_amdahls_serial_fraction():
    # For a speed-up that obeys Amdahl exactly, e equals s for every N.
    for s in (0.1, 0.2, 0.35):
        for n in (2, 4, 8, 16):
            assert karp_flatt(amdahl_speedup(n, s), n) == pytest.approx(s, abs=1e-12)
    assert karp_flatt(2.0, 2) == 0.0  # linear speed-up
    assert karp_flatt(1.0, 4) == pytest.approx(1.0)  # no speed-up at all
    assert karp_flatt(0.5, 2) == pytest.approx(3.0)  # a slow-down: e > 1
    assert karp_flatt(2.2, 2) < 0  # super-linear


def test_efficiency():
    assert efficiency(3.0, 4) == 0.75


@pytest.mark.parametrize(
    "call",
    [
        lambda: amdahl_speedup(0, 0.1),
        lambda: amdahl_speedup(2, -0.1),
        lambda: amdahl_speedup(2, 1.5),
        lambda: amdahl_speedup(math.nan, 0.1),
        lambda: karp_flatt(1.5, 1),
        lambda: karp_flatt(0.0, 2),
        lambda: efficiency(-1.0, 2),
        lambda: amdahl_table((), (0.1,)),
        lambda: format_amdahl_table([]),
    ],
)
def test_bad_arguments_raise_cropscale_error(call):
    with pytest.raises(CropScaleError):
        call()


def test_error_names_the_argument():
    with pytest.raises(CropScaleError, match="serial_fraction"):
        amdahl_speedup(2, 20)
    with pytest.raises(CropScaleError, match="undefined at N = 1"):
        karp_flatt(1.0, 1)


def test_fit_serial_fraction_by_hand():
    # one point is Karp-Flatt's: S = 1.6 on 2 devices -> (1/1.6 - 1/2) / (1/2) = 0.25
    assert fit_serial_fraction([1, 2], [1.0, 1.6]) == pytest.approx(0.25)
    # exact Amdahl points at s = 0.1 are recovered
    assert fit_serial_fraction([2, 4, 8], [amdahl_speedup(n, 0.1) for n in (2, 4, 8)]) == pytest.approx(0.1)
    # two points by hand: N = 2, S = 1.6 (x = 0.5, y = 0.125); N = 4, S = 2.5 (x = 0.75, y = 0.15)
    # s = (0.5 * 0.125 + 0.75 * 0.15) / (0.25 + 0.5625) = 0.175 / 0.8125
    assert fit_serial_fraction([2, 4], [1.6, 2.5]) == pytest.approx(0.175 / 0.8125)
    with pytest.raises(CropScaleError, match="more than one device"):
        fit_serial_fraction([1, 1], [1.0, 1.0])
    with pytest.raises(CropScaleError, match="positive"):
        fit_serial_fraction([2], [0.0])
