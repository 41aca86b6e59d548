"""TensorBoard of a run folder: its scalars, and what a run writes for the eye.

The scalars are read with tensorboard's ``EventAccumulator``; a run writes the custom-scalars layout
(:data:`LAYOUT`, the one list of tags it uses) and the HPARAMS summaries (:data:`HPARAMS_METRICS`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cropscale.errors import CropScaleError

Scalars = dict[str, list[tuple[int, float, float]]]
"""``{tag: [(step, value, wall_time_s), ...]}`` sorted by wall time."""


def events_files(folder: str | Path) -> list[Path]:
    """The TensorBoard event files directly in ``folder``, sorted by name."""
    return sorted(Path(folder).glob("events.out.tfevents.*"))


def load_scalars(folder: str | Path) -> Scalars:
    """Every scalar of the TensorBoard event files directly in ``folder``, files merged.

    Raises:
        CropScaleError: an event file that tensorboard cannot read (truncated, foreign), named.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: Scalars = {}
    for path in events_files(folder):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        try:
            acc.Reload()
        except Exception as err:  # a truncated or foreign file: name it
            raise CropScaleError(f"cannot read TensorBoard events {path}: {err}") from None
        for tag in acc.Tags().get("scalars", []):
            scalars.setdefault(tag, []).extend((e.step, float(e.value), e.wall_time) for e in acc.Scalars(tag))
    for events in scalars.values():
        events.sort(key=lambda e: e[2])
    return scalars


def epoch_series(scalars: Scalars, tag: str) -> list[tuple[int, float]]:
    """``[(epoch, value)]`` of ``tag``.

    The epoch is Lightning's ``epoch`` scalar logged at the same step (nearest in wall time), else the
    event's position (validation once per epoch).
    """
    epochs = scalars.get("epoch", [])
    out = []
    for i, (step, value, wall) in enumerate(scalars.get(tag, [])):
        same = [e for e in epochs if e[0] == step]
        epoch = int(round(min(same, key=lambda e: abs(e[2] - wall))[1])) if same else i
        out.append((epoch, value))
    return out


# ------------------------------------------------------------------------------ what a run writes for the eye
@dataclass(frozen=True)
class Chart:
    """One chart of the custom-scalars layout: every scalar whose tag matches one of ``tags`` on one plot.

    Attributes:
        category: the group it is shown in (TensorBoard sorts groups by name).
        title: the chart's title (with the unit).
        tags: regular expressions, anchored at both ends when written (:func:`custom_scalars_layout`);
            mostly exact tags.
        needs: where the run can log these tags: ``None`` (any run), ``"scaler"`` (a GradScaler:
            ``16-mixed``) or ``"cuda"`` (a CUDA device: GPU memory, energy, MFU).
    """

    category: str
    title: str
    tags: tuple[str, ...]
    needs: str | None = None


_WINDOWS = "(data_wait|transfer|forward|backward|optimizer|remainder)"

#: The charts of the custom-scalars layout, in display order: the one list of tags the layout uses.
LAYOUT: tuple[Chart, ...] = (
    Chart("1 quality", "loss (train step, train epoch, val)", ("train/loss_step", "train/loss_epoch", "val/loss")),
    Chart("1 quality", "training loss terms", ("train/loss_semantic", "train/loss_parcel", "train/loss_hr")),
    Chart("1 quality", "val/mIoU and best so far", ("val/mIoU", "val/mIoU_best")),
    Chart("2 step time", "step decomposition (ms, mean over each log interval)", (f"perf/step/{_WINDOWS}_ms",)),
    Chart("2 step time", "step (ms): log-interval mean, epoch median and p95",
          ("perf/step/step_ms", "perf/epoch/step_ms_median", "perf/epoch/step_ms_p95")),
    Chart("2 step time", "epoch medians of the step windows (ms)", (f"perf/epoch/{_WINDOWS}_ms_median",)),
    Chart("3 throughput", "training-loop samples/s (epoch, steady, rank 0 log interval) and epoch-clock samples/s",
          ("perf/epoch/samples_per_s", "perf/epoch/samples_per_s_steady", "perf/samples_per_s_rank",
           "perf/epoch/samples_per_s_epoch_clock")),
    Chart("3 throughput", "TFLOP/s (epoch)", ("perf/epoch/tflops_per_s",)),
    Chart("3 throughput", "MFU (epoch, fraction of the GPU peak)", ("perf/epoch/mfu",), needs="cuda"),
    Chart("4 AMP", "loss scale", ("amp/loss_scale",), needs="scaler"),
    Chart("4 AMP", "skipped steps and scale events (cumulative)",
          ("amp/skipped_steps", "amp/overflow_skips", "amp/backoff_events", "amp/growth_events"), needs="scaler"),
    Chart("5 memory", "host RSS (GiB)", ("memory/host_rss_gib", "memory/host_peak_rss_gib")),
    Chart("5 memory", "GPU memory (GiB)", ("memory/allocated_gib", "memory/reserved_gib", "memory/peak_allocated_gib",
                                           "memory/peak_reserved_gib"), needs="cuda"),
    Chart("6 energy", "GPU board power (W, NVML)", ("energy/power_w", "energy/epoch_avg_w"), needs="cuda"),
    Chart("6 energy", "GPU board energy per training sample (J, NVML: no CPU, memory, network or cooling)",
          ("energy/j_per_sample",), needs="cuda"),
)


def custom_scalars_layout(scaler: bool, cuda: bool, charts: tuple[Chart, ...] = LAYOUT,
                          ) -> dict[str, dict[str, list[Any]]]:
    """The layout of TensorBoard's custom-scalars tab for one run, as ``SummaryWriter.add_custom_scalars`` takes it.

    Args:
        scaler: the run has a GradScaler (the AMP charts are kept).
        cuda: the run is on a CUDA device (GPU memory, energy and MFU charts are kept).
        charts: the charts to choose from.

    Returns:
        ``{category: {title: ["Multiline", [regex, ...]]}}``, each regex ``^tag$``; the charts whose tags this
        run cannot log are left out.
    """
    have = {None: True, "scaler": scaler, "cuda": cuda}
    layout: dict[str, dict[str, list[Any]]] = {}
    for chart in charts:
        if have[chart.needs]:
            layout.setdefault(chart.category, {})[chart.title] = ["Multiline", [f"^{t}$" for t in chart.tags]]
    return layout


@dataclass(frozen=True)
class HparamsMetric:
    """One final figure of the HPARAMS tab: the scalar ``tag`` (logged once, at the last step) and its column name."""

    tag: str
    display_name: str


#: The HPARAMS metric columns in display order (TensorBoard shows the first five): ``run/<figure key>`` tags, the
#: figure keys of :class:`~cropscale.runs.record.RunRecord` ``figures``.
HPARAMS_METRICS: tuple[HparamsMetric, ...] = (
    HparamsMetric("run/best_miou", "best val/mIoU"),
    HparamsMetric("run/samples_per_s", "training-loop samples/s"),
    HparamsMetric("run/median_step_ms", "median step (ms)"),
    HparamsMetric("run/peak_memory_gib", "peak memory (GiB)"),
    HparamsMetric("run/energy_j_per_sample", "GPU board energy (J/sample, NVML)"),
    HparamsMetric("run/final_miou", "final val/mIoU"),
    HparamsMetric("run/best_epoch", "best epoch"),
    HparamsMetric("run/final_train_loss", "final train loss"),
    HparamsMetric("run/time_to_target_s", "time to target (s)"),
    HparamsMetric("run/samples_per_s_epoch_clock", "epoch-clock samples/s"),
)


def hparams_summaries(settings: dict[str, str | float | int], metrics: tuple[HparamsMetric, ...] = HPARAMS_METRICS,
                      lead: int = 5) -> list[Any]:
    """The three summaries of TensorBoard's HPARAMS tab (experiment, session start, session end) for one run.

    TensorBoard orders the settings by ``(not differs, name)`` and shows the first five: the first ``lead``
    settings are marked ``differs`` (the ones compared across runs), so they are the five shown.

    Args:
        settings: ``{name: value}``, the compared ones first. TensorBoard's HPARAMS table shows every number
            with five significant digits (8 as ``8.0000``), so an int is written as its text (``"8"``: the table
            and its filter list it as a value, its sort is by text) and a float as a number; a bool is refused
            (pass ``"true"`` / ``"false"``).
        metrics: the metric columns in display order (TensorBoard keeps it and shows the first five); their
            values are the scalars of the same tags in the run.
        lead: how many of the first settings lead the table.

    Returns:
        Three ``Summary`` protos, for ``SummaryWriter._get_file_writer().add_summary``.

    Raises:
        CropScaleError: a setting that is a bool, None or not a str, int or float, named.
    """
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    infos = []
    start = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for name, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise CropScaleError(f"HPARAMS setting {name!r} = {value!r}: give a str, int or float (a bool as a str)")
        if isinstance(value, str | int):  # TensorBoard shows a number as toPrecision(5): 8 as "8.0000"
            start.hparams[name].string_value = str(value)
        else:
            start.hparams[name].number_value = float(value)
        kind = api_pb2.DATA_TYPE_FLOAT64 if isinstance(value, float) else api_pb2.DATA_TYPE_STRING
        infos.append(api_pb2.HParamInfo(name=name, type=kind, differs=len(infos) < lead))
    experiment = api_pb2.Experiment(time_created_secs=time.time(), hparam_infos=infos, metric_infos=[
        api_pb2.MetricInfo(name=api_pb2.MetricName(tag=m.tag), display_name=m.display_name) for m in metrics])
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time())
    parts = ((metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment)),
             (metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start)),
             (metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end)))
    return [summary_pb2.Summary(value=[summary_pb2.Summary.Value(
        tag=tag, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR)]) for tag, data in parts]


#: The charts pinned at the top of the Time Series tab by :func:`first_screen_url` (TensorBoard expands only the
#: first two tag groups by name, ``epoch`` and ``lr-*`` in a CPU run, and keeps the tags' names).
FIRST_SCREEN: tuple[str, ...] = ("train/loss_step", "val/mIoU", "perf/epoch/step_ms_median", "memory/host_rss_gib")


def first_screen_url(host: str = "localhost", port: int = 6006, tags: tuple[str, ...] = FIRST_SCREEN) -> str:
    """The TensorBoard address whose Time Series tab opens with ``tags`` pinned at the top (``pinnedCards``)."""
    from urllib.parse import quote

    cards = json.dumps([{"plugin": "scalars", "tag": t} for t in tags], separators=(",", ":"))
    return f"http://{host}:{port}/?pinnedCards={quote(cards)}#timeseries"
