"""Ring all-reduce, DDP buckets and FSDP volumes: the study's figures and PyTorch's own bucketing."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from cropscale import CropScaleError
from cropscale.scaling.allreduce import (
    MIB,
    allreduce_table,
    ddp_allreduce_time,
    ddp_buckets,
    estimated_bucket_count,
    format_allreduce_table,
    fsdp_send_bytes,
    gradient_payload,
    payload_bytes,
    reduce_scatter_send_bytes,
    reduce_scatter_time,
    ring_allreduce_send_bytes,
    ring_allreduce_time,
)

STUDY_PARAMS = 1_947_456


def test_study_volumes_fp32():
    # STUDY.md: M = 7.43 MiB; V = 7.43 MiB (N = 2), 11.14 MiB (N = 4), 13.00 MiB (N = 8).
    assert f"{payload_bytes(STUDY_PARAMS, 4) / MIB:.2f}" == "7.43"
    got = [f"{ring_allreduce_send_bytes(STUDY_PARAMS, n, 4) / MIB:.2f}" for n in (2, 4, 8)]
    assert got == ["7.43", "11.14", "13.00"]
    # Exact bytes: 2 (N - 1) P b / N.
    assert ring_allreduce_send_bytes(STUDY_PARAMS, 4, 4) == 2 * 3 * STUDY_PARAMS * 4 / 4
    assert ring_allreduce_send_bytes(STUDY_PARAMS, 1, 4) == 0.0


def test_study_volumes_in_the_table_and_labels():
    rows = allreduce_table(num_params=STUDY_PARAMS, bytes_per_element=4, world_sizes=(2, 4, 8))
    assert [f"{r.ring_send_mib:.2f}" for r in rows] == ["7.43", "11.14", "13.00"]
    assert all(f"{r.payload_mib:.2f}" == "7.43" for r in rows)
    text = format_allreduce_table(rows)
    body = text.splitlines()[2:]
    assert len(body) == 3 and all(line.endswith("| analytical-scenario |") for line in body)
    assert "| 4 | 7.43 MiB | 11.14 MiB |" in text


def test_ring_time_formula():
    m, n, a, bw = 8 * MIB, 4, 5e-6, 2e9
    assert ring_allreduce_time(m, n, a, bw) == pytest.approx(2 * 3 * a + (2 * 3 / 4) * m / bw, rel=1e-12)
    assert reduce_scatter_time(m, n, a, bw) == pytest.approx(3 * a + (3 / 4) * m / bw, rel=1e-12)
    assert ring_allreduce_time(m, 1, a, bw) == 0.0


def test_fsdp_volumes():
    one = reduce_scatter_send_bytes(STUDY_PARAMS, 8, 4)
    assert one == pytest.approx(7 / 8 * STUDY_PARAMS * 4)
    full = fsdp_send_bytes(STUDY_PARAMS, 8, 4)
    assert full["total"] == pytest.approx(3 * one) and full["reduce_scatter"] == one
    grad_op = fsdp_send_bytes(STUDY_PARAMS, 8, 4, reshard_after_forward=False)
    assert grad_op["total"] == pytest.approx(2 * one)
    # Reduce-scatter + all-gather = one all-reduce in volume.
    assert 2 * one == pytest.approx(ring_allreduce_send_bytes(STUDY_PARAMS, 8, 4))


def test_bucket_latency_is_paid_per_bucket():
    sizes = [MIB, 6 * MIB]
    t = ddp_allreduce_time(sizes, 4, 10e-6, 1e9)
    assert t == pytest.approx(2 * (2 * 3 * 10e-6) + (2 * 3 / 4) * 7 * MIB / 1e9, rel=1e-12)


def test_estimated_bucket_count():
    assert estimated_bucket_count(0) == 0
    assert estimated_bucket_count(0.5 * MIB) == 1
    assert estimated_bucket_count(payload_bytes(STUDY_PARAMS, 4)) == 2
    assert estimated_bucket_count(26 * MIB) == 2
    assert estimated_bucket_count(27 * MIB) == 3
    assert estimated_bucket_count(27 * MIB, first_bucket_mb=None) == 2


def test_ddp_buckets_match_pytorchs_assignment():
    # PyTorch's own bucketing routine (private, used by DDP) on the same sizes and caps.
    numels = [100_000, 200_000, 50_000, 300_000, 10, 7_000_000, 1_000, 2_000_000, 5]
    tensors = [torch.empty(n) for n in numels]
    ref, _ = dist._compute_bucket_assignment_by_size(tensors, [1 << 20, 25 << 20], [False] * len(tensors))
    mine = ddp_buckets([n * 4 for n in numels])
    assert [list(b.indices) for b in mine] == [list(r) for r in ref]
    assert [b.nbytes for b in mine] == [sum(numels[i] * 4 for i in r) for r in ref]


def test_ddp_buckets_separate_dtypes():
    mine = ddp_buckets([400_000, 600_000, 800_000], dtypes=["float32", "float16", "float32"])
    tensors = [torch.empty(100_000), torch.empty(300_000, dtype=torch.float16), torch.empty(200_000)]
    ref, _ = dist._compute_bucket_assignment_by_size(tensors, [1 << 20, 25 << 20], [False] * 3)
    assert [list(b.indices) for b in mine] == [list(r) for r in ref]
    assert {b.dtype for b in mine} == {"float32", "float16"}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1024),
                         nn.Linear(1024, 300))


def test_gradient_payload_of_a_real_module():
    m = _mlp()
    p = gradient_payload(m)
    expected = sum(q.numel() for q in m.parameters())
    assert p.num_params == expected
    assert p.payload_bytes == 4 * expected and p.bytes_per_element == 4.0
    assert p.grad_dtypes == ("float32",)
    # Ready order = reverse registration: last bias first.
    assert p.tensor_bytes[0] == 300 * 4
    half = gradient_payload(m, grad_dtype=torch.float16)
    assert half.payload_bytes == 2 * expected
    m[0].weight.requires_grad_(False)
    assert gradient_payload(m).num_params == expected - 64 * 256


def test_gradient_payload_rejects_non_modules():
    with pytest.raises(CropScaleError, match="nn.Module"):
        gradient_payload([1, 2, 3])
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(CropScaleError, match="no trainable parameter"):
        gradient_payload(frozen)


def test_buckets_match_real_ddp_rebuilt_buckets(tmp_path):
    """DDP (gloo, world size 1) rebuilds its buckets after the first iteration in gradient-ready
    order with the 1 MiB / 25 MiB caps; our model of it must give the same bucket sizes."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        m = _mlp()
        ddp = nn.parallel.DistributedDataParallel(m)
        for _ in range(3):
            ddp(torch.randn(2, 64)).sum().backward()
        data = ddp._get_ddp_logging_data()
        assert data["has_rebuilt_buckets"] == 1
        real = [int(s) for s in data["rebuilt_bucket_sizes"].split(",")]
    finally:
        dist.destroy_process_group()
    assert [b.nbytes for b in gradient_payload(m).buckets()] == real


def test_table_from_a_module_uses_exact_buckets():
    p = gradient_payload(_mlp())
    rows = allreduce_table(payload=p, world_sizes=(2,), alpha_us=0.0, bandwidth_gb_s=1.0)
    assert rows[0].buckets == len(p.buckets()) == 2
    assert rows[0].ring_send_mib == pytest.approx(p.payload_bytes / MIB)


@pytest.mark.parametrize(
    "call",
    [
        lambda: ring_allreduce_send_bytes(-1, 2),
        lambda: ring_allreduce_send_bytes(10, 0),
        lambda: ring_allreduce_send_bytes(10, 2, 0),
        lambda: ring_allreduce_time(1.0, 2, 1e-6, 0.0),
        lambda: ddp_buckets([1, -2]),
        lambda: ddp_buckets([1, 2], dtypes=["float32"]),
        lambda: allreduce_table(),
        lambda: format_allreduce_table([]),
    ],
)
def test_bad_arguments_raise_cropscale_error(call):
    with pytest.raises(CropScaleError):
        call()
