"""The columns of the report's tables: the runs table and the precision-pair table."""

from __future__ import annotations

from cropscale.runs.tables import Column

COLUMNS: tuple[Column, ...] = (
    Column("name", "Run", figure=False),
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
    Column("status", "Status", figure=False),
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
