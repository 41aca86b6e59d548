"""Rank rules: the culprit of the other ranks' waits, and a rank that slows down over the run.

**Culprit, not victim.** Under DDP the gradient all-reduce (and Lightning's per-step SIGTERM broadcast) make
every rank wait for the slowest: a rank slow in its data, forward or backward shows up as waiting on the
*other* ranks, and every rank's step is about as long. The culprit is therefore the rank with the most own work
and the least wait (:mod:`cropscale.diagnosis.windows`), not the one with the largest step:

1. ``c`` = the rank with the most own work (the lowest on a tie);
2. its excess ``e`` = its own work - the median of the other ranks'; the others' extra wait ``w`` = the median of
   their waits - rank ``c``'s wait;
3. ``c`` is named when ``e`` reaches :data:`~cropscale.diagnosis.thresholds.WARN_SHARE` of the step, explains at
   least :data:`~cropscale.diagnosis.thresholds.STRAGGLER_EXPLAINS` of ``w``, and ``c`` has the most own work in
   every measured epoch (a rank that stays behind, not one epoch's noise); the part of its step is the own window
   where it exceeds the others' median most. Removing the excess gives at best ``T / (T - e)``.
4. When the others wait at least the warning share more but no rank's excess explains 80 % of it, or the rank
   with the most own work changes between epochs, the finding is an ``imbalance``: it names no rank and says why
   the evidence cannot separate them.

**Slowing over the run.** Each rank is scored against its own best epoch (NVIDIA's individual performance score):
``score = own work of the best epoch / own work of the last epoch``. A rank is named when its score is below
:data:`~cropscale.diagnosis.thresholds.SLOWDOWN_SCORE` and, with several ranks, its relative score in that last
epoch (the best rank's own work over its own, NVIDIA's relative score) is below it too, so that a machine on which
every rank slowed names none. NVML's throttle reasons are
added where the energy callback read them (rank 0's, at each epoch end); a CPU run has none and says so.
"""

from __future__ import annotations

from cropscale.diagnosis import advice
from cropscale.diagnosis.steps import bound
from cropscale.diagnosis.thresholds import KINDS, SLOWDOWN_SCORE, STRAGGLER_EXPLAINS, WARN_SHARE, severity
from cropscale.diagnosis.windows import OWN_WINDOWS, RankWindows, own_by_epoch, window_growth
from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN
from cropscale.numbers import median
from cropscale.runs.schema import DiagnosisFigure, Finding, RankScore, RunSummary

_SOURCE = "summary.step_timing.epochs[].window_median_ms_per_rank"
PART_NAMES = {"data_wait": "data wait", "transfer": "transfer", "forward": "forward",
              "backward_own": "backward (without the exposed all-reduce)", "optimizer": "optimizer"}
"""How the lines name the part of a rank's step."""


def _others(values: list[float | None], rank: int) -> list[float]:
    return [v for r, v in enumerate(values) if r != rank and v is not None]


def _part(rw: RankWindows, rank: int) -> tuple[str | None, float]:
    """The own window in which ``rank`` exceeds the other ranks' median most, and by how much (ms)."""
    best: tuple[float, str | None] = (float("-inf"), None)
    for w in OWN_WINDOWS:
        mine, rest = rw.at(w, rank), median(_others(rw.ms.get(w) or [], rank))
        if mine is not None and rest is not None and mine - rest > best[0]:
            best = (mine - rest, w)
    return best[1], best[0]


def _imbalance(c: int, step: float, waited: float, why: str, figures: list[DiagnosisFigure],
               train_s: float | None) -> Finding:
    """The finding when the other ranks wait more than rank ``c`` but the evidence names no culprit (``why``)."""
    b = bound(step, waited)
    share = waited / step
    line = (f"{KINDS['imbalance']} ({severity(share)}): the other ranks wait {waited:.1f} ms a step"
            f" ({100 * share:.0f} %) more than rank {c}, but the evidence cannot separate the ranks: {why}")
    figures = [*figures, DiagnosisFigure("bound T / (T - wait)", b, "x", ANALYTICAL_SCENARIO, "the step decomposition")]
    return Finding(kind="imbalance", severity=severity(share), line=line, share=share, base="step", bound=b,
                   saving_s_per_epoch=None if train_s is None else share * train_s, rank=None, part=None,
                   evidence=figures, try_settings=advice.straggler(None, None))


def _straggler(rw: RankWindows, c: int, step: float, excess: float, waited: float,
               figures: list[DiagnosisFigure], train_s: float | None) -> Finding:
    """The finding that names rank ``c`` and the part of its step."""
    part, _ = _part(rw, c)
    share = excess / step
    b = bound(step, excess)
    explained = excess / waited if waited > 0 else None
    if explained is None or waited < WARN_SHARE * step:
        how = f"the other ranks' wait for it is not in the timed windows ({waited:.1f} ms more than rank {c}'s)"
    else:
        how = (f"the other rank(s) wait {waited:.1f} ms a step more than rank {c}, which its excess explains"
               + (" in full" if explained >= 1 else f" to {100 * explained:.0f} %"))
    line = (f"{KINDS['straggler']} ({severity(share)}): rank {c}, in its {PART_NAMES.get(part or '', part)}: its own"
            f" work is {excess:.1f} ms a step ({100 * share:.0f} % of the {step:.1f} ms step) above the other ranks'"
            f" median in every measured epoch; {how}; without the excess the step could be at best {b:.2f}x faster")
    figures = [*figures, DiagnosisFigure("bound T / (T - excess)", b, "x", ANALYTICAL_SCENARIO,
                                         "the step decomposition")]
    return Finding(kind="straggler", severity=severity(share), line=line, share=share, base="step", bound=b,
                   saving_s_per_epoch=None if train_s is None else share * train_s, rank=c, part=part,
                   evidence=figures, try_settings=advice.straggler(c, part))


def _behind_in(own_epochs: list[list[float | None]], c: int) -> tuple[int, int]:
    """``(epochs in which rank c has the most own work, epochs with every rank's own work)``."""
    columns = [[row[i] for row in own_epochs] for i in range(len(own_epochs[0]) if own_epochs else 0)]
    complete = [col for col in columns if all(v is not None for v in col)]
    return sum(1 for col in complete if max(range(len(col)), key=lambda r: (col[r], -r)) == c), len(complete)


def culprit(rw: RankWindows | None, own_epochs: list[list[float | None]], train_s: float | None
            ) -> tuple[Finding | None, float | None, list[str]]:
    """The straggler finding (or the imbalance finding that names no rank), the excess share, notes.

    Args:
        rw: per-rank figures over the measured epochs.
        own_epochs: ``[rank][measured epoch]`` own work (ms; None where not recorded): a culprit must have the most
            own work in every measured epoch.
        train_s: the median measured epoch's training seconds.

    Returns:
        ``(finding or None, excess own work / step or None, not_judged sentences)``.
    """
    if rw is None or rw.ranks < 2:
        return None, None, []
    if not rw.comm_timed:
        return None, None, ["the culprit rank: the gradient all-reduce was not timed (StepTimingCallback time_comm,"
                            " DDP only), so waits and own work cannot be told apart"]
    own, wait = rw.ms["own"], rw.ms["wait"]
    known = [(v, -r) for r, v in enumerate(own) if v is not None]
    steps = [s for s in rw.ms["step"] if s is not None]
    step = median(steps)
    if len(known) < 2 or not step:
        return None, None, ["the culprit rank: fewer than two ranks with own-work and step figures"]
    c = -max(known)[1]
    excess = own[c] - median(_others(own, c))
    waits_others = _others(wait, c)
    waited = (median(waits_others) - (wait[c] or 0.0)) if waits_others else 0.0
    share = max(excess, 0.0) / step
    if waited < WARN_SHARE * step and excess < WARN_SHARE * step:
        return None, share, []
    figures = [DiagnosisFigure(f"own work, rank {r}", v, "ms", MEASURED_RUN, _SOURCE) for r, v in enumerate(own)]
    figures += [DiagnosisFigure(f"wait, rank {r}", v, "ms", MEASURED_RUN, _SOURCE) for r, v in enumerate(wait)]
    behind, epochs = _behind_in(own_epochs, c)
    if excess >= WARN_SHARE * step and behind < epochs:
        why = (f"rank {c} has the most own work in {behind} of {epochs} measured epochs only, not a rank that stays"
               " behind")
        return _imbalance(c, step, max(waited, excess), why, figures, train_s), share, []
    if waited >= WARN_SHARE * step and excess < STRAGGLER_EXPLAINS * waited:
        why = (f"rank {c}'s extra own work ({excess:.1f} ms) explains {100 * max(excess, 0.0) / waited:.0f} % of it,"
               f" less than the {100 * STRAGGLER_EXPLAINS:.0f} % that names a culprit")
        return _imbalance(c, step, waited, why, figures, train_s), share, []
    if excess < WARN_SHARE * step:
        return None, share, []
    return _straggler(rw, c, step, excess, waited, figures, train_s), share, []


def scores(summary: RunSummary, rw: RankWindows | None) -> list[RankScore]:
    """Every rank's own work and wait (medians over measured epochs) and its score against its own best epoch."""
    epochs, own, _ = own_by_epoch(summary)
    out = []
    for r, series in enumerate(own):
        known = [(v, i) for i, v in enumerate(series) if v is not None]
        best = min(known) if known else None
        last = next((v for v in reversed(series) if v is not None), None)
        out.append(RankScore(
            rank=r, own_ms=rw.at("own", r) if rw else None, wait_ms=rw.at("wait", r) if rw else None,
            own_ms_by_epoch=series, best_epoch=epochs[best[1]] if best else None,
            score=best[0] / last if best and last else None))
    return out


def _throttle_reasons(summary: RunSummary) -> list[str] | None:
    """NVML throttle reasons rank 0 read at its epoch ends (``gpu_idle`` left out); None when never read."""
    energy = summary.energy
    if energy is None or not energy.available or not energy.epochs:
        return None
    found = {r for e in energy.epochs for r in (e.throttle_reasons_rank0_end or []) if r != "gpu_idle"}
    return sorted(found)


def _slow_finding(summary: RunSummary, s: RankScore, epochs: list[int], series: list[float | None],
                  last_step: float, reasons: list[str] | None, train_s: float | None) -> Finding:
    """The finding for rank ``s.rank``, whose score fell below :data:`SLOWDOWN_SCORE` (``series``: own ms/epoch)."""
    last_i = max(i for i, v in enumerate(series) if v is not None)
    best_i = epochs.index(s.best_epoch)
    slowdown = series[last_i] - series[best_i]
    share = slowdown / last_step
    first_slow = next(epochs[i] for i in range(best_i, last_i + 1)
                      if series[i] is not None and series[best_i] / series[i] < SLOWDOWN_SCORE)
    part = window_growth(summary, s.rank, best_i, last_i)
    b = bound(last_step, slowdown)
    nvml = ("; NVML throttle reasons (rank 0): " + (", ".join(reasons) or "none") if reasons is not None
            and s.rank == 0 else "; no NVML throttle reasons recorded for it")
    line = (f"{KINDS['throttling']} ({severity(share)}): rank {s.rank} slowed from epoch {first_slow}: its own"
            f" work in epoch {epochs[last_i]} is {series[last_i]:.1f} ms a step against {series[best_i]:.1f} ms in"
            f" its best epoch {s.best_epoch} (score {s.score:.2f} < {SLOWDOWN_SCORE}), most in its"
            f" {PART_NAMES.get(part or '', part)}{nvml}; back at its best the step could be at best {b:.2f}x"
            " faster")
    figures = [DiagnosisFigure(f"own work, rank {s.rank}, epoch {e}", v, "ms", MEASURED_RUN, _SOURCE)
               for e, v in zip(epochs, series, strict=True)]
    figures += [DiagnosisFigure(f"score, rank {s.rank}", s.score, "fraction", MEASURED_RUN, "best / last epoch"),
                DiagnosisFigure("bound T / (T - slow-down)", b, "x", ANALYTICAL_SCENARIO, "the step decomposition")]
    return Finding(kind="throttling", severity=severity(share), line=line, share=share, base="step", bound=b,
                   saving_s_per_epoch=None if train_s is None else share * train_s, rank=s.rank, part=part,
                   evidence=figures, try_settings=advice.throttling(s.rank, reasons if s.rank == 0 else None))


def _relative(own: list[list[float | None]], rank: int, i: int) -> float | None:
    """NVIDIA's relative score of ``rank`` in epoch position ``i``: the best rank's own work there over this rank's.

    None on one rank (or without the others' figures in that epoch).
    """
    mine = own[rank][i]
    there = [series[i] for series in own if i < len(series) and series[i] is not None]
    return min(there) / mine if len(there) > 1 and mine else None


def slowing(summary: RunSummary, ranks: list[RankScore], train_s: float | None
            ) -> tuple[list[Finding], float | None, list[str]]:
    """Findings for ranks that slowed over the run, the largest slow-down share, and notes.

    Returns:
        ``(findings, largest (last - best own work) / last step, not_judged sentences)``.
    """
    epochs, own, step = own_by_epoch(summary)
    notes = []
    reasons = _throttle_reasons(summary)
    if reasons is None:
        notes.append("NVML throttle reasons: none recorded (no GPU, or EnergyCallback did not read NVML)")
    if len([v for v in (own[0] if own else []) if v is not None]) < 2:
        return [], None, notes + ["a rank slowing over the run: fewer than two epochs with step timing"]
    scored = [s for s in ranks if s.score is not None]
    findings, largest = [], None
    for s in scored:
        series = own[s.rank]
        last_i = max(i for i, v in enumerate(series) if v is not None)
        last_step = step[s.rank][last_i]
        if not last_step:
            continue
        largest = max(largest or 0.0, (series[last_i] - series[epochs.index(s.best_epoch)]) / last_step)
        relative = _relative(own, s.rank, last_i)
        if s.score < SLOWDOWN_SCORE and (relative is None or relative < SLOWDOWN_SCORE):
            findings.append(_slow_finding(summary, s, epochs, series, last_step, reasons, train_s))
    return findings, largest, notes
