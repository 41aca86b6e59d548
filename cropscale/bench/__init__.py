"""Benchmarks and measurements of the real model, data pipeline, tiling and callbacks.

=====================  ==================================================================
module                 content
=====================  ==================================================================
``step``               ``python -m cropscale benchmark``: compute-only training step, FP32 vs AMP
``step_config``        the benchmark's settings (``BenchmarkConfig``) and their checks
``step_run``           one benchmark configuration: set-up, timed steps, its figures
``step_energy``        NVML energy of the measured steps
``step_mfu``           FLOPs per sample, dense peaks, MFU
``step_rows``          the benchmark's result rows and Markdown tables
``loader``             ``python -m cropscale loader-bench``: data-pipeline samples/s by worker count
``tiling``             ``python -m cropscale tiling-bench``: tiled validation time per patch
``callbacks``          ``python -m cropscale callback-bench``: per-step overhead of the callbacks
``interleave``         callback sets swapped in blocks of steps within one fit, every step timed
``callback_counts``    ``callback-bench --count``: calls, torch ops and device reads per step
``summary``            ``python -m cropscale summary``: parameters and FLOPs per sample
``measure``            measurement series from the real code for the performance assertions
``ddp_probe``          training step time on 1 vs N processes under DDP (speed-up, Karp-Flatt)
=====================  ==================================================================
"""
