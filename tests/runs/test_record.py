"""The flattened configuration that run pairing (``pair_key``) and the report's series keys compare."""

from __future__ import annotations

from cropscale.runs.record import flatten_config

CONFIG = {"trainer": {"devices": 2, "plugins": []}, "data": {"test_folds": [2, 5], "batch_size": 4}}


def test_nested_mappings_and_lists_become_dotted_keys():
    assert flatten_config(CONFIG) == {"trainer.devices": 2, "trainer.plugins": [], "data.test_folds.0": 2,
                                      "data.test_folds.1": 5, "data.batch_size": 4}


def test_lists_stay_whole_values_when_asked():
    assert flatten_config(CONFIG, split_lists=False) == {"trainer.devices": 2, "trainer.plugins": [],
                                                         "data.test_folds": [2, 5], "data.batch_size": 4}


def test_a_scalar_at_the_top_is_its_prefix():
    assert flatten_config(3, "x") == {"x": 3}
