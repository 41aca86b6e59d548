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

**The rule for a figure computed from other figures** (:func:`derived_label`, applied by the report, the
study and ``python -m cropscale scaling``): it keeps the measured label of its inputs when the computation
is an identity of the measurements at the configurations measured: a ratio or difference (speed-up, mIoU
change), an interval over seeds or epochs, the Karp-Flatt fraction ``e_N`` at the ``N`` whose ``S_N`` was
measured. It is ``analytical-scenario`` when it needs a model's assumption to exist: a parameter fitted to
points under a law (Amdahl's serial fraction by least squares, even from one point, once it stands for the
law), and every value at a configuration that was not measured (a prediction, with its interval).
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


def derived_label(*inputs: str, model: bool = False) -> str:
    """The evidence label of a figure computed from figures labelled ``inputs`` (the rule of this module).

    ``model=True``: the computation assumes a model (a fitted law's parameter, a prediction) ->
    ``analytical-scenario``. Otherwise the inputs' common label, or ``"a + b"`` when they differ (a measured
    run against a microbenchmark); ``analytical-scenario`` when any input is one.

    Raises:
        CropScaleError: an input that is not one of :data:`LABELS`.
    """
    for label in inputs:
        check_label(label, "input evidence")
    if model or ANALYTICAL_SCENARIO in inputs:
        return ANALYTICAL_SCENARIO
    unique = list(dict.fromkeys(inputs))
    return " + ".join(unique) if unique else ANALYTICAL_SCENARIO


def check_label(label: str, what: str = "evidence") -> str:
    """Return ``label`` if it is one of :data:`LABELS`.

    Raises:
        CropScaleError: naming ``what`` and the allowed labels.
    """
    if label not in LABELS:
        raise CropScaleError(f"{what} must be one of {', '.join(LABELS)}; got {label!r}")
    return label
