"""Epoch rules: validation and checkpoint writes weighed against the epoch.

- **Validation**: an epoch whose validation takes ``v`` of its end-to-end ``w`` (``summary.throughput``: ``val_s``
  of ``wall_s``, medians over the measured epochs) could at best be ``w / (w - v)`` times faster without it.
- **Checkpoint writes**: global rank 0's write time ``c`` per epoch (``summary.checkpoint``, the other ranks wait
  for it) against the epoch's period ``P = wall_s + the writes outside it`` (ModelCheckpoint writes after the
  epoch's end hook): at best ``P / (P - c)``; medians over the measured epochs, an epoch without a write counting 0.

Either is a finding from :data:`~cropscale.diagnosis.thresholds.WARN_SHARE` of its epoch.
"""

from __future__ import annotations

from typing import Any

from cropscale.diagnosis import advice
from cropscale.diagnosis.steps import bound
from cropscale.diagnosis.thresholds import KINDS, WARN_SHARE, severity
from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN
from cropscale.numbers import median
from cropscale.runs.rules import measured
from cropscale.runs.schema import DiagnosisFigure, Finding, RunSummary


def _measured_walls(summary: RunSummary, warmup_epochs: int) -> list[tuple[int, float, float | None]]:
    """``(epoch, wall_s, val_s)`` of the measured epochs with a wall time."""
    through = summary.throughput
    rows = measured(through.epochs, warmup_epochs) if through is not None else []
    return [(int(e.epoch), float(e.wall_s), e.val_s) for e in rows if e.wall_s]


def validation(summary: RunSummary, warmup_epochs: int, config: dict[str, Any] | None
               ) -> tuple[Finding | None, float | None, list[str]]:
    """The validation finding (None below the warning share), validation's share of the epoch, notes."""
    walls = _measured_walls(summary, warmup_epochs)
    pairs = [(w, v) for _, w, v in walls if v is not None]
    if not pairs:
        return None, None, ["validation: no measured epoch with its validation time (ThroughputCallback)"]
    w, v = median(p[0] for p in pairs), median(p[1] for p in pairs)
    share = v / w
    if share < WARN_SHARE:
        return None, share, []
    b = bound(w, v)
    line = (f"{KINDS['validation']} ({severity(share)}): {v:.2f} s of the {w:.2f} s epoch ({100 * share:.0f} %,"
            f" medians over {len(pairs)} measured epoch(s)); without it an epoch could be at best {b:.2f}x faster"
            if b else f"{KINDS['validation']} ({severity(share)}): validation is the whole epoch")
    source = "summary.throughput.epochs[]"
    figures = [DiagnosisFigure("validation s per epoch", v, "s", MEASURED_RUN, f"{source}.val_s"),
               DiagnosisFigure("epoch s (end to end)", w, "s", MEASURED_RUN, f"{source}.wall_s"),
               DiagnosisFigure("bound w / (w - v)", b, "x", ANALYTICAL_SCENARIO, "the epoch decomposition")]
    return Finding(kind="validation", severity=severity(share), line=line, share=share, base="epoch", bound=b,
                   saving_s_per_epoch=v, evidence=figures, try_settings=advice.validation(config)), share, []


def checkpoint(summary: RunSummary, warmup_epochs: int, world_size: int = 1
               ) -> tuple[Finding | None, float | None, list[str]]:
    """The checkpoint-write finding (None below the warning share), the writes' share of the epoch, notes."""
    section = summary.checkpoint
    if section is None:
        return None, None, ["checkpoint writes: not timed (CheckpointTimingCallback did not run)"]
    walls = _measured_walls(summary, warmup_epochs)
    if not walls:
        return None, None, ["checkpoint writes: no measured epoch with a wall time (ThroughputCallback)"]
    by_epoch = {e.epoch: e for e in section.epochs}
    writes = [by_epoch[e].write_s if e in by_epoch else 0.0 for e, _, _ in walls]
    periods = [w + (by_epoch[e].outside_wall_s if e in by_epoch else 0.0) for e, w, _ in walls]
    c, p = median(writes), median(periods)
    share = c / p
    if share < WARN_SHARE:
        return None, share, []
    b = bound(p, c)
    saves = sum(by_epoch[e].saves for e, _, _ in walls if e in by_epoch)
    line = (f"{KINDS['checkpoint']} ({severity(share)}): {c:.2f} s of checkpoint writes per {p:.2f} s epoch"
            f" ({100 * share:.0f} %; {saves} write(s) by rank 0 in {len(walls)} measured epoch(s)"
            + (", the other ranks waiting" if world_size > 1 else "")
            + f"); without them an epoch could be at best {b:.2f}x faster")
    source = "summary.checkpoint.epochs[]"
    figures = [DiagnosisFigure("checkpoint write s per epoch", c, "s", MEASURED_RUN, f"{source}.write_s"),
               DiagnosisFigure("epoch period s", p, "s", MEASURED_RUN,
                               f"summary.throughput.epochs[].wall_s + {source}.outside_wall_s"),
               DiagnosisFigure("bound P / (P - c)", b, "x", ANALYTICAL_SCENARIO, "the epoch decomposition")]
    return Finding(kind="checkpoint", severity=severity(share), line=line, share=share, base="epoch", bound=b,
                   saving_s_per_epoch=c, evidence=figures, try_settings=advice.checkpoint()), share, []
