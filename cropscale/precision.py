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


CPU_REFUSED: tuple[str, ...] = ("16-true", "bf16-true")
"""Precisions refused on a CPU: 16-bit weights and optimizer state with no loss scaling (small updates are lost)."""


def cpu_precision_line(precision: Any) -> tuple[str, str] | None:
    """``("error" | "warning", line)`` for a precision a CPU run should not take silently, or None.

    ``16-true`` and ``bf16-true`` are refused: 16-bit weights and optimizer state without a master FP32 copy
    or loss scaling. ``64-true`` runs, with a warning: its figures are not
    comparable with the precisions the project's study compares on CPU.
    """
    unified = normalise(precision)
    supported = "32-true, 16-mixed or bf16-mixed (configs/precision/{fp32,amp_fp16,bf16}.yaml)"
    if unified in CPU_REFUSED:
        return "error", (f"trainer.precision={unified} on CPU: {LABELS[unified]} weights, gradients and optimizer "
                         "state with no FP32 master copy or loss scaling: updates below the 16-bit resolution are "
                         f"lost; use {supported}, or a GPU")
    if unified == "64-true":
        return "warning", ("trainer.precision=64-true on CPU: FP64 weights and math; speed and memory figures of this "
                           f"run are not comparable with {supported}")
    return None
