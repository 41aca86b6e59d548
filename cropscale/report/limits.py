"""What limits each run, and what changed the limit across device counts: the report's diagnosis sections.

Each run's diagnosis is the one its ``run.json`` holds (:func:`cropscale.diagnosis.diagnosis_of`; computed from
``run.json`` for a run written before the diagnosis existed). The device-scaling section adds, per series and
device count, what limits the run there against the same configuration on one device
(:func:`cropscale.diagnosis.limit_change`), so that the efficiency in its table has a reason beside it.
"""

from __future__ import annotations

from collections.abc import Sequence

from cropscale.diagnosis import diagnosis_of, limit_change, markdown
from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN
from cropscale.report.scaling import DeviceSeries
from cropscale.runs.record import RunRecord

INTRO = (f"What limits each run, from its recorded figures (`run.json` diagnosis; the rules and their thresholds:"
         f" docs/measuring.md, \"What limits a run\"). Figures are `{MEASURED_RUN}`; a bound (how much faster the"
         f" run could at best be without the term) is `{ANALYTICAL_SCENARIO}`.")


def diagnosis_section(records: Sequence[RunRecord]) -> str:
    """``## What limits each run``: per training run its findings, evidence and what to try (Markdown)."""
    runs = [r for r in records if r.kind == "run"]
    if not runs:
        return "## What limits each run\n\nNo training run among the inputs (benchmarks have no diagnosis).\n"
    parts = []
    for r in runs:
        diag = diagnosis_of(r)
        body = markdown(diag) if diag is not None else "- n/a: no run.json (a fit without the scaling callbacks)"
        parts.append(f"### {r.name}\n\n{body}\n")
    return "## What limits each run\n\n" + INTRO + "\n\n" + "\n".join(parts)


def limit_changes(series: Sequence[DeviceSeries], records: Sequence[RunRecord]) -> str:
    """One line per device count > 1 of each series: what limits it there against its 1-device run (Markdown).

    The first run of each device count stands for it (its seeds share a configuration); empty without series.
    """
    by_name = {r.name: r for r in records}
    lines = []
    for s in series:
        base = next((p for p in s.points if p.devices == 1), None)
        base_diag = diagnosis_of(by_name[base.runs[0]]) if base and base.runs[0] in by_name else None
        for p in s.points:
            if p.devices == 1 or base_diag is None or p.runs[0] not in by_name:
                continue
            other = diagnosis_of(by_name[p.runs[0]])
            if other is None:
                continue
            eff = f"; efficiency {p.efficiency:.2f}" if p.efficiency is not None else ""
            lines.append(f"- {s.label}: {limit_change(base_diag, other, p.devices)}{eff}")
    if not lines:
        return ""
    return "What changed the limit (each run's diagnosis against the 1-device run of its series):\n\n" + "\n".join(
        lines) + "\n"
