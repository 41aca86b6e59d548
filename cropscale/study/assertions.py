"""The study's two-parameter performance assertion on its measured grid (world size x local batch).

Claim: the median step time is O(local batch) and O(1) in the world size at equal local batch
(``"O(local_batch)"`` over ``("world_size", "local_batch")``: data-parallel steps do the same work per
rank whatever the number of ranks). It is checked by
:func:`cropscale.scaling.multi_verdict.check_scaling_multi` on the study's measured rows
(evidence ``measured-run``; the batch sweep's and every analytical row are left out), one assertion
per precision, with rows at one coordinate (several protocols or accumulation counts) taken as
repetitions. It needs at least 3 distinct world sizes and 3 distinct local batches on the grid's
lines; with fewer the file says so and nothing is asserted. The outcome never stops the study:
it is written to ``scaling_assertions.md`` next to the study table.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cropscale.errors import CropScaleError
from cropscale.evidence import MEASURED_RUN
from cropscale.files import atomic_write_text
from cropscale.scaling.multi_verdict import MultiVerdict, check_scaling_multi
from cropscale.study import protocol as P
from cropscale.study.aggregate import StudyRow

CLAIM = "O(local_batch)"
"""The expected class of the median step time over (world size, local batch)."""
VARIABLES = ("world_size", "local_batch")
MIN_VALUES = 3


def grid(rows: Sequence[StudyRow], precision: str) -> tuple[list[float], list[float], list[list[float]]]:
    """``(world sizes, local batches, step times in ms per coordinate)`` of the measured rows of ``precision``."""
    cells: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        if (r.evidence == MEASURED_RUN and r.protocol != P.BATCH_SWEEP and r.precision == precision
                and r["median_step_ms"] is not None):
            cells.setdefault((r.world_size, r.local_batch), []).append(float(r["median_step_ms"]))
    keys = sorted(cells)
    return [float(k[0]) for k in keys], [float(k[1]) for k in keys], [cells[k] for k in keys]


def study_assertions(rows: Sequence[StudyRow], resamples: int = 1000) -> dict[str, MultiVerdict | str]:
    """Per precision, the verdict of :data:`CLAIM`, or why it was not asserted (too small a grid)."""
    out: dict[str, MultiVerdict | str] = {}
    for precision in sorted({r.precision for r in rows if r.evidence == MEASURED_RUN}):
        n, b, y = grid(rows, precision)
        if len(set(n)) < MIN_VALUES or len(set(b)) < MIN_VALUES:
            out[precision] = (f"not asserted: the measured grid has {len(set(n))} world sizes and {len(set(b))} "
                              f"local batches; at least {MIN_VALUES} of each are needed")
            continue
        try:
            out[precision] = check_scaling_multi((n, b), y, CLAIM, variables=VARIABLES, resamples=resamples,
                                                 label=f"median step time (ms), {precision}", evidence=MEASURED_RUN)
        except CropScaleError as err:
            out[precision] = f"not asserted: {err}"
    return out


def write_scaling_assertions(rows: Sequence[StudyRow], out: Path) -> dict[str, Path]:
    """Write ``scaling_assertions.md`` into ``out`` when the study has measured rows.

    Returns:
        ``{"scaling_assertions": path}``, or ``{}`` without measured rows.
    """
    verdicts = study_assertions(rows)
    if not verdicts:
        return {}
    lines = ["# Performance assertion on the measured grid", "",
             f"Claim: median step time {CLAIM} over {' x '.join(VARIABLES)} (O(1) in the world size at equal "
             "local batch). Verdict per precision (`cropscale.scaling.multi_verdict`).", ""]
    for precision, v in verdicts.items():
        lines += [f"## {precision}", ""]
        lines += ([v] if isinstance(v, str) else [v.summary(), "", "```", v.message(), "```"])
        lines.append("")
    return {"scaling_assertions": atomic_write_text(Path(out) / "scaling_assertions.md", "\n".join(lines))}
