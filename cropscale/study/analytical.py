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

import argparse
from dataclasses import asdict

from cropscale.errors import CropScaleError
from cropscale.evidence import LABELS as EVIDENCE_LABELS
from cropscale.files import atomic_write_json
from cropscale.model.network import CropMappingNet
from cropscale.scaling.allreduce import (
    DDP_BUCKET_CAP_MB,
    DDP_FIRST_BUCKET_MB,
    allreduce_table,
    format_allreduce_table,
    gradient_payload,
)
from cropscale.scaling.amdahl import amdahl_table, efficiency, format_amdahl_table, karp_flatt
from cropscale.scaling.assert_bench import main as assert_bench_main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cropscale scaling",
        description="Analytical Amdahl (speed-up / efficiency) and ring all-reduce (volume / time) tables; "
        "every row is an analytical-scenario.",
        epilog="python -m cropscale scaling assert-bench --help: error rates of the scaling verdict on synthetic"
        " series.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--params", type=int, help="trainable parameter count P (e.g. 1947456)")
    src.add_argument("--from-model", action="store_true",
                     help="take P, the gradient dtype and the exact DDP buckets from CropMappingNet()")
    p.add_argument("--bytes-per-element", type=float, default=4.0,
                   help="bytes per gradient element b (4 = FP32, 2 = FP16/BF16); with --params only")
    p.add_argument("--devices", type=int, nargs="+", default=[2, 4, 8], help="device counts / world sizes N")
    p.add_argument("--serial-fractions", type=float, nargs="+", default=[0.10, 0.20, 0.35],
                   help="Amdahl serial fractions s in [0, 1]")
    p.add_argument("--alpha-us", type=float, default=10.0, help="assumed per-phase latency alpha in microseconds")
    p.add_argument("--bandwidth-gbs", type=float, nargs="+", default=[10.0],
                   help="assumed effective per-rank bandwidth B_eff in GB/s (1e9 bytes/s); one table per value")
    p.add_argument("--bucket-cap-mb", type=float, default=DDP_BUCKET_CAP_MB, help="DDP bucket cap (MiB)")
    p.add_argument("--first-bucket-mb", type=float, default=DDP_FIRST_BUCKET_MB, help="DDP first-bucket cap (MiB)")
    p.add_argument("--speedup", action="append", default=[], metavar="N:S",
                   help="a speed-up S measured on N devices, for the Karp-Flatt serial fraction (repeatable)")
    p.add_argument("--speedup-evidence", choices=EVIDENCE_LABELS, default=None,
                   help="evidence label of the --speedup values (required with --speedup)")
    p.add_argument("--json", default=None, help="also write all rows to this JSON file")
    return p


def _parse_speedup(text: str) -> tuple[int, float]:
    try:
        n_text, s_text = text.split(":")
        return int(n_text), float(s_text)
    except ValueError as err:
        raise CropScaleError(f"--speedup {text!r}: expected N:S, e.g. 2:1.62") from err


def main(argv: list[str] | None = None) -> int:
    """Print the tables; returns the exit status (0). Raises ``CropScaleError`` on bad arguments.

    ``assert-bench ...`` runs :func:`cropscale.scaling.assert_bench.main` instead.
    """
    if argv and argv[0] == "assert-bench":
        return assert_bench_main(list(argv[1:]))
    args = _parser().parse_args(argv)
    if args.params is not None and args.params < 1:
        raise CropScaleError(f"--params must be a positive parameter count, got {args.params}")
    if args.speedup and args.speedup_evidence is None:
        raise CropScaleError("--speedup needs --speedup-evidence (measured-run, measured-microbenchmark or "
                             "analytical-scenario): say what kind of evidence the speed-ups are")

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
            all_rows["karp_flatt"].append({"n": n, "speedup": s, "efficiency": eff, "karp_flatt": e,
                                           "evidence": args.speedup_evidence})
    if args.json:
        atomic_write_json(args.json, all_rows, indent=2, allow_nan=True)
        print(f"\nrows written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
