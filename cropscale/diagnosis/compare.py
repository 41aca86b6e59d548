"""Across runs: what changed the limit of the step between a run on one device and the same configuration on N.

The report's device-scaling section says, for each device count of a series, e.g. "at 2 devices input pipeline
becomes the step's limit (was compute) (data wait 3 % -> 31 %)", so that the equal-global and equal-local tables
explain their efficiency. Efficiency there is a ratio of training samples/s, so the comparison weighs the
**step's** limit: the first finding whose base is the step (a compute-bound step, or nothing dominant, where no
step term is one). The figure compared is that limit's share (:attr:`cropscale.runs.schema.Diagnosis.shares`) in
both runs (compute's when nothing dominates), then the step term whose share grew most, when it grew by at least
:data:`~cropscale.diagnosis.thresholds.WARN_SHARE` / 2 of the step, then the median step and the ranks' median own
work in both runs (under equal local batches, a slower own work per rank is compute that got slower, e.g. ranks
sharing a host's cores).
"""

from __future__ import annotations

from cropscale.diagnosis.thresholds import KINDS, SHARE_LABELS, SHARE_NAMES, WARN_SHARE
from cropscale.numbers import median
from cropscale.runs.schema import Diagnosis, Finding

PARTS = {"data_wait": "data wait", "transfer": "transfer", "forward": "forward", "backward_own": "backward",
         "optimizer": "optimizer"}
"""The part of a culprit's step, as the comparison names it."""
STEP_TERMS = ("data_wait", "transfer", "comm_exposed", "remainder", "straggler")
"""The step terms whose growth the comparison reports."""


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f} %"


def step_limit(diag: Diagnosis) -> Finding | None:
    """The first finding about the step (a step term, a rank, compute, or nothing dominant); None without one."""
    return next((f for f in diag.findings if f.base == "step" or f.kind in ("compute", "none")), None)


def _named(finding: Finding | None) -> str:
    """The limit's name, with the culprit rank and the part of its step where it has one."""
    if finding is None:
        return KINDS["none"]
    if finding.rank is not None:
        part = f", {PARTS.get(finding.part, finding.part)}" if finding.part else ""
        return f"{KINDS.get(finding.kind, finding.kind)} (rank {finding.rank}{part})"
    return KINDS.get(finding.kind, finding.kind)


def _grew(base: Diagnosis, other: Diagnosis, shown: str | None) -> str:
    """``; grew most: <term> a % -> b %`` for the step term that grew most (not the one shown), else ``""``."""
    growth = [((other.shares.get(t) or 0.0) - (base.shares.get(t) or 0.0), t) for t in STEP_TERMS if t != shown]
    if not growth:
        return ""
    delta, term = max(growth)
    if delta < WARN_SHARE / 2:
        return ""
    return f"; grew most: {SHARE_LABELS[term]} {_pct(base.shares.get(term))} -> {_pct(other.shares.get(term))}"


def _slower(base: Diagnosis, other: Diagnosis) -> str:
    """``; step a -> b ms, own work a -> b ms a rank``: the step and the ranks' own work (medians) in both runs."""
    if base.step_ms is None or other.step_ms is None:
        return ""
    own_b, own_o = (median(r.own_ms for r in d.ranks) for d in (base, other))
    own = f", own work {own_b:.0f} -> {own_o:.0f} ms a rank" if own_b is not None and own_o is not None else ""
    return f"; step {base.step_ms:.0f} -> {other.step_ms:.0f} ms{own}"


def limit_change(base: Diagnosis, other: Diagnosis, devices: int) -> str:
    """One sentence: what limits the step on ``devices`` devices against the 1-device base, with the shares moved.

    Args:
        base: the diagnosis of the 1-device run.
        other: the diagnosis of the run on ``devices`` devices.
        devices: the other run's device count.
    """
    before, after = step_limit(base), step_limit(other)
    kind_b, kind_o = (before.kind if before else "none"), (after.kind if after else "none")
    key = SHARE_NAMES.get(kind_o) or SHARE_NAMES.get(kind_b) or "compute"
    moved = (f" ({SHARE_LABELS.get(key, key)} {_pct(base.shares.get(key))} -> {_pct(other.shares.get(key))})"
             if key in base.shares or key in other.shares else "")
    grew = _grew(base, other, key) + _slower(base, other)
    if kind_o == kind_b:
        return f"at {devices} devices the step's limit stays {_named(after)}{moved}{grew}"
    if kind_o == "none":
        return f"at {devices} devices nothing dominates the step any more (was {_named(before)}){moved}{grew}"
    return f"at {devices} devices {_named(after)} becomes the step's limit (was {_named(before)}){moved}{grew}"
