"""Predicted rows for the configurations this machine cannot run: ``analytical-scenario``, never measured.

The prediction uses the Karp-Flatt serial fraction of the largest measured world size plus the growth of
the modelled gradient-synchronisation time (ring all-reduce, :mod:`cropscale.scaling.allreduce`).
"""

from __future__ import annotations

from collections.abc import Sequence

from cropscale.evidence import ANALYTICAL_SCENARIO
from cropscale.model.network import CropMappingNet
from cropscale.scaling import allreduce as ar
from cropscale.scaling.amdahl import karp_flatt
from cropscale.study import protocol as P
from cropscale.study.aggregate import StudyRow, base_row
from cropscale.study.plan import Configuration
from cropscale.study.spec import StudySpec


def comm_time_per_update(spec: StudySpec, num_params: int, world_size: int, bucket_bytes: Sequence[float]) -> float:
    """Modelled gradient-synchronisation time of one optimiser update on ``N`` ranks (s), no overlap.

    DDP: one ring all-reduce per bucket (:func:`cropscale.scaling.allreduce.ddp_allreduce_time`);
    FSDP (FULL_SHARD): two all-gathers and one reduce-scatter of the whole payload.
    """
    alpha = spec.allreduce["alpha_us"] * 1e-6
    bw = spec.allreduce["bandwidth_gb_s"] * 1e9
    if world_size == 1:
        return 0.0
    if spec.strategy == "fsdp":
        m = ar.payload_bytes(num_params, spec.allreduce["bytes_per_element"])
        return 3.0 * ar.reduce_scatter_time(m, world_size, alpha, bw)
    return ar.ddp_allreduce_time(bucket_bytes, world_size, alpha, bw)


def gradient_buckets(spec: StudySpec) -> tuple[int, list[float], str]:
    """(P, DDP bucket sizes in bytes, source) of the study's network."""
    if spec.num_params is not None:
        m = ar.payload_bytes(int(spec.num_params), spec.allreduce["bytes_per_element"])
        k = ar.estimated_bucket_count(m)
        first, cap = ar.DDP_FIRST_BUCKET_MB * ar.MIB, ar.DDP_BUCKET_CAP_MB * ar.MIB
        sizes = [min(m, first)] + [min(cap, m - first - i * cap) for i in range(k - 1)]
        return int(spec.num_params), sizes, "num_params of the spec"

    net = CropMappingNet(num_classes=spec.num_classes, **spec.net_kwargs)
    payload = ar.gradient_payload(net)
    sizes = [float(b.nbytes) for b in payload.buckets()]
    return payload.num_params, sizes, f"CropMappingNet(num_classes={spec.num_classes}) parameters"


def _interval_of_e(ref: StudyRow) -> tuple[float, float] | None:
    """The Karp-Flatt fraction at the ends of the reference row's S_N interval (``e`` falls as ``S`` grows)."""
    low, high = ref["speedup_vs_1_device_low"], ref["speedup_vs_1_device_high"]
    if low is None or high is None:
        return None
    return karp_flatt(high, ref.world_size), karp_flatt(low, ref.world_size)


def _refusal(e: float, n_ref: int) -> str | None:
    if 0.0 <= e <= 1.0:
        return None
    kind = "a slow-down beyond serial execution (S < 1)" if e > 1 else "a super-linear speed-up (S > N)"
    return (f"no prediction: the Karp-Flatt serial fraction e = {e:.3f} measured at N = {n_ref} lies outside [0, 1]"
            f" ({kind}, e.g. runs that met different load on a shared machine): Amdahl's law does not describe"
            " it, so it is not extrapolated")


def _predict_interval(row: StudyRow, one: StudyRow, ref: StudyRow | None, e: float, config: Configuration,
                      comm: tuple[int, float, float]) -> None:
    """Propagate the measured intervals (T_1 of the 1-rank runs, S at N_ref) through the prediction, in place."""
    updates, comm_n, comm_ref = comm
    t1_lo = one.train_epoch_s_low if one.train_epoch_s_low is not None else one["train_epoch_s"]
    t1_hi = one.train_epoch_s_high if one.train_epoch_s_high is not None else one["train_epoch_s"]
    e_lo, e_hi = (e, e) if ref is None else (_interval_of_e(ref) or (None, None))
    if e_lo is None or t1_lo is None or t1_lo <= 0:
        why = "no interval of the measured S_N at N_ref"
        row.why["speedup_vs_1_device_low"] = row.why["speedup_vs_1_device_high"] = why
        return
    clipped = (min(1.0, max(0.0, e_lo)), min(1.0, max(0.0, e_hi)))
    if clipped != (e_lo, e_hi):
        row.figure_notes["speedup_vs_1_device_low"] = (f"the e interval {e_lo:.3f}..{e_hi:.3f} clipped to [0, 1]:"
                                           f" {clipped[0]:.3f}..{clipped[1]:.3f}")
    e_lo, e_hi = clipped

    def t_n(t1: float, frac: float) -> float:
        return P.predicted_epoch_time(t1, config.world_size, frac, updates, comm_n, comm_ref)

    row.train_epoch_s_low, row.train_epoch_s_high = t_n(t1_lo, e_lo), t_n(t1_hi, e_hi)
    row["speedup_vs_1_device_low"] = t1_lo / t_n(t1_lo, e_hi)
    row["speedup_vs_1_device_high"] = t1_hi / t_n(t1_hi, e_lo)


def analytical_rows(
    spec: StudySpec, configs: Sequence[Configuration], measured: Sequence[StudyRow],
    buckets: tuple[int, list[float], str] | None = None,
) -> list[StudyRow]:
    """``analytical-scenario`` rows for the configurations that were not run.

    For each (protocol, precision): ``T_1`` is the measured 1-rank training-epoch time; ``e`` the
    Karp-Flatt serial fraction at the largest measured ``N_ref > 1`` (``e = 0`` and
    ``N_ref = 1`` when only one rank was measured: ideal compute scaling); then
    ``T_N = T_1 (e + (1 - e) / N) + U_N (t_c(N) - t_c(N_ref))``
    (:func:`cropscale.study.protocol.predicted_epoch_time`) with the modelled all-reduce time
    ``t_c`` (:func:`comm_time_per_update`); ``S_N = T_1 / T_N`` (the same samples, so the samples/s ratio),
    ``E_N = S_N / N``, samples/s ``= samples/s_1 x S_N``. An ``e`` outside [0, 1] is refused (the row says why).
    Intervals: the measured 95 % intervals of ``T_1`` and of ``S`` at ``N_ref`` propagated through the formula
    (``speedup_vs_1_device_low/high``, ``train_epoch_s_low/high``). Step times, shares, energy and IoU are not
    predicted.
    """
    rows = []
    cache = buckets
    for config in configs:
        if config.runnable:
            continue
        row = base_row(config, ANALYTICAL_SCENARIO)
        same = [r for r in measured if r.protocol == row.protocol and r.precision == row.precision
                and r["train_epoch_s"] is not None]
        one = next((r for r in same if r.world_size == 1), None)
        if one is None:
            row.notes.append("no prediction: the 1-rank configuration has no measured training-epoch time")
            rows.append(row)
            continue
        refs = [r for r in same if r.world_size > 1 and r["karp_flatt"] is not None]
        ref = max(refs, key=lambda r: r.world_size) if refs else None
        e, n_ref = (ref["karp_flatt"], ref.world_size) if ref else (0.0, 1)
        refused = _refusal(e, n_ref)
        if refused:
            row["karp_flatt"] = e
            row.notes.append(f"not run ({config.reason}); {refused}")
            rows.append(row)
            continue
        updates = config.updates_per_epoch
        comm_note = ""
        comm_n = comm_ref = 0.0
        if updates is not None:
            if cache is None:
                cache = gradient_buckets(spec)
            num_params, sizes, source = cache
            comm_n = comm_time_per_update(spec, num_params, config.world_size, sizes)
            comm_ref = comm_time_per_update(spec, num_params, n_ref, sizes)
            comm_note = (
                f"; + {updates} updates x ({1e3 * comm_n:.3f} - {1e3 * comm_ref:.3f}) ms modelled {spec.strategy}"
                f" sync (P = {num_params} from {source}; alpha {spec.allreduce['alpha_us']:g} us,"
                f" B_eff {spec.allreduce['bandwidth_gb_s']:g} GB/s, no overlap)"
            )
        else:
            comm_note = "; all-reduce growth not modelled (train_samples_per_epoch unknown)"
        t_n = P.predicted_epoch_time(one["train_epoch_s"], config.world_size, e, updates or 0, comm_n, comm_ref)
        row["train_epoch_s"] = t_n
        row["speedup_vs_1_device"] = P.speedup(one["train_epoch_s"], t_n)
        row["efficiency"] = P.efficiency(row["speedup_vs_1_device"], config.world_size)
        row["karp_flatt"] = e
        if one["samples_per_s"] is not None:
            row["samples_per_s"] = one["samples_per_s"] * row["speedup_vs_1_device"]
        _predict_interval(row, one, ref, e, config, (updates or 0, comm_n, comm_ref))
        basis = (f"Karp-Flatt e = {e:.3f} from measured N = {n_ref}" if ref
                 else "ideal compute scaling (e = 0: only N = 1 measured)")
        row.notes.append(f"not run ({config.reason}); predicted: {basis}{comm_note}")
        rows.append(row)
    return rows
