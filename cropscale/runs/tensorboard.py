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
from urllib.parse import quote, urlsplit

from cropscale.errors import CropScaleError

Scalars = dict[str, list[tuple[int, float, float]]]
"""``{tag: [(step, value, wall_time_s), ...]}`` sorted by wall time."""


def events_files(folder: str | Path) -> list[Path]:
    """The TensorBoard event files directly in ``folder``, sorted by name."""
    return sorted(Path(folder).glob("events.out.tfevents.*"))


def events_damage(path: str | Path) -> str | None:
    """Why the events file ``path`` cannot be read to its end, or None when every record is whole.

    TensorBoard's reader stops silently at the first damaged record (a failed CRC, a truncated record) and keeps
    what came before: this check reads the records' framing and CRCs with tensorboard's own record reader, so
    that the loss is said. Costs one read of the file (about 60 ms per 250 kB).
    """
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

    records = 0
    try:
        reader = PyRecordReader_New(str(path))
        while True:
            reader.GetNext()
            records += 1
    except errors.OutOfRangeError:
        return None
    except Exception as err:  # DataLossError (CRC, truncation), an unreadable file
        detail = str(getattr(err, "message", None) or err or type(err).__name__).replace(f"{path} ", "")
        return f"{' '.join(detail.split())} after {records} whole record(s); the events after it are not read"


def read_scalars(folder: str | Path) -> tuple[Scalars, list[str]]:
    """Every readable scalar of the TensorBoard event files directly in ``folder`` (files merged), and the damage.

    Returns:
        ``(scalars, problems)``: ``problems`` holds one line ``events file unreadable: <file>, <error>`` per file
        that could not be read to its end (:func:`events_damage`, or tensorboard's own error); the scalars read
        before the damage are kept.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: Scalars = {}
    problems: list[str] = []
    for path in events_files(folder):
        damage = events_damage(path)
        if damage is not None:
            problems.append(f"events file unreadable: {path}, {damage}")
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        try:
            acc.Reload()
        except Exception as err:  # a foreign file
            if damage is None:
                problems.append(f"events file unreadable: {path}, {' '.join(str(err).split())}")
            continue
        for tag in acc.Tags().get("scalars", []):
            scalars.setdefault(tag, []).extend((e.step, float(e.value), e.wall_time) for e in acc.Scalars(tag))
    for events in scalars.values():
        events.sort(key=lambda e: e[2])
    return scalars, problems


def load_scalars(folder: str | Path) -> Scalars:
    """The readable scalars of the TensorBoard event files directly in ``folder`` (:func:`read_scalars`)."""
    return read_scalars(folder)[0]


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
    """One chart of the custom-scalars layout: one line, or one line and a band, each named in the title.

    TensorBoard's custom-scalars charts draw every line of a run in the run's colour and tell them apart only by
    a marker that its server hands out in an order that changes from one start to the next (the lines are named
    only under "Matches"). So a chart holds one figure: one line, whose tag the title names, or (``band``) a
    margin chart whose title names the line (``tags[0]``) and the band (from ``tags[1]`` up to ``tags[2]``), e.g.
    an epoch median and its p95, or val/mIoU and the best so far.

    Attributes:
        category: the group it is shown in (TensorBoard sorts groups by name).
        title: what the line (and band) is, with the unit.
        tags: the exact tag of the line; with ``band``, ``(line, band bottom, band top)``, logged at the same steps.
        needs: where the run can log these tags: ``None`` (any run), ``"scaler"`` (a GradScaler:
            ``16-mixed``) or ``"cuda"`` (a CUDA device: GPU memory, energy, MFU).
        band: a margin chart (TensorBoard draws ``tags[0]`` as the line, the band between the other two).
    """

    category: str
    title: str
    tags: tuple[str, ...]
    needs: str | None = None
    band: bool = False


_WINDOWS = {"data_wait": "data wait", "transfer": "host-to-device transfer", "forward": "forward",
            "backward": "backward", "optimizer": "optimizer step", "remainder": "remainder (outside the hooks)"}
_STEP_WINDOWS = {"step": "step", **_WINDOWS}


def _epoch_band(name: str, label: str) -> Chart:
    median, p95 = f"perf/epoch/{name}_ms_median", f"perf/epoch/{name}_ms_p95"
    return Chart("2 step time per epoch", f"{label} (ms): epoch median (line) up to the p95 (band)",
                 (median, median, p95), band=True)


#: The charts of the custom-scalars layout, in display order (TensorBoard shows a group's margin charts after its
#: line charts): the one list of tags the layout uses.
LAYOUT: tuple[Chart, ...] = (
    Chart("1 quality", "training loss, each log step (train/loss_step)", ("train/loss_step",)),
    Chart("1 quality", "training loss, epoch mean (train/loss_epoch)", ("train/loss_epoch",)),
    Chart("1 quality", "validation loss (val/loss)", ("val/loss",)),
    Chart("1 quality", "loss term: semantic cross-entropy (train/loss_semantic)", ("train/loss_semantic",)),
    Chart("1 quality", "loss term: parcel (train/loss_parcel)", ("train/loss_parcel",)),
    Chart("1 quality", "loss term: high-grid L1 (train/loss_hr)", ("train/loss_hr",)),
    Chart("1 quality", "val/mIoU (line) up to the best so far (band, val/mIoU_best)",
          ("val/mIoU", "val/mIoU", "val/mIoU_best"), band=True),
    *(_epoch_band(name, label) for name, label in _STEP_WINDOWS.items()),
    *(Chart("3 step time per log interval", f"{label} (ms), mean over each log interval (perf/step/{name}_ms)",
            (f"perf/step/{name}_ms",)) for name, label in _STEP_WINDOWS.items()),
    Chart("4 throughput", "training-loop samples/s, epoch, all ranks (perf/epoch/samples_per_s)",
          ("perf/epoch/samples_per_s",)),
    Chart("4 throughput", "epoch-clock samples/s: training samples / end-to-end epoch seconds"
          " (perf/epoch/samples_per_s_epoch_clock)", ("perf/epoch/samples_per_s_epoch_clock",)),
    Chart("4 throughput", "training-loop samples/s, epoch without its first steps (perf/epoch/samples_per_s_steady)",
          ("perf/epoch/samples_per_s_steady",)),
    Chart("4 throughput", "training-loop samples/s, rank 0, each log interval (perf/samples_per_s_rank)",
          ("perf/samples_per_s_rank",)),
    Chart("4 throughput", "TFLOP/s per device, epoch (perf/epoch/tflops_per_s)", ("perf/epoch/tflops_per_s",)),
    Chart("4 throughput", "MFU, epoch, fraction of the GPU peak (perf/epoch/mfu)", ("perf/epoch/mfu",), needs="cuda"),
    Chart("5 AMP", "loss scale (amp/loss_scale)", ("amp/loss_scale",), needs="scaler"),
    Chart("5 AMP", "skipped optimizer steps, cumulative (amp/skipped_steps)", ("amp/skipped_steps",), needs="scaler"),
    Chart("5 AMP", "steps skipped on an overflow, cumulative (amp/overflow_skips)", ("amp/overflow_skips",),
          needs="scaler"),
    Chart("5 AMP", "scale back-offs, cumulative (amp/backoff_events)", ("amp/backoff_events",), needs="scaler"),
    Chart("5 AMP", "scale growths, cumulative (amp/growth_events)", ("amp/growth_events",), needs="scaler"),
    Chart("6 memory", "host RSS (GiB), each log step (memory/host_rss_gib)", ("memory/host_rss_gib",)),
    Chart("6 memory", "host peak RSS (GiB), epoch, max over ranks (memory/host_peak_rss_gib)",
          ("memory/host_peak_rss_gib",)),
    Chart("6 memory", "GPU memory allocated (GiB), each log step (memory/allocated_gib)", ("memory/allocated_gib",),
          needs="cuda"),
    Chart("6 memory", "GPU memory reserved (GiB), each log step (memory/reserved_gib)", ("memory/reserved_gib",),
          needs="cuda"),
    Chart("6 memory", "GPU peak allocated (GiB), epoch (memory/peak_allocated_gib)", ("memory/peak_allocated_gib",),
          needs="cuda"),
    Chart("6 memory", "GPU peak reserved (GiB), epoch (memory/peak_reserved_gib)", ("memory/peak_reserved_gib",),
          needs="cuda"),
    Chart("7 energy", "GPU board power (W, NVML), rank 0, each log interval (energy/power_w)", ("energy/power_w",),
          needs="cuda"),
    Chart("7 energy", "GPU board power (W, NVML), epoch average (energy/epoch_avg_w)", ("energy/epoch_avg_w",),
          needs="cuda"),
    Chart("7 energy", "GPU board energy per training sample (J, NVML: no CPU, memory, network or cooling), epoch"
          " (energy/j_per_sample)", ("energy/j_per_sample",),
          needs="cuda"),
)


def custom_scalars_layout(scaler: bool, cuda: bool, charts: tuple[Chart, ...] = LAYOUT,
                          ) -> dict[str, dict[str, list[Any]]]:
    """The layout of TensorBoard's custom-scalars tab for one run, as ``SummaryWriter.add_custom_scalars`` takes it.

    Args:
        scaler: the run has a GradScaler (the AMP charts are kept).
        cuda: the run is on a CUDA device (GPU memory, energy and MFU charts are kept).
        charts: the charts to choose from.

    Returns:
        ``{category: {title: ["Multiline", ["^tag$"]] or ["Margin", [line, bottom, top]]}}``; the charts whose
        tags this run cannot log are left out.
    """
    have = {None: True, "scaler": scaler, "cuda": cuda}
    layout: dict[str, dict[str, list[Any]]] = {}
    for chart in charts:
        if have[chart.needs]:
            spec = ["Margin", list(chart.tags)] if chart.band else ["Multiline", [f"^{t}$" for t in chart.tags]]
            layout.setdefault(chart.category, {})[chart.title] = spec
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
#: first two tag groups by name, ``epoch`` and ``lr-*`` in a CPU run, and keeps the tags' names). Quality is the
#: best val/mIoU so far: its last value is the run's best, in the card's table and (see :data:`FIRST_SCREEN_SMOOTHING`)
#: within the card's frame.
FIRST_SCREEN: tuple[str, ...] = ("train/loss_step", "val/mIoU_best", "perf/epoch/step_ms_median",
                                 "memory/host_rss_gib")

#: The Time Series smoothing the first-screen address sets (TensorBoard's default is 0.6). A card's y-range is taken
#: over the line it draws: with smoothing, the smoothed line, which stays below a best that is not held for several
#: points, so the best's raw point ends up above the frame; TensorBoard's "ignore outliers" (on by default, no
#: address setting) then also drops the top 5 % of the points (of up to 20, the highest: a value reached once).
#: Unsmoothed, the best so far is in the frame from the second validation that keeps it.
FIRST_SCREEN_SMOOTHING = 0.0


def first_screen_url(host: str = "localhost", port: int = 6006, tags: tuple[str, ...] = FIRST_SCREEN,
                     smoothing: float = FIRST_SCREEN_SMOOTHING) -> str:
    """The TensorBoard address whose Time Series tab opens with ``tags`` pinned at the top (``pinnedCards``).

    ``smoothing`` is TensorBoard's own address parameter of that name (:data:`FIRST_SCREEN_SMOOTHING`).
    """
    cards = json.dumps([{"plugin": "scalars", "tag": t} for t in tags], separators=(",", ":"))
    return f"http://{host}:{port}/?smoothing={smoothing:g}&pinnedCards={quote(cards)}#timeseries"


def serve(logdir: str | Path = "runs", host: str = "localhost", port: int = 6006) -> None:
    """Serve ``logdir`` with TensorBoard and print, as the last line, the address to open (:func:`first_screen_url`).

    TensorBoard starts in this process (``tensorboard.program``, the same server as the ``tensorboard`` command);
    once it listens, the address with the pinned first screen is printed, and TensorBoard's own start-up line,
    the bare address, is not. Runs until interrupted (Ctrl+C). ``port=0`` takes a free port.

    Raises:
        CropScaleError: ``logdir`` is not a folder, or TensorBoard cannot serve (e.g. the port is taken).
    """
    from tensorboard import program

    if not Path(logdir).is_dir():
        raise CropScaleError(f"tensorboard: no folder {logdir}: train a run first (make fit)")
    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", str(logdir), "--host", host, "--port", str(port)])
    try:
        address = urlsplit(board.launch())
    except program.TensorBoardServerException as err:
        raise CropScaleError(f"tensorboard --logdir {logdir} --port {port}: {err.msg}") from None
    print(f"TensorBoard serves {logdir}; open {first_screen_url(host, address.port)}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
