"""Analytical scaling models and performance assertions.

- :mod:`~cropscale.scaling.amdahl`: Amdahl speed-up and efficiency, Gustafson, Karp-Flatt, tables.
- :mod:`~cropscale.scaling.allreduce`: ring all-reduce volume and time, DDP buckets, FSDP
  reduce-scatter / all-gather, inputs from a real ``nn.Module``.
- :mod:`~cropscale.scaling.pmnf`: single-parameter PMNF fitting (Extra-P's search).
- :mod:`~cropscale.scaling.multi`: two-parameter PMNF models (Extra-P's multi-parameter selection).
- :mod:`~cropscale.scaling.landau`: Landau notation (``parse_order``) and the class ladder O(1) .. O(n^3)
  (24 classes: every polynomial exponent of the fitter and the log classes).
- :mod:`~cropscale.scaling.noise`: outlying repetitions screened by a stated rule, the pooled relative noise.
- :mod:`~cropscale.scaling.verdict`: does a series grow faster than a class? (bootstrap over repetitions).
- :mod:`~cropscale.scaling.hints`: what would decide an inconclusive verdict (repetitions, points, range).
- :mod:`~cropscale.scaling.multi_verdict`: does a metric of two parameters grow faster than a product class?
- :mod:`~cropscale.scaling.assertions`: ``assert_scaling(x, y, expected="O(n)")``, ``check_scaling``; with
  ``x = (devices, batch)`` a two-parameter assertion.
- :mod:`~cropscale.scaling.assert_bench`: error rates of the verdict on seeded synthetic series.
- :mod:`~cropscale.scaling.pytest_plugin`: ``@pytest.mark.scaling("O(n)")`` (a ``pytest11`` entry point).
- :mod:`~cropscale.scaling.series`: :class:`ScalingSeries`, ``(x, repeated y)`` of one metric.
- :mod:`~cropscale.scaling.extrap`: Extra-P interchange (JSON Lines out, text format in).

Layer 1: this package imports numpy (and scipy) and the vocabulary, nothing of torch, Lightning or
the rest of cropscale. The series measured on the real code are made by :mod:`cropscale.bench.measure`.
"""

from cropscale.scaling.allreduce import (
    Bucket,
    GradientPayload,
    all_gather_send_bytes,
    allreduce_table,
    ddp_allreduce_time,
    ddp_buckets,
    estimated_bucket_count,
    format_allreduce_table,
    fsdp_send_bytes,
    gradient_payload,
    reduce_scatter_send_bytes,
    reduce_scatter_time,
    ring_allreduce_send_bytes,
    ring_allreduce_time,
)
from cropscale.scaling.amdahl import (
    amdahl_efficiency,
    amdahl_speedup,
    amdahl_table,
    efficiency,
    format_amdahl_table,
    gustafson_speedup,
    karp_flatt,
)
from cropscale.scaling.assertions import (
    ScalingAssertionError,
    ScalingInconclusiveError,
    ScalingVerdict,
    assert_scaling,
    check_scaling,
)
from cropscale.scaling.extrap import (
    read_extrap_jsonl,
    read_extrap_jsonl_series,
    read_extrap_text,
    write_extrap_jsonl,
    write_extrap_jsonl_by_points,
)
from cropscale.scaling.landau import LADDER, excess_factor, parse_order
from cropscale.scaling.multi import MultiModel, fit_pmnf_multi
from cropscale.scaling.multi_verdict import MultiVerdict, check_scaling_multi
from cropscale.scaling.pmnf import PMNFModel, PMNFWarning, Term, fit_pmnf, hypotheses
from cropscale.scaling.series import ScalingSeries
from cropscale.scaling.verdict import ClassVerdict, judge

__all__ = [
    "Bucket", "ClassVerdict", "GradientPayload", "LADDER", "MultiModel", "MultiVerdict", "PMNFModel", "PMNFWarning",
    "ScalingAssertionError",
    "ScalingInconclusiveError", "ScalingSeries", "ScalingVerdict", "Term", "all_gather_send_bytes",
    "allreduce_table", "amdahl_efficiency", "amdahl_speedup", "amdahl_table", "assert_scaling", "check_scaling",
    "check_scaling_multi", "fit_pmnf_multi",
    "ddp_allreduce_time", "ddp_buckets", "efficiency", "estimated_bucket_count", "excess_factor", "fit_pmnf",
    "format_allreduce_table", "format_amdahl_table", "fsdp_send_bytes", "gradient_payload", "gustafson_speedup",
    "hypotheses", "judge", "karp_flatt", "parse_order", "read_extrap_jsonl", "read_extrap_jsonl_series",
    "read_extrap_text", "reduce_scatter_send_bytes", "reduce_scatter_time", "ring_allreduce_send_bytes",
    "ring_allreduce_time", "write_extrap_jsonl", "write_extrap_jsonl_by_points",
]
