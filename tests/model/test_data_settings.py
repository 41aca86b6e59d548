"""The task's data-dependent settings (``t2``, ``t1``, ``crop_size``) are its own arguments (linked from ``data.*``
by the CLI), not read from the trainer's data module (issue 35)."""

import pytest

from cropscale import CropScaleError
from cropscale.model.task import CropMappingTask

SMALL = {"s2_dim": 16, "s2_depth": 1, "s2_heads": 2, "s1_dim": 8, "s1_depth": 1, "s1_heads": 2, "width": 8,
         "fpn_dim": 16, "head_dim": 8, "decoder_dim": 8, "hr_dim": 4}


def test_example_input_follows_the_task_settings_without_a_data_module():
    task = CropMappingTask(num_classes=5, net_kwargs=SMALL, t2=6, t1=3, crop_size=16, val_window=16)
    task.setup("validate")
    x = task.example_input_array
    assert tuple(x["s2"].shape) == (1, 6, 10, 16, 16) and tuple(x["s1a"].shape) == (1, 3, 2, 16, 16)


def test_a_crop_size_off_the_network_stride_is_refused():
    task = CropMappingTask(num_classes=5, net_kwargs=SMALL, crop_size=18)
    with pytest.raises(CropScaleError, match=r"data.crop_size=18 must be a multiple of the network's FPN stride"):
        task.setup("validate")
