import math

import pytest
import pytorch_optimizer
import torch
from torch import nn

from cropscale import CropScaleError
from cropscale.model.network import CropMappingNet
from cropscale.model.optim import (
    build_optimizer,
    global_batch_size,
    parameter_groups,
    scale_learning_rate,
    warmup_factor,
    warmup_steps_of,
)


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


def test_warmup_in_epochs_or_steps():
    assert warmup_steps_of(5, 0.0, None) == 5
    # 1 epoch of 8 / 4 / 2 / 1 updates (G = 4 ... 32 over 32 samples): the same samples warm up for every G
    assert [warmup_steps_of(0, 1.0, u) for u in (8, 4, 2, 1)] == [8, 4, 2, 1]
    assert warmup_steps_of(0, 0.5, 3) == 2  # 1.5 updates -> 2 (ceil)
    assert warmup_steps_of(0, 2.0, 3) == 6
    with pytest.raises(CropScaleError, match="one unit: model.warmup_steps=4 and model.warmup_epochs=1"):
        warmup_steps_of(4, 1.0, 8)
    with pytest.raises(CropScaleError, match="updates per epoch"):
        warmup_steps_of(0, 1.0, None)
    with pytest.raises(CropScaleError, match="must be >= 0"):
        warmup_steps_of(-1, 0.0, 8)


# ----------------------------------------------------------------------------- groups and exclusions
class Small(nn.Module):
    """A linear layer (weight + bias), a LayerNorm (weight + bias) and a learned 1-D embedding."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.norm = nn.LayerNorm(2)
        self.token = nn.Parameter(torch.tensor([0.5, -0.25]))
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[0.2, -0.4, 0.1], [0.3, 0.05, -0.2]]))
            self.fc.bias.copy_(torch.tensor([0.1, -0.1]))
            self.norm.weight.copy_(torch.tensor([1.0, 0.8]))
            self.norm.bias.copy_(torch.tensor([0.0, 0.2]))


def _grads(model):
    """Fixed, hand-chosen gradients (no forward pass needed)."""
    g = {"fc.weight": [[0.3, -0.1, 0.2], [-0.05, 0.4, 0.1]], "fc.bias": [0.2, -0.3], "norm.weight": [-0.1, 0.05],
         "norm.bias": [0.25, -0.2], "token": [0.4, 0.1]}
    for name, p in model.named_parameters():
        p.grad = torch.tensor(g[name], dtype=p.dtype)


def test_real_network_groups_cover_every_parameter_with_the_documented_exclusions():
    net = CropMappingNet(num_classes=10)
    named = dict(net.named_parameters())
    for name in ("lars", "lamb"):
        groups = parameter_groups(net.named_parameters(), name, weight_decay=0.01)
        assert [g["name"] for g in groups] == ["adapted", "excluded"]
        ids = [id(p) for g in groups for p in g["params"]]
        assert len(ids) == len(set(ids)) == len(named)  # every parameter exactly once
        excluded = {n for n, p in named.items() if any(p is q for q in groups[1]["params"])}
        # the documented exclusions, built from module types and names, not from ndim: every bias, the
        # weight of every GroupNorm / LayerNorm, and the five learned 1-D embeddings
        norms = {f"{m}.weight" for m, mod in net.named_modules() if isinstance(mod, (nn.GroupNorm, nn.LayerNorm))}
        biases = {n for n in named if n.endswith(".bias")}
        embeddings = {"s1a_missing", "s1d_missing", "s2_encoder.token", "s1a_encoder.token", "s1d_encoder.token"}
        assert norms and biases
        assert excluded == norms | biases | embeddings
        assert len(excluded) == 87 and sum(named[n].numel() for n in excluded) == 6608  # as optim.py documents
        assert groups[0]["weight_decay"] == 0.01 and groups[1]["weight_decay"] == 0.0
        assert groups[1].get("adam", False) is (name == "lamb")


@pytest.mark.parametrize("name,cls", [("adamw", torch.optim.AdamW), ("sgd", torch.optim.SGD),
                                      ("lars", pytorch_optimizer.LARS), ("lamb", pytorch_optimizer.Lamb)])
def test_build_optimizer_classes_and_one_step_changes_every_parameter(name, cls):
    model = Small()
    opt = build_optimizer(model.named_parameters(), name, lr=0.1, weight_decay=0.01)
    assert type(opt) is cls
    assert sum(len(g["params"]) for g in opt.param_groups) == 5
    assert len(opt.param_groups) == (2 if name in ("lars", "lamb") else 1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _grads(model)
    opt.step()
    for n, p in model.named_parameters():
        assert (p.detach() != before[n]).all(), n


def test_lars_step_matches_you_et_al_with_exclusions():
    """One LARS step by hand (You et al. 2017; momentum buffer starts at the first update):
    adapted tensors: u = eta ||w|| / (||g|| + wd ||w||) (g + wd w), w' = w - lr u;
    excluded (ndim <= 1): plain SGD, no weight decay, w' = w - lr g."""
    lr, wd, eta = 0.5, 0.01, 0.001
    model = Small()
    w0 = {n: p.detach().clone().double() for n, p in model.named_parameters()}
    opt = build_optimizer(model.named_parameters(), "lars", lr=lr, weight_decay=wd, momentum=0.9,
                          trust_coefficient=eta)
    _grads(model)
    g = {n: p.grad.detach().clone().double() for n, p in model.named_parameters()}
    opt.step()
    w, gw = w0["fc.weight"], g["fc.weight"]
    trust = eta * w.norm() / (gw.norm() + wd * w.norm())
    expected = w - lr * trust * (gw + wd * w)
    assert torch.allclose(model.fc.weight.double(), expected, rtol=1e-5, atol=1e-7)
    for n in ("fc.bias", "norm.weight", "norm.bias", "token"):
        assert torch.allclose(dict(model.named_parameters())[n].double(), w0[n] - lr * g[n], rtol=1e-5, atol=1e-7), n


def test_lamb_step_matches_you_et_al_with_exclusions():
    """One LAMB step by hand (You et al., ICLR 2020, as pytorch-optimizer implements it: first moment
    bias-corrected through the step size, second moment not; decoupled weight decay):
    m = (1 - b1) g, v = (1 - b2) g^2, r = m / (sqrt(v) + eps), step = lr / (1 - b1);
    adapted: w1 = w (1 - lr wd), w' = w1 - step min(||w1||, 10) / (||r|| + eps) r;
    excluded: trust ratio 1 and no decay, w' = w - step r."""
    lr, wd, b1, b2, eps = 0.01, 0.1, 0.9, 0.999, 1e-6
    model = Small()
    w0 = {n: p.detach().clone().double() for n, p in model.named_parameters()}
    opt = build_optimizer(model.named_parameters(), "lamb", lr=lr, weight_decay=wd)
    _grads(model)
    g = {n: p.grad.detach().clone().double() for n, p in model.named_parameters()}
    opt.step()
    step = lr / (1 - b1)

    def r(name):
        return (1 - b1) * g[name] / (((1 - b2) * g[name] ** 2).sqrt() + eps)

    w1 = w0["fc.weight"] * (1 - lr * wd)
    ratio = torch.clamp(w1.norm(), max=10.0) / (r("fc.weight").norm() + eps)
    expected = w1 - step * ratio * r("fc.weight")
    assert torch.allclose(model.fc.weight.double(), expected, rtol=1e-5, atol=1e-7)
    assert not math.isclose(float(ratio), 1.0, rel_tol=0.1)  # the trust ratio really acts on this tensor
    for n in ("fc.bias", "norm.weight", "norm.bias", "token"):
        assert torch.allclose(dict(model.named_parameters())[n].double(), w0[n] - step * r(n), rtol=1e-5,
                              atol=1e-7), n


@pytest.mark.parametrize("kwargs,needle", [({"optimizer": "adam"}, "model.optimizer must be one of"),
                                           ({"lr": 0.0}, "model.lr must be > 0"),
                                           ({"momentum": 1.0}, "model.momentum must be in [0, 1)"),
                                           ({"trust_coefficient": -1.0}, "model.trust_coefficient must be > 0")])
def test_bad_optimizer_arguments_name_the_option(kwargs, needle):
    with pytest.raises(CropScaleError) as err:
        build_optimizer(Small().named_parameters(), **{"optimizer": "lars", **kwargs})
    assert needle in str(err.value)
