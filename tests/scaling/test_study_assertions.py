"""The study's hook (cropscale.study.assertions): the claim "step time O(local batch), O(1) in the world
size at equal local batch" on hand-made study rows of a measured grid, and the file it writes."""

import numpy as np

from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN
from cropscale.study.aggregate import StudyRow
from cropscale.study.assertions import grid, study_assertions, write_scaling_assertions

WORLD = (1, 2, 4, 8, 16)
LOCAL = (2, 4, 8, 16, 32)


def _rows(step_ms, precision="32-true", evidence=MEASURED_RUN, protocols=("equal-local", "equal-global")):
    rows = []
    for proto in protocols:
        for n in WORLD:
            for b in LOCAL:
                rows.append(StudyRow(evidence=evidence, protocol=proto, precision=precision, world_size=n,
                                     local_batch=b, accumulation=1, global_batch=n * b, lr=1e-3, lr_scaling="none",
                                     updates_per_epoch=None, figures={"median_step_ms": step_ms(n, b, proto)}))
    return rows


def test_grid_takes_measured_rows_and_repeats_a_coordinate_per_protocol():
    rows = _rows(lambda n, b, p: 1.0 + b) + _rows(lambda n, b, p: 99.0, evidence=ANALYTICAL_SCENARIO)
    n, b, y = grid(rows, "32-true")
    assert len(n) == len(WORLD) * len(LOCAL) and all(v == [1.0 + bb] * 2 for bb, v in zip(b, y, strict=True))


def test_step_time_linear_in_local_batch_and_flat_in_world_size_passes():
    """Counts over 20 seeded grids (2 rows per coordinate, 2 % noise): 17 pass, 3 fail in the world size
    (with 2 repetitions the noise rests on 5 degrees of freedom per line: the false reject rate is above
    the nominal 5 %; the local batch is never failed)."""
    statuses = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        rows = _rows(lambda n, b, p: (5 + 0.8 * b) * (1 + 0.02 * rng.standard_normal()))  # noqa: B023
        (v,) = study_assertions(rows, resamples=300).values()
        assert v.evidence == MEASURED_RUN and v.variables == ("world_size", "local_batch")
        assert v.per_parameter[1].status == "pass", v.message()
        statuses.append(v.status)
    assert statuses.count("pass") >= 16 and statuses.count("fail") <= 4, statuses


def test_step_time_growing_with_world_size_fails_and_the_file_says_so(tmp_path):
    rows = _rows(lambda n, b, p: (5 + 0.8 * b) * (1 + 0.3 * np.log2(n)))
    paths = write_scaling_assertions(rows, tmp_path)
    text = paths["scaling_assertions"].read_text()
    assert "FAIL median step time (ms), 32-true: expected O(local_batch)" in text
    assert "world_size: FAIL: expected O(1); exceeds O(1) by a factor" in text
    assert [p.name for p in tmp_path.iterdir()] == ["scaling_assertions.md"]


def test_too_small_a_grid_is_not_asserted_and_no_measured_rows_write_nothing(tmp_path):
    rows = [r for r in _rows(lambda n, b, p: 1.0 + b) if r.world_size <= 2]
    (why,) = study_assertions(rows).values()
    assert why == "not asserted: the measured grid has 2 world sizes and 5 local batches; at least 3 of each are needed"
    assert write_scaling_assertions(_rows(lambda n, b, p: 1.0, evidence=ANALYTICAL_SCENARIO), tmp_path) == {}
