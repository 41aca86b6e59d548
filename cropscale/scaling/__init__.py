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

``from cropscale.scaling import assert_scaling`` works for every name of :data:`__all__`, but the submodule is
imported only when the name is first used (:func:`__getattr__`): importing the package imports none of them.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the submodule that defines it (imported on first use)
_EXPORTS: dict[str, str] = {
    "Bucket": "allreduce",
    "GradientPayload": "allreduce",
    "all_gather_send_bytes": "allreduce",
    "allreduce_table": "allreduce",
    "ddp_allreduce_time": "allreduce",
    "ddp_buckets": "allreduce",
    "estimated_bucket_count": "allreduce",
    "format_allreduce_table": "allreduce",
    "fsdp_send_bytes": "allreduce",
    "gradient_payload": "allreduce",
    "reduce_scatter_send_bytes": "allreduce",
    "reduce_scatter_time": "allreduce",
    "ring_allreduce_send_bytes": "allreduce",
    "ring_allreduce_time": "allreduce",
    "amdahl_efficiency": "amdahl",
    "amdahl_speedup": "amdahl",
    "amdahl_table": "amdahl",
    "efficiency": "amdahl",
    "format_amdahl_table": "amdahl",
    "gustafson_speedup": "amdahl",
    "karp_flatt": "amdahl",
    "ScalingAssertionError": "assertions",
    "ScalingInconclusiveError": "assertions",
    "ScalingVerdict": "assertions",
    "assert_scaling": "assertions",
    "check_scaling": "assertions",
    "read_extrap_jsonl": "extrap",
    "read_extrap_jsonl_series": "extrap",
    "read_extrap_text": "extrap",
    "write_extrap_jsonl": "extrap",
    "write_extrap_jsonl_by_points": "extrap",
    "LADDER": "landau",
    "excess_factor": "landau",
    "parse_order": "landau",
    "MultiModel": "multi",
    "fit_pmnf_multi": "multi",
    "MultiVerdict": "multi_verdict",
    "check_scaling_multi": "multi_verdict",
    "PMNFModel": "pmnf",
    "PMNFWarning": "pmnf",
    "Term": "pmnf",
    "fit_pmnf": "pmnf",
    "hypotheses": "pmnf",
    "ScalingSeries": "series",
    "ClassVerdict": "verdict",
    "judge": "verdict",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """The public name ``name`` from its submodule (PEP 562), imported on first use.

    Raises:
        AttributeError: ``name`` is not a public name of the package.
    """
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
