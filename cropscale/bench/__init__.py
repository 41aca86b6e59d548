"""Benchmarks and measurements of the real model, data pipeline, tiling and callbacks.

=====================  ==================================================================
module                 content
=====================  ==================================================================
``step/``              ``python -m cropscale benchmark`` (``step.command``): compute-only training step, FP32 vs
                       AMP; ``step.config`` its settings, ``step.run`` the timed steps, ``step.energy``,
                       ``step.mfu``, ``step.rows``
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
