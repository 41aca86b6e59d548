"""Rows of the study table: seeds aggregated, and speed-up, efficiency and Karp-Flatt against 1 rank.

Each measured configuration's seeds are aggregated into one row; speed-up, efficiency and the
Karp-Flatt serial fraction are taken against the measured 1-rank row.

Per run, every figure follows its rule in :mod:`cropscale.runs.rules` over the spec's measured
epochs (the run reader :func:`cropscale.runs.record.load_run` with ``warmup_epochs``); per
configuration: the median over seeds (times, steps, rates, shares) and the mean and sample standard
deviation over seeds (macro IoU).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from cropscale.evidence import MEASURED_RUN
from cropscale.numbers import mean_sd, median
from cropscale.runs.record import RunRecord
from cropscale.scaling.amdahl import karp_flatt
from cropscale.study import protocol as P
from cropscale.study.plan import Configuration
from cropscale.study.spec import PRECISION_LABELS


@dataclass
class StudyRow:
    """One configuration of the study table (times in s, steps in ms, shares as fractions).

    ``None`` = not measured or not predicted, with the reason in ``why[<field>]``; ``notes`` hold
    what qualifies the row, ``figure_notes`` what qualifies one figure.
    """

    evidence: str
    protocol: str
    precision: str
    world_size: int
    local_batch: int
    accumulation: int
    global_batch: int
    lr: float
    lr_scaling: str
    updates_per_epoch: float | None
    seeds: int = 0
    step_median_ms: float | None = None
    step_p95_ms: float | None = None
    samples_per_s: float | None = None
    train_epoch_s: float | None = None
    train_epoch_cv: float | None = None
    val_epoch_s: float | None = None
    e2e_epoch_s: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    serial_fraction: float | None = None
    loader_wait_share: float | None = None
    exposed_comm_share: float | None = None
    energy_per_sample_j: float | None = None
    miou_final: float | None = None
    miou_final_sd: float | None = None
    miou_best: float | None = None
    miou_best_sd: float | None = None
    notes: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)
    figure_notes: dict[str, str] = field(default_factory=dict)


def base_row(config: Configuration, evidence: str) -> StudyRow:
    """The planned (exact) columns of a configuration's row."""
    plan = config.plan
    return StudyRow(
        evidence=evidence, protocol=config.protocol, precision=PRECISION_LABELS[config.precision],
        world_size=config.world_size, local_batch=plan.local_batch, accumulation=plan.accumulation,
        global_batch=plan.global_batch, lr=plan.lr, lr_scaling=plan.lr_scaling,
        updates_per_epoch=config.updates_per_epoch,
    )


def run_notes(record: RunRecord) -> tuple[list[str], dict[str, str]]:
    """What qualifies one run (``notes``) and why some of its figures are n/a (``why``, by row field)."""
    notes, why = [], {}
    if record.run_json is None:
        notes.append(f"no run.json in {record.path} (fit without the scaling callbacks)")
    elif record.status != "finished":
        notes.append(f"run.json status {record.status!r}")
    for key, column in (("energy_j_per_sample", "energy_per_sample_j"), ("median_step_ms", "step_median_ms"),
                        ("final_miou", "miou_final"), ("best_miou", "miou_best")):
        if record.figures[key].value is None:
            why[column] = record.figures[key].why
    if record.exposed_comm_share is None and record.run_json is not None:
        comm = record.run_json.summary.step_timing.comm_timing if record.run_json.summary.step_timing else {}
        why["exposed_comm_share"] = (
            "no gradient all-reduce on 1 rank" if record.devices == 1
            else f"not timed: {comm.get('reason') or comm or 'no comm_exposed window in run.json'}")
    return notes, why


def _seed_figures(row: StudyRow, runs: Sequence[RunRecord]) -> None:
    """Median over seeds of each run's figure (each itself over the measured epochs)."""
    row.step_median_ms = median(r.figures["median_step_ms"].value for r in runs)
    row.step_p95_ms = median(r.figures["p95_step_ms"].value for r in runs)
    row.samples_per_s = median(r.figures["samples_per_s"].value for r in runs)
    row.train_epoch_s = median(r.figures["train_epoch_s"].value for r in runs)
    row.val_epoch_s = median(r.figures["val_epoch_s"].value for r in runs)
    row.e2e_epoch_s = median(r.figures["epoch_s"].value for r in runs)
    row.loader_wait_share = median(r.loader_wait_share for r in runs)
    row.exposed_comm_share = median(r.exposed_comm_share for r in runs)
    row.energy_per_sample_j = median(r.figures["energy_j_per_sample"].value for r in runs)
    row.miou_final, row.miou_final_sd = mean_sd(r.figures["final_miou"].value for r in runs)
    row.miou_best, row.miou_best_sd = mean_sd(r.figures["best_miou"].value for r in runs)


def measured_row(config: Configuration, runs: Sequence[RunRecord], train_samples: int | None,
                 extra_notes: Sequence[str] = ()) -> StudyRow:
    """Aggregate the seeds of one measured configuration into a table row.

    ``train_epoch_cv`` is the coefficient of variation of all measured training-epoch times (seeds x
    epochs): the dispersion. ``extra_notes`` (e.g. a batch mismatch found in the logs) are added.
    """
    row = base_row(config, MEASURED_RUN)
    row.seeds = len(runs)
    _seed_figures(row, runs)
    pooled = [t for r in runs for t in r.epoch_seconds.get("train_s", [])]
    if len(pooled) > 1 and statistics.fmean(pooled) > 0:
        row.train_epoch_cv = statistics.stdev(pooled) / statistics.fmean(pooled)
    elif len(pooled) == 1:
        row.why["train_epoch_cv"] = "one measured epoch in all: no dispersion"
    if row.energy_per_sample_j is not None:
        row.figure_notes["energy_per_sample_j"] = (
            "GPU board energy (NVML) of the measured epochs, their validation included, per training sample;"
            " excludes CPU, storage, network, cooling")
    measured_updates = median(r.updates_per_epoch for r in runs)
    if measured_updates is not None:
        if config.updates_per_epoch is None:
            row.updates_per_epoch = measured_updates
        elif not math.isclose(measured_updates, config.updates_per_epoch):
            row.notes.append(
                f"measured {measured_updates:g} optimizer updates/epoch, planned {config.updates_per_epoch}")
    if row.samples_per_s is None and train_samples and row.train_epoch_s:
        row.samples_per_s = train_samples / row.train_epoch_s
        row.notes.append("samples/s = training samples per epoch / median training-epoch time")
    row.notes.extend(n for n in extra_notes if n not in row.notes)
    for r in runs:
        notes, why = run_notes(r)
        row.notes.extend(n for n in notes if n not in row.notes)
        for key, text in why.items():
            row.why.setdefault(key, text)
    if len(runs) < 2:
        row.why.setdefault("miou_final_sd", "one seed: no spread")
        row.why.setdefault("miou_best_sd", "one seed: no spread")
    return row


def add_speedups(rows: list[StudyRow]) -> None:
    """Set S_N = T_1 / T_N, E_N = S_N / N and the Karp-Flatt fraction of measured rows, in place.

    Against the measured 1-rank row of the same protocol and precision (T = median training epoch).
    """
    t1 = {(r.protocol, r.precision): r.train_epoch_s for r in rows
          if r.evidence == MEASURED_RUN and r.world_size == 1}
    for r in rows:
        base = t1.get((r.protocol, r.precision))
        if r.evidence != MEASURED_RUN or r.train_epoch_s is None or base is None:
            continue
        r.speedup = P.speedup(base, r.train_epoch_s)
        r.efficiency = P.efficiency(r.speedup, r.world_size)
        if r.world_size > 1:
            r.serial_fraction = karp_flatt(r.speedup, r.world_size)
