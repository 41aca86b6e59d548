"""``python -m cropscale scaling``: the analytical Amdahl and ring all-reduce tables.

    python -m cropscale scaling --params 1947456 [--bytes-per-element 4]
    python -m cropscale scaling --from-model              # P, dtype and exact DDP buckets of CropMappingNet()
    python -m cropscale scaling --params 1947456 --speedup 2:1.62 --speedup-evidence measured-run
    python -m cropscale scaling assert-bench [--seed 0]   # error rates of the scaling verdict

Every row of the two tables is an ``analytical-scenario``: what N devices could do under the
stated assumptions (serial fraction; per-phase latency ``alpha`` and effective bandwidth
``B_eff``), not a measurement. Karp-Flatt rows (``--speedup N:S``) carry the evidence label of
the speed-ups they were computed from, which the user must state.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from pathlib import Path
from typing import Literal

from cropscale.evidence import LABELS as EVIDENCE_LABELS
from cropscale.files import atomic_write_json
from cropscale.model.network import CropMappingNet
from cropscale.options import JsonOut, OptionError, Seed, parse_options
from cropscale.scaling.allreduce import (
    DDP_BUCKET_CAP_MB,
    DDP_FIRST_BUCKET_MB,
    allreduce_table,
    format_allreduce_table,
    gradient_payload,
)
from cropscale.scaling.amdahl import amdahl_table, efficiency, format_amdahl_table, karp_flatt
from cropscale.scaling.assert_bench import (
    DEFAULT_BENCH_RESAMPLES,
    DEFAULT_MULTI,
    DEFAULT_PER_CELL,
    format_result,
    run,
    write_json,
)
from cropscale.scaling.landau import LADDER


@dataclasses.dataclass(kw_only=True)
class ScalingOptions(JsonOut):
    """Analytical Amdahl (speed-up / efficiency) and ring all-reduce (volume / time) tables.

    Every row is an analytical-scenario. Give --params or --from-model.
    ``python -m cropscale scaling assert-bench --help``: error rates of the scaling verdict on synthetic series.
    """

    params: int | None = None
    """trainable parameter count P (e.g. 1947456)"""
    from_model: bool = False
    """take P, the gradient dtype and the exact DDP buckets from CropMappingNet()"""
    bytes_per_element: float = 4.0
    """bytes per gradient element b (4 = FP32, 2 = FP16/BF16); with --params only"""
    devices: list[int] = dataclasses.field(default_factory=lambda: [2, 4, 8])
    """device counts / world sizes N"""
    serial_fractions: list[float] = dataclasses.field(default_factory=lambda: [0.10, 0.20, 0.35])
    """Amdahl serial fractions s in [0, 1]"""
    alpha_us: float = 10.0
    """assumed per-phase latency alpha in microseconds"""
    bandwidth_gbs: list[float] = dataclasses.field(default_factory=lambda: [10.0])
    """assumed effective per-rank bandwidth B_eff in GB/s (1e9 bytes/s); one table per value"""
    bucket_cap_mb: float = DDP_BUCKET_CAP_MB
    """DDP bucket cap (MiB)"""
    first_bucket_mb: float = DDP_FIRST_BUCKET_MB
    """DDP first-bucket cap (MiB)"""
    speedup: list[str] = dataclasses.field(default_factory=list)
    """a speed-up S measured on N devices, N:S, for the Karp-Flatt serial fraction (repeatable)"""
    speedup_evidence: Literal[EVIDENCE_LABELS] | None = None
    """evidence label of the --speedup values (required with --speedup)"""

    AT_LEAST = {"params": 1, "devices": 1}

    def check(self) -> None:
        """Raises OptionError: neither or both of --params and --from-model; --speedup without its evidence."""
        if (self.params is None) == (not self.from_model):
            raise OptionError("give one of --params and --from-model")
        if self.speedup and self.speedup_evidence is None:
            raise OptionError("--speedup needs --speedup-evidence (measured-run, measured-microbenchmark or "
                              "analytical-scenario): say what kind of evidence the speed-ups are")


@dataclasses.dataclass(kw_only=True)
class AssertBenchOptions(Seed, JsonOut):
    """Error rates of the scaling verdict on seeded synthetic series of known class.

    Classes: base, one outlier, two parameters. Counted: false reject, next-lower accepted per adjacent pair,
    inconclusive.
    """

    seed: int = 0
    """seed of the generated series"""
    per_cell: int = DEFAULT_PER_CELL
    """series per class and point set (3: 216 per case)"""
    multi: int = DEFAULT_MULTI
    """two-parameter series"""
    resamples: int = DEFAULT_BENCH_RESAMPLES
    """bootstrap resamples per test (>= 100)"""
    class_step: int = 1
    """judge every k-th class of the ladder only (1: all 24; for quick checks)"""

    AT_LEAST = {"resamples": 100, "class_step": 1}


def assert_bench_main(argv: list[str] | None = None) -> int:
    """``python -m cropscale scaling assert-bench``: print the rates; 0 when every target is met, 1 otherwise.

    Raises:
        OptionError: a bad option (named).
        CropScaleError: ``--per-cell`` < 1 or ``--multi`` < 0.
    """
    args = parse_options(AssertBenchOptions, argv, "python -m cropscale scaling assert-bench")
    classes = None if args.class_step == 1 else tuple(range(0, len(LADDER), args.class_step))
    res = run(args.seed, args.per_cell, args.resamples, args.multi, classes=classes)
    print(format_result(res))
    if args.json:
        write_json(Path(args.json), res)
    return 0 if not res.missed() else 1


def _parse_speedup(text: str) -> tuple[int, float]:
    try:
        n_text, s_text = text.split(":")
        return int(n_text), float(s_text)
    except ValueError as err:
        raise OptionError(f"--speedup {text!r}: expected N:S, e.g. 2:1.62") from err


def main(argv: list[str] | None = None) -> int:
    """Print the tables; returns the exit status (0).

    ``assert-bench ...`` runs :func:`assert_bench_main` instead.

    Raises:
        OptionError: a bad option (named).
    """
    if argv and argv[0] == "assert-bench":
        return assert_bench_main(list(argv[1:]))
    args = parse_options(ScalingOptions, argv, "python -m cropscale scaling")

    amdahl_rows = amdahl_table(args.devices, args.serial_fractions)
    payload = None
    if args.from_model:
        payload = gradient_payload(CropMappingNet())
        source = (f"{payload.source}: P = {payload.num_params:,} trainable parameters, gradients "
                  f"{'/'.join(payload.grad_dtypes)} ({payload.bytes_per_element:g} B/element), exact DDP buckets")
    else:
        source = (f"P = {args.params:,} parameters x b = {args.bytes_per_element:g} B/element; DDP buckets "
                  "estimated from the payload")

    print("# Amdahl: S(N, s) = 1 / (s + (1 - s) / N), E = S / N  [analytical-scenario]\n")
    print(format_amdahl_table(amdahl_rows, evidence_column=True))
    all_rows = {"amdahl": [asdict(r) for r in amdahl_rows], "allreduce": [], "karp_flatt": []}
    for bw in args.bandwidth_gbs:
        rows = allreduce_table(
            num_params=None if payload is not None else args.params,
            bytes_per_element=args.bytes_per_element,
            world_sizes=args.devices,
            alpha_us=args.alpha_us,
            bandwidth_gb_s=bw,
            bucket_cap_mb=args.bucket_cap_mb,
            first_bucket_mb=args.first_bucket_mb,
            payload=payload,
        )
        print(f"\n# Ring all-reduce per rank and step: V = 2(N-1) M / N, T = 2(N-1) alpha + (2(N-1)/N) M / B_eff; "
              f"{source}; alpha = {args.alpha_us:g} us, B_eff = {bw:g} GB/s (assumed), no overlap with "
              "backward  [analytical-scenario]\n")
        print(format_allreduce_table(rows))
        all_rows["allreduce"].extend(asdict(r) for r in rows)
    if args.speedup:
        print(f"\n# Karp-Flatt serial fraction e = (1/S - 1/N) / (1 - 1/N)  [{args.speedup_evidence}]\n")
        print("| Devices | Speed-up | Efficiency | Karp-Flatt e | Evidence |")
        print("| --- | --- | --- | --- | --- |")
        for text in args.speedup:
            n, s = _parse_speedup(text)
            e = karp_flatt(s, n)
            eff = efficiency(s, n)
            print(f"| {n} | {s:.2f}x | {100 * eff:.1f} % | {e:.3f} | {args.speedup_evidence} |")
            all_rows["karp_flatt"].append({"n": n, "speedup_vs_1_device": s, "efficiency": eff, "karp_flatt": e,
                                           "evidence": args.speedup_evidence})
    if args.json:
        atomic_write_json(args.json, all_rows, indent=2, allow_nan=True)
        print(f"\nrows written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
