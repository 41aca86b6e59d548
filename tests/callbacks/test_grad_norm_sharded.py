"""The global gradient norm under sharding (issue 12, item 5), on real gloo process groups on CPU.

Four processes form a 2 x 2 device mesh: 2 replicas x 2 shards (hybrid sharding). The model is trained
on a global batch of 8 samples, 2 per rank, once with FSDP2 (``fully_shard`` on the mesh: DTensor
gradients with placements ``(Replicate(), Shard(0))``) and once with FSDP1 ``HYBRID_SHARD`` (flat
parameters sharded over the intra-node group of 2, replicated across the other). One parameter is left
out of the sharding (``ignored_params`` / ``ignored_states``) and all-reduced by hand as data parallelism
would: it is replicated, whole on every rank. :class:`~cropscale.callbacks.GradNormCallback`'s norm on
every rank must equal a one-process computation on the same global batch (the unsharded model, the
mean loss over the 8 samples, ``sqrt(sum g^2)`` in float64) to 1e-6 relative. Summing every rank's
shards (the old behaviour) counts each shard twice and the replicated gradient four times.

The processes are started with ``torch.multiprocessing.spawn`` in a subprocess running this file, so that
no process group is left in the pytest process.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cropscale.callbacks import GradNormCallback
from cropscale.callbacks._grads import REPLICATED, shard_layout

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
WORLD, PER_RANK = 4, 2


class Net(torch.nn.Module):
    """Two linear layers and a replicated output scale (left out of the sharding)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
        self.scale = torch.nn.Parameter(torch.tensor([1.5, -0.5, 2.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * self.scale


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(WORLD * PER_RANK, 6, generator=g), torch.randn(WORLD * PER_RANK, 3, generator=g)


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (model(x) - y).square().mean()


def reference_norm() -> float:
    """One process, the whole global batch: the L2 norm of the gradient, in float64."""
    torch.manual_seed(0)
    model = Net()
    x, y = _data()
    _loss(model, x, y).backward()
    return float(torch.sqrt(sum(p.grad.double().square().sum() for p in model.parameters())))


def _callback_norm(strategy: object, model: torch.nn.Module) -> float:
    """GradNormCallback's norm of the current gradients, its hooks driven as Lightning would (no Trainer)."""
    trainer = SimpleNamespace(strategy=strategy, world_size=WORLD, global_step=0, current_epoch=0, loggers=[],
                              precision_plugin=SimpleNamespace(), gradient_clip_val=None, log_every_n_steps=0)
    cb = GradNormCallback()
    cb.on_train_start(trainer, model)
    cb.on_train_batch_start(trainer, model, None, 0)
    cb.on_before_optimizer_step(trainer, model, None)
    cb.on_train_batch_end(trainer, model, None, None, 0)
    cb.on_train_epoch_end(trainer, model)
    assert cb.steps == 1 and cb.summary().sharded_reduction
    return cb.epochs[0].grad_norm_max


def _average_replicated(param: torch.nn.Parameter) -> None:
    """What data parallelism does to a parameter the sharding leaves out: the mean gradient on every rank."""
    torch.distributed.all_reduce(param.grad)
    param.grad /= WORLD


def _rank(rank: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy, fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["CROPSCALE_TEST_PORT"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    x, y = _data()
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)

    torch.manual_seed(0)
    base = Net()
    # FSDP2 / hybrid: DTensor gradients (Replicate(), Shard(0)), reduce-scattered and averaged over all 4 ranks
    fsdp2 = copy.deepcopy(base)
    fully_shard(fsdp2.body[0], mesh=mesh)
    fully_shard(fsdp2, mesh=mesh, ignored_params={fsdp2.scale})
    _loss(fsdp2, x[mine], y[mine]).backward()
    _average_replicated(fsdp2.scale)
    placements = [str(p.grad.placements) for p in fsdp2.body.parameters()]
    norm2 = _callback_norm(type("ModelParallelStrategy", (), {})(), fsdp2)

    # FSDP1 HYBRID_SHARD: flat parameters sharded over the intra-node group of 2
    inner = copy.deepcopy(base)
    fsdp1 = FullyShardedDataParallel(inner, device_mesh=mesh, device_id=torch.device("cpu"),
                                     sharding_strategy=ShardingStrategy.HYBRID_SHARD, use_orig_params=False,
                                     ignored_states=[inner.scale])
    _loss(fsdp1, x[mine], y[mine]).backward()
    _average_replicated(inner.scale)
    assert len([p for p in fsdp1.parameters() if getattr(p, "_fsdp_flattened", False)]) == 1  # one flat shard
    strategy = type("FSDPStrategy", (), {})()
    strategy.sharding_strategy, strategy.model = ShardingStrategy.HYBRID_SHARD, fsdp1
    shard_group_size = fsdp1.process_group.size()
    norm1 = _callback_norm(strategy, fsdp1)
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "fsdp2": norm2, "fsdp1": norm1, "placements": placements, "shard_group_size": shard_group_size}))
    dist.destroy_process_group()


@pytest.mark.slow
def test_norm_under_hybrid_sharding_equals_one_process(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", CROPSCALE_TEST_PORT=str(29500 + os.getpid() % 400))
    proc = subprocess.run([sys.executable, str(HERE), str(tmp_path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ref = reference_norm()
    for rank in range(WORLD):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["placements"] == ["(Replicate(), Shard(dim=0))"] * 4  # the layout the test is about
        assert r["shard_group_size"] == 2
        assert r["fsdp2"] == pytest.approx(ref, rel=1e-6), ("FSDP2", rank)
        assert r["fsdp1"] == pytest.approx(ref, rel=1e-6), ("FSDP1 HYBRID_SHARD", rank)


def test_layouts_of_the_strategies():
    """Which gradients are reduced, and over which group, for each strategy (single process, no collective)."""
    from torch.distributed.fsdp import ShardingStrategy

    def strategy(name, **attrs):
        return SimpleNamespace(strategy=type(name, (), attrs)())

    group = object()
    hybrid = shard_layout(strategy("FSDPStrategy", sharding_strategy=ShardingStrategy.HYBRID_SHARD,
                                   model=SimpleNamespace(process_group=group)))
    assert (hybrid.kind, hybrid.group) == ("flat", group)  # the FSDP root's (shard) group, not the world
    assert shard_layout(strategy("FSDPStrategy", sharding_strategy=ShardingStrategy.NO_SHARD)) == REPLICATED
    assert shard_layout(strategy("DeepSpeedStrategy", config={"zero_optimization": {"stage": 1}})) == REPLICATED
    zero3 = shard_layout(strategy("DeepSpeedStrategy", config={"zero_optimization": {"stage": 3}}))
    assert zero3.kind == "unsupported" and "stage 3" in zero3.reason
    assert shard_layout(strategy("ModelParallelStrategy")).kind == "dtensor"
    assert shard_layout(strategy("DDPStrategy")) == REPLICATED


if __name__ == "__main__":
    torch.multiprocessing.spawn(_rank, args=(sys.argv[1],), nprocs=WORLD)
