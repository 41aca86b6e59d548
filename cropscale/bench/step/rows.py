"""The benchmark's result rows and their tables (:mod:`cropscale.bench.step.command`).

The empty row of one configuration, its display label, AMP against FP32, and the Markdown tables the
command prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from cropscale.bench.step.config import AUTOCAST_DTYPE, BenchmarkConfig
from cropscale.evidence import MEASURED_MICROBENCHMARK
from cropscale.precision import LABELS as PRECISION_LABELS

__all__ = ["amp_ratios", "empty_row", "format_details", "format_table", "row_label"]


def empty_row(config: BenchmarkConfig, precision: str, batch_size: int, device: torch.device) -> dict[str, Any]:
    """The result row of one configuration before it runs.

    Every field of :func:`~cropscale.bench.step.run_benchmark`'s rows: ``status = "ok"``, the settings
    filled in, the figures ``None``.
    """
    return {
        "precision": precision,
        "precision_label": row_label(precision, config.tf32),
        "batch_size": int(batch_size),
        "status": "ok",
        "error": None,
        "evidence": MEASURED_MICROBENCHMARK,
        "device": str(device),
        "autocast_dtype": str(AUTOCAST_DTYPE[precision]).removeprefix("torch.") if AUTOCAST_DTYPE[precision] else None,
        "grad_scaler": precision == "16-mixed",
        "tf32": None,
        "channels_last": config.channels_last,
        "compile": config.compile,
        "compile_mode": config.compile_mode if config.compile else None,
        "fused": config.fused,
        "warmup": config.warmup,
        "iterations": config.iterations,
        "warmup_step_times_ms": [],
        "step_times_ms": [],
        "median_step_ms": None,
        "p95_step_ms": None,
        "mean_step_ms": None,
        "min_step_ms": None,
        "max_step_ms": None,
        "samples_per_s": None,
        "peak_memory_gib": None,
        "peak_memory_kind": None,
        "peak_reserved_gib": None,
        "flops_per_sample": None,
        "achieved_tflops": None,
        "peak_tflops": None,
        "dtypes_by_class": None,
        "mfu": None,
        "mfu_reason": None,
        "loss_scale_initial": None,
        "loss_scale_final": None,
        "nonfinite_steps": None,
        "nonfinite_warmup_steps": None,
        "final_loss": None,
        "energy_j": None,
        "energy_j_per_sample": None,
        "energy_window_s": None,
        "avg_power_w": None,
        "energy_method": None,
        "energy_reason": None,
    }



def row_label(precision: str, tf32: bool = False) -> str:
    """Display label of a benchmark row: the precision's (``FP32``, ``AMP FP16``, ...); ``TF32`` for 32-true + TF32."""
    return "TF32" if tf32 and precision == "32-true" else PRECISION_LABELS[precision]




def amp_ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """AMP against FP32 at each batch size where both rows are ``ok``.

    Returns:
        one dict per (AMP precision, batch): ``precision``, ``batch_size``, ``speedup_vs_fp32`` (AMP
        samples/s / FP32 samples/s), ``throughput_gain_pct`` (``100 (speedup_vs_fp32 - 1)``), ``memory_ratio``
        (AMP peak / FP32 peak) and ``memory_saving_pct`` (``100 (1 - memory_ratio)``), ``evidence``.
    """
    fp32 = {r["batch_size"]: r for r in rows if r["precision"] == "32-true" and r["status"] == "ok"}
    out = []
    for r in rows:
        base = fp32.get(r["batch_size"])
        if r["precision"] == "32-true" or r["status"] != "ok" or base is None:
            continue
        speedup = r["samples_per_s"] / base["samples_per_s"]
        mem = (r["peak_memory_gib"] / base["peak_memory_gib"]
               if r["peak_memory_gib"] and base["peak_memory_gib"] else None)
        out.append({
            "precision": r["precision"],
            "batch_size": r["batch_size"],
            "speedup_vs_fp32": speedup,
            "throughput_gain_pct": 100.0 * (speedup - 1.0),
            "memory_ratio": mem,
            "memory_saving_pct": 100.0 * (1.0 - mem) if mem is not None else None,
            "evidence": MEASURED_MICROBENCHMARK,
        })
    return out


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    if row["status"] != "ok":
        return {"oom": "OOM", "unsupported": "unsupported", "error": "error", "skipped": "not run"}[row["status"]]
    value = row.get(key)
    return "n/a" if value is None else format(value, fmt)


def format_table(doc: dict[str, Any]) -> str:
    """Format the study's table (Precision, Batch, Median step, p95 step, Samples/s, Peak GiB) as Markdown.

    The table is followed by the evidence label, the memory kind, and one AMP-vs-FP32 line per batch size.
    """
    rows = doc["results"]
    lines = [
        "| Precision | Batch | Median step | p95 step | Samples/s | Peak GiB |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        med = _cell(r, "median_step_ms", ".2f")
        p95 = _cell(r, "p95_step_ms", ".2f")
        lines.append(
            f"| {r['precision_label']} | {r['batch_size']} | {med}{' ms' if r['status'] == 'ok' else ''} | "
            f"{p95}{' ms' if r['status'] == 'ok' else ''} | {_cell(r, 'samples_per_s', '.1f')} | "
            f"{_cell(r, 'peak_memory_gib', '.2f')} |"
        )
    device = doc["environment"]["device"]
    kinds = sorted({r["peak_memory_kind"] for r in rows if r["peak_memory_kind"]})
    kind_text = {"cuda-max-allocated": "peak allocated GPU memory (torch.cuda.max_memory_allocated)",
                 "host-rss-process": "peak host RSS of the whole benchmark process (CPU run)"}
    lines.append("")
    host = doc["environment"].get("host", {})
    cpu = ""
    if device["type"] == "cpu":
        start, end = host.get("load_average_1_5_15_min"), host.get("load_average_1_5_15_min_end")
        load = f", 1-min load average {start[0]} -> {end[0]}" if start and end else ""
        cpu = f" {device.get('torch_threads')} torch thread(s) on {device.get('logical_cores')} logical cores{load};"
    lines.append(
        f"evidence: {MEASURED_MICROBENCHMARK} — {device.get('name')} ({device['type']}),{cpu} "
        f"{doc['settings']['warmup']} warm-up + {doc['settings']['iterations']} measured steps; "
        f"Peak GiB = {'; '.join(kind_text.get(k, k) for k in kinds) or 'n/a'}"
    )
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['precision_label']} batch {r['batch_size']}: {r['status']} — {r['error']}")
    base = "TF32" if str(doc["settings"].get("tf32", "")).startswith("on") else "FP32"
    for a in doc["amp_vs_fp32"]:
        mem = (f", peak memory x{a['memory_ratio']:.2f}" if a["memory_ratio"] is not None else "")
        lines.append(
            f"{PRECISION_LABELS[a['precision']]} vs {base} at batch {a['batch_size']}: "
            f"{a['speedup_vs_fp32']:.2f}x samples/s ({a['throughput_gain_pct']:+.1f} %){mem}"
            f" [{MEASURED_MICROBENCHMARK}]"
        )
    return "\n".join(lines)


def format_details(doc: dict[str, Any]) -> str:
    """Per-configuration FLOP rate, MFU, loss scale and non-finite counts (Markdown)."""
    lines = ["| Precision | Batch | TFLOP/s | MFU | Loss scale (start -> end) | Non-finite steps |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in doc["results"]:
        if r["status"] != "ok":
            continue
        mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else f"n/a ({r['mfu_reason']})"
        tflops = f"{r['achieved_tflops']:.3f}" if r["achieved_tflops"] is not None else "n/a"
        scale = (f"{r['loss_scale_initial']:g} -> {r['loss_scale_final']:g}" if r["loss_scale_final"] is not None
                 else "no scaler")
        lines.append(f"| {r['precision_label']} | {r['batch_size']} | {tflops} | {mfu} | {scale} | "
                     f"{r['nonfinite_steps']} (warm-up {r['nonfinite_warmup_steps']}) |")
    return "\n".join(lines)


