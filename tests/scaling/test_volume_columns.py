"""The per-rank volume columns against hand-worked numbers (issue 27): a 4 MiB FP32 payload
(1,048,576 parameters x 4 bytes). Ring all-reduce sends 2 (N - 1) / N of it, FSDP FULL_SHARD 3 (N - 1) / N
(two all-gathers and one reduce-scatter, each (N - 1) / N):

=====  ==========  ==========
N      ring MiB    FSDP MiB
=====  ==========  ==========
1      0           0
2      4           6
4      6           9
8      7           10.5
=====  ==========  ==========
"""

from __future__ import annotations

import pytest
from torch import nn

from cropscale.bench.measure import allreduce_volume_vs_world_size
from cropscale.scaling.allreduce import allreduce_table, fsdp_send_bytes, ring_allreduce_volume

P = 1_048_576
MIB = 2**20
HAND = {1: (0.0, 0.0), 2: (4.0, 6.0), 4: (6.0, 9.0), 8: (7.0, 10.5)}


def test_table_columns_match_the_hand_worked_volumes():
    rows = allreduce_table(num_params=P, world_sizes=tuple(HAND))
    assert [(r.world_size, r.payload_mib) for r in rows] == [(n, 4.0) for n in HAND]
    assert [(r.ring_send_mib, r.fsdp_send_mib) for r in rows] == [pytest.approx(v) for v in HAND.values()]


def test_fsdp_column_agrees_with_the_collectives_it_counts():
    for n, (_, fsdp) in HAND.items():
        assert fsdp_send_bytes(P, n)["total"] / MIB == pytest.approx(fsdp)


def test_benchmark_series_matches_the_hand_worked_volumes():
    module = nn.Linear(1023, 1024)  # 1023 x 1024 weights + 1024 biases = 1,048,576 parameters
    s = allreduce_volume_vs_world_size((2, 4, 8), module=module)
    assert s.settings["num_params"] == P
    assert s.y == [[pytest.approx(HAND[n][0])] for n in (2, 4, 8)]


def test_ring_volume_in_bytes():
    assert ring_allreduce_volume(1000.0, 4) == 1500.0 and ring_allreduce_volume(1000.0, 1) == 0.0
