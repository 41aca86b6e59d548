"""Precision pairs: records that differ only in precision, an FP32 base against each other precision.

``speedup_vs_fp32 = other samples/s / base samples/s`` (:func:`cropscale.numbers.speedup`, the one definition),
``step_ratio = other median step / base median step``,
``iou_difference = other best mIoU - base best mIoU`` (IoU units, 0..1), ``memory_ratio = other
peak / base peak``. A ratio whose inputs are missing is n/a with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cropscale.precision import BY_CPU_FALLBACK, shown_label
from cropscale.runs.record import RunRecord
from cropscale.runs.rules import Figure
from cropscale.runs.validity import INVALID

FAILED = ("oom", "error", "unsupported", "skipped", "failed", "running", "unreadable", *INVALID)
"""Statuses of records that take part in no pair (benchmark rows, then ``run.json`` statuses: a fit that did not
finish, and one that is no valid result, :data:`cropscale.runs.validity.INVALID`)."""


@dataclass
class PrecisionPair:
    """One pair: the base and other run's names, the pair's precision label, and the figures."""

    base: str
    other: str
    precision: str
    precision_verified: bool
    global_batch: int | None
    evidence: str
    figures: dict[str, Figure] = field(default_factory=dict)
    descriptive: dict[str, Figure] = field(default_factory=dict)


def _ratio(key: str, other: RunRecord, base: RunRecord, evidence: str, diff: bool = False) -> Figure:
    a, b = other.value(key), base.value(key)
    if a is None or b is None or (not diff and not b):
        whys = {n: (rec.figures[key].why if key in rec.figures else None) or "not recorded"
                for n, rec in (("mixed", other), ("FP32", base)) if rec.value(key) is None}
        why = ("; ".join(f"{n}: {w}" for n, w in whys.items()) if len(set(whys.values())) > 1
               else next(iter(whys.values()), "FP32 value is zero"))
        return Figure(None, evidence, why)
    return Figure(a - b if diff else a / b, evidence)


def _requested_note(base: RunRecord, other: RunRecord) -> str | None:
    """Why the pair's precision is the *requested* one, when a run has no ``run.json``."""
    requested = [rec for rec in (base, other) if not rec.precision_decision.verified]
    if not requested:
        return None
    why = ("precision as requested in config.yaml, not verified (no run.json) for "
           + " and ".join(rec.name for rec in requested)
           + "; the pair is by requested precision, not by the precision the runs ran with")
    if not other.precision_decision.verified and other.precision_decision.by == BY_CPU_FALLBACK:
        why += f"; {other.name} ran on accelerator 'cpu', where Lightning runs 16-mixed as bf16-mixed"
    return why


def _bases(records: Sequence[RunRecord]) -> dict[str, RunRecord]:
    bases: dict[str, RunRecord] = {}
    for r in records:
        if r.precision == "32-true" and r.status in (None, "ok", "finished") and r.excluded is None:
            bases.setdefault(r.pair_key, r)
    return bases


def precision_pairs(records: Sequence[RunRecord]) -> list[PrecisionPair]:
    """Pair every record of another precision with the FP32 (``32-true``) record of the same ``pair_key``.

    Failed benchmark rows (``oom``, ``error``, ``unsupported``), runs that did not finish (``run.json``
    status ``failed`` or ``running``), unreadable run folders and runs that are no valid result (``not-trained``,
    ``diverged``, ``not-validated``: :attr:`RunRecord.excluded` says why) are left out, as base and as other.
    """
    pairs = []
    bases = _bases(records)
    for r in records:
        base = bases.get(r.pair_key)
        if base is None or r is base or r.precision in (None, "32-true") or r.status in FAILED or r.excluded:
            continue
        evidence = base.evidence if base.evidence == r.evidence else f"{base.evidence} + {r.evidence}"
        note = _requested_note(base, r)
        label = shown_label(r.precision, verified=note is None)
        pairs.append(PrecisionPair(
            base=base.name, other=r.name, precision=label, precision_verified=note is None,
            global_batch=r.global_batch, evidence=evidence,
            descriptive={"precision": Figure(label, None, note=note)} if note else {},
            figures={
                "base_samples_per_s": base.figures["samples_per_s"],
                "other_samples_per_s": r.figures["samples_per_s"],
                "speedup_vs_fp32": _ratio("samples_per_s", r, base, evidence),
                "step_ratio": _ratio("median_step_ms", r, base, evidence),
                "base_best_miou": base.figures["best_miou"],
                "other_best_miou": r.figures["best_miou"],
                "iou_difference": _ratio("best_miou", r, base, evidence, diff=True),
                "memory_ratio": _ratio("peak_memory_gib", r, base, evidence),
            },
        ))
    return pairs
