"""The study's comparisons over seeds: precision, device count and global batch, each with its verdict.

From the planned configurations and their runs (``config.key`` -> records), three kinds of comparison of a
base configuration against another that differs in one thing (statistics and verdicts:
:mod:`cropscale.report.equivalence`, margin and target from the spec):

- ``precision``: FP32 against each other precision of the same protocol and world size;
- ``devices``: the 1-rank configuration against each measured N > 1 of the same protocol and precision;
- ``batch sweep``: a batch sweep's baseline point (its first optimizer and LR rule at the smallest ``G``) against
  every other point of its precision, other optimizers at the baseline's ``G`` included, at the sweep's
  ``tolerance`` as the margin; :func:`cropscale.study.aggregate.sweep_summary` reads "holds to G" from these
  verdicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cropscale.report.verdicts import Comparison, compare_runs
from cropscale.runs.record import RunRecord
from cropscale.study import protocol as P
from cropscale.study.plan import Configuration
from cropscale.study.spec import PRECISION_LABELS, BatchSweepSpec, StudySpec


def _sides(runs: Sequence[RunRecord]) -> list[tuple[object, RunRecord]]:
    out = [((r.config or {}).get("seed_everything"), r) for r in runs]
    return sorted(out, key=lambda sr: str(sr[0]))


def _usable(runs: Sequence[RunRecord]) -> list[RunRecord]:
    return [r for r in runs if r.status in (None, "finished")
            and not (r.divergence is not None and r.divergence.diverged)]


def study_comparisons(spec: StudySpec, configs: Sequence[Configuration],
                      records: Mapping[str, Sequence[RunRecord]]) -> list[Comparison]:
    """Every comparison among the measured configurations of a study (runs that failed or diverged left out)."""
    runs = {c.key: _usable(records.get(c.runs_as or c.key, ())) for c in configs if c.runnable}
    measured = [c for c in configs if c.runnable and runs.get(c.key)]
    margin, fraction = spec.equivalence_margin, spec.target_fraction
    out = []
    scaling = [c for c in measured if c.protocol in P.PROTOCOLS]
    for base in (c for c in scaling if c.precision == "fp32"):
        for other in scaling:
            if (other.protocol, other.world_size) == (base.protocol, base.world_size) and other.precision != "fp32":
                out.append(compare_runs("precision", f"FP32 {base.protocol} N {base.world_size}",
                                        PRECISION_LABELS[other.precision], _sides(runs[base.key]),
                                        _sides(runs[other.key]), margin, fraction))
    for base in (c for c in scaling if c.world_size == 1):
        for other in scaling:
            if (other.protocol, other.precision) == (base.protocol, base.precision) and other.world_size > 1:
                label = f"{PRECISION_LABELS[base.precision]} {base.protocol} on 1"
                out.append(compare_runs("devices", label, f"{other.world_size} ranks", _sides(runs[base.key]),
                                        _sides(runs[other.key]), margin, fraction, devices=other.world_size))
    sweep = next((p for p in spec.protocols if isinstance(p, BatchSweepSpec)), None)
    if sweep is not None:
        opt, rule, g0 = sweep.baseline
        points = [c for c in measured if c.protocol == P.BATCH_SWEEP]
        base = next((c for c in points
                     if (c.plan.optimizer, c.plan.lr_scaling, c.plan.global_batch) == (opt, rule, g0)), None)
        for other in points if base is not None else ():
            if (other.runs_as or other.key) == (base.runs_as or base.key) or other.precision != base.precision:
                continue  # the baseline itself, or a point that shares its runs (another LR rule at the same G)
            label = f"{PRECISION_LABELS[base.precision]} {opt} {rule} G {g0}"
            out.append(compare_runs("batch sweep", label, f"{other.plan.optimizer} {other.plan.lr_scaling} G"
                                    f" {other.plan.global_batch}", _sides(runs[base.key]), _sides(runs[other.key]),
                                    sweep.tolerance, fraction, keys=(base.key, other.key)))
    return out
