"""LossScaleCallback's resolution of a fused step that the scaler gave no ``found_inf`` (issue 36, mutation testing).

torch's GradScaler hands a fused optimizer its ``found_inf`` as an attribute, except on its ``grad_scaler``-keyword
path (an optimizer whose ``step`` takes ``grad_scaler``), where the post hook finds none. Such a step is pending with
``skipped=None`` and no ``found_inf``: no value of the device read is its, and it counts as a step that ran. Driven
through ``_count`` with the device read given by hand, as test_loss_scale_epochs.py does.
"""

from __future__ import annotations

import torch

from cropscale.callbacks import LossScaleCallback
from cropscale.callbacks.loss_scale import _Step


def test_a_fused_step_without_found_inf_reads_no_flag_and_counts_as_run():
    amp = LossScaleCallback()
    amp._config = {"growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3}
    amp._replay = (1024.0, 0)
    # the read: scale, growth tracker, then the losses of the steps that may have been skipped (here the one loss, 5.0)
    amp._count([_Step(None, None, [torch.tensor(5.0)], 0)], [1024.0, 1.0, 5.0])
    assert amp.counts["steps"] == 1
    assert (amp.counts["skipped_steps"], amp.counts["backoff_events"], amp.counts["overflow_skips"]) == (0, 0, 0)
    assert amp._replay == (1024.0, 1) and amp._last_scale == 1024.0
