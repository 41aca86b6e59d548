"""The diagnosis as text: a few lines for the end-of-fit summary, Markdown for the report and TensorBoard.

Every sentence is the finding's own ``line`` (written once by the rule that made it); this module only lays the
findings out. A bound is ``analytical-scenario`` (what removing a term could give under the decomposition), the
figures it rests on ``measured-run``: the layout says so once.
"""

from __future__ import annotations

from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN
from cropscale.runs.schema import Diagnosis, Finding

MAX_ALSO = 2
"""Findings after the limit that the fit summary prints (the report and TensorBoard print all)."""
LABELS = f"figures {MEASURED_RUN}, bounds {ANALYTICAL_SCENARIO}"


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "fraction":
        return f"{100 * value:.1f} %"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:,.2f} {unit}".rstrip()


def summary_lines(diag: Diagnosis, indent: str) -> list[str]:
    """The limit with what to try, then at most :data:`MAX_ALSO` other findings, each one line.

    Args:
        diag: the run's diagnosis.
        indent: the prefix of a continuation line (the summary's label column, blank).

    Returns:
        Lines without the summary's label of the first one (the caller prefixes ``limit``).
    """
    if not diag.findings:
        return [f"n/a ({diag.error or 'nothing recorded to judge'})"]
    lead, others = diag.findings[0], diag.findings[1:]
    out = [f"{lead.line} [{LABELS}]"]
    if lead.try_settings:
        out.append(f"{indent}try: " + "; ".join(lead.try_settings[:3]))
    for f in others[:MAX_ALSO]:
        out.append(f"{indent}also: {f.line}")
    if len(others) > MAX_ALSO:
        out.append(f"{indent}({len(others) - MAX_ALSO} more finding(s): run.json diagnosis, the report)")
    return out


def _finding_markdown(f: Finding, first: bool) -> str:
    head = f"- **{'Limit' if first else 'Also'}**: {f.line}"
    figures = "; ".join(f"{e.name} {_figure(e.value, e.unit)} ({e.evidence})" for e in f.evidence)
    tries = "".join(f"\n  - try {t}" for t in f.try_settings)
    return head + (f"\n  - evidence: {figures}" if figures else "") + tries


def markdown(diag: Diagnosis) -> str:
    """Every finding with its evidence and what to try, then what the run's records cannot answer (Markdown)."""
    if not diag.findings:
        return f"- n/a ({diag.error or 'nothing recorded to judge'})"
    parts = [_finding_markdown(f, i == 0) for i, f in enumerate(diag.findings)]
    if diag.not_judged:
        parts.append("- not judged: " + "; ".join(diag.not_judged))
    if diag.error:
        parts.append(f"- a rule failed: {diag.error}")
    return "\n".join(parts)
