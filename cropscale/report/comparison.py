"""The rows of the report's tables: the comparison it leads with, the step decomposition and device scaling.

The comparison puts quality, speed, memory and energy of every run side by side with the differences
that matter: the mIoU change and speed-up against the FP32 run of the same configuration
(:mod:`cropscale.report.pairs`) and the parallel efficiency against the same configuration on one
device (:mod:`cropscale.report.scaling`). The FP32 base of a pair shows speed-up 1 and change 0, the
1-device base of a device series efficiency 1 (each with a note saying so).

A run's Status (:func:`status`): its validity when it is no valid result (``not-trained``, ``diverged``,
``not-validated``: :mod:`cropscale.runs.validity`, the reason in the note), else ``failed`` / ``incomplete`` for a
``run.json`` that was never finished, ``unreadable`` for a run folder that could not be read, else ``finished``; a
benchmark configuration shows its own status (``ok``, ``oom`` ...).
"""

from __future__ import annotations

from collections.abc import Sequence

from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN, derived_label
from cropscale.report.pairs import PrecisionPair
from cropscale.report.scaling import DeviceSeries, efficiency_of
from cropscale.report.tables import TableRow
from cropscale.runs.figures import AMDAHL_DEVICES, Column
from cropscale.runs.record import RunRecord
from cropscale.runs.rules import Figure
from cropscale.runs.schema import STEP_WINDOWS
from cropscale.scaling.amdahl import amdahl_speedup

UNFINISHED = {"failed": "failed", "running": "incomplete"}
"""``run.json`` statuses of a fit that did not finish -> the word the report shows."""


def status(record: RunRecord) -> Figure:
    """The Status cell of a record (a descriptive cell: value and the note that explains it)."""
    recorded = record.descriptive.get("status")  # set by the run reader where it judges the status itself
    if isinstance(recorded, Figure) and recorded.value is not None:
        return recorded
    if record.kind != "run":
        return Figure(record.status or "n/a", None, note=None if record.status else "no status in the benchmark JSON")
    if record.run_json is None:
        return Figure("not recorded", None, note="no run.json in the run folder (fit without the scaling callbacks)")
    if record.status in UNFINISHED:
        error = record.run_json.error or {}
        note = (f"{error.get('type', 'error')}: {error.get('message', '')}" if error
                else "run.json was written at fit start and never completed: the run was killed or still runs")
        return Figure(UNFINISHED[record.status], None, note=note)
    return Figure(record.status or "not recorded", None, note=None if record.status else "run.json has no status")


def with_status(record: RunRecord, columns: Sequence[Column]) -> TableRow:
    """The record's table row with its :func:`status` cell."""
    row = TableRow.of(record, columns)
    row.descriptive["status"] = status(record)
    return row


def _pair_figures(record: RunRecord, pairs: Sequence[PrecisionPair]) -> dict[str, Figure]:
    as_other = [p for p in pairs if p.other == record.name]
    if as_other:
        p = as_other[0]
        return {"speedup_vs_fp32": p.figures["speedup_vs_fp32"], "iou_difference": p.figures["iou_difference"]}
    if any(p.base == record.name for p in pairs):
        note = "the FP32 base of its precision pair(s)"
        return {key: (Figure(same, record.evidence, note=note) if record.value(figure) is not None
                      else record.figures[figure])
                for key, figure, same in (("speedup_vs_fp32", "samples_per_s", 1.0),
                                          ("iou_difference", "best_miou", 0.0))}
    if record.excluded:
        why = f"forms no precision pair ({record.excluded})"
    elif record.precision == "32-true":
        why = "no other precision of the same configuration among the inputs"
    else:
        why = "no FP32 run of the same configuration among the inputs"
    return {"speedup_vs_fp32": Figure(None, record.evidence, why), "iou_difference": Figure(None, record.evidence, why)}


def comparison_rows(records: Sequence[RunRecord], pairs: Sequence[PrecisionPair],
                    series: Sequence[DeviceSeries]) -> list[TableRow]:
    """One row per record for the lead table (:data:`~cropscale.report.columns.COMPARISON_COLUMNS`)."""
    rows = []
    for r in records:
        row = TableRow(values={"name": r.name, "devices": r.devices, "global_batch": r.global_batch},
                       figures=dict(r.figures), descriptive={k: v for k, v in r.descriptive.items()
                                                             if k in ("devices", "global_batch")},
                       evidence=r.evidence)
        row.descriptive["precision"] = Figure(r.precision_label, None, note=r.precision_decision.note)
        row.descriptive["status"] = status(r)
        row.figures.update(_pair_figures(r, pairs))
        if r.kind == "run":
            row.figures["efficiency"] = efficiency_of(r, series)
        else:
            row.figures["efficiency"] = Figure(None, r.evidence, "a single-device microbenchmark")
        rows.append(row)
    return rows


def step_rows(records: Sequence[RunRecord]) -> list[TableRow]:
    """The step decomposition in percent of the median step (:data:`~cropscale.report.columns.STEP_COLUMNS`)."""
    rows = []
    for r in records:
        if r.kind != "run":
            continue
        figures = {"median_step_ms": r.figures["median_step_ms"]}
        why = (r.figures["median_step_ms"].why if r.figures["median_step_ms"].value is None
               else "no step decomposition in run.json (StepTimingCallback did not run)")
        for w in STEP_WINDOWS:
            share = r.step_shares.get(w)
            figures[f"share_{w}"] = Figure(None if share is None else 100 * share, why=why if not r.step_shares
                                           else f"no {w} window recorded")
        figures["share_sum"] = (Figure(100 * sum(r.step_shares.values()),
                                       note="a sum of medians, not the median of the sum: about 100 %")
                                if r.step_shares else Figure(None, why=why))
        for name in ("data_wait_host", "transfer_host"):  # the host clock's, named apart from the windows above
            value = r.host_windows_ms.get(name)
            figures[f"{name}_ms"] = Figure(value, why=None if value is not None else
                                           "no host-clock windows in run.json (StepTimingCallback host_windows_ms)")
        rows.append(TableRow(values={"name": r.name}, figures=figures, evidence=MEASURED_RUN))
    return rows


MAX_NONFINITE_ROWS = 20
"""Non-finite batches listed per run (the rest stay in its ``run.json``)."""


def _ids(ids: Sequence[int] | None, checked: bool | None = True) -> str | None:
    if ids:
        return ", ".join(str(i) for i in ids)
    return "none" if checked else None


def nonfinite_rows(records: Sequence[RunRecord]) -> tuple[list[TableRow], int]:
    """The non-finite batches of every run (:data:`~cropscale.report.columns.NONFINITE_COLUMNS`), in step order.

    At most :data:`MAX_NONFINITE_ROWS` per run; returns ``(rows, records left out)``.
    """
    rows, left_out = [], 0
    for r in records:
        section = r.run_json.summary.nonfinite if r.run_json is not None else None
        found = sorted(section.records, key=lambda x: (x.global_step, x.rank)) if section is not None else []
        left_out += max(0, len(found) - MAX_NONFINITE_ROWS)
        for rec in found[:MAX_NONFINITE_ROWS]:
            rows.append(TableRow(values={
                "name": r.name, "global_step": rec.global_step, "epoch": rec.epoch, "rank": rec.rank,
                "micro_batch": "all" if rec.micro_batch is None else rec.micro_batch, "part": rec.part,
                "patch_id": _ids(rec.patch_id, None), "input_patch_id": _ids(rec.nonfinite_input_patch_id,
                                                                             rec.input_finite is not None),
            }, evidence=r.evidence))
    return rows, left_out


def scaling_rows(series: Sequence[DeviceSeries]) -> list[TableRow]:
    """One row per device count of each series (:data:`~cropscale.report.columns.SCALING_COLUMNS`)."""
    rows = []
    for s in series:
        for p in s.points:
            base = "1 device: the base" if p.devices == 1 else None
            rows.append(TableRow(
                values={"series": s.label, "devices": p.devices, "runs": len(p.runs)},
                figures={"samples_per_s": Figure(p.samples_per_s, note=f"median of {', '.join(p.runs)}"),
                         "speedup_vs_1_device": Figure(p.speedup_vs_1_device, note=base),
                         "efficiency": Figure(p.efficiency, note=base),
                         "karp_flatt": Figure(p.karp_flatt, why="undefined on 1 device", note=(
                             "negative: a super-linear speed-up (caches, or runs that met different load on"
                             " a shared machine)" if p.karp_flatt is not None and p.karp_flatt < 0 else None))},
                evidence=MEASURED_RUN))
    return rows


def amdahl_rows(series: Sequence[DeviceSeries]) -> list[TableRow]:
    """Amdahl's speed-up on 2, 4, 8 devices at each series' fitted serial fraction (an analytical scenario).

    The fitted fraction itself is ``analytical-scenario`` too (:func:`cropscale.evidence.derived_label`: a
    parameter fitted under a law); the per-N Karp-Flatt ``e_N`` of :func:`scaling_rows` stays ``measured-run``.
    """
    rows = []
    for s in series:
        frac = s.serial_fraction
        fitted = Figure(frac, derived_label(MEASURED_RUN, model=True),
                        note="least squares in 1/S over the measured N > 1 points: a parameter of Amdahl's law")
        why = "no fitted serial fraction"
        if frac is not None and not 0.0 <= frac <= 1.0:
            kind = "a slow-down beyond serial (S < 1)" if frac > 1 else "a super-linear speed-up (S > N)"
            why = (f"refused: the fitted serial fraction {frac:.3f} lies outside [0, 1] ({kind}): Amdahl's law does"
                   " not describe these runs, so it is not extrapolated")
        ok = frac is not None and 0.0 <= frac <= 1.0
        figures = {"serial_fraction": fitted}
        for n in AMDAHL_DEVICES:
            figures[f"amdahl_speedup_{n}"] = Figure(amdahl_speedup(n, frac) if ok else None, ANALYTICAL_SCENARIO, why)
        rows.append(TableRow(values={"series": s.label}, figures=figures, evidence=ANALYTICAL_SCENARIO))
    return rows
