"""The benchmark of the scaling verdict: the generator follows its documented formula, the rates meet
their targets on a small seeded sample (default suite) and on the full default sample (perf), and
``python -m cropscale scaling assert-bench`` prints them with their evidence labels."""

import json

import numpy as np
import pytest

from cropscale import CropScaleError
from cropscale.scaling import assert_bench
from cropscale.scaling.assert_bench import KINDS, POINT_SETS, TARGETS, generate, run
from cropscale.scaling.landau import LADDER
from cropscale.study.analytical import main as scaling_main


def test_generator_follows_the_documented_formula():
    series = generate(seed=5, per_cell=2)
    assert len(series) == len(LADDER) * len(POINT_SETS) * 2
    for s in series:
        # the formula of the module docstring, drawn again in the documented order
        rng = np.random.default_rng([5, s.truth, s.point_set, s.index])
        sigma, share, amp = rng.uniform(0.02, 0.05), rng.uniform(0.5, 0.95), 10.0 ** rng.uniform(-3, 3)
        x = np.array(POINT_SETS[s.point_set])
        g = LADDER[s.truth](x)
        f = np.full_like(x, amp) if s.truth == 0 else amp * (g.max() * (1 - share) / share + g)
        y = f[:, None] * (1 + sigma * rng.standard_normal((x.size, 5)))
        np.testing.assert_array_equal(s.x, x)
        np.testing.assert_allclose(s.y, y, rtol=1e-13)
        assert (s.noise, s.share) == (sigma, share)
    assert [tuple(p) for p in POINT_SETS] == [(1, 2, 4, 8, 16), (2, 4, 8, 16, 32, 64), (4, 8, 16, 32, 64, 128, 256)]


def test_a_series_does_not_depend_on_how_many_are_generated():
    a, b = generate(seed=1, per_cell=1), generate(seed=1, per_cell=3)
    first = {(s.truth, s.point_set): s.y for s in b if s.index == 0}
    for s in a:
        np.testing.assert_array_equal(s.y, first[(s.truth, s.point_set)])
    assert not np.array_equal(generate(seed=2, per_cell=1)[5].y, a[5].y)


def test_rates_meet_the_targets_on_a_small_seeded_sample():
    res = run(seed=0, per_cell=2, resamples=300)
    n_series = len(LADDER) * len(POINT_SETS) * 2
    assert res.total("true") == n_series
    assert res.total("next-lower") == n_series - len(POINT_SETS) * 2  # O(1) has no lower class
    assert sum(res.total(k) for k in KINDS) == sum(t + 1 for t in range(len(LADDER))) * len(POINT_SETS) * 2
    r = res.rates
    assert r["false_reject"] <= TARGETS["false_reject"], assert_bench.format_result(res)
    assert r["next_lower_accepted"] <= TARGETS["next_lower_accepted"], assert_bench.format_result(res)
    assert r["two_or_more_lower_accepted"] == 0.0, assert_bench.format_result(res)
    assert r["inconclusive"] <= TARGETS["inconclusive"], assert_bench.format_result(res)
    # and the verdict does catch the next-lower class most of the time
    assert res.rate("next-lower", "fail") >= 0.85


@pytest.mark.perf
def test_rates_meet_the_targets_on_the_default_sample():
    res = run()  # 330 series, 1000 resamples: what `assert-bench` prints
    print("\n" + assert_bench.format_result(res))
    assert not res.missed(), assert_bench.format_result(res)


def test_command_prints_the_rates_with_labels_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench" / "rates.json"
    status = scaling_main(["assert-bench", "--per-cell", "1", "--resamples", "200", "--seed", "3",
                           "--json", str(out)])
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert status == (0 if not data["missed"] else 1)
    assert "[count: verdict outcomes on 30 seeded synthetic series, seed 3" in text
    for line in ("false reject (true class fails)", "next-lower class accepted", "two or more classes lower accepted",
                 "inconclusive, all assertions"):
        assert line in text and text.split(line)[1].split("\n")[0].rstrip().endswith("[count]")
    assert "[measured-microbenchmark]" in text
    assert data["evidence"] == "count" and data["series"] == 30 and set(TARGETS) <= set(data["rates"])
    assert list(tmp_path.joinpath("bench").iterdir()) == [out]  # written atomically: no temp file left


def test_command_rejects_bad_arguments():
    with pytest.raises(CropScaleError, match="resamples must be >= 100"):
        scaling_main(["assert-bench", "--resamples", "10"])
    with pytest.raises(CropScaleError, match="per_cell must be a positive integer"):
        scaling_main(["assert-bench", "--per-cell", "0"])
