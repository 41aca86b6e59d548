"""The columns of the report's tables that hold no figure of a run: the non-finite records.

Every other table of the report (the runs CSV, the comparison it leads with, the quality, speed, step and
resource details, precision pairs, device scaling, the Amdahl fit, the verdicts) takes its columns from the
figure registry when it is rendered: :func:`cropscale.runs.figures.table_columns` of
:data:`~cropscale.runs.figures.RUNS`, :data:`~cropscale.runs.figures.COMPARISON` ...; header, unit, format
and membership are each figure's entry there, so a figure reads the same in every table.
"""

from __future__ import annotations

from cropscale.runs.figures import Column, column

NONFINITE_COLUMNS: tuple[Column, ...] = (
    column("name"),
    Column("global_step", "Step", "d", figure=False),
    Column("epoch", "Epoch", "d", figure=False),
    Column("rank", "Rank", "d", figure=False),
    Column("micro_batch", "Micro-batch", figure=False),
    Column("part", "Not finite", figure=False),
    Column("patch_id", "Sample ids (patch_id)", figure=False),
    Column("input_patch_id", "Samples with non-finite inputs", figure=False),
)
"""One row per non-finite batch ``run.json`` records (``summary.nonfinite.records``): where (step, epoch, rank,
micro-batch; ``all``: the gradients alone were non-finite, so the record names every micro-batch of the step),
which part was not finite (loss, gradients, input tensors by key) and the samples it held."""
