"""Across runs: what changed the limit between a run on one device and the same configuration on N.

The report's device-scaling section says, for each device count of a series, e.g. "at 2 devices the input
pipeline becomes the limit (data wait 3 % -> 31 %)", so that the equal-global and equal-local tables explain their
efficiency. The figure compared is the share (of the step or the epoch) that the new limit's rule weighs
(:attr:`cropscale.runs.schema.Diagnosis.shares`), in both runs.
"""

from __future__ import annotations

from cropscale.diagnosis.thresholds import KINDS, SHARE_LABELS, SHARE_NAMES
from cropscale.runs.schema import Diagnosis

PARTS = {"data_wait": "data wait", "transfer": "transfer", "forward": "forward", "backward_own": "backward",
         "optimizer": "optimizer"}
"""The part of a culprit's step, as the comparison names it."""


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f} %"


def _named(diag: Diagnosis) -> str:
    """The limit's name, with the culprit rank and the part of its step where it has one."""
    kind = diag.limit or "none"
    lead = diag.findings[0] if diag.findings else None
    if lead is not None and lead.rank is not None:
        part = f", {PARTS.get(lead.part, lead.part)}" if lead.part else ""
        return f"{KINDS.get(kind, kind)} (rank {lead.rank}{part})"
    return KINDS.get(kind, kind)


def limit_change(base: Diagnosis, other: Diagnosis, devices: int) -> str:
    """One sentence: what limits the run on ``devices`` devices against its 1-device base, with the share moved.

    Args:
        base: the diagnosis of the 1-device run.
        other: the diagnosis of the run on ``devices`` devices.
        devices: the other run's device count.
    """
    kind = other.limit or "none"
    key = SHARE_NAMES.get(kind) or SHARE_NAMES.get(base.limit or "none")
    moved = (f" ({SHARE_LABELS.get(key, key)} {_pct(base.shares.get(key))} -> {_pct(other.shares.get(key))})"
             if key else "")
    if kind == (base.limit or "none"):
        return f"at {devices} devices the limit stays {_named(other)}{moved}"
    if kind == "none":
        return f"at {devices} devices nothing dominates any more (was {_named(base)}){moved}"
    return f"at {devices} devices {_named(other)} becomes the limit (was {_named(base)}){moved}"
