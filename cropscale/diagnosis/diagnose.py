"""The diagnosis of one run: every rule applied once, the findings ordered, the limit named; and its lines.

:func:`diagnose` reads a finished ``run.json`` (:class:`~cropscale.runs.schema.RunJson`) and returns its
:class:`~cropscale.runs.schema.Diagnosis`; :class:`~cropscale.callbacks.ProvenanceCallback` stores it in
``run.json["diagnosis"]`` at fit end, and the summary, the report and TensorBoard print :func:`lines` of it.

Order: findings that cost time are ordered by the seconds per epoch they cost (a step term: its share of the
step times the epoch's training seconds; validation and checkpoint writes: their seconds), the largest first;
then a compute-bound step. The **limit** of the run is the first finding's kind. When no finding reaches the
warning share and the step is not compute-bound, the one finding is ``nothing dominant``, with the largest term.
"""

from __future__ import annotations

from cropscale.diagnosis import advice, epochs, ranks, steps
from cropscale.diagnosis.thresholds import COMPUTE_BOUND_SHARE, KINDS, SHARE_LABELS, WARN_SHARE
from cropscale.diagnosis.windows import measured_own, rank_windows
from cropscale.evidence import MEASURED_RUN
from cropscale.numbers import median
from cropscale.runs.record import RunRecord
from cropscale.runs.rules import default_warmup_epochs, epoch_seconds
from cropscale.runs.schema import Diagnosis, DiagnosisFigure, Finding, RunJson, RunSummary

CPU_CLOCK_NOTE = ("host gaps between kernels and launch overhead: they need the device timeline (CUDA events), and"
                  " this run's step windows are on the host clock (perf_counter), where neither exists")
CUDA_CLOCK_NOTE = ("host gaps between kernels and launch overhead: the step windows are on the device timeline, so a"
                   " gap the host leaves at the step's edges is device-idle data wait, transfer or remainder (judged"
                   " above); gaps between kernels inside forward and backward, and launch overhead, are inside those"
                   " windows and need a profiler trace (torch.profiler) to be told from compute")


def _epochs_recorded(summary: RunSummary) -> int:
    if summary.throughput is not None:
        return len(summary.throughput.epochs)
    return len(summary.step_timing.epochs) if summary.step_timing is not None else 0


def _on_gpu(run: RunJson) -> bool:
    clock = run.summary.step_timing.clock if run.summary.step_timing is not None else None
    return clock == "cuda-events" or any(str(d.get("device", "")).startswith("cuda") for d in run.devices)


def _order(found: list[Finding]) -> list[Finding]:
    timed = sorted((f for f in found if f.saving_s_per_epoch is not None),
                   key=lambda f: (-f.saving_s_per_epoch, -(f.share or 0.0)))
    rest = sorted((f for f in found if f.saving_s_per_epoch is None and f.kind != "compute"),
                  key=lambda f: -(f.share or 0.0))
    return timed + rest + [f for f in found if f.kind == "compute"]


def _nothing_dominant(shares: dict[str, float]) -> Finding:
    removable = {k: v for k, v in shares.items() if k not in ("compute", "slowdown")}
    if removable:
        key = max(removable, key=removable.get)
        largest = f"the largest: {SHARE_LABELS.get(key, key)} {100 * removable[key]:.0f} %"
    else:
        largest = "no term measured"
    compute = shares.get("compute")
    busy = f"; compute {100 * compute:.0f} % of the step" if compute is not None else ""
    line = (f"{KINDS['none']}: no removable term reaches {100 * WARN_SHARE:.0f} % of the step or the epoch"
            f" ({largest}){busy}, and the step is not compute-bound (below {100 * COMPUTE_BOUND_SHARE:.0f} %)")
    figures = [DiagnosisFigure(f"{k} share", v, "fraction", MEASURED_RUN, "Diagnosis.shares")
               for k, v in shares.items()]
    return Finding(kind="none", severity="info", line=line, evidence=figures, try_settings=advice.nothing_dominant())


def diagnose(run: RunJson, warmup_epochs: int | None = None) -> Diagnosis:
    """The diagnosis of ``run``: findings (the limit first), every term's share, rank scores, what is not judged.

    Args:
        run: the run's ``run.json`` (its ``summary`` complete: at fit end or read back).
        warmup_epochs: epochs left out of the figures; None: the report's rule
            (:func:`~cropscale.runs.rules.default_warmup_epochs`). Rank scores use every epoch.
    """
    summary = run.summary
    warmup = default_warmup_epochs(_epochs_recorded(summary)) if warmup_epochs is None else warmup_epochs
    config = run.config if isinstance(run.config, dict) else None
    rw = rank_windows(summary, warmup)
    train_s = median(epoch_seconds(summary, warmup)["train_s"])
    found, shares, not_judged = steps.step_findings(rw, train_s, config, _on_gpu(run))
    straggler, excess, notes = ranks.culprit(rw, measured_own(summary, warmup), train_s)
    not_judged += notes
    if straggler is not None:
        found.append(straggler)
    if excess is not None:
        shares["straggler"] = excess
    scores = ranks.scores(summary, rw)
    slow, slowdown, notes = ranks.slowing(summary, scores, train_s)
    found += slow
    not_judged += notes
    if slowdown is not None:
        shares["slowdown"] = slowdown
    world = max(rw.ranks if rw else 1, int(run.distributed.get("world_size") or 1))
    for key, (finding, share, notes) in (("validation", epochs.validation(summary, warmup, config)),
                                         ("checkpoint", epochs.checkpoint(summary, warmup, world))):
        not_judged += notes
        if finding is not None:
            found.append(finding)
        if share is not None:
            shares[key] = share
    if summary.step_timing is not None:
        not_judged.append(CUDA_CLOCK_NOTE if summary.step_timing.clock == "cuda-events" else CPU_CLOCK_NOTE)
    ordered = _order(found)
    if not any(f.severity in ("warning", "critical") or f.kind == "compute" for f in ordered):
        ordered.append(_nothing_dominant(shares))
    step_ms = median(rw.ms["step"]) if rw is not None else None
    return Diagnosis(warmup_epochs=warmup, world_size=world, limit=ordered[0].kind, step_ms=step_ms, findings=ordered,
                     shares=shares, ranks=scores, not_judged=not_judged)


READ_BACK_NOTE = "computed when run.json was read: the run was written before the diagnosis existed"


def diagnosis_of(record: RunRecord) -> Diagnosis | None:
    """The diagnosis a run folder holds (``run.json["diagnosis"]``), else computed from its ``run.json``.

    None for a record without ``run.json`` (a benchmark configuration, a run without the scaling callbacks).
    """
    run = record.run_json
    if run is None:
        return None
    if run.diagnosis is not None:
        return run.diagnosis
    diag = diagnose(run, record.warmup_epochs)
    diag.not_judged.append(READ_BACK_NOTE)
    return diag
