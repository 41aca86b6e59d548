"""The columns of the report's tables: the comparison it leads with, the detail tables, pairs and scaling.

:data:`COLUMNS` is every figure of a run in one row: ``report.csv`` (for machines). The Markdown report
splits them: :data:`COMPARISON_COLUMNS` first, then :data:`QUALITY_COLUMNS`, :data:`SPEED_COLUMNS`,
:data:`STEP_COLUMNS` and :data:`RESOURCE_COLUMNS`.
"""

from __future__ import annotations

from cropscale.runs.tables import Column

COLUMNS: tuple[Column, ...] = (
    Column("name", "Run", figure=False),
    Column("status", "Status", figure=False),
    Column("kind", "Kind", figure=False),
    Column("precision", "Precision", figure=False),
    Column("strategy", "Strategy", figure=False),
    Column("devices", "Devices", "d", figure=False),
    Column("global_batch", "Global batch", "d", figure=False),
    Column("best_miou", "Best val/mIoU", ".4f"),
    Column("best_epoch", "Best epoch", "d"),
    Column("final_train_loss", "Final train loss", ".4f"),
    Column("median_step_ms", "Median step (ms)", ".2f"),
    Column("p95_step_ms", "p95 step (ms)", ".2f"),
    Column("samples_per_s", "Samples/s", ".2f"),
    Column("train_epoch_s", "Train epoch (s)", ".2f"),
    Column("val_epoch_s", "Val epoch (s)", ".2f"),
    Column("epoch_s", "End-to-end epoch (s)", ".2f"),
    Column("energy_j", "Energy (J)", ".0f"),
    Column("energy_j_per_sample", "J/sample", ".3f"),
    Column("peak_memory_gib", "Peak GiB", ".2f"),
    Column("nonfinite", "Non-finite", "d"),
    Column("skipped_steps", "Skipped steps", "d"),
    Column("data_warning_count", "Data warnings", "d", figure=False),
)
"""Columns of the runs table, in order."""

PAIR_COLUMNS: tuple[Column, ...] = (
    Column("base", "FP32 run", figure=False),
    Column("other", "Mixed-precision run", figure=False),
    Column("precision", "Precision", figure=False),
    Column("global_batch", "Global batch", "d", figure=False),
    Column("base_samples_per_s", "FP32 samples/s", ".2f"),
    Column("other_samples_per_s", "Mixed samples/s", ".2f"),
    Column("speedup", "Speed-up", ".3f"),
    Column("step_ratio", "Median step ratio", ".3f"),
    Column("base_best_miou", "FP32 best mIoU", ".4f"),
    Column("other_best_miou", "Mixed best mIoU", ".4f"),
    Column("iou_difference", "IoU difference", "+.4f"),
    Column("memory_ratio", "Peak memory ratio", ".3f"),
)
"""Columns of the precision-pair table."""

COMPARISON_COLUMNS: tuple[Column, ...] = (
    Column("name", "Run", figure=False),
    Column("status", "Status", figure=False, qualifiers=False),
    Column("precision", "Precision", figure=False),
    Column("devices", "Devices", "d", figure=False),
    Column("global_batch", "Global batch", "d", figure=False),
    Column("best_miou", "Best val/mIoU", ".4f", qualifiers=False),
    Column("iou_difference", "mIoU change vs FP32", "+.4f", qualifiers=False),
    Column("samples_per_s", "Samples/s", ",.2f", qualifiers=False),
    Column("speedup", "Speed-up vs FP32", ".2f", qualifiers=False),
    Column("efficiency", "Efficiency vs 1 device", ".2f", qualifiers=False),
    Column("peak_memory_gib", "Peak GiB", ".2f"),
    Column("energy_j_per_sample", "J/sample", ".3f", qualifiers=False),
)
"""The comparison the report leads with: one row per run or benchmark configuration (qualifiers of present
values are in the detail tables and the CSV; the peak-memory note says GPU or host RSS)."""

QUALITY_COLUMNS: tuple[Column, ...] = (
    Column("name", "Run", figure=False),
    Column("status", "Status", figure=False),
    Column("best_miou", "Best val/mIoU", ".4f"),
    Column("best_epoch", "Best epoch", "d"),
    Column("final_miou", "Final val/mIoU", ".4f"),
    Column("final_train_loss", "Final train loss", ".4f"),
)
"""Quality detail: macro IoU and the final training loss."""

SPEED_COLUMNS: tuple[Column, ...] = (
    Column("name", "Run", figure=False),
    Column("kind", "Kind", figure=False),
    Column("strategy", "Strategy", figure=False),
    Column("median_step_ms", "Median step (ms)", ",.1f"),
    Column("p95_step_ms", "p95 step (ms)", ",.1f"),
    Column("samples_per_s", "Samples/s", ",.2f"),
    Column("train_epoch_s", "Train epoch (s)", ",.1f"),
    Column("val_epoch_s", "Val epoch (s)", ",.1f"),
    Column("epoch_s", "End-to-end epoch (s)", ",.1f"),
)
"""Speed detail: step latency, throughput, epoch times."""

STEP_COLUMNS: tuple[Column, ...] = (
    Column("name", "Run", figure=False),
    *(Column(f"share_{w}", f"{w.replace('_', ' ')} (%)", ".1f")
      for w in ("data_wait", "transfer", "forward", "backward", "optimizer", "remainder")),
    Column("share_sum", "Sum (%)", ".1f"),
    Column("median_step_ms", "Median step (ms) = 100 %", ",.1f"),
    Column("data_wait_host_ms", "Data wait, host clock (ms)", ",.2f"),
    Column("transfer_host_ms", "Transfer, host clock (ms)", ",.2f"),
)
"""Step decomposition detail: each window in percent of the median step (the figure shows the same)."""

RESOURCE_COLUMNS: tuple[Column, ...] = (
    Column("name", "Run", figure=False),
    Column("peak_memory_gib", "Peak GiB", ".2f"),
    Column("energy_j", "Energy (J)", ",.0f"),
    Column("energy_j_per_sample", "J/sample", ".3f"),
    Column("nonfinite", "Non-finite batches", "d"),
    Column("skipped_steps", "Skipped steps", "d"),
    Column("data_warning_count", "Data warnings", "d", figure=False),
)
"""Memory, energy, numerics and data-check detail (the Data warnings note lists ``run.json`` ``data_warnings``)."""

SCALING_COLUMNS: tuple[Column, ...] = (
    Column("series", "Configuration", figure=False),
    Column("devices", "Devices", "d", figure=False),
    Column("runs", "Runs", "d", figure=False),
    Column("samples_per_s", "Samples/s (median)", ",.2f"),
    Column("speedup", "Speed-up vs 1 device", ".2f"),
    Column("efficiency", "Efficiency", ".2f"),
    Column("karp_flatt", "Karp-Flatt serial fraction", ".3f"),
)
"""Device scaling: one row per device count of a series."""

AMDAHL_COLUMNS: tuple[Column, ...] = (
    Column("series", "Configuration", figure=False),
    Column("serial_fraction", "Fitted serial fraction", ".3f"),
    *(Column(f"speedup_{n}", f"Amdahl speed-up on {n}", ".2f") for n in (2, 4, 8)),
)
"""Amdahl's law at each series' fitted serial fraction (the fraction is measured, the speed-ups a model)."""
