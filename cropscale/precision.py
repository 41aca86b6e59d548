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

The precision a run ran with is decided once (:func:`decide`) into a :class:`PrecisionDecision` (what was
requested, what Lightning resolved, by whom, the label): ``ProvenanceCallback`` writes it into ``run.json``
(``precision_decision``), and every reader of a run takes it whole (its label, its note).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cropscale.errors import CropScaleError

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


# ------------------------------------------------------------------------------ the decision record
BY_CONFIGURATION = "configuration"
"""``trainer.precision`` asked for the precision, and Lightning ran it."""
BY_PLUGIN = "plugin"
"""A precision plugin in ``trainer.plugins`` (``trainer.precision`` unset): ``configs/precision/amp_fp16_cpu.yaml``."""
BY_DEFAULT = "Lightning's default"
"""Nothing configured: Lightning's ``32-true``."""
BY_CPU_FALLBACK = "Lightning's CPU fallback"
"""``trainer.precision=16-mixed`` on a CPU: Lightning runs ``bf16-mixed`` (it has no FP16 AMP on CPU)."""
BY_LIGHTNING = "Lightning"
"""Lightning ran another precision than requested, for another reason than the CPU fallback."""
BY_DEVICE = "the device the run got"
"""Without ``run.json``: a mixed or half precision on accelerator ``auto``, resolved by the device the run got."""
NOT_RECORDED = "not recorded"
"""No configuration with a ``trainer`` section: what was requested is unknown."""
REQUESTED = " (requested)"
"""Suffix of a precision (string or label) that no ``run.json`` confirms: what the configuration asked for."""


@dataclass(frozen=True)
class PrecisionDecision:
    """The precision of one run: what the configuration requested, what Lightning ran, and who decided.

    Attributes:
        requested: unified precision string the configuration asked for (``trainer.precision``, else a precision
            plugin's, else Lightning's default ``32-true``); None when no configuration says.
        resolved: the precision Lightning ran with (``trainer.precision``); None when no ``run.json`` records it
            (the run is then known only by what it requested: :attr:`verified` is False).
        by: who decided :attr:`resolved` (or, unverified, who would): one of the ``BY_*`` names of this module.
    """

    requested: str | None
    resolved: str | None
    by: str

    @property
    def verified(self) -> bool:
        """True when ``run.json`` records what Lightning ran."""
        return self.resolved is not None

    @property
    def value(self) -> str | None:
        """The run's precision string: the resolved one, else (unverified) the requested one."""
        return self.resolved if self.verified else self.requested

    @property
    def shown(self) -> str | None:
        """The precision string as a table shows it: `` (requested)`` appended when unverified; None when unknown."""
        return None if self.value is None else self.value + ("" if self.verified else REQUESTED)

    @property
    def label(self) -> str:
        """``AMP FP16`` ..., `` (requested)`` appended when unverified (:func:`shown_label`)."""
        return shown_label(self.value, self.verified)

    @property
    def note(self) -> str | None:
        """What the precision cell's footnote says: what was changed, or why it is not verified; None when neither."""
        if self.value is None:
            return "no precision: no run.json and no trainer.precision in config.yaml"
        if self.verified:
            if self.by == BY_CPU_FALLBACK:
                return (f"the configuration requested {self.requested}; Lightning's CPU fallback ran {self.resolved} "
                        "(no FP16 AMP on CPU)")
            if self.by == BY_LIGHTNING:
                return f"the configuration requested {self.requested}; Lightning ran {self.resolved}"
            return None
        note = ("precision as requested in config.yaml"
                + {BY_DEFAULT: " (trainer.precision unset: Lightning's default 32-true)",
                   BY_PLUGIN: " (a precision plugin in trainer.plugins)"}.get(self.by, "")
                + "; no run.json records the precision Lightning ran with")
        if self.by == BY_CPU_FALLBACK:
            note += ("; accelerator 'cpu': Lightning runs 16-mixed on CPU as bf16-mixed, so this run did not use "
                     "FP16 AMP")
        elif self.by == BY_DEVICE:
            note += ("; accelerator not fixed: the effective precision depends on the device the run got "
                     "(Lightning runs 16-mixed on CPU as bf16-mixed) and cannot be verified")
        return note

    def to_json(self) -> dict[str, Any]:
        """``{"requested", "resolved", "by", "label"}`` (``run.json["precision_decision"]``)."""
        return {"requested": self.requested, "resolved": self.resolved, "by": self.by, "label": self.label}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PrecisionDecision:
        """Read :meth:`to_json`'s object (``label`` is derived, not read; a missing ``by`` is :data:`NOT_RECORDED`).

        Raises:
            CropScaleError: ``data`` is not a JSON object (a malformed ``run.json``).
        """
        if not isinstance(data, Mapping):
            raise CropScaleError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        by = str(data.get("by") or NOT_RECORDED)
        return cls(normalise(data.get("requested")), normalise(data.get("resolved")), by)


def shown_label(precision: Any, verified: bool = True) -> str:
    """Display label of a precision (:func:`label`), with `` (requested)`` when no ``run.json`` confirms it."""
    return label(precision) + ("" if verified else REQUESTED)


def requested_in(config: Mapping[str, Any] | None) -> tuple[str | None, str]:
    """What a run's configuration requested, and by what: ``(precision, BY_PLUGIN | BY_CONFIGURATION | BY_DEFAULT)``.

    A precision plugin in ``trainer.plugins`` (a ``{class_path, init_args: {precision}}`` entry) wins, as in
    Lightning (which refuses both at once); ``(None, NOT_RECORDED)`` when ``config`` has no ``trainer`` section.
    """
    trainer = config.get("trainer") if isinstance(config, Mapping) else None
    if not isinstance(trainer, Mapping):
        return None, NOT_RECORDED
    plugins = trainer.get("plugins")
    for plugin in plugins if isinstance(plugins, list) else [plugins]:
        args = plugin.get("init_args") if isinstance(plugin, Mapping) else None
        if isinstance(args, Mapping) and args.get("precision") is not None:
            return normalise(args["precision"]), BY_PLUGIN
    if trainer.get("precision") is not None:
        return normalise(trainer["precision"]), BY_CONFIGURATION
    return "32-true", BY_DEFAULT


def decide(requested: Any, asked_by: str, resolved: Any, device: str | None) -> PrecisionDecision:
    """The one precision decision of a run, from what was requested and what Lightning ran.

    Args:
        requested: what the configuration asked for (:func:`requested_in`).
        asked_by: who asked for it (:func:`requested_in`): a plugin, ``trainer.precision``, Lightning's default.
        resolved: ``trainer.precision`` (what Lightning ran), or None without ``run.json``.
        device: ``cpu`` / ``cuda`` / ``gpu`` / ``mps`` / ``auto`` (the accelerator), or None when unknown.

    Returns:
        The :class:`PrecisionDecision`: ``by`` is ``asked_by`` when Lightning ran what was asked,
        :data:`BY_CPU_FALLBACK` for ``16-mixed`` run as ``bf16-mixed`` on CPU, :data:`BY_LIGHTNING` for another
        change; unverified, the CPU fallback or :data:`BY_DEVICE` where Lightning's rules say the run cannot have
        run (or cannot be known to have run) what it asked.
    """
    requested, resolved = normalise(requested), normalise(resolved)
    plain_fp16 = requested == "16-mixed" and asked_by != BY_PLUGIN  # a plugin keeps its own device and scaler
    if resolved is None:
        if plain_fp16 and device == "cpu":
            return PrecisionDecision(requested, None, BY_CPU_FALLBACK)
        if requested in MIXED_OR_HALF and asked_by != BY_PLUGIN and device not in ("cpu", "cuda", "gpu"):
            return PrecisionDecision(requested, None, BY_DEVICE)
        return PrecisionDecision(requested, None, asked_by)
    if requested is None or resolved == requested:
        return PrecisionDecision(requested, resolved, asked_by)
    if plain_fp16 and resolved == "bf16-mixed":  # Lightning changes 16-mixed only there
        return PrecisionDecision(requested, resolved, BY_CPU_FALLBACK)
    return PrecisionDecision(requested, resolved, BY_LIGHTNING)
