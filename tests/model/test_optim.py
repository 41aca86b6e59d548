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


# ------------------------------------------------------------------ the batch that really forms (issue 17, case 7)
def test_formed_global_batch_is_the_product_when_batches_fill():
    from cropscale.model.optim import formed_global_batch

    # 16 samples on one rank, batches of 4, 4 batches per epoch, accumulation 2: every update holds 8
    assert formed_global_batch(4, 1, 2, samples_per_rank=16, batches_per_epoch=4) == 8
    # unknown epoch shape (an iterable loader): the product, unchecked
    assert formed_global_batch(4, 2, 1) == 8
    # a last partial batch is normal (10 = 4 + 4 + 2): the rule uses the full batch
    assert formed_global_batch(4, 1, 1, samples_per_rank=10, batches_per_epoch=3) == 4


def test_batch_larger_than_the_epoch_is_refused_with_the_numbers():
    from cropscale.model.optim import formed_global_batch

    with pytest.raises(CropScaleError) as err:
        formed_global_batch(64, 1, 1, samples_per_rank=4, batches_per_epoch=1)
    msg = str(err.value)
    for needle in ("data.batch_size=64", "4 training samples per rank", "global batch 4, not 64"):
        assert needle in msg, (needle, msg)


def test_accumulation_longer_than_the_epoch_is_refused_with_the_numbers():
    from cropscale.model.optim import formed_global_batch

    with pytest.raises(CropScaleError) as err:
        formed_global_batch(2, 2, 4, samples_per_rank=6, batches_per_epoch=3)
    msg = str(err.value)
    for needle in ("trainer.accumulate_grad_batches=4", "3 batches per rank", "global batch 12, not 16"):
        assert needle in msg, (needle, msg)
