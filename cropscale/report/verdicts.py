"""The comparisons the report and the study lead with: configurations over their seeds, each pair with its verdict.

A *configuration* is the runs whose configuration is the same but for the seed (``seed_everything``) and
what changes nothing computed (logger, output folder, progress bar, checkpoint path). Three kinds of
comparison, each of a base against another configuration that differs in one thing only
(:func:`comparisons`):

- ``precision``: FP32 (``32-true``) against each other precision at the same devices and batches;
- ``devices``: 1 device against N devices of the same device series (:mod:`cropscale.report.scaling`:
  equal-global or equal-local batch);
- ``global batch``: the smallest global batch against each larger one at the same precision and devices.

One :class:`Comparison` (:func:`compare_runs`) holds, for two sides' runs: the quality verdicts of
:func:`cropscale.report.equivalence.decide` at alpha = 0.05 (best and final macro IoU, classes moving by more
than the margin) with the convergence note of :mod:`cropscale.report.convergence`, the speed-up of training-loop
samples/s with the run as the unit, and samples and wall time to the target compared as MLPerf compares runs.
Runs that diverged, failed, did not finish or did not train take part in no comparison (the statuses of
:mod:`cropscale.report.pairs`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cropscale.errors import CropScaleError
from cropscale.evidence import MEASURED_RUN
from cropscale.numbers import TARGET_FRACTION
from cropscale.report.convergence import (
    ConvergenceNote,
    TargetComparison,
    ToTarget,
    compare_to_target,
    convergence_note,
    to_target,
)
from cropscale.report.equivalence import (
    ALPHA,
    CONFIDENCE,
    DEFAULT_MARGIN,
    INCONCLUSIVE,
    TRAINING_LOOP,
    Interval,
    QualityVerdict,
    format_ratio,
    level_text,
    quality_verdict,
    scaled,
    speedup_interval,
)
from cropscale.report.pairs import FAILED
from cropscale.report.scaling import DEVICE_KNOBS, series_key
from cropscale.report.tables import TableRow
from cropscale.runs.record import RunRecord, flatten_config
from cropscale.runs.rules import Figure
from cropscale.runs.tensorboard import epoch_series, load_scalars


def class_final_iou(record: RunRecord) -> dict[str, float]:
    """Final validation IoU per class, ``val_class/IoU_<index>_<name>`` -> value (TensorBoard)."""
    tags = [t for t in record.scalar_tags if t.startswith("val_class/IoU_")]
    if not tags or record.kind != "run":
        return {}
    scalars = load_scalars(record.path)
    out = {}
    for tag in tags:
        series = epoch_series(scalars, tag)
        if series:
            out[tag.removeprefix("val_class/IoU_")] = float(max(series)[1])  # the last epoch's value
    return out


# ---------------------------------------------------------------------------------- a comparison
@dataclass
class Comparison:
    """Two configurations compared over their seeds: quality verdicts, convergence, speed-up, samples to a target.

    Attributes:
        kind: ``precision``, ``devices``, ``global batch`` or ``batch sweep``; label: e.g. ``AMP BF16 vs FP32``.
        base, other: the configurations' display labels; base_runs / other_runs: the run names.
        best, final: :class:`~cropscale.report.equivalence.QualityVerdict` of best and final macro IoU.
        classes: verdicts of the classes whose final IoU moves by more than the margin.
        speedup, efficiency: :class:`~cropscale.report.equivalence.Interval` over runs (efficiency = speed-up / N for
            a device comparison, else None); speed_spread: the within-run epoch spread, as text.
        convergence: :class:`~cropscale.report.convergence.ConvergenceNote`.
        target: the macro IoU target; samples_to_target / time_to_target: the MLPerf comparisons of samples and
            end-to-end wall seconds to it; to_target_base / to_target_other: per run.
        base_key, other_key: the configurations' keys (a study's), where the caller gives them.
    """

    kind: str
    label: str
    base: str
    other: str
    base_runs: list[str]
    other_runs: list[str]
    best: QualityVerdict
    final: QualityVerdict
    speedup: Interval
    speed_spread: str = ""
    devices: int = 1
    efficiency: Interval | None = None
    classes: list[tuple[str, QualityVerdict]] = field(default_factory=list)
    convergence: ConvergenceNote | None = None
    target: float | None = None
    target_fraction: float = TARGET_FRACTION
    samples_to_target: TargetComparison | None = None
    time_to_target: TargetComparison | None = None
    to_target_base: list[ToTarget] = field(default_factory=list)
    to_target_other: list[ToTarget] = field(default_factory=list)
    base_key: str = ""
    other_key: str = ""

    @property
    def time_ratio(self) -> float | None:
        """Olympic mean end-to-end wall time to the target, other / base (None: not reached or not recorded)."""
        return self.time_to_target.ratio if self.time_to_target is not None else None

    def target_text(self) -> str:
        """Samples to the target compared as MLPerf does, with the runs a decision needs, or why there is none."""
        what = f"samples to {self.target_fraction:g} of {self.base}'s best"
        if self.target is None or self.samples_to_target is None:
            return f"{what}: n/a (no best macro IoU of the base)"
        s = self.samples_to_target
        return f"{what} ({self.target:.4f}): {s.text()}; {s.sides_text()}; {s.runs_text()}"

    def target_detail(self) -> str:
        """Olympic mean time, optimizer steps, samples and GPU board joules to the target per side, or "not reached"."""
        def side(name: str, runs: Sequence[ToTarget]) -> str:
            hit = [t for t in runs if t.reached]
            if len(hit) < len(runs) or not runs:
                return f"{name}: not reached by {len(runs) - len(hit)} of {len(runs)} run(s)"
            parts = []
            for key, fmt, unit in (("seconds", ".1f", "s end-to-end"), ("steps", "g", "steps"),
                                   ("samples", "g", "samples"), ("joules", ".0f", "J GPU board energy (NVML)")):
                values = [getattr(t, key) for t in hit if getattr(t, key) is not None]
                parts.append(f"{format(float(np.mean(values)), fmt)} {unit}" if len(values) == len(hit)
                             else f"{unit.split()[0]} n/a")
            return f"{name}: " + ", ".join(parts) + f" (mean of {len(hit)} run(s))"
        if self.target is None:
            return "no target: the base has no best macro IoU"
        return (f"target macro IoU {self.target:.4f}; " + side(self.base, self.to_target_base) + "; "
                + side(self.other, self.to_target_other))

    def quality_text(self) -> str:
        """``quality equivalent at this budget (3 epochs) (+0.0040, 90 % CI ...)``."""
        text = self.best.text()
        if self.convergence is not None and self.convergence.at_budget and self.best.verdict != INCONCLUSIVE:
            text = text.replace(self.best.verdict, f"{self.best.verdict} {self.convergence.budget}", 1)
        return f"quality {text}"

    def line(self) -> str:
        """The verdict line: quality (with the convergence note), speed-up, samples to target."""
        eff = ""
        if self.efficiency is not None and self.efficiency.estimate is not None:
            e = self.efficiency
            eff = (f", efficiency {e.estimate:.2f}" + (f" ({e.low:.2f}..{e.high:.2f})" if e.low is not None else ""))
        parts = [self.quality_text(), *( [self.convergence.text()] if self.convergence is not None else []),
                 f"speed-up {format_ratio(self.speedup)}{eff}, {self.speed_spread}", self.target_text()]
        return f"{self.label}: " + "; ".join(parts)


def compare_runs(kind: str, base_label: str, other_label: str, base: Sequence[tuple[object, RunRecord]],
                 other: Sequence[tuple[object, RunRecord]], margin: float = DEFAULT_MARGIN,
                 target_fraction: float = TARGET_FRACTION, devices: int = 1, keys: tuple[str, str] = ("", "")
                 ) -> Comparison:
    """Compare two configurations given as ``(seed, run)`` lists (seeds may be None: Welch then).

    Raises:
        CropScaleError: a margin or target fraction out of range.
    """
    if not 0.0 < target_fraction <= 1.0:
        raise CropScaleError(f"target fraction must lie in (0, 1], got {target_fraction!r}")

    def by_seed(side, key):
        return {(s if s is not None else f"run{i}"): r.value(key) for i, (s, r) in enumerate(side)}

    base_runs, other_runs = [r for _, r in base], [r for _, r in other]
    best = quality_verdict(by_seed(base, "best_miou"), by_seed(other, "best_miou"), margin)
    final = quality_verdict(by_seed(base, "final_miou"), by_seed(other, "final_miou"), margin, "final macro IoU")
    speed, spread = speedup_interval(base_runs, other_runs)
    out = Comparison(kind, f"{other_label} vs {base_label}", base_label, other_label, [r.name for r in base_runs],
                     [r.name for r in other_runs], best, final, speed, spread, devices,
                     target_fraction=target_fraction, base_key=keys[0], other_key=keys[1],
                     convergence=convergence_note(base_label, base_runs, other_label, other_runs, margin))
    if devices > 1:
        out.efficiency = scaled(speed, 1.0 / devices)
    _classes(out, base, other, margin)
    best_base = [r.value("best_miou") for r in base_runs if r.value("best_miou") is not None]
    if best_base:
        out.target = target_fraction * float(np.mean(best_base))
        out.to_target_base = [to_target(r, out.target) for r in base_runs]
        out.to_target_other = [to_target(r, out.target) for r in other_runs]
        for figure in ("samples", "seconds"):
            values = [[t.value(figure) for t in side] for side in (out.to_target_base, out.to_target_other)]
            if all(v is not None for side in values for v in side):
                result = compare_to_target(values[0], values[1], figure)
                setattr(out, f"{'samples' if figure == 'samples' else 'time'}_to_target", result)
    return out


def _classes(out: Comparison, base, other, margin: float) -> None:
    base_classes = [(s, class_final_iou(r)) for s, r in base]
    other_classes = [(s, class_final_iou(r)) for s, r in other]
    names = sorted({c for _, d in base_classes for c in d} & {c for _, d in other_classes for c in d})
    for c in names:
        v = quality_verdict({s: d.get(c) for s, d in base_classes}, {s: d.get(c) for s, d in other_classes}, margin,
                            f"final IoU of class {c}")
        if v.interval.estimate is not None and abs(v.interval.estimate) > margin:
            out.classes.append((c, v))


# ------------------------------------------------------------------------------------ the table
def _ci(i: Interval, fmt: str) -> str:
    if i.low is None:
        return f"n/a ({i.why})"
    return f"{format(i.low, fmt)}..{format(i.high, fmt)}"


def _head(text: str) -> str:
    return text.split(" (")[0]


def verdict_row(c: Comparison) -> TableRow:
    """One row of the verdict table (:data:`cropscale.runs.figures.VERDICTS`) of a comparison.

    Every figure ``measured-run``; the speed-up is ``speedup_vs_base`` (training-loop samples/s, runs as the unit).
    """
    speed_ci = _ci(c.speedup, ".2f") + (" (includes 1)" if c.speedup.includes(1.0) else "")
    s = c.samples_to_target
    values = {
        "label": c.label, "compared": c.kind, "seeds": f"{c.best.interval.n_base} / {c.best.interval.n_other}",
        "best_ci": _ci(c.best.interval, "+.4f"), "best_verdict": _head(c.best.text()),
        "final_verdict": _head(c.final.text()), "speedup_vs_base_ci": speed_ci,
        "convergence": (c.convergence.budget if c.convergence is not None and c.convergence.at_budget
                        else "plateaued" if c.convergence is not None else "n/a"),
        "to_target_verdict": (s.text() if s is not None else "n/a (no target)"),
        "runs_needed": s.runs_text() if s is not None else "n/a (no target)",
        "classes": "; ".join(f"{name}: {v.interval.estimate:+.3f} {_head(v.text())}" for name, v in c.classes)
        or "none",
    }
    eff = (Figure(c.efficiency.estimate, MEASURED_RUN, note=f"speed-up / {c.devices} devices")
           if c.efficiency is not None else Figure(None, MEASURED_RUN, "not a device comparison"))
    no_target = c.target_detail() if c.target is not None else "no target: the base has no best macro IoU"
    figures = {
        "best_diff": Figure(c.best.interval.estimate, MEASURED_RUN, c.best.interval.why,
                            note=f"{c.best.interval.method}; margin {c.best.margin:g}"),
        "final_diff": Figure(c.final.interval.estimate, MEASURED_RUN, c.final.interval.why),
        "speedup_vs_base": Figure(c.speedup.estimate, MEASURED_RUN, c.speedup.why,
                                  note=f"ratio of per-run geometric-mean {TRAINING_LOOP}; {c.speed_spread}"),
        "efficiency": eff,
        "samples_to_target_ratio": Figure(s.ratio if s is not None else None, MEASURED_RUN,
                                          c.target_text(), note=s.sides_text() if s is not None else None),
        "time_ratio": Figure(c.time_ratio, MEASURED_RUN, no_target, note=c.target_detail()),
    }
    return TableRow(values=values, figures=figures, evidence=MEASURED_RUN)


def verdict_intro(margin: float, target_fraction: float) -> str:
    """The paragraph above a verdict table: the methods, the level, the margin, the target."""
    return (f"Quality: best (and final) validation macro IoU of the other configuration minus the base, over seeds;"
            f" {level_text(CONFIDENCE)} t-interval, paired by seed when both ran the same seeds, Welch otherwise."
            f" Every verdict is a one-sided test at alpha = {ALPHA:g} read off the {level_text(CONFIDENCE)}:"
            f" equivalent = TOST (the interval inside +-{margin:g} macro IoU), worse / better = the interval entirely"
            " below -margin / above +margin, else inconclusive with the seeds per side that would decide at the"
            " observed spread; one seed on a side, or no spread observed, is always inconclusive. A verdict is"
            " qualified 'at this budget' when a run of either side was still improving (Convergence column)."
            f" Speed-up: ratio of per-run geometric-mean {TRAINING_LOOP} (the run is the unit), Welch t-interval on"
            " log rates over runs; an interval that includes 1 shows no speed-up; one run per side gives none."
            f" Samples and time to target ({target_fraction:g} x the base's mean best): per run, a run that does not"
            " reach it counted as infinitely slow, fastest and slowest dropped from 5 runs per side, one-sided t-tests"
            f" at alpha = {ALPHA:g} (MLPerf Training's comparison); runs needed from the coefficient of variation.")


SEED = "seed_everything"
NOTHING_COMPUTED = ("trainer.logger", "trainer.default_root_dir", "trainer.enable_progress_bar",
                    "trainer.enable_model_summary", "ckpt_path", "config")
"""Configuration keys that change nothing computed (they may differ within a configuration)."""
PRECISION_KEYS = ("trainer.precision", "model.allow_tf32", "trainer.plugins")
BATCH_KEYS = ("data.batch_size", "trainer.accumulate_grad_batches", "model.lr")


def usable(record: RunRecord) -> bool:
    """A finished training run that is a valid result (``excluded`` is None: :mod:`cropscale.runs.validity`)."""
    return (record.kind == "run" and record.config is not None and record.status not in FAILED
            and record.status in (None, "finished") and record.excluded is None)


def _key(record: RunRecord, drop: tuple[str, ...], extra: dict | None = None) -> str:
    flat = {k: v for k, v in flatten_config(record.config, split_lists=False).items()
            if not k.startswith((SEED, *NOTHING_COMPUTED, *drop))}
    return json.dumps({"config": flat, **(extra or {})}, sort_keys=True, default=str)


def _seed(record: RunRecord) -> object:
    return (record.config or {}).get(SEED)


def _sides(runs: Sequence[RunRecord]) -> list[tuple[object, RunRecord]]:
    return sorted(((_seed(r), r) for r in runs), key=lambda sr: str(sr[0]))


def _group(records: Sequence[RunRecord], outer, inner) -> dict[str, dict[object, list[RunRecord]]]:
    groups: dict[str, dict[object, list[RunRecord]]] = {}
    for r in records:
        key = outer(r)
        if key is not None:
            groups.setdefault(key, {}).setdefault(inner(r), []).append(r)
    return groups


def _precision(records, margin, fraction) -> list[Comparison]:
    out = []
    groups = _group(records, lambda r: _key(r, PRECISION_KEYS, {"devices": r.devices}), lambda r: r.precision)
    for by_precision in groups.values():
        base = by_precision.get("32-true")
        if not base:
            continue
        for precision, runs in sorted(by_precision.items(), key=lambda kv: str(kv[0])):
            if precision == "32-true":
                continue
            b, o = base[0], runs[0]
            out.append(compare_runs("precision", f"{b.precision_label} (G {b.global_batch}, N {b.devices})",
                                    f"{o.precision_label}", _sides(base), _sides(runs), margin, fraction))
    return out


def _local_batch(record: RunRecord) -> object:
    return (record.config or {}).get("data", {}).get("batch_size")


def _devices(records, margin, fraction) -> list[Comparison]:
    out, seen = [], set()
    for protocol, batch_of in (("equal-global", lambda r: r.global_batch), ("equal-local", _local_batch)):
        groups = _group(records, lambda r, f=batch_of: None if series_key(r) is None or f(r) is None
                        else f"{series_key(r)}|{f(r)}", lambda r: r.devices)
        for by_n in groups.values():
            base = by_n.get(1)
            if not base:
                continue
            for n, runs in sorted((kv for kv in by_n.items() if kv[0] != 1), key=lambda kv: kv[0]):
                names = frozenset(r.name for r in base + runs)
                if names in seen:
                    continue  # equal-global and equal-local can be the same runs (accumulation 1)
                seen.add(names)
                b = base[0]
                label = f"{b.precision_label} {protocol} (G {b.global_batch}, L {_local_batch(b)})"
                out.append(compare_runs("devices", f"{label} on 1", f"{n} devices", _sides(base), _sides(runs),
                                        margin, fraction, devices=int(n)))
    return out


def _batches(records, margin, fraction) -> list[Comparison]:
    out = []
    groups = _group(records, lambda r: _key(r, (*BATCH_KEYS, *DEVICE_KNOBS),
                                            {"precision": r.precision, "devices": r.devices}),
                    lambda r: r.global_batch)
    for by_g in groups.values():
        gs = sorted(g for g in by_g if g is not None)
        if len(gs) < 2:
            continue
        base = by_g[gs[0]]
        for g in gs[1:]:
            b = base[0]
            out.append(compare_runs("global batch", f"{b.precision_label} G {gs[0]} (N {b.devices})", f"G {g}",
                                    _sides(base), _sides(by_g[g]), margin, fraction))
    return out


def comparisons(records: Sequence[RunRecord], margin: float = DEFAULT_MARGIN,
                target_fraction: float = TARGET_FRACTION) -> list[Comparison]:
    """Every precision, device and global-batch comparison among the usable runs of ``records``.

    Raises:
        CropScaleError: a margin or target fraction out of range (:func:`~cropscale.report.equivalence.compare_runs`).
    """
    runs = [r for r in records if usable(r)]
    return (_precision(runs, margin, target_fraction) + _devices(runs, margin, target_fraction)
            + _batches(runs, margin, target_fraction))
