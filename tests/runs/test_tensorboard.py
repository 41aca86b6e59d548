"""What a run writes for TensorBoard: the HPARAMS summaries as its hparams plugin reads them back (its own
``plugin_data_pb2`` parser), the custom-scalars layout (one figure per chart), the first screen's pinned quality
card against TensorBoard's y-range rule."""

from __future__ import annotations

import json
import math
import urllib.parse

import pytest

from cropscale.errors import CropScaleError
from cropscale.runs.tensorboard import hparams_summaries


def _start_and_experiment(settings):
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    read = {}
    for summary in hparams_summaries(settings):
        (value,) = summary.value
        read[value.tag] = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
    return read[metadata.SESSION_START_INFO_TAG].session_start_info, read[metadata.EXPERIMENT_TAG].experiment


def test_integer_settings_are_written_so_the_table_shows_them_as_integers():
    """TensorBoard 2.21's HPARAMS table writes every number value with ``toPrecision(5)`` (8 -> "8.0000"): an int
    setting (devices, batch, accumulation) goes in as the text of the integer, a float stays a number."""
    from tensorboard.plugins.hparams import api_pb2

    start, experiment = _start_and_experiment({"devices": 8, "global_batch": 1024, "lr": 0.001, "precision": "bf16"})
    got = {name: (value.WhichOneof("kind"), getattr(value, value.WhichOneof("kind")))
           for name, value in start.hparams.items()}
    assert got == {"devices": ("string_value", "8"), "global_batch": ("string_value", "1024"),
                   "lr": ("number_value", 0.001), "precision": ("string_value", "bf16")}
    kinds = {info.name: info.type for info in experiment.hparam_infos}
    assert kinds == {"devices": api_pb2.DATA_TYPE_STRING, "global_batch": api_pb2.DATA_TYPE_STRING,
                     "lr": api_pb2.DATA_TYPE_FLOAT64, "precision": api_pb2.DATA_TYPE_STRING}


@pytest.mark.parametrize("value", [True, None, [1]])
def test_a_bool_none_or_list_setting_is_refused_by_name(value):
    with pytest.raises(CropScaleError, match="'compile'"):
        hparams_summaries({"compile": value})


def test_each_custom_scalars_chart_holds_one_figure_named_in_its_title():
    """TensorBoard's custom-scalars charts draw a run's lines in one colour and hand out markers in an order that
    changes with each server start: a chart holds one line (its tag in the title), or one line and a band (a margin
    chart, the line at the band's bottom), the title saying which is which."""
    from cropscale.runs.tensorboard import LAYOUT, custom_scalars_layout

    assert len({c.title for c in LAYOUT}) == len(LAYOUT)
    for chart in LAYOUT:
        if getattr(chart, "band", False):
            line, bottom, top = chart.tags
            assert line == bottom != top and "(line)" in chart.title and "(band" in chart.title, chart
        else:
            assert len(chart.tags) == 1 and chart.tags[0] in chart.title, chart
    layout = custom_scalars_layout(scaler=True, cuda=True)
    specs = [spec for charts in layout.values() for spec in charts.values()]
    assert len(specs) == len(LAYOUT)
    assert {kind for kind, _ in specs} == {"Multiline", "Margin"}
    assert all(len(tags) == (3 if kind == "Margin" else 1) for kind, tags in specs)


def _tensorboard_frame(values: list[float], smoothing: float) -> tuple[float, float]:
    """The y-range a Time Series card of TensorBoard 2.21 gives one run's points, before rounding it out.

    From its web bundle (``webfiles.zip``, ``index.js``): with smoothing > 0 the card draws the debiased
    exponential moving average and the raw points as a faded auxiliary line, left out of the range; with "ignore
    outliers" (on by default, no address setting) n > 2 values range from the ceil(0.05 (n-1))-th to the
    floor(0.95 (n-1))-th sorted value; 5 % of the range is added on each side, then d3's ``nice()`` rounds it out
    (which only widens it, left out here).
    """
    line, last, debias = [], 0.0, 0
    for v in values:
        if smoothing > 0:
            last, debias = last * smoothing + (1 - smoothing) * v, debias + 1
            line.append(last / (1 - smoothing ** debias))
        else:
            line.append(v)
    a = sorted(line)
    lo, hi = a[0], a[-1]
    if len(a) > 2:
        lo, hi = a[math.ceil(0.05 * (len(a) - 1))], a[math.floor(0.95 * (len(a) - 1))]
    pad = 0.05 * (hi - lo)
    return lo - pad, hi + pad


@pytest.mark.parametrize("miou", [
    [0.100, 0.108, 0.093, 0.128, 0.188, 0.136],  # make fit's six epochs (docs/screenshots): best 0.188 at epoch 4
    [0.05, 0.09, 0.12, 0.15, 0.17, 0.16, 0.18, 0.175, 0.17, 0.18, 0.179, 0.17, 0.165, 0.16, 0.16, 0.155],
])
def test_the_pinned_quality_card_holds_the_best_val_miou(miou):
    """The first-screen address pins a quality card whose frame holds the run's best val/mIoU (by TensorBoard's own
    y-range rule, :func:`_tensorboard_frame`); before, ``val/mIoU`` smoothed at TensorBoard's default 0.6 left the
    best above the frame."""
    from cropscale.runs.tensorboard import first_screen_url

    query = urllib.parse.parse_qs(urllib.parse.urlsplit(first_screen_url()).query)
    smoothing = float(query["smoothing"][0]) if "smoothing" in query else 0.6  # TensorBoard's default
    (tag,) = [c["tag"] for c in json.loads(query["pinnedCards"][0]) if c["tag"].startswith("val/mIoU")]
    best_so_far = [max(miou[:i + 1]) for i in range(len(miou))]  # what the task logs as val/mIoU_best
    points = {"val/mIoU": miou, "val/mIoU_best": best_so_far}[tag]
    low, high = _tensorboard_frame(points, smoothing)
    assert low <= max(miou) <= high, (tag, smoothing, low, high)
