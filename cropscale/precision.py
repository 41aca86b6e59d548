"""Precision names: Lightning's precision strings, their legacy spellings, display labels and config files.

The config files are the study's, under ``configs/precision/`` (layer 0, every name defined once here).

=============  ===========  ==============================  ==========================
Lightning      label        meaning                         ``configs/precision/``
=============  ===========  ==============================  ==========================
``32-true``    FP32         FP32 weights and math           ``fp32.yaml`` (TF32 off)
``16-mixed``   AMP FP16     autocast FP16 + GradScaler      ``amp_fp16.yaml``
``bf16-mixed`` AMP BF16     autocast BF16, no loss scaling  ``bf16.yaml``
``16-true``    FP16         FP16 weights and math           —
``bf16-true``  BF16         BF16 weights and math           —
``64-true``    FP64         FP64 weights and math           —
=============  ===========  ==============================  ==========================
"""

from __future__ import annotations

from typing import Any

LABELS: dict[str, str] = {
    "32-true": "FP32", "16-mixed": "AMP FP16", "bf16-mixed": "AMP BF16", "16-true": "FP16",
    "bf16-true": "BF16", "64-true": "FP64",
}
"""Display label of each Lightning precision string."""

LEGACY: dict[str, str] = {"64": "64-true", "32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}
"""Lightning's legacy spellings and the unified string they mean (``_convert_precision_to_unified_args``)."""

MIXED_OR_HALF: tuple[str, ...] = ("16-mixed", "bf16-mixed", "16-true", "bf16-true")
"""Precisions that compute in a 16-bit format."""

STUDY_CONFIGS: dict[str, str] = {"32-true": "fp32", "16-mixed": "amp_fp16", "bf16-mixed": "bf16"}
"""Lightning precision -> the name of its ``configs/precision/<name>.yaml`` (the study's precision names)."""

STUDY_ALIASES: dict[str, str] = {
    "32": "fp32", "32-true": "fp32", "amp": "amp_fp16", "16-mixed": "amp_fp16", "fp16": "amp_fp16",
    "bf16-mixed": "bf16",
}
"""Spellings a study spec accepts for each study precision name."""


def normalise(value: Any) -> str | None:
    """Lightning's unified precision string (``16`` -> ``16-mixed``, ``bf16`` -> ``bf16-mixed``, ...).

    ``None`` stays ``None``.
    """
    if value is None:
        return None
    text = str(value).strip()
    return LEGACY.get(text, text)


def label(precision: Any) -> str:
    """Display label (``AMP FP16`` ...) of a precision string; unknown strings are shown as given."""
    unified = normalise(precision)
    return LABELS.get(unified, str(unified))
