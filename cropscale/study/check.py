"""The prediction check: predict the N-rank training-epoch time from the 1-rank runs alone, measure it, print the error.

Two models, both ``analytical-scenario`` (the measured time beside them is ``measured-run``):

- **ideal**: ``T_N = T_1 / N + U_N t_c(N)``: the study's analytical rows with only ``N = 1`` measured
  (``e = 0``) and the modelled all-reduce time ``t_c`` (:func:`cropscale.study.predict.comm_time_per_update`).
- **CPU share** (CPU studies): ranks share the host's cores with each other and with other work. With ``C``
  cores, ``t`` threads per rank (``torch.get_num_threads()`` recorded in ``run.json``) and ``L`` cores busy
  with other work during a run (measured by the study around each run, :func:`cropscale.study.launch.cpu_usage`),
  a fair-share scheduler gives ``k`` ranks ``c_k = k t min(1, C / (L + k t))`` cores; the same samples then
  take ``T_N = T_1 c_1 / c_N + U_N t_c(N)``.
- **session share** (CPU studies on a Linux host whose scheduler groups threads by session, ``autogroup``): the
  kernel shares the cores between sessions first, so the ranks of one study, all in its session, share what the
  session gets however many they are. When the N = 1 rank was held below its threads (it used ``own_1 < 0.9 t``
  cores, measured around the run), that is the session's share ``s = own_1``, and ``k`` ranks get
  ``min(k t, s)``: ``T_N = T_1 own_1 / min(N t, own_1) + U_N t_c(N)``. The fair-share model counts other work by
  what it consumed, which on a saturated host is what was left over, not what it demanded: it over-predicts the
  cores a second rank adds.

Error = predicted / measured - 1 (negative: the model is too optimistic).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN
from cropscale.numbers import median
from cropscale.runs.record import RunRecord
from cropscale.study import protocol as P
from cropscale.study.aggregate import StudyRow
from cropscale.study.predict import comm_time_per_update, gradient_buckets
from cropscale.study.spec import StudySpec


@dataclass
class PredictionCheck:
    """One measured N > 1 configuration against its predictions from N = 1 (times in s)."""

    protocol: str
    precision: str
    world_size: int
    t_1: float
    measured: float
    ideal: float
    cpu_share: float | None = None
    basis: str = ""
    session_share: float | None = None
    session_basis: str = ""

    @property
    def ideal_error(self) -> float:
        """Ideal prediction / measured - 1."""
        return self.ideal / self.measured - 1.0

    @property
    def cpu_share_error(self) -> float | None:
        """CPU-share prediction / measured - 1 (None off a CPU or without the core measurements)."""
        return None if self.cpu_share is None else self.cpu_share / self.measured - 1.0

    @property
    def session_share_error(self) -> float | None:
        """Session-share prediction / measured - 1 (None where the model does not apply)."""
        return None if self.session_share is None else self.session_share / self.measured - 1.0

    def line(self) -> str:
        """The printed line."""
        text = (f"prediction check {self.protocol} {self.precision} N = 1 -> {self.world_size}: measured training"
                f" epoch {self.measured:.2f} s [{MEASURED_RUN}]; ideal T_1/N + all-reduce {self.ideal:.2f} s"
                f" (error {100 * self.ideal_error:+.1f} %)")
        if self.cpu_share is not None:
            text += f"; CPU share {self.cpu_share:.2f} s (error {100 * self.cpu_share_error:+.1f} %; {self.basis})"
        elif self.basis:
            text += f"; CPU share: {self.basis}"
        if self.session_share is not None:
            text += (f"; session share {self.session_share:.2f} s (error {100 * self.session_share_error:+.1f} %;"
                     f" {self.session_basis})")
        return text + f" [{ANALYTICAL_SCENARIO}]"


def share_cores(ranks: int, threads: int, cores: float, other: float) -> float:
    """Cores ``ranks`` processes of ``threads`` threads get on ``cores`` cores with ``other`` cores of other work.

    Fair share: ``ranks x threads x min(1, cores / (other + ranks x threads))``.
    """
    demand = ranks * threads
    return demand * min(1.0, cores / (max(0.0, other) + demand))


def _threads(runs: Sequence[RunRecord], spec: StudySpec) -> int:
    found = [d.get("cpu_threads") for r in runs if r.run_json is not None for d in r.run_json.devices]
    found = [int(t) for t in found if isinstance(t, int) and t > 0]
    return int(median(found)) if found else int(spec.threads_per_process or 1)


def prediction_checks(spec: StudySpec, rows: Sequence[StudyRow], records: Mapping[str, Sequence[RunRecord]],
                      cpu: Mapping[str, Sequence[dict]], accelerator: str) -> list[PredictionCheck]:
    """The check of every measured N > 1 row that has a measured 1-rank row of its protocol and precision.

    ``records``: config key -> runs; ``cpu``: config key -> the runs' ``cpu`` entries of ``study.json``
    (:func:`cropscale.study.launch.cpu_usage`).
    """
    measured = [r for r in rows if r.evidence == MEASURED_RUN and r.protocol in P.PROTOCOLS and r["train_epoch_s"]]
    out = []
    buckets = None
    for row in (r for r in measured if r.world_size > 1):
        one = next((r for r in measured if (r.protocol, r.precision, r.world_size) == (row.protocol, row.precision, 1)),
                   None)
        if one is None:
            continue
        comm = 0.0
        updates = int(row.updates_per_epoch or 0)
        if updates:
            buckets = buckets or gradient_buckets(spec)
            comm = updates * comm_time_per_update(spec, buckets[0], row.world_size, buckets[1])
        check = PredictionCheck(row.protocol, row.precision, row.world_size, one["train_epoch_s"], row["train_epoch_s"],
                                one["train_epoch_s"] / row.world_size + comm)
        if accelerator == "cpu":
            _cpu_share(check, spec, one, row, records, cpu, comm)
        out.append(check)
    return out


def _cpu_share(check: PredictionCheck, spec: StudySpec, one: StudyRow, row: StudyRow,
               records: Mapping[str, Sequence[RunRecord]], cpu: Mapping[str, Sequence[dict]], comm: float) -> None:
    entries_1, entries_n = cpu.get(one.config_key) or (), cpu.get(row.config_key) or ()
    other_1 = median(e.get("other_cores") for e in entries_1)
    other_n = median(e.get("other_cores") for e in entries_n)
    cores = median(e.get("cores") for e in (*entries_1, *entries_n))
    if other_1 is None or other_n is None or not cores:
        check.basis = "no measurement of the cores busy with other work (no /proc/stat)"
        return
    threads = _threads([*records.get(one.config_key, ()), *records.get(row.config_key, ())], spec)
    c_1 = share_cores(1, threads, cores, other_1)
    c_n = share_cores(row.world_size, threads, cores, other_n)
    check.cpu_share = one["train_epoch_s"] * c_1 / c_n + comm
    own = median(e.get("own_cores") for e in entries_n)
    check.basis = (f"C = {cores:g} cores, {threads} thread(s)/rank, other work {other_1:.2f} / {other_n:.2f} cores"
                   f" during the N = 1 / N = {row.world_size} runs: {c_1:.2f} / {c_n:.2f} cores for the ranks"
                   + (f", {own:.2f} used by the N = {row.world_size} runs" if own is not None else ""))
    _session_share(check, one["train_epoch_s"], row.world_size, threads, entries_1, entries_n, comm)


HELD = 0.9
"""The N = 1 rank was held below its threads when it used less than this share of them (the session's share)."""


def session_cores(ranks: int, threads: int, session: float) -> float:
    """Cores ``ranks`` processes of ``threads`` threads get when their session gets ``session`` cores: the minimum."""
    return min(ranks * threads, session)


def _session_share(check: PredictionCheck, t_1: float, n: int, threads: int, entries_1: Sequence[dict],
                   entries_n: Sequence[dict], comm: float) -> None:
    """The session-share prediction (module docstring), where the host groups by session and N = 1 was held."""
    own_1 = median(e.get("own_cores") for e in entries_1)
    if not all(e.get("autogroup") for e in (*entries_1, *entries_n)) or own_1 is None or own_1 <= 0:
        return
    if own_1 >= HELD * threads:
        return  # the rank got its threads: the session's share is not known to be the limit
    check.session_share = t_1 * own_1 / session_cores(n, threads, own_1) + comm
    check.session_basis = (f"the scheduler shares the cores between sessions (autogroup) and the study's session got"
                           f" {own_1:.2f} cores during the N = 1 runs, below its {threads} thread(s): {n} ranks share"
                           f" {session_cores(n, threads, own_1):.2f}")
