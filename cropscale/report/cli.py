"""Quality-and-speed report: training runs and microbenchmarks side by side (Markdown, CSV, PNG).

``python -m cropscale report RUN_DIR_OR_BENCH_JSON ... [--out DIR] [--stem report]``

Inputs, any mix of:

- a **run folder** (the TensorBoard version folder ``runs/<name>/version_<n>/`` of ``python -m
  cropscale fit``): ``run.json`` (written by :class:`cropscale.callbacks.ProvenanceCallback`, schema
  ``cropscale.run/1``, see ``docs/run_json.md``), the TensorBoard event files (read with
  tensorboard's ``EventAccumulator``) and ``config.yaml``. A folder that holds run folders further
  down (e.g. ``runs/``) is searched for them.
- a **benchmark JSON** written by ``python -m cropscale benchmark --output`` (schema
  ``cropscale.benchmark/1``): one row per (precision, batch size) configuration.

Outputs in ``--out`` (default ``reports/``): ``<stem>.md`` and ``<stem>.csv`` (one row per run or
benchmark configuration), and the figures ``iou_by_epoch.png`` (best macro IoU available at each
epoch, per run), ``throughput.png`` and ``peak_memory.png`` (by precision and batch size),
``step_decomposition.png`` (median time per step window, stacked bars).

Every figure carries an evidence label: ``measured-run`` (a training run's own record),
``measured-microbenchmark`` (compute-only benchmark). A figure that is missing is "n/a" with the
reason. Runs that differ only in precision are paired (FP32 as the base): speed-up = samples/s of the
mixed-precision run / samples/s of the FP32 run; IoU difference = best ``val/mIoU`` (mixed) - best
``val/mIoU`` (FP32), in IoU units (0..1).

Where each run figure comes from (``run.json`` ``summary`` sections are the scaling callbacks'):

================================  ===================================================================
figure                            source
================================  ===================================================================
precision                         ``run.json`` ``precision`` (the precision Lightning ran with), else
                                  ``config.yaml`` ``trainer.precision`` shown as ``<p> (requested)``
                                  (see "Runs without run.json" below)
strategy                          ``run.json`` ``distributed.strategy``, else ``config.yaml``
                                  ``trainer.strategy``; short names ``ddp`` / ``fsdp`` / ``deepspeed``
                                  for those classes, else the class name (a ``class_path`` entry) or
                                  the configured string
devices                           ``run.json`` ``distributed.world_size``, else ``config.yaml``
                                  ``trainer.devices`` x ``num_nodes`` (numeric strings such as ``'2'``
                                  count; a list of device ids counts its ids; ``auto`` / ``-1`` are
                                  shown as such, footnoted: the resolved count is not recorded)
global batch                      TensorBoard ``optim/global_batch`` (else local batch x world size x
                                  accumulation from the configuration)
best val/mIoU, its epoch          maximum of TensorBoard ``val/mIoU``; epoch (0-based) from Lightning's
                                  ``epoch`` scalar at the same step
final train loss                  last TensorBoard ``train/loss_epoch``
median / p95 step (ms)            ``summary.step_timing``: the ``step`` window of the last epoch with
                                  measured (post-warm-up) steps, else ``summary.throughput`` step latency
samples/s                         ``summary.throughput.samples_per_s``: training samples / training-loop
                                  seconds over the whole run
train / val / end-to-end epoch    ``summary.throughput.epochs[*]`` ``train_s`` / ``val_s`` / ``wall_s``:
                                  median over epochs, the first epoch left out when there are several
energy (J, J/sample)              ``summary.energy`` ``total_energy_j`` / ``j_per_sample`` (NVML)
peak memory (GiB)                 ``summary.memory.peak_allocated_gib`` (GPU), else
                                  ``host_peak_rss_gib`` (host RSS, CPU runs; noted)
non-finite, skipped steps         ``summary.nonfinite`` (summed over ranks) + ``summary.loss_scale``
                                  ``skipped_steps`` (GradScaler skips under 16-mixed)
================================  ===================================================================

Runs without ``run.json`` (``python -m cropscale fit`` without ``--config callbacks/scaling.yaml``:
only ``config.yaml``, ``hparams.yaml`` and TensorBoard events). The configuration holds the *requested*
precision, not the one Lightning ran with (it runs ``16-mixed`` on CPU as ``bf16-mixed``), and nothing
else in such a folder records it. The report therefore shows ``<precision> (requested)`` with a footnote
saying that it is unverified, and why when the accelerator makes it so (``cpu``: the request was
changed; ``auto``: it depends on the device the run got). Such runs are still paired (their IoU
difference is measured), but the pair is labelled by the *requested* precision: the pair's Precision
cell reads e.g. ``AMP FP16 (requested)`` and its footnote names the unverified run(s) -- never a bare
``AMP FP16`` as if the precision had been recorded. With ``run.json`` its ``precision`` is
authoritative (a footnote notes where the configuration requested something else).

Run folders that are no training run -- no TensorBoard tag under ``train/`` (``train/loss_step``,
``train/loss_epoch``) and no ``run.json`` with a training summary, e.g. ``runs/default/version_N``
written by ``python -m cropscale validate`` / ``test`` -- are skipped with one printed line
``skipped RUN: no training run (validate/test only)``; a folder named explicitly on the command line is
skipped too, with the longer reason.

Functions for reuse (the study runner :mod:`cropscale.study.runner` builds on them):
:func:`load_run`, :func:`load_benchmark`, :func:`load_inputs`, :func:`find_runs`,
:func:`load_scalars`, :func:`precision_pairs`, :func:`write_table`, :func:`write_report`, and the
figure helpers :func:`plot_iou_by_epoch`, :func:`plot_by_precision_and_batch`,
:func:`plot_step_decomposition`. A *record* (what the loaders return) is a dict with ``name``,
``kind`` (``run`` or ``microbenchmark``), ``path``, ``figures`` (column key -> :func:`figure` dict),
``iou_by_epoch`` (``[(epoch, best mIoU so far)]``), ``step_windows_ms`` (window -> ms, with
``step_windows_source``) and ``pair_key`` (what must be equal for two records to form a precision pair);
run records also carry ``precision_requested``, ``precision_verified`` (False: from the configuration
only), ``descriptive`` (column key -> :func:`figure` dict of a descriptive cell with its footnote),
``training_run`` and ``skip_reason``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cropscale.errors import CropScaleError

__all__ = [
    "COLUMNS",
    "EVIDENCE_BENCH",
    "EVIDENCE_RUN",
    "PAIR_COLUMNS",
    "Column",
    "figure",
    "find_runs",
    "load_benchmark",
    "load_inputs",
    "load_run",
    "load_scalars",
    "main",
    "plot_by_precision_and_batch",
    "plot_iou_by_epoch",
    "plot_step_decomposition",
    "precision_label",
    "precision_pairs",
    "write_report",
    "write_table",
]

EVIDENCE_RUN = "measured-run"
EVIDENCE_BENCH = "measured-microbenchmark"
EVIDENCE_ANALYTICAL = "analytical-scenario"
RUN_SCHEMA = "cropscale.run/1"
BENCH_SCHEMA = "cropscale.benchmark/1"
PRECISION_LABELS = {"32-true": "FP32", "16-mixed": "AMP FP16", "bf16-mixed": "AMP BF16", "16-true": "FP16",
                    "bf16-true": "BF16", "64-true": "FP64"}
STEP_WINDOWS = ("data_wait", "transfer", "forward", "backward", "optimizer", "remainder")
"""The disjoint windows of :class:`cropscale.callbacks.StepTimingCallback` that add up to a step."""
# configuration keys that may differ inside a precision pair (they do not change what is computed)
PAIR_IGNORED_PREFIXES = (
    "trainer.precision", "model.allow_tf32", "trainer.logger", "trainer.default_root_dir",
    "trainer.enable_progress_bar", "trainer.enable_model_summary", "ckpt_path", "config",
)


@dataclass(frozen=True)
class Column:
    """One table column: ``key`` in a record's ``figures`` (or a top-level record key), Markdown
    ``header``, ``fmt`` (``format`` spec for numbers), ``figure`` (True: a measured figure with an
    evidence label; False: a descriptive field)."""

    key: str
    header: str
    fmt: str = ""
    figure: bool = True


COLUMNS: tuple[Column, ...] = (
    Column("name", "Run", figure=False),
    Column("kind", "Kind", figure=False),
    Column("precision", "Precision", figure=False),
    Column("strategy", "Strategy", figure=False),
    Column("devices", "Devices", "d", figure=False),
    Column("global_batch", "Global batch", "d", figure=False),
    Column("best_miou", "Best val/mIoU", ".4f"),
    Column("best_epoch", "Best epoch", "d"),
    Column("final_train_loss", "Final train loss", ".4f"),
    Column("median_step_ms", "Median step (ms)", ".2f"),
    Column("p95_step_ms", "p95 step (ms)", ".2f"),
    Column("samples_per_s", "Samples/s", ".2f"),
    Column("train_epoch_s", "Train epoch (s)", ".2f"),
    Column("val_epoch_s", "Val epoch (s)", ".2f"),
    Column("epoch_s", "End-to-end epoch (s)", ".2f"),
    Column("energy_j", "Energy (J)", ".0f"),
    Column("energy_j_per_sample", "J/sample", ".3f"),
    Column("peak_memory_gib", "Peak GiB", ".2f"),
    Column("nonfinite", "Non-finite", "d"),
    Column("skipped_steps", "Skipped steps", "d"),
)
"""Columns of the run table, in order."""

PAIR_COLUMNS: tuple[Column, ...] = (
    Column("base", "FP32 run", figure=False),
    Column("other", "Mixed-precision run", figure=False),
    Column("precision", "Precision", figure=False),
    Column("global_batch", "Global batch", "d", figure=False),
    Column("base_samples_per_s", "FP32 samples/s", ".2f"),
    Column("other_samples_per_s", "Mixed samples/s", ".2f"),
    Column("speedup", "Speed-up", ".3f"),
    Column("step_ratio", "Median step ratio", ".3f"),
    Column("base_best_miou", "FP32 best mIoU", ".4f"),
    Column("other_best_miou", "Mixed best mIoU", ".4f"),
    Column("iou_difference", "IoU difference", "+.4f"),
    Column("memory_ratio", "Peak memory ratio", ".3f"),
)
"""Columns of the precision-pair table."""


def figure(value: Any, evidence: str | None, why: str | None = None, note: str | None = None) -> dict[str, Any]:
    """A reported figure: ``{"value", "evidence", "why", "note"}``. ``value`` None means n/a and then
    ``why`` says why; ``note`` qualifies a present value (e.g. "host RSS")."""
    if value is not None and isinstance(value, float) and not math.isfinite(value):
        value, why = None, why or f"non-finite value {value}"
    return {"value": value, "evidence": evidence, "why": None if value is not None else (why or "not recorded"),
            "note": note}


# --------------------------------------------------------------------------------------- loading
def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CropScaleError(f"report: cannot read {path}: {err}") from None
    except json.JSONDecodeError as err:
        raise CropScaleError(f"report: {path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise CropScaleError(f"report: {path} does not hold a JSON object")
    return data


def _events_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("events.out.tfevents.*"))


def _is_run_folder(folder: Path) -> bool:
    return (folder / "run.json").is_file() or bool(_events_files(folder))


def find_runs(path: str | Path) -> list[Path]:
    """Run folders at or under ``path`` (a folder holding ``run.json`` or TensorBoard event files),
    sorted; ``[path]`` itself when it is one.

    Raises:
        CropScaleError: ``path`` does not exist or holds no run folder.
    """
    root = Path(path)
    if not root.exists():
        raise CropScaleError(f"report: {root} does not exist")
    if root.is_file():
        if root.name == "run.json":
            return [root.parent]
        raise CropScaleError(f"report: {root} is a file but not run.json or a benchmark JSON")
    if _is_run_folder(root):
        return [root]
    found = sorted({p.parent for p in root.rglob("run.json")} | {p.parent for p in root.rglob("events.out.tfevents.*")})
    if not found:
        raise CropScaleError(f"report: {root} holds no run folder (no run.json, no TensorBoard event file)")
    return found


def load_scalars(folder: str | Path) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar of the TensorBoard event files directly in ``folder``:
    ``{tag: [(step, value, wall_time_s), ...]}`` sorted by wall time (files merged)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[tuple[int, float, float]]] = {}
    for path in _events_files(Path(folder)):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        try:
            acc.Reload()
        except Exception as err:  # a truncated or foreign file: name it
            raise CropScaleError(f"report: cannot read TensorBoard events {path}: {err}") from None
        for tag in acc.Tags().get("scalars", []):
            scalars.setdefault(tag, []).extend((e.step, float(e.value), e.wall_time) for e in acc.Scalars(tag))
    for events in scalars.values():
        events.sort(key=lambda e: e[2])
    return scalars


def _epoch_series(scalars: dict[str, list[tuple[int, float, float]]], tag: str) -> list[tuple[int, float]]:
    """``[(epoch, value)]`` of ``tag``: the epoch is Lightning's ``epoch`` scalar logged at the same
    step (nearest in wall time), else the event's position (validation once per epoch)."""
    epochs = scalars.get("epoch", [])
    out = []
    for i, (step, value, wall) in enumerate(scalars.get(tag, [])):
        same = [e for e in epochs if e[0] == step]
        epoch = int(round(min(same, key=lambda e: abs(e[2] - wall))[1])) if same else i
        out.append((epoch, value))
    return out


def _get(d: Any, *keys: Any, default: Any = None) -> Any:
    for k in keys:
        if isinstance(d, dict) and k in d:
            d = d[k]
        elif isinstance(d, list) and isinstance(k, int) and -len(d) <= k < len(d):
            d = d[k]
        else:
            return default
    return d


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(_flatten(v, f"{prefix}.{i}"))
        return out if obj else {prefix: []}
    return {prefix: obj}


def _pair_key(config: dict[str, Any] | None, fallback: dict[str, Any]) -> str:
    if config:
        flat = {k: v for k, v in _flatten(config).items() if not k.startswith(PAIR_IGNORED_PREFIXES)}
        return "config:" + json.dumps(flat, sort_keys=True, default=str)
    return "fields:" + json.dumps(fallback, sort_keys=True, default=str)


def _median_after_first(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median(values[1:] if len(values) > 1 else values)


def _load_config(folder: Path, run_json: dict[str, Any] | None) -> dict[str, Any] | None:
    config = _get(run_json, "config")
    if isinstance(config, dict) and config:
        return config
    path = folder / "config.yaml"
    if path.is_file():
        import yaml

        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            raise CropScaleError(f"report: {path} is not valid YAML: {err}") from None
        return data if isinstance(data, dict) else None
    return None


# Lightning's short names of the strategies the report abbreviates (else the class name is shown)
STRATEGY_SHORT_NAMES = {"DDPStrategy": "ddp", "FSDPStrategy": "fsdp", "DeepSpeedStrategy": "deepspeed"}
# Lightning's legacy precision spellings (``_convert_precision_to_unified_args``)
PRECISION_ALIASES = {"64": "64-true", "32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}
MIXED_OR_HALF = ("16-mixed", "bf16-mixed", "16-true", "bf16-true")
TRAINING_SCALAR_PREFIX = "train/"
"""TensorBoard tags of a training run (``train/loss_step``, ``train/loss_epoch``, ...): ``validate`` and
``test`` never log them."""


def _class_name(value: Any) -> str | None:
    """The class name of a LightningCLI ``{class_path, init_args}`` entry or of a dotted import path."""
    if isinstance(value, dict):
        path = value.get("class_path")
        return str(path).rsplit(".", 1)[-1] if path else None
    if isinstance(value, str) and "." in value and value.rsplit(".", 1)[-1][:1].isupper():
        return value.rsplit(".", 1)[-1]
    return None


def _strategy_name(value: Any) -> str | None:
    """Short strategy name: ``ddp`` / ``fsdp`` / ``deepspeed`` for those classes, else the class name
    (a ``class_path`` entry, a dotted path or ``run.json``'s class name), or the configured string."""
    if value is None:
        return None
    cls = _class_name(value)
    if cls is None and isinstance(value, str) and value.endswith("Strategy"):
        cls = value  # run.json distributed.strategy: a class name
    if cls is not None:
        return STRATEGY_SHORT_NAMES.get(cls, cls)
    if isinstance(value, dict):
        return "custom (no class_path)"
    return str(value)


def _accelerator_name(value: Any) -> str | None:
    cls = _class_name(value)
    if cls is not None:
        return {"CPUAccelerator": "cpu", "CUDAAccelerator": "cuda", "MPSAccelerator": "mps"}.get(cls, cls)
    return None if value is None else str(value).lower()


def _normalise_precision(value: Any) -> str | None:
    """Lightning's unified precision string (``16`` -> ``16-mixed``, ``bf16`` -> ``bf16-mixed``, ...);
    ``None`` stays ``None``."""
    if value is None:
        return None
    text = str(value).strip()
    return PRECISION_ALIASES.get(text, text)


def _as_int(value: Any) -> int | None:
    """An int from an int or a numeric string (``'2'``, as LightningCLI may store ``devices``), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def _devices_from_config(config: dict[str, Any] | None) -> tuple[int | None, Any, str | None]:
    """``(world size or None, shown value, reason or qualifier)`` from ``trainer.devices`` x
    ``trainer.num_nodes`` of the configuration. Numeric strings count as ints; a list of device ids
    (or Lightning's ``"0,1"`` string) counts its ids; ``auto`` / ``-1`` are shown as such with the reason
    the count is unknown."""
    src = "config.yaml"
    d, n_raw = _get(config, "trainer", "devices"), _get(config, "trainer", "num_nodes", default=1)
    nodes = _as_int(n_raw) if n_raw is not None else 1
    if nodes is None or nodes < 1:
        return None, None, f"{src} trainer.num_nodes={n_raw!r} is not a node count"
    per_node = f" x {nodes} nodes" if nodes > 1 else ""
    if d is None:
        return None, None, f"no trainer.devices in {src} (and no run.json)"
    count = _as_int(d)
    ids: list[Any] | None = None
    if isinstance(d, (list, tuple)):
        ids = list(d)
    elif isinstance(d, str) and "," in d:
        ids = [x.strip() for x in d.split(",") if x.strip()]
    if ids is not None:
        n = len(ids) * nodes
        return n, n, f"{len(ids)} device id(s) {ids}{per_node} in {src} (no run.json)"
    if count is not None and count > 0:
        note = f"{count} per node{per_node} in {src} (no run.json)" if nodes > 1 else None
        return count * nodes, count * nodes, note
    shown = "all (-1)" if count == -1 else str(d)
    return None, shown, (f"{src} requests devices={d!r}{per_node}: the number Lightning resolved is not "
                         "recorded (no run.json)")


def _precision_from(run_json: dict[str, Any] | None, config: dict[str, Any] | None
                    ) -> tuple[str | None, str | None, bool, str | None]:
    """``(precision, requested, verified, note)``. ``run.json`` ``precision`` (the precision plugin
    Lightning actually used) is authoritative; without it the configuration's ``trainer.precision`` is
    the *requested* precision (``verified`` False) and ``note`` says what cannot be verified."""
    raw = _get(config, "trainer", "precision")
    has_trainer = isinstance(_get(config, "trainer"), dict)
    requested = _normalise_precision(raw) if raw is not None else ("32-true" if has_trainer else None)
    recorded = _normalise_precision(_get(run_json, "precision"))
    if recorded is not None:
        note = (f"run.json records {recorded}; the configuration requested {requested} "
                "(Lightning changed it)" if requested and requested != recorded else None)
        return recorded, requested, True, note
    if requested is None:
        return None, None, False, "no precision: no run.json and no trainer.precision in config.yaml"
    accel = _accelerator_name(_get(config, "trainer", "accelerator")) or "auto"
    note = ("precision as requested in config.yaml"
            + (" (trainer.precision unset: Lightning's default 32-true)" if raw is None else "")
            + "; no run.json records the precision Lightning ran with")
    if requested == "16-mixed" and accel == "cpu":
        note += ("; accelerator 'cpu': Lightning runs 16-mixed on CPU as bf16-mixed, so this run did not use "
                 "FP16 AMP")
    elif requested in MIXED_OR_HALF and accel not in ("cuda", "gpu"):
        note += (f"; accelerator {accel!r}: the effective precision depends on the device the run got "
                 "(Lightning runs 16-mixed on CPU as bf16-mixed) and cannot be verified")
    return requested, requested, False, note


def _training_summary(run_json: dict[str, Any] | None) -> bool:
    summary = _get(run_json, "summary")
    return bool(isinstance(summary, dict) and summary) or bool(_get(run_json, "global_step"))


def precision_label(record: dict[str, Any]) -> str:
    """Display label of a record's precision (``AMP FP16``, ...), with `` (requested)`` when no
    ``run.json`` confirms it."""
    p = record.get("precision")
    label = PRECISION_LABELS.get(p, str(p))
    return f"{label} (requested)" if record.get("precision_verified") is False else label


def _run_name(folder: Path) -> str:
    parts = folder.resolve().parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else str(folder)


def load_run(path: str | Path) -> dict[str, Any]:
    """Read one run folder (``run.json``, TensorBoard events, ``config.yaml``) into a record (see the
    module docstring); every figure labelled ``measured-run`` or n/a with the reason.

    Raises:
        CropScaleError: the folder holds neither ``run.json`` nor an event file, or a file in it is
            unreadable (named in the message).
    """
    folder = Path(path)
    if folder.is_file() and folder.name == "run.json":
        folder = folder.parent
    if not folder.is_dir() or not _is_run_folder(folder):
        raise CropScaleError(f"report: {folder} is not a run folder (no run.json, no TensorBoard event file)")
    run_json = _read_json(folder / "run.json") if (folder / "run.json").is_file() else None
    if run_json is not None and run_json.get("schema") not in (None, RUN_SCHEMA):
        raise CropScaleError(f"report: {folder / 'run.json'} has schema {run_json.get('schema')!r}, expected {RUN_SCHEMA!r}")
    scalars = load_scalars(folder)
    config = _load_config(folder, run_json)
    summary = _get(run_json, "summary", default={}) or {}
    no_json = "no run.json in the run folder (fit without --config callbacks/scaling.yaml)"
    E = EVIDENCE_RUN  # noqa: N806
    figures: dict[str, dict[str, Any]] = {}

    precision, precision_requested, precision_verified, precision_note = _precision_from(run_json, config)
    precision_shown = precision if precision_verified or precision is None else f"{precision} (requested)"
    recorded_strategy = _get(run_json, "distributed", "strategy")
    strategy = _strategy_name(recorded_strategy or _get(config, "trainer", "strategy"))
    strategy_note = None
    if strategy is None:
        strategy_note = "no strategy in run.json or config.yaml"
    elif recorded_strategy is None and strategy == "auto":
        strategy_note = "strategy 'auto' as configured: the strategy Lightning chose is not recorded (no run.json)"
    devices = _as_int(_get(run_json, "distributed", "world_size"))
    devices_shown: Any = devices
    devices_note = None
    if devices is None:
        devices, devices_shown, devices_note = _devices_from_config(config)
    descriptive = {
        "precision": figure(precision_shown, None, precision_note, precision_note),
        "strategy": figure(strategy, None, strategy_note, strategy_note),
        "devices": figure(devices_shown, None, devices_note, devices_note),
    }
    gb_events = scalars.get("optim/global_batch", [])
    if gb_events:
        global_batch: int | None = int(round(gb_events[-1][1]))
    else:
        local = _get(config, "data", "batch_size")
        acc = _get(config, "trainer", "accumulate_grad_batches", default=1) or 1
        global_batch = int(local) * int(devices) * int(acc) if isinstance(local, int) and devices else None
        if global_batch is None:
            descriptive["global_batch"] = figure(None, None, "no optim/global_batch in the TensorBoard events and "
                                                 + ("the world size is unknown" if isinstance(local, int)
                                                    else "no integer data.batch_size in the configuration"))

    # quality
    miou = _epoch_series(scalars, "val/mIoU")
    if miou:
        best = max(v for _, v in miou)
        best_epoch = min(ep for ep, v in miou if v == best)  # the first epoch that reached it
        figures["best_miou"] = figure(best, E)
        figures["best_epoch"] = figure(int(best_epoch), E)
    else:
        why = "no val/mIoU in the TensorBoard events (validation did not run)"
        figures["best_miou"] = figure(None, E, why)
        figures["best_epoch"] = figure(None, E, why)
    iou_by_epoch: list[tuple[int, float]] = []
    running = -math.inf
    for epoch, value in sorted(miou):
        running = max(running, value)
        iou_by_epoch.append((epoch, running))
    losses = scalars.get("train/loss_epoch", [])
    figures["final_train_loss"] = (figure(losses[-1][1], E) if losses
                                   else figure(None, E, "no train/loss_epoch in the TensorBoard events"))

    # speed
    step_timing = summary.get("step_timing") if isinstance(summary, dict) else None
    throughput = summary.get("throughput") if isinstance(summary, dict) else None
    median = p95 = None
    step_note = None
    windows: dict[str, float] = {}
    windows_source = None
    for ep in reversed(_get(step_timing, "epochs", default=[]) or []):
        step = _get(ep, "windows_ms", "step", default={}) or {}
        if step.get("median") is not None:
            median, p95 = step.get("median"), step.get("p95")
            step_note = f"epoch {ep.get('epoch')}, {step.get('n')} measured steps"
            windows = {w: _get(ep, "windows_ms", w, "median") for w in STEP_WINDOWS}
            windows = {w: v for w, v in windows.items() if v is not None}
            windows_source = f"StepTimingCallback medians, epoch {ep.get('epoch')} ({E})"
            break
    if median is None:
        for ep in reversed(_get(throughput, "epochs", default=[]) or []):
            lat = ep.get("step_latency_ms") or {}
            if lat.get("median") is not None:
                median, p95 = lat.get("median"), lat.get("p95")
                step_note = f"ThroughputCallback, epoch {ep.get('epoch')}, {lat.get('n')} steps"
                break
    if median is None:
        if run_json is None:
            why = no_json
        elif step_timing is None and throughput is None:
            why = "run.json has no step_timing or throughput summary"
        else:
            total = _get(step_timing, "steps_total")
            warm = _get(step_timing, "warmup_steps", default=_get(throughput, "warmup_steps"))
            why = f"no step outside the callbacks' warm-up ({total} steps in all, warm-up {warm})"
        figures["median_step_ms"] = figure(None, E, why)
        figures["p95_step_ms"] = figure(None, E, why)
    else:
        figures["median_step_ms"] = figure(float(median), E, note=step_note)
        figures["p95_step_ms"] = figure(None if p95 is None else float(p95), E, "p95 not recorded", note=step_note)
    if not windows:
        means = {w: statistics.fmean(v for _, v, _ in scalars[f"perf/step/{w}_ms"])
                 for w in STEP_WINDOWS if scalars.get(f"perf/step/{w}_ms")}
        if means:
            windows = means
            windows_source = f"TensorBoard perf/step/*_ms, mean of logged intervals incl. warm-up ({E})"

    sps = _get(throughput, "samples_per_s")
    if sps is not None:
        figures["samples_per_s"] = figure(float(sps), E, note="training samples / training-loop seconds, whole run")
    else:
        figures["samples_per_s"] = figure(None, E, no_json if run_json is None else "no throughput summary in run.json")
    epochs = _get(throughput, "epochs", default=[]) or []
    for key, field in (("train_epoch_s", "train_s"), ("val_epoch_s", "val_s"), ("epoch_s", "wall_s")):
        value = _median_after_first([ep.get(field) for ep in epochs])
        note = (f"median of {len(epochs) - 1} epochs after the first" if len(epochs) > 1 else "single epoch")
        figures[key] = (figure(value, E, note=note) if value is not None
                        else figure(None, E, no_json if run_json is None else f"no {field} in the throughput summary"))

    energy = summary.get("energy") if isinstance(summary, dict) else None
    if _get(energy, "available") and _get(energy, "total_energy_j") is not None:
        note = f"GPU board energy via NVML ({_get(energy, 'method')}); excludes CPU, storage, cooling"
        figures["energy_j"] = figure(float(energy["total_energy_j"]), E, note=note)
        jps = _get(energy, "j_per_sample")
        figures["energy_j_per_sample"] = figure(None if jps is None else float(jps), E, "no samples counted", note)
    else:
        why = (no_json if run_json is None else _get(energy, "reason") or "no energy summary in run.json")
        figures["energy_j"] = figure(None, E, f"not measured: {why}")
        figures["energy_j_per_sample"] = figure(None, E, f"not measured: {why}")

    memory = summary.get("memory") if isinstance(summary, dict) else None
    if _get(memory, "peak_allocated_gib") is not None:
        figures["peak_memory_gib"] = figure(float(memory["peak_allocated_gib"]), E,
                                            note="peak allocated GPU memory (torch.cuda)")
    elif _get(memory, "host_peak_rss_gib") is not None:
        figures["peak_memory_gib"] = figure(float(memory["host_peak_rss_gib"]), E,
                                            note="host RSS of the training process (no GPU)")
    else:
        figures["peak_memory_gib"] = figure(None, E, no_json if run_json is None else "no memory summary in run.json")

    nonfinite = summary.get("nonfinite") if isinstance(summary, dict) else None
    loss_scale = summary.get("loss_scale") if isinstance(summary, dict) else None
    if nonfinite is not None:
        per_rank = nonfinite.get("per_rank") or [{"nonfinite_batches": nonfinite.get("nonfinite_batches_rank0", 0),
                                                  "skipped_steps": nonfinite.get("skipped_steps_rank0", 0)}]
        figures["nonfinite"] = figure(int(sum(r.get("nonfinite_batches") or 0 for r in per_rank)), E,
                                      note=f"summed over {len(per_rank)} rank(s)")
        skipped = int(sum(r.get("skipped_steps") or 0 for r in per_rank))
        scaler_skips = int(_get(loss_scale, "skipped_steps", default=0) or 0)
        note = (f"{skipped} by the non-finite policy + {scaler_skips} by the GradScaler"
                if _get(loss_scale, "scaler_in_use") else f"{skipped} by the non-finite policy; no GradScaler")
        figures["skipped_steps"] = figure(skipped + scaler_skips, E, note=note)
    else:
        why = no_json if run_json is None else "no nonfinite summary in run.json"
        figures["nonfinite"] = figure(None, E, why)
        figures["skipped_steps"] = figure(None, E, why)

    status = _get(run_json, "status")
    training = any(t.startswith(TRAINING_SCALAR_PREFIX) for t in scalars) or _training_summary(run_json)
    if training:
        skip_reason = None
    elif run_json is None:
        skip_reason = "no training run (validate/test only)"
    else:
        skip_reason = (f"no training run: no training scalars and run.json holds no training summary "
                       f"(status {status!r})")
    return {
        "name": _run_name(folder),
        "kind": "run",
        "path": str(folder),
        "evidence": E,
        "status": status,
        "precision": precision,
        "precision_requested": precision_requested,
        "precision_verified": precision_verified,
        "strategy": strategy,
        "devices": devices,
        "global_batch": global_batch,
        "descriptive": descriptive,
        "training_run": training,
        "skip_reason": skip_reason,
        "figures": figures,
        "iou_by_epoch": iou_by_epoch,
        "step_windows_ms": windows,
        "step_windows_source": windows_source,
        "pair_key": _pair_key(config, {"strategy": strategy, "devices": devices, "global_batch": global_batch}),
        "scalars_tags": sorted(scalars),
    }


def load_benchmark(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``python -m cropscale benchmark`` JSON into one record per configuration; figures are
    ``measured-microbenchmark``; quality, epoch-time and energy figures are n/a (compute-only).

    Raises:
        CropScaleError: unreadable file, or not a ``cropscale.benchmark/1`` document.
    """
    path = Path(path)
    doc = _read_json(path)
    if doc.get("schema") != BENCH_SCHEMA or not isinstance(doc.get("results"), list):
        raise CropScaleError(f"report: {path} is not a cropscale benchmark JSON (schema {doc.get('schema')!r}, "
                             f"expected {BENCH_SCHEMA!r} with a 'results' list)")
    E = EVIDENCE_BENCH  # noqa: N806
    device = _get(doc, "environment", "device", "name", default="?")
    records = []
    compute_only = "compute-only microbenchmark: no training on data, no validation"
    for r in doc["results"]:
        precision, batch = r.get("precision"), r.get("batch_size")
        ok = r.get("status") == "ok"
        why_failed = f"configuration {r.get('status')}: {r.get('error')}"
        figures = {
            "best_miou": figure(None, E, compute_only),
            "best_epoch": figure(None, E, compute_only),
            "final_train_loss": figure(None, E, "synthetic batch: the loss is not a quality figure"),
            "train_epoch_s": figure(None, E, compute_only),
            "val_epoch_s": figure(None, E, compute_only),
            "epoch_s": figure(None, E, compute_only),
            "energy_j": figure(None, E, "not measured by the benchmark"),
            "energy_j_per_sample": figure(None, E, "not measured by the benchmark"),
        }
        steps_note = f"{r.get('iterations')} measured steps after {r.get('warmup')} warm-up, synchronised"
        for key, src, note in (("median_step_ms", "median_step_ms", steps_note), ("p95_step_ms", "p95_step_ms", steps_note),
                               ("samples_per_s", "samples_per_s", "batch / median step")):
            figures[key] = figure(r.get(src) if ok else None, E, why_failed, note)
        kind = r.get("peak_memory_kind")
        mem_note = {"cuda-max-allocated": "peak allocated GPU memory (torch.cuda)",
                    "host-rss-process": "host RSS of the whole benchmark process (CPU)"}.get(kind, kind)
        figures["peak_memory_gib"] = figure(r.get("peak_memory_gib") if ok else None, E, why_failed, mem_note)
        figures["nonfinite"] = figure(r.get("nonfinite_steps") if ok else None, E, why_failed,
                                      "measured steps with a non-finite loss or gradient norm")
        if ok:
            scaler = bool(r.get("grad_scaler"))
            figures["skipped_steps"] = figure(int(r.get("nonfinite_steps") or 0) if scaler else 0, E,
                                              note="GradScaler skips" if scaler else "no GradScaler: never skipped")
        else:
            figures["skipped_steps"] = figure(None, E, why_failed)
        label = PRECISION_LABELS.get(precision, precision)
        records.append({
            "name": f"{path.name}: {label} b{batch}",
            "kind": "microbenchmark",
            "path": str(path),
            "evidence": E,
            "status": r.get("status"),
            "precision": precision,
            "strategy": f"single device, compute-only ({device})",
            "devices": 1,
            "global_batch": batch,
            "figures": figures,
            "iou_by_epoch": [],
            "step_windows_ms": {},
            "step_windows_source": None,
            "pair_key": f"bench:{path.resolve()}:{batch}",
        })
    return records


def load_inputs(paths: Iterable[str | Path], on_skip: Callable[[str], None] | None = print) -> list[dict[str, Any]]:
    """Records of every input: benchmark JSON files (by their schema) and training-run folders
    (searched with :func:`find_runs`).

    A run folder that is no training run (no ``train/*`` TensorBoard scalar and no ``run.json`` with a
    training summary: a ``python -m cropscale validate`` / ``test`` folder) is skipped, with one line
    ``skipped RUN: <reason>`` passed to ``on_skip`` (default ``print``; None: silent); a folder named
    explicitly gets the longer reason.

    Raises:
        CropScaleError: an input that is neither (named); every input skipped (the reasons listed).
    """
    records: list[dict[str, Any]] = []
    skipped: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_file() and path.suffix == ".json" and path.name != "run.json":
            records.extend(load_benchmark(path))
            continue
        folders = find_runs(path)
        named = path.parent if path.is_file() else path
        for folder in folders:
            record = load_run(folder)
            if record["training_run"]:
                records.append(record)
                continue
            line = f"skipped {folder}: {record['skip_reason']}"
            if folder.resolve() == named.resolve():
                line += (f" (named explicitly, still skipped: its TensorBoard events hold no "
                         f"{TRAINING_SCALAR_PREFIX}* scalar such as train/loss_step or train/loss_epoch, and "
                         + ("it has no run.json" if record["status"] is None else "its run.json has no summary")
                         + "; `python -m cropscale validate` / `test` write such folders)")
            skipped.append(f"{folder} ({record['skip_reason']})")
            if on_skip is not None:
                on_skip(line)
    if not records and skipped:
        raise CropScaleError(f"report: no training run or benchmark among the inputs; skipped {len(skipped)} "
                             "run folder(s): " + "; ".join(skipped))
    names = [r["name"] for r in records]
    for r in records:  # make names unique: fall back to the full path where two collide
        if names.count(r["name"]) > 1 and r["kind"] == "run":
            r["name"] = r["path"]
    return records


# ---------------------------------------------------------------------------------------- pairing
def _value(record: dict[str, Any], key: str) -> Any:
    fig = record["figures"].get(key)
    return fig["value"] if fig else record.get(key)


def precision_pairs(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pairs of records that differ only in precision: an FP32 (``32-true``) base and each record of
    another precision with the same ``pair_key``.

    Returns:
        one dict per pair with the :data:`PAIR_COLUMNS` keys as :func:`figure` dicts (the ratios are
        ``speedup = other samples/s / base samples/s``, ``step_ratio = other median step / base
        median step``, ``iou_difference = other best mIoU - base best mIoU``, ``memory_ratio = other
        peak / base peak``), plus ``evidence`` (the records' shared label). A ratio whose inputs are
        missing is n/a with the reason.
    """
    pairs = []
    bases: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("precision") == "32-true" and r.get("status") in (None, "ok", "finished"):
            bases.setdefault(r["pair_key"], r)
    for r in records:
        base = bases.get(r["pair_key"])
        if base is None or r is base or r.get("precision") in (None, "32-true") or r.get("status") in (
                "oom", "error", "unsupported"):
            continue
        E = base["evidence"] if base["evidence"] == r["evidence"] else f"{base['evidence']} + {r['evidence']}"  # noqa: N806

        def ratio(key: str, other: dict[str, Any] = r, base: dict[str, Any] = base, E: str = E,  # noqa: N803
                  diff: bool = False) -> dict[str, Any]:
            a, b = _value(other, key), _value(base, key)
            if a is None or b is None or (not diff and not b):
                whys = {n: rec["figures"].get(key, {}).get("why") or "not recorded"
                        for n, rec in (("mixed", other), ("FP32", base)) if _value(rec, key) is None}
                why = ("; ".join(f"{n}: {w}" for n, w in whys.items()) if len(set(whys.values())) > 1
                       else next(iter(whys.values()), "FP32 value is zero"))
                return figure(None, E, why)
            return figure(a - b if diff else a / b, E)

        requested = [rec for rec in (base, r) if rec.get("precision_verified") is False]
        pair_precision = PRECISION_LABELS.get(r["precision"], r["precision"])
        descriptive = {}
        if requested:
            pair_precision += " (requested)"
            why = ("precision as requested in config.yaml, not verified (no run.json) for "
                   + " and ".join(rec["name"] for rec in requested)
                   + "; the pair is by requested precision, not by the precision the runs ran with")
            if r.get("precision_verified") is False and r.get("precision") == "16-mixed" and "on CPU as bf16" in (
                    (r.get("descriptive") or {}).get("precision", {}).get("note") or ""):
                why += f"; {r['name']} ran on accelerator 'cpu', where Lightning runs 16-mixed as bf16-mixed"
            descriptive["precision"] = figure(pair_precision, None, note=why)
        pairs.append({
            "base": base["name"],
            "other": r["name"],
            "precision": pair_precision,
            "precision_verified": not requested,
            "descriptive": descriptive,
            "global_batch": r.get("global_batch"),
            "evidence": E,
            "base_samples_per_s": base["figures"]["samples_per_s"],
            "other_samples_per_s": r["figures"]["samples_per_s"],
            "speedup": ratio("samples_per_s"),
            "step_ratio": ratio("median_step_ms"),
            "base_best_miou": base["figures"]["best_miou"],
            "other_best_miou": r["figures"]["best_miou"],
            "iou_difference": ratio("best_miou", diff=True),
            "memory_ratio": ratio("peak_memory_gib"),
        })
    return pairs


# ---------------------------------------------------------------------------------------- tables
def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "n/a"
    if fmt and isinstance(value, (int, float)) and not isinstance(value, bool):
        if fmt.endswith("d"):
            return format(int(value), fmt)
        return format(value, fmt)
    return str(value)


def _cell_md(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def write_table(rows: Sequence[dict[str, Any]], out_dir: str | Path, stem: str,
                columns: Sequence[Column] = COLUMNS, title: str | None = None,
                intro: str | None = None) -> tuple[Path, Path]:
    """Write ``<stem>.md`` and ``<stem>.csv`` in ``out_dir`` (created if needed).

    Args:
        rows: records or pairs: each column ``key`` is looked up in ``row["figures"]`` then in
            ``row`` itself; a figure column's value is a :func:`figure` dict (or a plain value, then
            labelled with ``row["evidence"]``).
        columns: which columns, in order.
        title, intro: Markdown heading and paragraph above the table.

    Markdown: one column per ``columns`` entry plus ``Evidence`` (the labels of the row's figures);
    an n/a cell or a qualified value carries a footnote number, the footnotes (``why`` / ``note``,
    each distinct text once) follow the table. CSV: per figure column ``<key>``, ``<key>_evidence``, ``<key>_note`` (the
    reason when n/a, else the qualifier), descriptive columns as they are; numbers unrounded.

    Returns:
        ``(markdown_path, csv_path)``.
    """
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CropScaleError(f"report: cannot create --out {out}: {err}") from None
    header = [c.header for c in columns] + ["Evidence"]
    md = []
    if title:
        md += [f"## {title}", ""]
    if intro:
        md += [intro, ""]
    md += ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    notes: list[str] = []
    csv_rows = []
    for row in rows:
        cells, labels, csv_row = [], [], {}
        for c in columns:
            fig = (row.get("figures") or {}).get(c.key, row.get(c.key))
            if c.figure:
                if not isinstance(fig, dict):
                    fig = figure(fig, row.get("evidence"))
                text = _fmt(fig["value"], c.fmt)
                if fig["evidence"] and fig["evidence"] not in labels:
                    labels.append(fig["evidence"])
                extra = fig["why"] if fig["value"] is None else fig.get("note")
                if extra:
                    if extra not in notes:
                        notes.append(extra)
                    text += f" [{notes.index(extra) + 1}]"
                cells.append(_cell_md(text))
                csv_row[c.key] = "" if fig["value"] is None else fig["value"]
                csv_row[f"{c.key}_evidence"] = fig["evidence"] or ""
                csv_row[f"{c.key}_note"] = extra or ""
            else:
                desc = (row.get("descriptive") or {}).get(c.key)
                if isinstance(desc, dict):  # a descriptive value with its qualifier / reason
                    text, fig = _fmt(desc["value"], c.fmt), desc["value"]
                    extra = desc["why"] if desc["value"] is None else desc.get("note")
                    if extra:
                        if extra not in notes:
                            notes.append(extra)
                        text += f" [{notes.index(extra) + 1}]"
                    csv_row[f"{c.key}_note"] = extra or ""
                else:
                    text = _fmt(fig, c.fmt)
                cells.append(_cell_md(text))
                csv_row[c.key] = "" if fig is None else fig
        evidence = ", ".join(labels) or row.get("evidence") or "n/a"
        csv_row["evidence"] = evidence
        md.append("| " + " | ".join(cells + [evidence]) + " |")
        csv_rows.append(csv_row)
    if notes:
        md += ["", *[f"[{i}] {_cell_md(n)}" for i, n in enumerate(notes, 1)]]
    md_path, csv_path = out / f"{stem}.md", out / f"{stem}.csv"
    md_path.write_text("\n".join(md) + "\n", encoding="utf-8")
    fieldnames: list[str] = []
    for c in columns:
        if c.figure:
            fieldnames += [c.key, f"{c.key}_evidence", f"{c.key}_note"]
        else:  # a descriptive column gets a _note column where some row qualifies it
            described = any(isinstance((r.get("descriptive") or {}).get(c.key), dict) for r in rows)
            fieldnames += [c.key, f"{c.key}_note"] if described else [c.key]
    fieldnames.append("evidence")
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames, restval="")
        writer.writeheader()
        writer.writerows(csv_rows)
    return md_path, csv_path


# --------------------------------------------------------------------------------------- figures
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_iou_by_epoch(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Best macro IoU available at each epoch (running maximum of ``val/mIoU``), one line per run;
    writes a PNG to ``path`` (a "no data" panel when no run has validation)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    runs = [r for r in records if r.get("iou_by_epoch")]
    for r in runs:
        epochs, values = zip(*r["iou_by_epoch"], strict=True)
        ax.plot(epochs, values, marker="o", label=f"{r['name']} ({precision_label(r)})")
    if runs:
        ax.set_xlabel("epoch (0-based)")
        ax.set_ylabel("best val macro IoU so far")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    else:
        _no_data(ax, "no run with val/mIoU")
    ax.set_title(f"Best macro IoU by epoch [{EVIDENCE_RUN}]", fontsize=10)
    fig.tight_layout()
    return _save(fig, Path(path))


def plot_by_precision_and_batch(records: Sequence[dict[str, Any]], key: str, ylabel: str,
                                path: str | Path, title: str) -> Path:
    """``figures[key]`` against global batch size, one line per (precision, kind: run or
    microbenchmark); x on a log2 axis; writes a PNG to ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in records:
        value, batch = _value(r, key), r.get("global_batch")
        if value is None or batch is None:
            continue
        label = precision_label(r)
        series.setdefault((label, r["kind"]), []).append((int(batch), float(value)))
    for (label, kind), points in sorted(series.items()):
        points.sort()
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o" if kind == "microbenchmark" else "s",
                linestyle="-" if kind == "microbenchmark" else "--",
                label=f"{label} [{EVIDENCE_BENCH if kind == 'microbenchmark' else EVIDENCE_RUN}]")
    if series:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("global batch (samples per optimiser step)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    else:
        _no_data(ax, f"no record with {key} and a batch size")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, Path(path))


def plot_step_decomposition(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Stacked bars of the step windows (data wait, transfer, forward, backward, optimizer, remainder;
    ms) per run that has them; the source of each bar (post-warm-up medians, or TensorBoard interval
    means incl. warm-up) is in its label. Writes a PNG to ``path``."""
    plt = _pyplot()
    runs = [r for r in records if r.get("step_windows_ms")]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(runs) + 3), 4.5))
    if runs:
        bottoms = [0.0] * len(runs)
        names = [f"{r['name']}\n{precision_label(r)}"
                 f"{'' if (r.get('step_windows_source') or '').startswith('StepTiming') else ' *'}" for r in runs]
        for window in STEP_WINDOWS:
            heights = [float(r["step_windows_ms"].get(window, 0.0)) for r in runs]
            ax.bar(names, heights, bottom=bottoms, label=window)
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        ax.set_ylabel("ms per optimiser step")
        ax.legend(fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
        if any(n.endswith("*") for n in names):
            ax.text(0.0, -0.28, "* mean of TensorBoard log intervals incl. warm-up (no post-warm-up median)",
                    transform=ax.transAxes, fontsize=7)
    else:
        _no_data(ax, "no run with a step decomposition (StepTimingCallback)")
    ax.set_title(f"Step decomposition [{EVIDENCE_RUN}]", fontsize=10)
    fig.tight_layout()
    return _save(fig, Path(path))


# ---------------------------------------------------------------------------------------- report
FIGURE_FILES = ("iou_by_epoch.png", "throughput.png", "peak_memory.png", "step_decomposition.png")


def write_report(records: Sequence[dict[str, Any]], out_dir: str | Path, stem: str = "report") -> dict[str, Path]:
    """Write ``<stem>.md``, ``<stem>.csv``, ``<stem>_pairs.csv`` (when there are pairs) and the four
    PNG figures of :data:`FIGURE_FILES` into ``out_dir``; return ``{name: path}``."""
    out = Path(out_dir)
    md_path, csv_path = write_table(records, out, stem, COLUMNS, title="Runs")
    body = md_path.read_text(encoding="utf-8")
    pairs = precision_pairs(records)
    paths: dict[str, Path] = {"markdown": md_path, "csv": csv_path}
    if pairs:
        pmd, pcsv = write_table(pairs, out, f"{stem}_pairs", PAIR_COLUMNS, title="Precision pairs",
                                intro="Runs that differ only in precision (FP32 as the base). Speed-up = mixed "
                                      "samples/s / FP32 samples/s; IoU difference = mixed - FP32 best val/mIoU.")
        pairs_md = pmd.read_text(encoding="utf-8")
        pmd.unlink()
        paths["pairs_csv"] = pcsv
    else:
        pairs_md = "## Precision pairs\n\nNo two inputs differ only in precision.\n"
    paths["iou_by_epoch"] = plot_iou_by_epoch(records, out / "iou_by_epoch.png")
    paths["throughput"] = plot_by_precision_and_batch(records, "samples_per_s", "samples/s", out / "throughput.png",
                                                      "Throughput by precision and batch size")
    paths["peak_memory"] = plot_by_precision_and_batch(records, "peak_memory_gib", "peak memory (GiB)",
                                                       out / "peak_memory.png", "Peak memory by precision and batch size")
    paths["step_decomposition"] = plot_step_decomposition(records, out / "step_decomposition.png")
    legend = (
        "Evidence labels: `measured-run` = recorded by the training run itself (scaling callbacks, TensorBoard); "
        "`measured-microbenchmark` = compute-only training step on synthetic tensors "
        "(`python -m cropscale benchmark`); `analytical-scenario` = a model, not a measurement. "
        "n/a cells name the reason in the notes under the table."
    )
    figures_md = "\n".join(f"![{name}]({name})" for name in FIGURE_FILES)
    md_path.write_text(f"# cropscale report\n\n{legend}\n\n{body}\n{pairs_md}\n## Figures\n\n{figures_md}\n",
                       encoding="utf-8")
    return paths


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cropscale report",
        description="Quality-and-speed report of training runs and benchmark JSONs (Markdown, CSV, PNG).",
    )
    p.add_argument("inputs", nargs="+", help="run folders (or folders holding them) and benchmark JSON files")
    p.add_argument("--out", default="reports", help="output folder (default: reports)")
    p.add_argument("--stem", default="report", help="file name stem of the tables (default: report)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m cropscale report INPUT ... [--out DIR]``: writes the report, prints the run table.

    Raises:
        CropScaleError: an input that is neither a run folder nor a benchmark JSON (named).
    """
    args = _parser().parse_args(argv)
    records = load_inputs(args.inputs)
    paths = write_report(records, args.out, args.stem)
    print(paths["markdown"].read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
