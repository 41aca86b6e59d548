"""The compute-only training-step microbenchmark: ``python -m cropscale benchmark`` is :mod:`~.command`.

:mod:`~.config` one configuration, :mod:`~.run` its timed steps,
:mod:`~.mfu` FLOPs and peak, :mod:`~.energy` NVML energy,
:mod:`~.rows` the rows and tables printed.
"""
