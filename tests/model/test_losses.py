"""MultiTaskLoss: exact values of each term, masking of absent targets, ignore_index, errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cropscale import CropScaleError
from cropscale.model.losses import MultiTaskLoss


def _outputs(b=2, c=5, h=4, w=6, s=3, requires_grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {"semantic": torch.randn(b, c, h, w, generator=g), "parcel": torch.randn(b, 3, h, w, generator=g),
           "hr": torch.rand(b, 3, s * h, s * w, generator=g)}
    return {k: v.requires_grad_(requires_grad) for k, v in out.items()}


def _batch(b=2, c=5, h=4, w=6, s=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    extent = (torch.rand(b, h, w, generator=g) > 0.5).float()
    parcel = torch.stack([extent, extent * (torch.rand(b, h, w, generator=g) > 0.7).float(),
                          extent * torch.rand(b, h, w, generator=g)], dim=1)
    return {"semantic": torch.randint(0, c, (b, h, w), generator=g), "parcel": parcel,
            "parcel_present": torch.ones(b, dtype=torch.bool),
            "hr": torch.rand(b, 3, s * h, s * w, generator=g), "hr_present": torch.ones(b, dtype=torch.bool)}


def test_known_values_and_weights():
    b, c, h, w = 2, 5, 4, 6
    out = {"semantic": torch.zeros(b, c, h, w), "parcel": torch.zeros(b, 3, h, w),
           "hr": torch.full((b, 3, 3 * h, 3 * w), 0.25)}
    batch = _batch(b, c, h, w)
    batch["parcel"][:, 2] = 0.5        # sigmoid(0) = 0.5 -> distance L1 = 0
    batch["hr"].fill_(0.75)
    total, terms = MultiTaskLoss(semantic_weight=2.0, parcel_weight=0.5, hr_weight=3.0)(out, batch)
    assert set(terms) == {"semantic", "parcel", "hr"}
    assert terms["semantic"].item() == pytest.approx(math.log(c), rel=1e-6)        # uniform logits
    assert terms["parcel"].item() == pytest.approx(2 * math.log(2.0), rel=1e-6)     # BCE(0, y) = ln 2, twice
    assert terms["hr"].item() == pytest.approx(0.5, rel=1e-6)
    assert total.item() == pytest.approx(2.0 * math.log(c) + 0.5 * 2 * math.log(2.0) + 3.0 * 0.5, rel=1e-6)


def test_terms_match_the_reference_functions():
    out, batch = _outputs(), _batch()
    total, terms = MultiTaskLoss()(out, batch)
    sem = F.cross_entropy(out["semantic"], batch["semantic"])
    z, t = out["parcel"], batch["parcel"]
    par = (F.binary_cross_entropy_with_logits(z[:, 0], t[:, 0]) + F.binary_cross_entropy_with_logits(z[:, 1], t[:, 1])
           + F.l1_loss(torch.sigmoid(z[:, 2]), t[:, 2]))
    hr = F.l1_loss(out["hr"], batch["hr"])
    torch.testing.assert_close(terms["semantic"], sem)
    torch.testing.assert_close(terms["parcel"], par)
    torch.testing.assert_close(terms["hr"], hr)
    torch.testing.assert_close(total, sem + par + hr)


@pytest.mark.parametrize("term", ["parcel", "hr"])
def test_absent_target_gives_exactly_zero_and_keeps_the_graph(term):
    out, batch = _outputs(), _batch()
    batch[f"{term}_present"][:] = False
    batch[term] = torch.full_like(batch[term], 1e6)   # garbage where absent must not matter
    total, terms = MultiTaskLoss()(out, batch)
    assert terms[term].item() == 0.0
    total.backward()
    assert out[term].grad is not None and (out[term].grad == 0).all()   # connected, zero gradient
    assert out["semantic"].grad.abs().sum() > 0


@pytest.mark.parametrize("term", ["parcel", "hr"])
def test_partly_absent_target_averages_over_present_samples_only(term):
    out, batch = _outputs(b=3), _batch(b=3)
    batch[f"{term}_present"] = torch.tensor([True, False, True])
    batch[term][1] = 123.0
    _, terms = MultiTaskLoss()(out, batch)
    keep = [0, 2]
    _, ref = MultiTaskLoss()({k: v[keep] for k, v in out.items()}, {k: v[keep] for k, v in batch.items()})
    torch.testing.assert_close(terms[term], ref[term])


def test_ignore_index_is_excluded_from_the_cross_entropy():
    out, batch = _outputs(c=20), _batch(c=20)
    sem = batch["semantic"]
    sem[:, :2] = 19                                          # PASTIS void label
    loss = MultiTaskLoss(ignore_index=19)
    _, terms = loss(out, batch)
    keep = sem != 19
    logits = out["semantic"].permute(0, 2, 3, 1)[keep]
    torch.testing.assert_close(terms["semantic"], F.cross_entropy(logits, sem[keep]))
    # Changing the logits of ignored pixels changes nothing.
    out2 = {k: v.detach().clone() for k, v in out.items()}
    out2["semantic"][:, :, :2] = 100.0
    torch.testing.assert_close(loss(out2, batch)[1]["semantic"], terms["semantic"].detach())
    # Without ignore_index the void pixels count.
    assert not torch.allclose(MultiTaskLoss()(out, batch)[1]["semantic"], terms["semantic"])


def test_all_pixels_ignored_gives_exactly_zero():
    out, batch = _outputs(c=20), _batch(c=20)
    batch["semantic"].fill_(19)
    total, terms = MultiTaskLoss(ignore_index=19)(out, batch)
    assert terms["semantic"].item() == 0.0
    total.backward()
    assert out["semantic"].grad is not None and (out["semantic"].grad == 0).all()


def test_low_precision_outputs_give_a_float32_loss():
    out, batch = _outputs(requires_grad=False), _batch()
    half = {k: v.to(torch.bfloat16) for k, v in out.items()}
    total, terms = MultiTaskLoss()(half, batch)
    assert total.dtype == torch.float32 and all(v.dtype == torch.float32 for v in terms.values())
    torch.testing.assert_close(total, MultiTaskLoss()(out, batch)[0], rtol=2e-2, atol=2e-2)


def test_errors_name_the_problem():
    out, batch = _outputs(requires_grad=False), _batch()
    with pytest.raises(CropScaleError, match="hr output"):
        MultiTaskLoss()({**out, "hr": out["hr"][:, :, :-1]}, batch)
    with pytest.raises(CropScaleError, match="parcel output"):
        MultiTaskLoss()({**out, "parcel": out["parcel"][:, :2]}, batch)
    with pytest.raises(CropScaleError, match="semantic logits"):
        MultiTaskLoss()({**out, "semantic": out["semantic"][..., :-1]}, batch)
    with pytest.raises(CropScaleError, match="'hr_present'"):
        MultiTaskLoss()(out, {k: v for k, v in batch.items() if k != "hr_present"})
    with pytest.raises(CropScaleError, match="parcel_weight"):
        MultiTaskLoss(parcel_weight=-1.0)
