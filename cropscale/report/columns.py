"""The columns of the report's tables: the comparison it leads with, the detail tables, pairs and scaling.

Each table is a list of figure keys; header, unit and format come from the registry
(:data:`cropscale.runs.figures.FIGURES`), so a figure reads the same in every table. :data:`COLUMNS` is
every figure of a run in one row: ``report.csv`` (for machines). The Markdown report splits them:
:data:`COMPARISON_COLUMNS` first, then :data:`QUALITY_COLUMNS`, :data:`SPEED_COLUMNS`,
:data:`STEP_COLUMNS` and :data:`RESOURCE_COLUMNS`.
"""

from __future__ import annotations

from cropscale.runs.figures import column, columns
from cropscale.runs.schema import STEP_WINDOWS
from cropscale.runs.tables import Column

COLUMNS: tuple[Column, ...] = columns(
    "name", "status", "kind", "precision", "strategy", "devices", "global_batch", "best_miou", "best_epoch",
    "final_train_loss", "median_step_ms", "p95_step_ms", "samples_per_s", "train_epoch_s", "val_epoch_s", "epoch_s",
    "energy_j", "energy_j_per_sample", "peak_memory_gib", "nonfinite", "skipped_steps", "data_warning_count",
    "slowest_rank", "slowest_rank_step_ms",
)
"""Columns of the runs table, in order."""

PAIR_COLUMNS: tuple[Column, ...] = (
    Column("base", "FP32 run", figure=False),
    Column("other", "Mixed-precision run", figure=False),
    column("precision"),
    column("global_batch"),
    column("samples_per_s", "FP32 samples/s").with_key("base_samples_per_s"),
    column("samples_per_s", "Mixed samples/s").with_key("other_samples_per_s"),
    column("speedup", "Speed-up vs FP32"),
    column("step_ratio"),
    column("best_miou", "FP32 best mIoU").with_key("base_best_miou"),
    column("best_miou", "Mixed best mIoU").with_key("other_best_miou"),
    column("iou_difference"),
    column("memory_ratio"),
)
"""Columns of the precision-pair table (the base's and the other's figure under the registry's format)."""

COMPARISON_COLUMNS: tuple[Column, ...] = (
    *columns("name"),
    column("status", qualifiers=False),
    *columns("precision", "devices", "global_batch"),
    column("best_miou", qualifiers=False),
    column("iou_difference", qualifiers=False),
    column("samples_per_s", qualifiers=False),
    column("speedup", "Speed-up vs FP32", qualifiers=False),
    column("efficiency", qualifiers=False),
    column("peak_memory_gib"),
    column("energy_j_per_sample", qualifiers=False),
)
"""The comparison the report leads with: one row per run or benchmark configuration (qualifiers of present
values are in the detail tables and the CSV; the peak-memory note says GPU or host RSS)."""

QUALITY_COLUMNS: tuple[Column, ...] = columns("name", "status", "best_miou", "best_epoch", "final_miou",
                                              "final_train_loss")
"""Quality detail: macro IoU and the final training loss."""

SPEED_COLUMNS: tuple[Column, ...] = columns("name", "kind", "strategy", "median_step_ms", "p95_step_ms",
                                            "samples_per_s", "train_epoch_s", "val_epoch_s", "epoch_s",
                                            "slowest_rank", "slowest_rank_step_ms")
"""Speed detail: step latency, throughput, epoch times, and the slowest rank (every rank's median in its note)."""

STEP_COLUMNS: tuple[Column, ...] = (
    *columns("name", *(f"share_{w}" for w in STEP_WINDOWS), "share_sum"),
    column("median_step_ms", "Median step (ms) = 100 %"),
    *columns("data_wait_host_ms", "transfer_host_ms"),
)
"""Step decomposition detail: each window in percent of the median step (the figure shows the same)."""

RESOURCE_COLUMNS: tuple[Column, ...] = columns("name", "peak_memory_gib", "energy_j", "energy_j_per_sample",
                                               "nonfinite", "skipped_steps", "data_warning_count")
"""Memory, energy, numerics and data-check detail (the Data warnings note lists ``run.json`` ``data_warnings``)."""

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

SCALING_COLUMNS: tuple[Column, ...] = (
    Column("series", "Configuration", figure=False),
    column("devices"),
    Column("runs", "Runs", "d", figure=False),
    column("samples_per_s", "Samples/s (median)"),
    column("speedup", "Speed-up vs 1 device"),
    column("efficiency"),
    column("karp_flatt"),
)
"""Device scaling: one row per device count of a series."""

AMDAHL_COLUMNS: tuple[Column, ...] = (
    Column("series", "Configuration", figure=False),
    column("serial_fraction"),
    *(column("speedup", f"Amdahl speed-up on {n}").with_key(f"speedup_{n}") for n in (2, 4, 8)),
)
"""Amdahl's law at each series' fitted serial fraction (the fraction is measured, the speed-ups a model)."""
