"""The callbacks' rank gathers (cropscale.callbacks._dist) with ranks that disagree, in one process.

The collectives are replaced by fakes that hand back what each of two ranks would send (checking what this
rank sent: its float64 values, on the module's device); the real 2-process gather runs in the slow stage
(tests/integration/test_callbacks_ddp.py, test_ranks_disagree_ddp.py).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from cropscale.callbacks._dist import dist_ready, gather_objects, gather_vectors, rank_stats

# a float64 value that float32 cannot hold (2^24 + 1), and one rank's "no value" (None travels as NaN)
EXACT = 16777217.0


def _trainer(world_size: int, other_rows: list[list[float]], sent: list, mine: list[float] | None = None):
    """A trainer of ``world_size`` ranks whose all_gather stacks this rank's tensor (kept in ``sent``) with
    ``other_rows``; a tensor on the meta device (no values) stands for ``mine``."""

    def all_gather(t):
        sent.append(t)
        own = torch.tensor(mine, dtype=torch.float64) if t.device.type == "meta" else t
        return torch.stack([own, *[torch.tensor(r, dtype=torch.float64) for r in other_rows]])

    return SimpleNamespace(world_size=world_size, strategy=SimpleNamespace(all_gather=all_gather))


@pytest.fixture
def dist_up(monkeypatch):
    """torch.distributed available and initialised (a process group of the trainer's size, faked)."""
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)


def test_dist_ready_needs_more_than_one_rank_and_an_initialised_group(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    assert dist_ready(SimpleNamespace(world_size=2)) is True
    assert dist_ready(SimpleNamespace(world_size=1)) is False  # one process: never a collective
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    assert dist_ready(SimpleNamespace(world_size=2)) is False  # a 2-device trainer before its group exists
    monkeypatch.setattr(torch.distributed, "is_available", lambda: False)
    assert dist_ready(SimpleNamespace(world_size=4)) is False


def test_gather_vectors_on_one_process_copies_and_maps_nan_to_none():
    trainer = SimpleNamespace(world_size=1)
    assert gather_vectors(trainer, None, [1.5, None, math.nan, 2]) == [[1.5, None, None, 2.0]]


def test_gather_vectors_two_ranks_that_disagree_rank_ordered(dist_up):
    sent: list[torch.Tensor] = []
    trainer = _trainer(2, [[3.0, math.nan, 0.25]], sent)
    module = SimpleNamespace(device=torch.device("cpu"))
    rows = gather_vectors(trainer, module, [EXACT, 7.0, None])
    assert rows == [[EXACT, 7.0, None], [3.0, None, 0.25]]  # rank 0's row first, NaN back as None, float64 kept
    (t,) = sent
    assert t.dtype == torch.float64 and t.shape == (3,) and t.device == module.device


def test_gather_vectors_sends_on_the_modules_device(dist_up):
    """NCCL gathers CUDA tensors only: the tensor is made on ``pl_module.device`` (here the meta device)."""
    sent: list[torch.Tensor] = []
    trainer = _trainer(2, [[1.0, 2.0]], sent, mine=[5.0, 6.0])
    rows = gather_vectors(trainer, SimpleNamespace(device=torch.device("meta")), [5.0, 6.0])
    assert sent[0].device.type == "meta" and rows == [[5.0, 6.0], [1.0, 2.0]]


def test_gather_objects_one_entry_per_rank(dist_up, monkeypatch):
    calls = []

    def all_gather_object(out, obj):
        calls.append((len(out), obj))
        for rank in range(len(out)):
            out[rank] = obj if rank == 0 else {"rank": rank, "steps": 10 * rank}

    monkeypatch.setattr(torch.distributed, "all_gather_object", all_gather_object)
    got = gather_objects(SimpleNamespace(world_size=3), {"rank": 0, "steps": 4})
    assert got == [{"rank": 0, "steps": 4}, {"rank": 1, "steps": 10}, {"rank": 2, "steps": 20}]
    assert calls == [(3, {"rank": 0, "steps": 4})]
    assert gather_objects(SimpleNamespace(world_size=1), "x") == ["x"]


def test_rank_stats_with_ranks_that_disagree_hand_worked():
    st_ = rank_stats([12.0, None, 30.0, 18.0, 15.0])
    # finite ranks 0, 2, 3, 4: max 30 on rank 2 (not the last nor the first); median of 12, 15, 18, 30 = 16.5
    assert st_ == {"per_rank": [12.0, None, 30.0, 18.0, 15.0], "max": 30.0, "median": 16.5, "slowest_rank": 2}
    assert rank_stats([None, None]) == {"per_rank": [None, None], "max": None, "median": None, "slowest_rank": None}
    assert rank_stats([4.0, 4.0])["slowest_rank"] == 0  # a tie names the lowest rank


@given(st.lists(st.one_of(st.none(), st.floats(0.0, 1e6)), min_size=1, max_size=8), st.randoms())
def test_a_rank_permutation_changes_no_global_figure(per_rank, rnd):
    order = list(range(len(per_rank)))
    rnd.shuffle(order)
    permuted = [per_rank[i] for i in order]
    a, b = rank_stats(per_rank), rank_stats(permuted)
    assert (a["max"], a["median"]) == (b["max"], b["median"])
    if a["slowest_rank"] is not None:  # the slowest rank is the same rank, wherever it sits
        assert per_rank[a["slowest_rank"]] == permuted[b["slowest_rank"]] == a["max"]

