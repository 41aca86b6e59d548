"""LossScaleCallback's resolution of a fused step that the scaler gave no ``found_inf`` (issue 36, mutation testing).

torch's GradScaler hands a fused optimizer its ``found_inf`` as an attribute, except on its ``grad_scaler``-keyword
path (an optimizer whose ``step`` takes ``grad_scaler``), where the post hook finds none. Such a step is pending with
``skipped=None`` and no ``found_inf``: no value of the device read is its, and it counts as a step that ran. Driven
through ``_count`` with the device read given by hand, as test_loss_scale_epochs.py does.
"""

from __future__ import annotations

from types import SimpleNamespace

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


def test_a_pending_fused_step_without_found_inf_is_flushed_without_a_flag_to_read():
    """_flush reads the scale, the growth tracker and the step's loss: nothing for the flag the step never got."""
    amp = LossScaleCallback()
    # the scaler after the step ran: scale 1024, growth tracker 1
    amp._scaler = SimpleNamespace(_scale=torch.tensor(1024.0), _growth_tracker=torch.tensor(1, dtype=torch.int32))
    amp._config = {"growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3}
    amp._replay = (1024.0, 0)
    amp._pending = [_Step(None, None, [torch.tensor(5.0)], 0)]
    amp._flush()
    assert amp._pending == [] and amp.counts["steps"] == 1 and amp.counts["skipped_steps"] == 0
    assert amp._replay == (1024.0, 1)


def test_a_callback_that_never_started_records_no_scaler():
    """run.json of a fit that failed before training holds this summary: no scaler in use, and no per-step hooks."""
    amp = LossScaleCallback()
    assert amp.summary().scaler_in_use is False
    assert amp.wants_hook("on_train_batch_end") is False
