"""Step rules: which removable term of the optimizer step limits the run, or whether the step is compute-bound.

The study's decomposition ``T_step = T_input + T_transfer + T_forward + T_backward + T_all-reduce + T_optimiser -
T_overlap`` gives every term ``t`` of a step ``T`` its bound: without it the step could at best be
``T / (T - t)`` times faster (Amdahl's law with the term as the removable part).

A term every rank pays is the run's: for the data wait, the transfer, the exposed communication, the loop
remainder and compute the rules take the **smallest** share over the ranks (a rank with a larger share carries
an excess that the straggler rule, :mod:`cropscale.diagnosis.ranks`, attributes). A term is a finding from
:data:`~cropscale.diagnosis.thresholds.WARN_SHARE` of the step; a step whose compute reaches
:data:`~cropscale.diagnosis.thresholds.COMPUTE_BOUND_SHARE` is compute-bound.

The input-pipeline finding also says how fast the loader is on this run's data, from the run itself: with
``data.num_workers: 0`` the main process loads while the model waits, so one "worker" gives ``samples per step /
data wait`` samples/s; with ``n`` workers that stall, each delivers a batch per ``n`` steps, ``samples per step /
(n x step)``. The model consumes ``samples per step / (step - data wait)``; the workers that keep up are the
loading time of a batch over the time the model takes for it (a steady-state model: ``analytical-scenario``).
"""

from __future__ import annotations

import math
from typing import Any

from cropscale.diagnosis import advice
from cropscale.diagnosis.thresholds import (
    COMPUTE_BOUND_SHARE,
    KINDS,
    MIN_MEASURED_STEPS,
    SHARE_LABELS,
    WARN_SHARE,
    severity,
)
from cropscale.diagnosis.windows import RankWindows
from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN
from cropscale.runs.describe import config_value
from cropscale.runs.schema import DiagnosisFigure, Finding

TERMS: dict[str, str] = {"data_wait": "input", "transfer": "transfer", "comm_exposed": "communication",
                         "remainder": "overhead"}
"""Removable step window -> the kind of finding it makes."""
_SOURCE = "summary.step_timing.epochs[].window_median_ms_per_rank"


def bound(total: float, removable: float) -> float | None:
    """``total / (total - removable)``: how many times faster without the removable part (None if it is all)."""
    return total / (total - removable) if total > removable >= 0 else None


def _left_to_remove(compute: float) -> str:
    """What removing everything but the compute could give: ``1 / share``.

    Nothing when the compute windows' medians reach the step's median (window medians need not add up to it).
    """
    if compute >= 1.0:
        return "nothing is left to remove outside the compute (its window medians reach the median step)"
    return f"what is left to remove gives at most {1 / compute:.2f}x"


def smallest_share(rw: RankWindows, figure: str) -> tuple[float, int] | None:
    """``(share, rank)``: the smallest share of ``figure`` in a rank's step over the ranks (lowest rank on ties)."""
    found = [(s, r) for r in range(rw.ranks) if (s := rw.share(figure, r)) is not None]
    return min(found) if found else None


def compute_share(rw: RankWindows) -> tuple[float, int] | None:
    """``(share, rank)``: the smallest share of own compute (forward + backward_own + optimizer) over the ranks.

    The smallest, as for the removable terms: a step is compute-bound when every rank computes through it; a rank
    that computes more than the others is the straggler rule's business.
    """
    found = []
    for r in range(rw.ranks):
        parts = [rw.at(w, r) for w in ("forward", "backward_own", "optimizer")]
        step = rw.at("step", r)
        if step and any(p is not None for p in parts):
            found.append((sum(p for p in parts if p is not None) / step, r))
    return min(found) if found else None


def _samples_per_step(config: dict[str, Any] | None) -> int | None:
    batch = config_value(config, "data.batch_size")
    acc = config_value(config, "trainer.accumulate_grad_batches", 1) or 1
    return int(batch) * int(acc) if isinstance(batch, int) and isinstance(acc, int) else None


def loader_rate(wait_ms: float, step_ms: float, config: dict[str, Any] | None
                ) -> tuple[str, list[DiagnosisFigure], int | None]:
    """The loader's samples/s per worker on this run's data against the model's, and the workers that keep up.

    Returns:
        ``(sentence, figures, workers needed)``; the sentence says why when the batch or worker count is unknown.
    """
    samples = _samples_per_step(config)
    workers = config_value(config, "data.num_workers")
    rest = step_ms - wait_ms
    if samples is None or not isinstance(workers, int) or rest <= 0 or wait_ms <= 0:
        return "the loader rate needs data.batch_size and data.num_workers in the run's configuration", [], None
    consume = samples / rest * 1e3
    if workers == 0:
        per_worker, label = samples / wait_ms * 1e3, MEASURED_RUN
        needed = math.ceil(wait_ms / rest)
        how = f"{samples} samples per step / {wait_ms:.1f} ms data wait, loaded by the main process (num_workers 0)"
    else:
        per_worker, label = samples / (workers * step_ms) * 1e3, ANALYTICAL_SCENARIO
        needed = math.ceil(workers * step_ms / rest)
        how = f"{workers} workers stalling the step: one batch per worker every {workers} x {step_ms:.1f} ms"
    sentence = (f"the loader gives {per_worker:.1f} samples/s per worker ({how}) and the model consumes"
                f" {consume:.1f} samples/s ({samples} samples / {rest:.1f} ms of the rest of the step): about"
                f" {needed} worker(s) would keep up")
    figures = [
        DiagnosisFigure("loader samples/s per worker", per_worker, "samples/s", label, _SOURCE),
        DiagnosisFigure("model samples/s", consume, "samples/s", MEASURED_RUN, _SOURCE),
        DiagnosisFigure("workers needed", float(needed), "workers", ANALYTICAL_SCENARIO,
                        "loading time of a batch / the model's time for it"),
    ]
    return sentence, figures, needed


def _term_finding(rw: RankWindows, figure: str, share: float, rank: int, train_s: float | None,
                  config: dict[str, Any] | None, on_gpu: bool) -> Finding:
    kind = TERMS[figure]
    t, step = rw.at(figure, rank) or 0.0, rw.at("step", rank) or 0.0
    b = bound(step, t)
    where = f" on every rank (the smallest share of the {rw.ranks} ranks: rank {rank})" if rw.ranks > 1 else ""
    line = (f"{KINDS[kind]} ({severity(share)}): {SHARE_LABELS[figure]} {100 * share:.0f} % of the step{where},"
            f" {t:.1f} of {step:.1f} ms; without it the step could be at best {b:.2f}x faster" if b else
            f"{KINDS[kind]} ({severity(share)}): {SHARE_LABELS[figure]} is the whole step")
    figures = [DiagnosisFigure(f"{figure} median, rank {rank}", t, "ms", MEASURED_RUN, _SOURCE),
               DiagnosisFigure(f"step median, rank {rank}", step, "ms", MEASURED_RUN, _SOURCE),
               DiagnosisFigure(f"{figure} share of the step", share, "fraction", MEASURED_RUN, _SOURCE),
               DiagnosisFigure("bound T / (T - t)", b, "x", ANALYTICAL_SCENARIO, "the step decomposition")]
    if kind == "input":
        sentence, rate_figures, needed = loader_rate(t, step, config)
        line += f"; {sentence}"
        figures += rate_figures
        tries = advice.input_pipeline(config, needed, on_gpu)
    elif kind == "transfer":
        tries = advice.transfer(config)
    elif kind == "communication":
        tries = advice.communication()
    else:
        tries = advice.overhead()
    return Finding(kind=kind, severity=severity(share), line=line, share=share, base="step", bound=b,
                   saving_s_per_epoch=None if train_s is None else share * train_s, rank=None, part=figure,
                   evidence=figures, try_settings=tries)


def step_findings(rw: RankWindows | None, train_s: float | None, config: dict[str, Any] | None,
                  on_gpu: bool) -> tuple[list[Finding], dict[str, float], list[str]]:
    """The step's findings, every term's share, and what could not be judged.

    Args:
        rw: the per-rank windows (:func:`~cropscale.diagnosis.windows.rank_windows`), None without step timing.
        train_s: the median measured epoch's training seconds (to weigh a step term against the epoch).
        config: the run's resolved configuration (batch size, workers: the loader rate and the advice).
        on_gpu: the run ran on CUDA devices.

    Returns:
        ``(findings, shares, not_judged)``: findings of the removable terms at or above the warning share and a
        ``compute`` finding when compute-bound; shares of every term; sentences on what the records cannot answer.
    """
    if rw is None:
        return [], {}, ["the step: no step timing in run.json (StepTimingCallback did not run or measured no epoch)"]
    if rw.steps < MIN_MEASURED_STEPS:
        return [], {}, [f"the step: {rw.steps} measured step(s), fewer than the {MIN_MEASURED_STEPS} the rules need"
                        " (more steps per epoch, or fewer StepTimingCallback warm-up steps)"]
    findings, shares = [], {}
    for figure in TERMS:
        if figure == "comm_exposed" and not rw.comm_timed:
            continue
        found = smallest_share(rw, figure)
        if found is None:
            continue
        shares[figure] = found[0]
        if found[0] >= WARN_SHARE:
            findings.append(_term_finding(rw, figure, found[0], found[1], train_s, config, on_gpu))
    busy = compute_share(rw)
    if busy is not None:
        shares["compute"] = busy[0]
        if busy[0] >= COMPUTE_BOUND_SHARE:
            findings.append(Finding(
                kind="compute", severity="info", share=busy[0], base="step", rank=None,
                line=(f"compute: forward + backward + optimizer are {100 * busy[0]:.0f} % of the step"
                      + (f" on every rank (the smallest share: rank {busy[1]})" if rw.ranks > 1 else "")
                      + ": the step is compute-bound; " + _left_to_remove(busy[0])),
                evidence=[DiagnosisFigure(f"compute share, rank {busy[1]}", busy[0], "fraction", MEASURED_RUN,
                                          _SOURCE)],
                try_settings=advice.compute(config)))
    return findings, shares, []
