"""The HPARAMS summaries as TensorBoard's hparams plugin reads them back (its own ``plugin_data_pb2`` parser)."""

from __future__ import annotations

import pytest

from cropscale.errors import CropScaleError
from cropscale.runs.tensorboard import hparams_summaries


def _start_and_experiment(settings):
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    read = {}
    for summary in hparams_summaries(settings):
        (value,) = summary.value
        read[value.tag] = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
    return read[metadata.SESSION_START_INFO_TAG].session_start_info, read[metadata.EXPERIMENT_TAG].experiment


def test_integer_settings_are_written_so_the_table_shows_them_as_integers():
    """TensorBoard 2.21's HPARAMS table writes every number value with ``toPrecision(5)`` (8 -> "8.0000"): an int
    setting (devices, batch, accumulation) goes in as the text of the integer, a float stays a number."""
    from tensorboard.plugins.hparams import api_pb2

    start, experiment = _start_and_experiment({"devices": 8, "global_batch": 1024, "lr": 0.001, "precision": "bf16"})
    got = {name: (value.WhichOneof("kind"), getattr(value, value.WhichOneof("kind")))
           for name, value in start.hparams.items()}
    assert got == {"devices": ("string_value", "8"), "global_batch": ("string_value", "1024"),
                   "lr": ("number_value", 0.001), "precision": ("string_value", "bf16")}
    kinds = {info.name: info.type for info in experiment.hparam_infos}
    assert kinds == {"devices": api_pb2.DATA_TYPE_STRING, "global_batch": api_pb2.DATA_TYPE_STRING,
                     "lr": api_pb2.DATA_TYPE_FLOAT64, "precision": api_pb2.DATA_TYPE_STRING}


@pytest.mark.parametrize("value", [True, None, [1]])
def test_a_bool_none_or_list_setting_is_refused_by_name(value):
    with pytest.raises(CropScaleError, match="'compile'"):
        hparams_summaries({"compile": value})
