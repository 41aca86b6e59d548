"""A scaling series: repeated measurements of one metric against one parameter (numpy only).

Produced by the measurement helpers (:mod:`cropscale.bench.measure`) or read from Extra-P files
(:mod:`cropscale.scaling.extrap`); consumed by PMNF fitting (:mod:`cropscale.scaling.pmnf`) and the
performance assertions (:mod:`cropscale.scaling.assertions`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from cropscale.errors import CropScaleError
from cropscale.evidence import LABELS
from cropscale.scaling.pmnf import PMNFModel, fit_pmnf


@dataclass
class ScalingSeries:
    """Repeated measurements of one metric against one parameter.

    Attributes:
        parameter: name of ``x`` (``"batch_size"``, ``"area_px"``, ``"t2"``, ``"world_size"``).
        metric: name of ``y`` including its unit (``"step_time_s"``).
        unit: unit of ``y`` (``"s"``, ``"MiB"``).
        x: parameter values.
        y: one list of repetitions per ``x`` value.
        evidence: ``measured-run``, ``measured-microbenchmark`` or ``analytical-scenario``.
        callpath: region name for Extra-P (``"train_step"``, ``"tiled_validation"`` ...).
        settings: what else was fixed (crop size, dates, threads, device ...).
    """

    parameter: str
    metric: str
    unit: str
    x: list[float]
    y: list[list[float]]
    evidence: str
    callpath: str = "<root>"
    settings: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.evidence not in LABELS:
            raise CropScaleError(f"evidence must be one of {LABELS}, got {self.evidence!r}")
        if len(self.x) != len(self.y):
            raise CropScaleError(f"ScalingSeries {self.metric}: {len(self.x)} x values but {len(self.y)} rows of y")

    @property
    def medians(self) -> list[float]:
        """Median of the repetitions at each ``x``."""
        return [statistics.median(r) for r in self.y]

    def fit(self, **fit_kwargs) -> PMNFModel:
        """PMNF model of the medians (:func:`cropscale.scaling.pmnf.fit_pmnf`)."""
        fit_kwargs.setdefault("variable", self.parameter)
        return fit_pmnf(self.x, self.y, **fit_kwargs)

    def table(self) -> str:
        """Markdown table: x, median, min, max, repetitions, evidence label on every row."""
        lines = [
            f"| {self.parameter} | median {self.metric} | min | max | repetitions | evidence |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for xv, reps in zip(self.x, self.y, strict=True):
            lines.append(
                f"| {xv:g} | {statistics.median(reps):.4g} | {min(reps):.4g} | {max(reps):.4g} | {len(reps)} "
                f"| {self.evidence} |"
            )
        return "\n".join(lines)
