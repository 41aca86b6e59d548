"""The sharded gradient-norm reduction in the default suite (issue 27), fed the other ranks' values by hand.

The slow test (``test_grad_norm_sharded.py``) runs real FSDP on 4 gloo processes. Here one process plays
rank 0 of a 2 x 2 hybrid layout: ``torch.distributed.all_reduce`` is replaced by a fake that adds what the
other ranks of the group it is given would contribute, written down by hand; GradNormCallback's hooks are
driven as Lightning would (no Trainer, the strategy faked by its class name).

The hand-worked case, 2-norm: this rank's flat shard has gradient ``[3, 4]`` (``sum g^2 = 25``); the other
rank of its shard group holds ``[12, 0]`` (144); the replicas across the other mesh dimension hold the same
shards, so the whole world sums ``2 x (25 + 144) = 338``. A replicated parameter (left out of the sharding) has
gradient ``[0, 84]`` on every rank. The global norm is ``sqrt(25 + 144 + 84^2) = 85``. What the wrong
reductions give: no all-reduce ``84.15``; over the world instead of the shard group ``85.99``; norms added
instead of squares ``85.70``; the replicated gradient summed over the group too ``119.5``. Max-norm: the
shards' max ``|g|`` are 4 here and 12 on the other rank, the replicated one ``[0, 7]``: 12.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.fsdp import ShardingStrategy

from cropscale.callbacks import GradNormCallback

SHARD_GROUP = object()  # the FSDP root's process group: the intra-node shard group under HYBRID_SHARD


class FakeCollectives:
    """``all_reduce`` that adds what the other ranks of the group it is called with would send, by hand.

    ``hybrid``: this rank's shard statistic is ``mine``, the other shard rank's ``theirs``; whatever else this
    rank sends (a replicated gradient wrongly reduced) the other ranks hold too, and send too. The world holds
    two replicas of the pair. Otherwise (``disjoint``) the other ranks send ``theirs`` in all.
    """

    def __init__(self, mine: float, theirs: float, hybrid: bool = True) -> None:
        self.mine, self.theirs, self.hybrid = mine, theirs, hybrid
        self.calls: list[str] = []

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        which = "shard" if group is SHARD_GROUP else "world"
        self.calls.append(which)
        sent = float(tensor)
        if op == torch.distributed.ReduceOp.MAX:
            other = max(self.theirs, sent) if sent != self.mine else self.theirs
            tensor.fill_(max(sent, other))
            return
        if not self.hybrid:
            tensor.fill_(sent + self.theirs)
            return
        other = sent - self.mine + self.theirs  # the other shard rank: its shard, the same rest
        tensor.fill_(sent + other if which == "shard" else 2 * (sent + other))


class Net(torch.nn.Module):
    def __init__(self, shard: list[float], replicated: list[float]) -> None:
        super().__init__()
        self.flat = torch.nn.Parameter(torch.zeros(2))
        self.flat._fsdp_flattened = True  # what FSDP marks its flat-parameter shards with
        self.rep = torch.nn.Parameter(torch.zeros(2))
        self.flat.grad, self.rep.grad = torch.tensor(shard), torch.tensor(replicated)


def callback_norm(monkeypatch, fake: FakeCollectives, net: Net, strategy_name: str, **kw) -> float:
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "all_reduce", fake.all_reduce)
    strategy = type(strategy_name, (), {})()
    strategy.sharding_strategy = ShardingStrategy.HYBRID_SHARD
    strategy.model = SimpleNamespace(process_group=SHARD_GROUP)
    trainer = SimpleNamespace(strategy=strategy, world_size=4, global_step=0, current_epoch=0, loggers=[],
                              precision_plugin=SimpleNamespace(), gradient_clip_val=None, log_every_n_steps=0)
    cb = GradNormCallback(**kw)
    cb.on_train_start(trainer, net)
    cb.on_train_batch_start(trainer, net, None, 0)
    cb.on_before_optimizer_step(trainer, net, None)
    cb.on_train_batch_end(trainer, net, None, None, 0)
    cb.on_train_epoch_end(trainer, net)
    assert cb.steps == 1 and cb.summary().sharding == ("world" if kw.get("sharded") else "flat")
    return cb.epochs[0].grad_norm_max


def test_flat_shards_are_summed_over_the_shard_group_and_replicated_gradients_once(monkeypatch):
    fake = FakeCollectives(mine=25.0, theirs=144.0)
    norm = callback_norm(monkeypatch, fake, Net([3.0, 4.0], [0.0, 84.0]), "FSDPStrategy")
    assert norm == pytest.approx(85.0, rel=1e-12)
    assert fake.calls == ["shard"]


def test_max_norm_takes_the_largest_shard_over_the_group(monkeypatch):
    fake = FakeCollectives(mine=4.0, theirs=12.0)
    norm = callback_norm(monkeypatch, fake, Net([3.0, 4.0], [0.0, 7.0]), "FSDPStrategy", norm_type=math.inf)
    assert norm == 12.0 and fake.calls == ["shard"]


def test_forced_sharding_sums_every_gradient_over_the_world(monkeypatch):
    """``sharded=True``: every plain gradient is a disjoint shard over all ranks. Here this rank's
    ``25 + 84^2 = 7081`` and the other ranks' 144 add up to ``85^2``."""
    fake = FakeCollectives(mine=25.0 + 84.0**2, theirs=144.0, hybrid=False)
    norm = callback_norm(monkeypatch, fake, Net([3.0, 4.0], [0.0, 84.0]), "DDPStrategy", sharded=True)
    assert norm == pytest.approx(85.0, rel=1e-12)
    assert fake.calls == ["world"]
