"""The diagnosis's thresholds and the kinds of limit it names: every number a rule compares with, in one place.

``docs/measuring.md`` ("What limits a run: the diagnosis") gives each threshold with the reason for its value.
The rules (:mod:`cropscale.diagnosis.steps`, :mod:`~cropscale.diagnosis.ranks`, :mod:`~cropscale.diagnosis.epochs`)
import them from here and nowhere else.
"""

from __future__ import annotations

WARN_SHARE = 0.10
"""A removable term (data wait, transfer, exposed communication, loop remainder; validation or checkpoint writes of
the epoch; a straggler's excess) is a finding from this fraction of its step (epoch) on: traceml's warning level.
Removing 10 % gives at best 1.11x."""
CRITICAL_SHARE = 0.20
"""... and critical from this fraction on (traceml's critical level): at best 1.25x without it."""
COMPUTE_BOUND_SHARE = 0.90
"""A step whose own compute (forward + backward without the exposed communication + optimizer) is at least this
fraction of it is compute-bound (traceml's level): what is left to remove is at most 1.11x."""
STRAGGLER_EXPLAINS = 0.80
"""A rank is named the culprit of the other ranks' waits only when its own extra work explains at least this
fraction of their extra waiting (as traceml requires of a straggler cause); below it the evidence cannot
separate the ranks, and the diagnosis says so."""
SLOWDOWN_SCORE = 0.70
"""A rank slowed over the run when its best epoch's own work over its last epoch's falls below this score
(NVIDIA's individual performance score; 0.7, the threshold NeMo's and Megatron-Bridge's straggler-detection
configurations use: the rank is 1.43x slower than at its best). Under DDP its relative score in that last epoch
(the best rank's own work over its own, NVIDIA's relative score, with the same threshold) must be below it too, so a
machine on which every rank slowed names no rank."""
MIN_MEASURED_STEPS = 3
"""Step findings need at least this many measured steps (summed over the measured epochs): a median of one or two
steps is one step's noise."""

KINDS: dict[str, str] = {
    "input": "input pipeline",
    "transfer": "host-to-device transfer",
    "communication": "exposed communication",
    "overhead": "loop overhead",
    "compute": "compute",
    "straggler": "a straggler rank",
    "imbalance": "unequal waits (no rank to name)",
    "throttling": "a rank slowing over the run (throttling)",
    "validation": "validation",
    "checkpoint": "checkpoint writes",
    "none": "nothing dominant",
}
"""Finding kind -> what the lines call it. ``imbalance``: the ranks wait unequally but no rank's own work explains it
(:mod:`cropscale.diagnosis.ranks`); ``none``: no term reaches :data:`WARN_SHARE` and the step is not compute-bound."""
SHARE_NAMES: dict[str, str] = {
    "input": "data_wait", "transfer": "transfer", "communication": "comm_exposed", "overhead": "remainder",
    "compute": "compute", "straggler": "straggler", "imbalance": "straggler", "throttling": "slowdown",
    "validation": "validation", "checkpoint": "checkpoint",
}
"""Finding kind -> its key in :attr:`cropscale.runs.schema.Diagnosis.shares` (the report compares runs on it)."""
SHARE_LABELS: dict[str, str] = {
    "data_wait": "data wait", "transfer": "transfer", "comm_exposed": "exposed communication",
    "remainder": "loop remainder", "compute": "compute", "straggler": "straggler excess",
    "slowdown": "slow-down", "validation": "validation", "checkpoint": "checkpoint writes",
}
"""Share key -> how a line names it."""


def severity(share: float) -> str:
    """``critical`` (>= :data:`CRITICAL_SHARE`), ``warning`` (>= :data:`WARN_SHARE`) or ``info``."""
    if share >= CRITICAL_SHARE:
        return "critical"
    return "warning" if share >= WARN_SHARE else "info"
