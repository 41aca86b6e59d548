"""The one reader of a run folder: :func:`load_run` -> :class:`RunRecord`, for the report and the study.

A benchmark JSON (``python -m cropscale benchmark --json``) reads into records of the same type
(:func:`load_benchmark`), so the report can set both side by side.

A run folder is the TensorBoard version folder ``runs/<name>/version_<n>/`` of ``python -m cropscale
fit``: ``run.json`` (:mod:`cropscale.runs.schema`, written by the scaling callbacks), the TensorBoard
event files and ``config.yaml``. Each figure follows the rule of :mod:`cropscale.runs.rules`, over the
measured epochs (``warmup_epochs``). A figure that cannot be given is n/a with the reason.

Runs that are no training run (no TensorBoard tag under ``train/`` and no ``run.json`` with a
training summary, e.g. a ``validate`` / ``test`` folder) load with ``training_run = False`` and a
``skip_reason``. A ``run.json`` exists only for a ``fit`` (``ProvenanceCallback`` writes it at fit
start), so one with status ``failed`` (an exception; ``error`` says which) or ``running`` (killed, or
still running) is a training run that did not finish: it loads as a training run with a ``status`` cell
``failed`` / ``incomplete`` that says why, and its n/a figures say so first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cropscale.errors import CropScaleError
from cropscale.evidence import MEASURED_MICROBENCHMARK, MEASURED_RUN
from cropscale.precision import BY_CONFIGURATION, NOT_RECORDED, PrecisionDecision, normalise
from cropscale.precision import label as precision_label_of
from cropscale.runs import describe, rules, validity
from cropscale.runs.figures import produced
from cropscale.runs.rules import Figure
from cropscale.runs.schema import BENCHMARK_SCHEMA, RUN_SCHEMA, STEP_WINDOWS, RunJson, RunSummary, ValidityRecord
from cropscale.runs.tensorboard import Scalars, events_files, read_scalars

TRAINING_SCALAR_PREFIX = "train/"
"""TensorBoard tags of a training run (``train/loss_step``, ...): ``validate`` and ``test`` log none."""
NO_RUN_JSON = "no run.json in the run folder (fit without the scaling callbacks)"
UNFINISHED: dict[str, str] = {"failed": "failed", "running": "incomplete"}
"""``run.json`` statuses of a fit that did not finish -> the word the report shows."""
UNREADABLE = "unreadable"
"""Status of a run folder whose ``run.json`` (or another file the reader needs) cannot be read
(:func:`unreadable_run`): listed with the reason, it forms no comparison."""
PAIR_IGNORED_PREFIXES = (
    "trainer.precision", "trainer.plugins", "model.allow_tf32", "trainer.logger", "trainer.default_root_dir",
    "trainer.enable_progress_bar", "trainer.enable_model_summary", "ckpt_path", "config",
)
"""Configuration keys that may differ between two runs of a precision pair (they change nothing computed;
``trainer.plugins`` is where a CPU ``16-mixed`` run puts its GradScaler, with ``trainer.precision: null``)."""


@dataclass
class RunRecord:
    """One run (or one benchmark configuration) as the report and the study see it.

    Attributes:
        name, path: display name and folder (or benchmark file).
        kind: ``run`` or ``microbenchmark``; ``evidence`` its label.
        status: ``run.json`` status (``running``, ``finished``, ``failed``) or the benchmark row's.
        precision_decision: the run's :class:`~cropscale.precision.PrecisionDecision` (requested, resolved, by whom,
            label), taken whole from ``run.json`` (:func:`cropscale.runs.describe.precision`); :attr:`precision` is
            its precision string.
        strategy, devices, global_batch: what the run was.
        descriptive: descriptive cells with a qualifier or reason (precision, strategy, devices ...).
        figures: column key -> :class:`~cropscale.runs.rules.Figure`.
        iou_by_epoch: ``[(epoch, best val/mIoU so far)]``.
        step_windows_ms, step_windows_source: the step decomposition (ms) and where it comes from.
        host_windows_ms: ``data_wait_host`` / ``transfer_host`` (ms): the data wait and transfer on the host
            clock, beside the run clock's windows (on CUDA those are device-timeline windows).
        step_shares: the step decomposition as fractions of the step (:func:`~cropscale.runs.rules.step_shares`).
        epoch_seconds: the measured epochs' ``train_s`` / ``val_s`` / ``wall_s`` lists.
        updates_per_epoch: optimizer updates per epoch.
        warmup_epochs: the epochs left out of every figure.
        pair_key: equal for two records that may form a precision pair.
        training_run, skip_reason: False and why for a folder that holds no training run.
        data_warnings: ``run.json["data_warnings"]``: what the data checks found (``[]`` without ``run.json``).
        divergence: the verdict of :func:`~cropscale.runs.rules.divergence` on TensorBoard ``train/loss_step``
            (None for a benchmark configuration): what the logged loss says, for the summary's numerics line.
        validity: the run's validity (:func:`cropscale.runs.validity.of_run`): ``run.json``'s verdict, else the
            rule applied to what it recorded; None for a fit that did not finish, a benchmark, or a folder without
            ``run.json`` whose logged loss did not diverge. An invalid run's ``status`` is its validity status.
        events_problems: ``events file unreadable: <file>, <error>`` per damaged TensorBoard events file.
        run_json, config: the parsed ``run.json`` and configuration.
    """

    name: str
    kind: str
    path: str
    evidence: str
    status: str | None = None
    precision_decision: PrecisionDecision = field(default_factory=lambda: PrecisionDecision(None, None, NOT_RECORDED))
    strategy: str | None = None
    devices: int | None = None
    global_batch: int | None = None
    descriptive: dict[str, Figure] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    iou_by_epoch: list[tuple[int, float]] = field(default_factory=list)
    step_windows_ms: dict[str, float] = field(default_factory=dict)
    step_windows_source: str | None = None
    host_windows_ms: dict[str, float] = field(default_factory=dict)
    step_shares: dict[str, float] = field(default_factory=dict)
    epoch_seconds: dict[str, list[float]] = field(default_factory=dict)
    updates_per_epoch: float | None = None
    warmup_epochs: int = 0
    pair_key: str = ""
    training_run: bool = True
    skip_reason: str | None = None
    data_warnings: list[str] = field(default_factory=list)
    divergence: rules.Divergence | None = None
    validity: ValidityRecord | None = None
    events_problems: list[str] = field(default_factory=list)
    run_json: RunJson | None = field(default=None, repr=False)
    config: dict[str, Any] | None = field(default=None, repr=False)
    scalar_tags: list[str] = field(default_factory=list, repr=False)

    def value(self, key: str) -> Any:
        """The value of figure ``key``, else of the attribute ``key`` (None when neither exists)."""
        fig = self.figures.get(key)
        return fig.value if fig is not None else getattr(self, key, None)

    @property
    def precision(self) -> str | None:
        """The precision string the run ran with (requested, when no ``run.json`` confirms it)."""
        return self.precision_decision.value

    @property
    def excluded(self) -> str | None:
        """Why this record takes part in no comparison (:func:`cropscale.runs.validity.excluded`), else None."""
        if self.status == UNREADABLE:
            return f"{UNREADABLE}: {self.skip_reason}"
        return validity.excluded(self.status, self.validity)

    @property
    def precision_label(self) -> str:
        """``AMP FP16`` ..., with `` (requested)`` when no ``run.json`` confirms the precision; ``n/a`` when unknown."""
        if self.precision is None:
            return "n/a"
        return self.precision_decision.label


# ------------------------------------------------------------------------------------------ files
def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``.

    Raises:
        CropScaleError: unreadable file, invalid JSON or not an object (the path is named).
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CropScaleError(f"cannot read {path}: {err}") from None
    except json.JSONDecodeError as err:
        raise CropScaleError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise CropScaleError(f"{path} does not hold a JSON object")
    return data


def read_run_json(folder: str | Path) -> RunJson | None:
    """``run.json`` of ``folder`` as a :class:`~cropscale.runs.schema.RunJson`; None when absent.

    Raises:
        CropScaleError: unreadable, not JSON, or another schema than ``cropscale.run/1``.
    """
    path = Path(folder) / "run.json"
    if not path.is_file():
        return None
    data = read_json(path)
    if data.get("schema") not in (None, RUN_SCHEMA):
        raise CropScaleError(f"{path} has schema {data.get('schema')!r}, expected {RUN_SCHEMA!r}")
    try:
        return RunJson.from_json(data)
    except CropScaleError as err:
        raise CropScaleError(f"{path} does not follow {RUN_SCHEMA}: {err}") from None


def is_run_folder(folder: Path) -> bool:
    """True when ``folder`` holds ``run.json`` or a TensorBoard event file."""
    return (folder / "run.json").is_file() or bool(events_files(folder))


def find_runs(path: str | Path) -> list[Path]:
    """Run folders at or under ``path``, sorted; ``[path]`` itself when it is one.

    Raises:
        CropScaleError: ``path`` does not exist or holds no run folder.
    """
    root = Path(path)
    if not root.exists():
        raise CropScaleError(f"{root} does not exist")
    if root.is_file():
        if root.name == "run.json":
            return [root.parent]
        raise CropScaleError(f"{root} is a file but not run.json or a benchmark JSON")
    if is_run_folder(root):
        return [root]
    found = sorted({p.parent for p in root.rglob("run.json")} | {p.parent for p in root.rglob("events.out.tfevents.*")})
    if not found:
        raise CropScaleError(f"{root} holds no run folder (no run.json, no TensorBoard event file)")
    return found


def _load_config(folder: Path, run_json: RunJson | None) -> dict[str, Any] | None:
    if run_json is not None and isinstance(run_json.config, dict) and run_json.config:
        return run_json.config
    path = folder / "config.yaml"
    if not path.is_file():
        return None
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise CropScaleError(f"{path} is not valid YAML: {err}") from None
    return data if isinstance(data, dict) else None


def flatten_config(obj: Any, prefix: str = "", split_lists: bool = True) -> dict[str, Any]:
    """A nested configuration as ``{"trainer.devices": 2, ...}``: mappings flattened into dotted keys.

    Lists too, by index (``"data.test_folds.0"``; an empty one stays ``[]``), unless ``split_lists`` is False (then a
    list is one value).
    """
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten_config(v, f"{prefix}.{k}" if prefix else str(k), split_lists))
        return out
    if isinstance(obj, list) and split_lists:
        out = {}
        for i, v in enumerate(obj):
            out.update(flatten_config(v, f"{prefix}.{i}"))
        return out if obj else {prefix: []}
    return {prefix: obj}


def pair_key(config: dict[str, Any] | None, fallback: dict[str, Any]) -> str:
    """What two runs share when they differ only in precision.

    The flattened configuration without :data:`PAIR_IGNORED_PREFIXES` together with ``fallback``'s fields (strategy,
    devices, global batch: a configuration from hyper-parameters alone holds no trainer keys, and runs on 1 and 2
    processes paired across world sizes), else ``fallback``'s fields.
    """
    if config:
        flat = {k: v for k, v in flatten_config(config).items() if not k.startswith(PAIR_IGNORED_PREFIXES)}
        return "config:" + json.dumps({"config": flat, **fallback}, sort_keys=True, default=str)
    return "fields:" + json.dumps(fallback, sort_keys=True, default=str)


def _run_name(folder: Path) -> str:
    parts = folder.resolve().parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else str(folder)


# -------------------------------------------------------------------------------------- a run folder
def _global_batch(scalars: Scalars, config: dict[str, Any] | None, devices: int | None) -> describe.Described:
    events = scalars.get("optim/global_batch", [])
    if events:
        return describe.Described(int(round(events[-1][1])), None)
    local = describe.config_value(config, "data.batch_size")
    acc = describe.config_value(config, "trainer.accumulate_grad_batches", 1) or 1
    if isinstance(local, int) and devices:
        return describe.Described(int(local) * int(devices) * int(acc), None)
    why = ("no optim/global_batch in the TensorBoard events and "
           + ("the world size is unknown" if isinstance(local, int)
              else "no integer data.batch_size in the configuration"))
    return describe.Described(None, None, why)




def _figures(summary: RunSummary, scalars: Scalars, warmup: int, no_json: str | None,
             events_problem: str | None = None) -> dict[str, Figure]:
    """Every figure of one run: each registered figure's producer (:data:`cropscale.runs.figures.FIGURES`)."""
    inputs = rules.RunInputs(summary, scalars, warmup, no_json, events_problem)
    return {key: spec.producer(inputs) for key, spec in produced().items()}


def _loss_series(scalars: Scalars, tag: str = "train/loss_step") -> list[tuple[int, float]]:
    """``[(step, loss)]`` of the logged training loss, in logging order."""
    return [(int(step), float(value)) for step, value, _ in scalars.get(tag, [])]


def _epochs_recorded(run_json: RunJson | None, scalars: Scalars) -> int:
    if run_json is not None and run_json.summary.throughput is not None:
        return len(run_json.summary.throughput.epochs)
    return len(scalars.get("train/loss_epoch", []))


def _training(run_json: RunJson | None, scalars: Scalars) -> tuple[bool, str | None]:
    if run_json is not None and run_json.status in UNFINISHED:
        return True, None  # a fit that failed or was killed, whatever it logged
    summary_present = run_json is not None and (bool(run_json.summary.to_json()) or bool(run_json.global_step))
    if any(t.startswith(TRAINING_SCALAR_PREFIX) for t in scalars) or summary_present:
        return True, None
    if run_json is None:
        return False, "no training run (validate/test only)"
    return False, ("no training run: no training scalars and run.json holds no training summary"
                   f" (status {run_json.status!r})")


def _status_cell(run_json: RunJson | None, verdict: ValidityRecord | None) -> Figure:
    """The Status cell: ``finished``, an invalid status, ``failed``, ``incomplete`` or ``not recorded``.

    An invalid status (:mod:`cropscale.runs.validity`) has its reason as the note, ``failed`` the error;
    ``incomplete`` is status ``running``.
    """
    if verdict is not None and not verdict.valid:
        return Figure(verdict.status, None, note=verdict.reason)
    if run_json is None:
        return Figure("not recorded", None, note=NO_RUN_JSON)
    status = run_json.status
    if status == "failed":
        error = run_json.error or {}
        detail = f"{error.get('type', 'error')}: {error.get('message', '')}".rstrip(": ")
        return Figure("failed", None, note=detail if error else "run.json has no error entry")
    if status == "running":
        return Figure("incomplete", None, note="run.json status 'running': written at fit start and never "
                                              "completed, so the run was killed or is still running")
    return Figure(status or "not recorded", None, note=None if status else "run.json has no status")


def _mark_unfinished(figures: dict[str, Figure], status: str | None) -> None:
    """Prefix each n/a reason of a run that did not finish with that fact."""
    shown = UNFINISHED.get(status or "")
    if shown is None:
        return
    for fig in figures.values():
        if fig.value is None:
            fig.why = f"run {shown} (see Status): {fig.why}"


def _data_warning_cell(run_json: RunJson | None) -> Figure:
    """The count of ``run.json["data_warnings"]``, the lines themselves as the note; n/a without them."""
    if run_json is None:
        return Figure(None, None, NO_RUN_JSON)
    if run_json.data_warnings is None:
        return Figure(None, None, "run.json has no data_warnings (written before the data checks recorded them)")
    found = list(run_json.data_warnings)
    return Figure(len(found), None, note="; ".join(found) or None)


def load_run(path: str | Path, warmup_epochs: int | None = None) -> RunRecord:
    """Read one run folder into a :class:`RunRecord`; every figure ``measured-run`` or n/a with the reason.

    Args:
        path: the run folder (or its ``run.json``).
        warmup_epochs: epochs left out of every figure; None = :func:`~cropscale.runs.rules.default_warmup_epochs`.

    Raises:
        CropScaleError: the folder holds neither ``run.json`` nor an event file, or a file in it is
            unreadable (named in the message).
    """
    folder = Path(path)
    if folder.is_file() and folder.name == "run.json":
        folder = folder.parent
    if not folder.is_dir() or not is_run_folder(folder):
        raise CropScaleError(f"{folder} is not a run folder (no run.json, no TensorBoard event file)")
    run_json = read_run_json(folder)
    scalars, problems = read_scalars(folder)
    config = _load_config(folder, run_json)
    summary = run_json.summary if run_json is not None else RunSummary()
    no_json = NO_RUN_JSON if run_json is None else None
    if warmup_epochs is None:
        warmup_epochs = rules.default_warmup_epochs(_epochs_recorded(run_json, scalars))
    warmup = warmup_epochs
    prec = describe.precision(run_json, config)
    strategy = describe.strategy(run_json, config)
    devices = describe.devices(run_json, config)
    batch = _global_batch(scalars, config, devices.value)
    descriptive = {
        "precision": Figure(prec.shown, None, prec.note, prec.note),
        "strategy": Figure(strategy.shown, None, strategy.note, strategy.note),
        "devices": Figure(devices.shown, None, devices.note, devices.note),
    }
    if batch.value is None:
        descriptive["global_batch"] = Figure(None, None, batch.note)
    descriptive["data_warning_count"] = _data_warning_cell(run_json)
    logged_loss = rules.divergence(_loss_series(scalars))
    verdict = validity.of_run(run_json, logged_loss)
    descriptive["status"] = _status_cell(run_json, verdict)
    figures = _figures(summary, scalars, warmup, no_json, "; ".join(problems) or None)
    _mark_unfinished(figures, run_json.status if run_json is not None else None)
    status = run_json.status if run_json is not None else None
    if verdict is not None and not verdict.valid:
        status = verdict.status
    windows, source = rules.step_windows(summary, STEP_WINDOWS, warmup, scalars)
    training, skip_reason = _training(run_json, scalars)
    return RunRecord(
        name=_run_name(folder), kind="run", path=str(folder), evidence=MEASURED_RUN,
        status=status,
        precision_decision=prec,
        strategy=strategy.value, devices=devices.value, global_batch=batch.value, descriptive=descriptive,
        figures=figures, iou_by_epoch=rules.quality(summary, scalars).by_epoch, step_windows_ms=windows,
        step_windows_source=source, step_shares=rules.step_shares(summary, STEP_WINDOWS, warmup),
        host_windows_ms=rules.host_windows(summary, warmup),
        epoch_seconds=rules.epoch_seconds(summary, warmup),
        updates_per_epoch=rules.updates_per_epoch(run_json), warmup_epochs=warmup,
        pair_key=pair_key(config, {"strategy": strategy.value, "devices": devices.value, "global_batch": batch.value}),
        training_run=training, skip_reason=skip_reason, divergence=logged_loss, validity=verdict,
        events_problems=problems, run_json=run_json, config=config, scalar_tags=sorted(scalars),
        data_warnings=list(run_json.data_warnings or []) if run_json is not None else [],
    )


def unreadable_run(folder: str | Path, reason: str) -> RunRecord:
    """The record of a run folder that cannot be read: status :data:`UNREADABLE`, every figure n/a with ``reason``.

    It is listed in the report (its Status cell names the reason) and forms no comparison.
    """
    why = f"run folder unreadable: {reason}"
    return RunRecord(
        name=_run_name(Path(folder)), kind="run", path=str(folder), evidence=MEASURED_RUN, status=UNREADABLE,
        descriptive={"status": Figure(UNREADABLE, None, note=reason)},
        figures={key: Figure(None, why=why) for key in produced()}, pair_key=f"unreadable:{Path(folder).resolve()}",
        skip_reason=reason,
    )


# -------------------------------------------------------------------------------- benchmark files
_COMPUTE_ONLY = "compute-only microbenchmark: no training on data, no validation"


def _benchmark_figures(row: dict[str, Any]) -> dict[str, Figure]:
    """The figures of one benchmark configuration (quality, epoch and energy figures n/a)."""
    E = MEASURED_MICROBENCHMARK  # noqa: N806
    ok = row.get("status") == "ok"
    failed = f"configuration {row.get('status')}: {row.get('error')}"
    figures = {key: Figure(None, E, _COMPUTE_ONLY)
               for key in ("best_miou", "best_epoch", "final_miou", "train_epoch_s", "val_epoch_s", "epoch_s")}
    figures["final_train_loss"] = Figure(None, E, "synthetic batch: the loss is not a quality figure")
    energy_why = failed if not ok else row.get("energy_reason") or "not measured by the benchmark"
    for key in ("energy_j", "energy_j_per_sample"):  # NVML counter around the measured steps (CUDA)
        value = row.get(key) if ok else None  # a present value's energy_reason qualifies it (a short window)
        figures[key] = Figure(value, E, energy_why, row.get("energy_reason") if value is not None else None)
    steps = f"{row.get('iterations')} measured steps after {row.get('warmup')} warm-up, synchronised"
    for key, note in (("median_step_ms", steps), ("p95_step_ms", steps), ("samples_per_s", "batch / median step")):
        figures[key] = Figure(row.get(key) if ok else None, E, failed, note)
    kind = row.get("peak_memory_kind")
    memory_note = {"cuda-max-allocated": "peak allocated GPU memory (torch.cuda)",
                   "host-rss-process": "host RSS of the whole benchmark process (CPU)"}.get(kind, kind)
    figures["peak_memory_gib"] = Figure(row.get("peak_memory_gib") if ok else None, E, failed, memory_note)
    figures["nonfinite"] = Figure(row.get("nonfinite_steps") if ok else None, E, failed,
                                  "measured steps with a non-finite loss or gradient norm")
    if not ok:
        figures["skipped_steps"] = Figure(None, E, failed)
    elif row.get("grad_scaler"):
        figures["skipped_steps"] = Figure(int(row.get("nonfinite_steps") or 0), E, note="GradScaler skips")
    else:
        figures["skipped_steps"] = Figure(0, E, note="no GradScaler: never skipped")
    for key in produced():  # every other figure of a run (energy, step shares, slowest rank ...)
        figures.setdefault(key, Figure(None, E, "not measured by the benchmark"))
    return figures


def load_benchmark(path: str | Path) -> list[RunRecord]:
    """Read a ``python -m cropscale benchmark`` JSON into one record per configuration.

    Figures are ``measured-microbenchmark``; quality and epoch-time figures are n/a (compute-only), energy is
    n/a where the row has none (CPU, no NVML counter: its ``energy_reason``).
    A record's name is ``<file>: <row label> b<batch>`` (``TF32`` for a ``--tf32`` row), `` compiled`` added
    for a ``--compile`` row.

    Raises:
        CropScaleError: unreadable file, or not a ``cropscale.benchmark/1`` document.
    """
    path = Path(path)
    doc = read_json(path)
    if doc.get("schema") != BENCHMARK_SCHEMA or not isinstance(doc.get("results"), list):
        raise CropScaleError(f"{path} is not a cropscale benchmark JSON (schema {doc.get('schema')!r}, "
                             f"expected {BENCHMARK_SCHEMA!r} with a 'results' list)")
    device = describe.config_value(doc, "environment.device.name", "?")
    records = []
    for row in doc["results"]:
        precision, batch = row.get("precision"), row.get("batch_size")
        records.append(RunRecord(
            name=f"{path.name}: {row.get('precision_label') or precision_label_of(precision)} b{batch}"
                 f"{' compiled' if row.get('compile') else ''}", kind="microbenchmark", path=str(path),
            evidence=MEASURED_MICROBENCHMARK, status=row.get("status"),
            precision_decision=PrecisionDecision(normalise(precision), normalise(precision), BY_CONFIGURATION),
            strategy=f"single device, compute-only ({device})", devices=1, global_batch=batch,
            figures=_benchmark_figures(row), pair_key=f"bench:{path.resolve()}:{batch}",
            descriptive={"data_warning_count": Figure(None, None, "synthetic tensors: no data read")},
        ))
    return records


def load_inputs(paths: Iterable[str | Path], on_skip: Callable[[str], None] | None = print,
                warmup_epochs: int | None = None) -> list[RunRecord]:
    """Records of every input: benchmark JSON files and training-run folders (found with :func:`find_runs`).

    A run folder that cannot be read (a malformed ``run.json`` or ``config.yaml``) is listed as an
    :func:`unreadable_run` with the reason, and the others are read as usual. A run folder that is no training
    run is skipped, with one line ``skipped RUN: <reason>`` passed
    to ``on_skip`` (default ``print``; None: silent); a folder named explicitly gets the longer reason.

    Raises:
        CropScaleError: an input that is neither (named); every input skipped (the reasons listed).
    """
    records: list[RunRecord] = []
    skipped: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_file() and path.suffix == ".json" and path.name != "run.json":
            records.extend(load_benchmark(path))
            continue
        named = path.parent if path.is_file() else path
        for folder in find_runs(path):
            try:
                record = load_run(folder, warmup_epochs)
            except CropScaleError as err:  # one broken run folder: listed with its reason, the rest reported
                records.append(unreadable_run(folder, str(err)))
                continue
            if record.training_run:
                records.append(record)
                continue
            line = f"skipped {folder}: {record.skip_reason}"
            if folder.resolve() == named.resolve():
                line += (f" (named explicitly, still skipped: its TensorBoard events hold no "
                         f"{TRAINING_SCALAR_PREFIX}* scalar such as train/loss_step or train/loss_epoch, and "
                         + ("it has no run.json" if record.status is None else "its run.json has no summary")
                         + "; `python -m cropscale validate` / `test` write such folders)")
            skipped.append(f"{folder} ({record.skip_reason})")
            if on_skip is not None:
                on_skip(line)
    if not records and skipped:
        raise CropScaleError(f"no training run or benchmark among the inputs; skipped {len(skipped)} "
                             "run folder(s): " + "; ".join(skipped))
    names = [r.name for r in records]
    for r in records:  # make names unique: fall back to the full path where two collide
        if names.count(r.name) > 1 and r.kind == "run":
            r.name = r.path
    return records
