import math

import pytest

from cropscale import CropScaleError
from cropscale.model.optim import global_batch_size, scale_learning_rate, warmup_factor


def test_global_batch_is_product():
    assert global_batch_size(4, 2, 3) == 24
    assert global_batch_size(1, 8) == 8
    with pytest.raises(CropScaleError, match="world size"):
        global_batch_size(4, 0)


@pytest.mark.parametrize(
    "rule,expected",
    [("none", 1e-3), ("linear", 1e-3 * 8 / 4), ("sqrt", 1e-3 * math.sqrt(8 / 4))],
)
def test_lr_rules(rule, expected):
    assert scale_learning_rate(1e-3, 8, 4, rule) == pytest.approx(expected, rel=1e-12)


def test_lr_rule_unknown():
    with pytest.raises(CropScaleError, match="lr_scaling"):
        scale_learning_rate(1e-3, 8, 4, "cubic")


def test_warmup_then_constant_and_cosine():
    assert [warmup_factor(s, 3) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert warmup_factor(3, 3, total_steps=13, schedule="cosine") == pytest.approx(1.0)
    assert warmup_factor(8, 3, total_steps=13, schedule="cosine") == pytest.approx(0.5)
    assert warmup_factor(13, 3, total_steps=13, schedule="cosine") == pytest.approx(0.0, abs=1e-12)
