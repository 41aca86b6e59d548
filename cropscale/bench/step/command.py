"""Compute-only training-step microbenchmark: FP32 against AMP FP16 and AMP BF16.

``python -m cropscale benchmark --precision 32-true 16-mixed bf16-mixed --batch-sizes 1 2 4
--warmup 10 --iterations 30 --device cuda --json bench.json``

What one step is (the study's compute-only step): synthetic tensors already on
the device (:func:`cropscale.model.synthetic.synthetic_batch`, ``s2 [B, T2, 10, H, W]``, ``s1a`` /
``s1d [B, T1, 2, H, W]``, targets incl. ``hr [B, 3, 10H, 10W]``); the full
:class:`~cropscale.model.network.CropMappingNet` forward under ``torch.autocast`` for the mixed
precisions; :class:`~cropscale.model.losses.MultiTaskLoss`; backward (through a real
``torch.amp.GradScaler`` for ``16-mixed``); gradient-norm clipping to 1.0 (after ``unscale_``);
``torch.optim.AdamW``. No data loading, no Lightning.

Timing: host ``time.perf_counter`` around each step, with ``torch.cuda.synchronize`` inside the timed
window after every step on CUDA (on CPU every op is synchronous already). ``--warmup`` steps are run
and recorded apart; ``--iterations`` steps are measured. Median and p95
(:func:`cropscale.numbers.percentile`: numpy's linear interpolation) of the measured steps in ms;
samples/s = batch / median step (s). The non-finite check of each step (loss and gradient norm,
accumulated on the device, read twice per configuration) is launched after the timed window; on CUDA
its two tiny kernels run at the start of the next step's window (microseconds against a step of
milliseconds).

Each configuration (precision x batch size) starts from a fresh state: same seed, new model,
optimizer, scaler and batch, ``torch._dynamo.reset()`` under ``--compile``, and on CUDA the peak
memory counters reset and the cache emptied. TF32 is switched off for matmul and cuDNN for every
row (``torch.backends.cuda.matmul.allow_tf32 = False``, ``torch.backends.cudnn.allow_tf32 = False``)
so that the FP32 row is true FP32 on Ampere and later GPUs and the FP32 parts of the AMP rows
match it, unless ``--tf32`` switches it on for every row (the ``32-true`` rows are then labelled
``TF32``); the previous settings are restored at the end.

Speed levers: ``--compile`` (``--compile-mode``), ``--fused`` (fused AdamW), ``--channels-last``
(:mod:`cropscale.model.speed`). ``--stop-at-oom`` skips the batch sizes above one that ran out of
memory, ``--max-seconds`` the configurations not started within a time budget (``status =
"skipped"``, printed as "not run"). Progress (configuration i of n, step, time left) and the
configurations known to be slow on this device go to stderr; stdout keeps the results.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` (GiB = 2**30 bytes) over the configuration
(model, optimizer state, batch, activations); on CPU the largest resident set size (RSS) of the
whole process read from ``/proc/self/statm`` after each step — the process total (Python, libraries,
allocator caches kept from earlier configurations), so only an upper bound of the step's needs.
``peak_memory_kind`` says which.

FLOPs: :func:`cropscale.model.flops.flops_per_sample` (forward + backward of one sample, optimizer
excluded; evidence ``count``) x batch / median step = achieved TFLOP/s; MFU = achieved / the attainable
dense peak of the math that ran (:func:`cropscale.env.peaks.attainable_peak_tflops`): the FLOPs per
operator class (:func:`cropscale.model.flops.flops_per_sample_by_class`, ``flops_by_class`` in the JSON)
weight the peaks of the dtypes each class ran in, read from torch's switches when the row runs
(``dtypes_by_class``: the autocast dtype under AMP, FP32 under ``32-true`` since TF32 is off here;
the usual convention although some ops stay in FP32); ``None`` with ``mfu_reason`` where the device is
not in the scaling callbacks' peak table (always on CPU) unless ``--peak-tflops`` is given.

16-mixed on CPU: torch (>= 2.3) has float16 autocast and ``torch.amp.GradScaler("cpu")`` on CPU, so the
row runs with a real scaler there too; it is numerically meaningful but its speed is not (most CPUs
have no fast FP16 matrix units). Where the installed torch lacks either, the row has
``status = "unsupported"`` and the reason.

Out of memory (``torch.OutOfMemoryError``) in a configuration gives ``status = "oom"`` for that row;
the remaining configurations still run. Any other error gives ``status = "error"`` with its message,
the rest still run, and the command exits with status 1.

Energy (CUDA): the NVML total-energy counter of the GPU (matched by UUID, :mod:`cropscale.env.nvml`) read
just before the first measured step and just after the last one (both synchronised): ``energy_j`` over
``energy_window_s``, ``energy_j_per_sample`` = J / (iterations x batch), ``avg_power_w``. The counter
moves in steps of its own update interval, so a window under a second is coarse (``energy_reason`` says
so). On CPU, or without the counter, the energy fields are ``None`` with ``energy_reason``.

Every figure here is evidence ``measured-microbenchmark``. The document's ``environment``
(:func:`cropscale.env.host.environment_record`) names the code that measured it: ``source_files``, the SHA-256
of every package module the command runs (``step/run.py`` with the timed step, the model, ...), and
``source_files_sha256``, one digest over them.

Modules: the settings and their checks in :mod:`~cropscale.bench.step.config`; one configuration's
set-up and timed steps in :mod:`~cropscale.bench.step.run`; its energy in
:mod:`~cropscale.bench.step.energy`; FLOPs, peaks and MFU in :mod:`~cropscale.bench.step.mfu`; the rows
and tables in :mod:`~cropscale.bench.step.rows`; the driver (every configuration, the JSON document, the
command) here.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from cropscale.bench.step.config import AUTOCAST_DTYPE, CLIP_NORM, PRECISIONS, BenchmarkConfig, resolve_device
from cropscale.bench.step.mfu import peak_tflops, sample_flops, sample_flops_by_class
from cropscale.bench.step.rows import amp_ratios, empty_row, format_details, format_table, row_label
from cropscale.bench.step.run import build_setup, run_configuration, set_tf32, train_step
from cropscale.env.host import cpu_bf16_units, environment_record, load_average
from cropscale.errors import CropScaleError
from cropscale.evidence import COUNT, MEASURED_MICROBENCHMARK
from cropscale.files import atomic_write_text
from cropscale.options import parse_options
from cropscale.progress import Progress

__all__ = [
    "AUTOCAST_DTYPE",
    "PRECISIONS",
    "SCHEMA",
    "BenchmarkConfig",
    "amp_ratios",
    "build_setup",
    "format_table",
    "main",
    "peak_tflops",
    "resolve_device",
    "run_benchmark",
    "run_configuration",
    "set_tf32",
    "train_step",
]

SCHEMA = "cropscale.benchmark/1"


def slow_notes(config: BenchmarkConfig, device: torch.device) -> list[str]:
    """Configurations known to be slow on this device, said before they run (printed on stderr).

    ``bf16-mixed`` on a CPU without bfloat16 units (:func:`cropscale.env.host.cpu_bf16_units`): autocast
    converts around FP32 arithmetic there, and a step takes several times an FP32 one.
    """
    notes = []
    if device.type == "cpu" and "bf16-mixed" in config.precision and cpu_bf16_units() is False:
        notes.append("bf16-mixed is known to be slow on this CPU: it has no bfloat16 units (no avx512_bf16 / "
                     "amx_bf16 flag), so autocast converts around FP32 math; expect each bf16 step to take "
                     "several times an FP32 step")
    if device.type == "cpu" and "16-mixed" in config.precision:
        notes.append("16-mixed on a CPU: numerically meaningful, but its speed is not (no fast FP16 units)")
    if config.compile:
        notes.append(f"--compile: each configuration compiles during its {config.warmup} warm-up step(s) "
                     "(the first one takes the longest)")
    return notes


def _skip_reason(config: BenchmarkConfig, oom_at: int | None, batch_size: int, elapsed_s: float) -> str | None:
    """Why a configuration is not run (``--stop-at-oom``, ``--max-seconds``), or ``None``."""
    if config.stop_at_oom and oom_at is not None and batch_size > oom_at:
        return f"not run: batch {oom_at} already ran out of memory (--stop-at-oom)"
    if config.max_seconds is not None and elapsed_s > config.max_seconds:
        return f"not run: the --max-seconds {config.max_seconds:g} budget was spent ({elapsed_s:.0f} s)"
    return None


def _one_row(config: BenchmarkConfig, precision: str, batch_size: int, device: torch.device,
             flops: dict[str, float] | None, step_fn: Callable[..., Any] | None,
             by_class: dict[str, float], progress: Progress) -> dict[str, Any]:
    """One configuration with its progress lines; an unexpected error becomes an ``error`` row."""
    label = row_label(precision, config.tf32)
    progress.start(f"{label} batch {batch_size}", steps=config.warmup + config.iterations)
    try:
        row = run_configuration(config, precision, batch_size, device, flops["total"] if flops else None,
                                step_fn, by_class, progress)
    except Exception as err:  # one broken configuration must not lose the others
        row = empty_row(config, precision, batch_size, device)
        row.update(status="error", error=f"{type(err).__name__}: {' '.join(str(err).split())[:400]}")
    took = progress.finish()
    if row["status"] == "ok":
        progress.note(f"{label} batch {batch_size}: {row['samples_per_s']:.1f} samples/s, median step "
                      f"{row['median_step_ms']:.1f} ms ({took:.0f} s) [{MEASURED_MICROBENCHMARK}]")
    else:
        progress.note(f"{label} batch {batch_size}: {row['status']}: {row['error']}")
    return row



def run_benchmark(
    config: BenchmarkConfig,
    argv: list[str] | None = None,
    step_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
    progress: Progress | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every configuration of ``config`` (precision outer, batch size inner) and return the JSON document.

    Returns:
        ``{"schema", "evidence", "settings", "flops_per_sample", "flops_by_class", "flops_evidence" ("count"),
        "environment", "results", "amp_vs_fp32"}``; ``results`` has one row per configuration with
        ``precision``, ``batch_size``, ``status`` (``ok | oom | unsupported | error | skipped``), ``error``,
        ``step_times_ms`` (``iterations`` raw measured steps), ``warmup_step_times_ms``, ``median_step_ms``,
        ``p95_step_ms``, ``mean_step_ms``, ``min_step_ms``, ``max_step_ms``, ``samples_per_s`` (= batch / median s),
        ``peak_memory_gib`` and ``peak_memory_kind``, ``peak_reserved_gib`` (CUDA), ``flops_per_sample``,
        ``achieved_tflops``, ``peak_tflops`` (the attainable peak), ``dtypes_by_class``, ``mfu``, ``mfu_reason``,
        ``loss_scale_initial``,
        ``loss_scale_final`` (16-mixed only), ``nonfinite_steps`` (measured steps with a non-finite loss
        or gradient norm; under 16-mixed exactly the steps the scaler skipped), ``nonfinite_warmup_steps``,
        ``final_loss``, ``tf32``, ``autocast_dtype``, ``grad_scaler``, ``evidence``.

    Progress (configuration i of n, steps, time left) and configurations known to be slow go to stderr
    through ``progress`` (a new :class:`~cropscale.progress.Progress` when ``None``). ``on_row`` receives
    the document of the rows so far after each configuration (``main`` writes ``--json`` with it, so
    a run stopped by a time limit keeps what it measured).

    Raises:
        CropScaleError: a device that is not here, or a ``--compile`` / ``--fused`` it cannot run
            (:meth:`BenchmarkConfig.torch_device`).
    """
    device = config.torch_device()
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    previous_tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    flops, flops_reason = sample_flops(config)
    by_class = sample_flops_by_class(config)
    environment = environment_record(Path(__file__), argv, device)
    rows: list[dict[str, Any]] = []
    progress = progress or Progress(len(config.precision) * len(config.batch_sizes), "benchmark")
    for line in slow_notes(config, device):
        progress.note(line)
    started = time.monotonic()
    oom_at: dict[str, int] = {}
    try:
        for precision, batch_size in configurations(config):
            skip = _skip_reason(config, oom_at.get(precision), batch_size, time.monotonic() - started)
            if skip is not None:
                row = empty_row(config, precision, batch_size, device)
                row.update(status="skipped", error=skip)
                progress.start(f"{row['precision_label']} batch {batch_size}")
                progress.finish()
                progress.note(f"{row['precision_label']} batch {batch_size}: {skip}")
            else:
                row = _one_row(config, precision, batch_size, device, flops, step_fn, by_class, progress)
                if flops is None:
                    row["mfu_reason"] = flops_reason
                if row["status"] == "oom" and batch_size < oom_at.get(precision, batch_size + 1):
                    oom_at[precision] = batch_size
            rows.append(row)
            if on_row is not None:
                on_row(_document(config, flops, by_class, flops_reason, environment, rows))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous_tf32
    environment["host"]["load_average_1_5_15_min_end"] = load_average()
    return _document(config, flops, by_class, flops_reason, environment, rows)


def _document(config: BenchmarkConfig, flops: dict[str, float] | None, by_class: dict[str, float],
              flops_reason: str | None, environment: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON document of :func:`run_benchmark` for the rows measured so far."""
    settings = {k: v for k, v in asdict(config).items() if k not in ("json", "details")}  # what was measured
    settings["precisions"] = settings.pop("precision")
    settings["device"] = config.device_name()
    settings.update(
        optimizer="AdamW (fused)" if config.fused else "AdamW",
        loss="MultiTaskLoss (default weights)",
        clip_grad_norm=CLIP_NORM,
        timing="host perf_counter around each step; torch.cuda.synchronize() after every step on CUDA",
        p95="numpy.percentile(q=95, linear interpolation)",
        samples_per_s="batch_size / (median_step_ms / 1000)",
        tf32=f"{'on' if config.tf32 else 'off'} for matmul and cuDNN in every configuration",
    )
    return {
        "schema": SCHEMA,
        "evidence": MEASURED_MICROBENCHMARK,
        "settings": settings,
        "flops_per_sample": flops,
        "flops_by_class": by_class,
        "flops_evidence": COUNT,
        "flops_reason": flops_reason,
        "environment": environment,
        "results": list(rows),
        "amp_vs_fp32": amp_ratios(rows),
    }


def configurations(config: BenchmarkConfig) -> list[tuple[str, int]]:
    """``(precision, batch size)`` pairs in run order: precision outer (``order="precision"``) or batch outer."""
    if config.order == "batch":
        return [(p, int(b)) for b in config.batch_sizes for p in config.precision]
    return [(p, int(b)) for p in config.precision for b in config.batch_sizes]



def main(argv: list[str] | None = None) -> int:
    """``python -m cropscale benchmark ...``; prints the study table, writes ``--json``.

    Returns 0, or 1 if a configuration failed with an error other than out-of-memory.

    Raises:
        CropScaleError: bad arguments (unknown device, batch size < 1, bad ``--net-kwargs`` JSON).
    """
    config = parse_options(BenchmarkConfig, argv, "python -m cropscale benchmark")
    config.apply()
    out = Path(config.json) if config.json else None

    def write(document: dict[str, Any]) -> None:
        try:
            atomic_write_text(out, json.dumps(document, indent=2, allow_nan=False) + "\n")
        except OSError as err:
            raise CropScaleError(f"--json {out}: cannot write: {err}") from None

    if out is not None:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CropScaleError(f"--json {out}: cannot create its folder: {err}") from None
    doc = run_benchmark(config, argv=list(sys.argv[1:] if argv is None else argv), on_row=write if out else None)
    if out is not None:
        write(doc)
    if config.details:
        print(format_details(doc))
        print()
    if config.json:
        print(f"wrote {config.json}")
    print(format_table(doc))
    return 1 if any(r["status"] == "error" for r in doc["results"]) else 0


if __name__ == "__main__":
    sys.exit(main())
