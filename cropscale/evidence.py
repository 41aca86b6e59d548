"""The evidence labels: what kind of evidence a reported number is (layer 0, defined once here).

Every figure cropscale prints or writes carries one of these labels:

=========================  ===================================================================
label                      meaning
=========================  ===================================================================
``measured-run``           recorded by a real training run (``fit`` with the scaling callbacks,
                           TensorBoard scalars, ``run.json``), on the devices it names
``measured-microbenchmark``  timed by a dedicated benchmark command (compute-only step,
                           loader, tiling, callback overhead) on the machine it names
``analytical-scenario``    computed from a model (Amdahl, Karp-Flatt, ring all-reduce), not
                           measured; what N devices *could* do
``count``                  an exact count, neither a measurement nor a model: parameters,
                           FLOPs counted by ``torch.utils.flop_counter``, bytes of a payload
=========================  ===================================================================

A multi-device figure is ``measured-*`` only when it ran on that many devices.
"""

from __future__ import annotations

from cropscale.errors import CropScaleError

MEASURED_RUN = "measured-run"
"""Recorded by a real training run (callbacks, TensorBoard, ``run.json``)."""
MEASURED_MICROBENCHMARK = "measured-microbenchmark"
"""Timed by a dedicated benchmark command (compute-only step, loader, tiling, callback overhead)."""
ANALYTICAL_SCENARIO = "analytical-scenario"
"""Computed from a model (Amdahl, Karp-Flatt, ring all-reduce), not measured."""
COUNT = "count"
"""An exact count (parameters, FLOPs from ``torch.utils.flop_counter``, payload bytes): not a measurement."""

MEASURED: tuple[str, ...] = (MEASURED_RUN, MEASURED_MICROBENCHMARK)
"""The labels of measurements."""
LABELS: tuple[str, ...] = (MEASURED_RUN, MEASURED_MICROBENCHMARK, ANALYTICAL_SCENARIO, COUNT)
"""Every label, in the order reports list them."""

LEGEND = (
    "Evidence labels: `measured-run` = recorded by the training run itself (scaling callbacks, TensorBoard); "
    "`measured-microbenchmark` = timed by a benchmark command (`python -m cropscale benchmark` ...); "
    "`analytical-scenario` = a model, not a measurement; `count` = an exact count (parameters, FLOPs)."
)
"""One-paragraph explanation of the labels for the foot of a report."""


def check_label(label: str, what: str = "evidence") -> str:
    """Return ``label`` if it is one of :data:`LABELS`.

    Raises:
        CropScaleError: naming ``what`` and the allowed labels.
    """
    if label not in LABELS:
        raise CropScaleError(f"{what} must be one of {', '.join(LABELS)}; got {label!r}")
    return label
