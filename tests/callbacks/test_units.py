"""Unit tests of the callback building blocks: batch helpers, rank statistics, peak table, NVML UUID
matching with fake handles, energy-window arithmetic, the callback group (step windows: test_windows.py)."""

from __future__ import annotations

import hashlib
import math
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from cropscale import CropScaleError
from cropscale.callbacks import (
    CallbackGroup,
    EnergyCallback,
    GradNormCallback,
    LossScaleCallback,
    MemoryCallback,
    NonFiniteCallback,
    ProvenanceCallback,
    StepTimingCallback,
    ThroughputCallback,
)
from cropscale.callbacks._batches import batch_size, id_tensors, ids_to_lists
from cropscale.callbacks._dist import rank_stats
from cropscale.callbacks._grads import norms_tensor
from cropscale.callbacks.base import scaling_callbacks
from cropscale.env import nvml, peaks
from cropscale.env.host import dataset_revision


# ----------------------------------------------------------------------------------------- batches
def test_batch_size_cropscale_and_generic_batches():
    s2 = torch.zeros(5, 16, 10, 32, 32)
    assert batch_size({"patch_id": torch.zeros(7), "s2": s2}) == 5  # s2 wins over dict order
    assert batch_size({"x": torch.zeros(()), "y": torch.zeros(3, 2)}) == 3  # first tensor with a dim
    assert batch_size((torch.zeros(4, 2), torch.zeros(4))) == 4
    assert batch_size([{"a": torch.zeros(6, 1)}]) == 6
    assert batch_size({"a": "text"}) is None
    assert batch_size(torch.zeros(9, 3)) == 9


def test_sample_ids_to_lists():
    batch = {"patch_id": torch.tensor([10, 11]), "crop_yx": torch.tensor([[0, 8], [16, 24]])}
    pid, yx = id_tensors(batch)
    assert pid is batch["patch_id"] and yx is batch["crop_yx"]
    assert ids_to_lists(pid, yx) == {"patch_id": [10, 11], "crop_yx": [[0, 8], [16, 24]]}
    assert id_tensors((torch.zeros(1),)) == (None, None)


def test_rank_stats_names_the_slowest_rank():
    st = rank_stats([10.0, 14.0, None, 12.0])
    assert st == {"per_rank": [10.0, 14.0, None, 12.0], "max": 14.0, "median": 12.0, "slowest_rank": 1}


def test_norms_tensor_combines_parts_exactly():
    steps = [[torch.tensor(3.0), torch.tensor(4.0)], [torch.tensor(1.0)],
             [torch.tensor(float("nan")), torch.tensor(1.0)]]
    out = norms_tensor(steps, 2.0).tolist()
    assert out[0] == pytest.approx(5.0) and out[1] == pytest.approx(1.0) and math.isnan(out[2])
    assert norms_tensor([[torch.tensor(3.0), torch.tensor(4.0)]], float("inf")).tolist() == [4.0]
    same_width = [[torch.tensor(3.0), torch.tensor(4.0)], [torch.tensor(6.0), torch.tensor(8.0)]]
    assert norms_tensor(same_width, 2.0).tolist() == pytest.approx([5.0, 10.0])
    assert norms_tensor([[torch.tensor(2.5)], [torch.tensor(7.0)]]).tolist() == [2.5, 7.0]  # one part: the total


def test_read_later_reads_once_inside_a_batch_and_hands_each_requester_its_values():
    from cropscale.callbacks import _readout

    got = {}
    _readout.open_reads()
    _readout.read_later([torch.tensor(1.5), torch.tensor(2, dtype=torch.int32)], lambda v: got.update(a=v))
    _readout.read_later([], lambda v: got.update(b=v), [torch.tensor([3.0, 4.0])])
    _readout.read_later([torch.tensor(5.0)], lambda v: got.update(c=v), [torch.tensor([6.0])])
    assert got == {}  # nothing read before the batch ends
    _readout.close_reads()
    assert got == {"a": [1.5, 2.0], "b": [3.0, 4.0], "c": [5.0, 6.0]}
    _readout.read_later([torch.tensor(7.0)], lambda v: got.update(d=v))  # outside a batch: at once
    assert got["d"] == [7.0]


# ------------------------------------------------------------------------------------------- peaks
@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A10G", None),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("Tesla T4", "T4"),
        ("cpu", None),
    ],
)
def test_device_family(name, family):
    assert peaks.device_family(name) == family


def test_peak_table_dense_figures():
    # H200 SXM: 1979 TFLOP/s bf16 "with sparsity" in the datasheet -> 989.5 dense
    assert peaks.peak_tflops("NVIDIA H200", "bf16") == 989.5
    assert peaks.peak_tflops("NVIDIA H200", "fp16") == 989.5
    assert peaks.peak_tflops("NVIDIA H200", "tf32") == 494.5
    assert peaks.peak_tflops("NVIDIA H200", "fp32") == 67.0
    assert peaks.peak_tflops("NVIDIA A100-SXM4-40GB", "bf16") == 312.0
    assert peaks.peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 on Volta
    assert peaks.peak_tflops("cpu", "fp32") is None
    for family, row in peaks.DENSE_PEAK_TFLOPS.items():
        assert set(row) <= set(peaks.DTYPES), family


@pytest.mark.parametrize(
    ("precision", "matmul", "dtype"),
    [("32-true", "highest", "fp32"), ("32-true", "high", "tf32"), ("16-mixed", "highest", "fp16"),
     ("bf16-mixed", "highest", "bf16"), ("bf16-true", "high", "bf16"), ("64-true", "highest", "fp64"),
     ("transformer-engine", "highest", "fp8")],
)
def test_precision_dtype(precision, matmul, dtype):
    assert peaks.precision_dtype(precision, matmul) == dtype


# -------------------------------------------------------------------------------------------- NVML
class FakeNvml:
    """NVML stand-in: devices given as UUIDs in NVML order, with optional MIG children."""

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    nvmlClocksEventReasonGpuIdle = 0x1
    nvmlClocksEventReasonSwPowerCap = 0x4
    nvmlClocksEventReasonHwSlowdown = 0x8

    def __init__(self, uuids, mig=None, energy_mj=None):
        self.uuids = list(uuids)
        self.mig = dict(mig or {})
        self.energy = dict(energy_mj or {})

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("dev", i)

    def nvmlDeviceGetUUID(self, h):
        if h[0] == "dev":
            return self.uuids[h[1]]
        return self.mig[h[1]][h[2]]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return len(self.mig.get(h[1], []))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        return ("mig", h[1], j)

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self.energy[h[1]]

    def nvmlDeviceGetPowerUsage(self, h):
        return 312_500  # mW

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200"

    def nvmlSystemGetDriverVersion(self):
        return "570.86.15"

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetPersistenceMode(self, h):
        return 1

    def nvmlDeviceGetClockInfo(self, h, kind):
        return {1: 1980, 2: 3201}[kind]

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return {1: 1980, 2: 3201}[kind]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x1 | 0x4


def test_uuid_matching_ignores_index_order_prefix_and_case():
    nv = FakeNvml(["GPU-aaaa-0001", "GPU-BBBB-0002", "GPU-cccc-0003"])
    # CUDA_VISIBLE_DEVICES=2,1: cuda:0 is NVML index 2, cuda:1 is NVML index 1
    assert nvml.find_handle_by_uuid(nv, "cccc-0003") == (("dev", 2), False)
    assert nvml.find_handle_by_uuid(nv, "bbbb-0002") == (("dev", 1), False)
    assert nvml.find_handle_by_uuid(nv, b"GPU-AAAA-0001") == (("dev", 0), False)
    with pytest.raises(LookupError, match="dddd"):
        nvml.find_handle_by_uuid(nv, "dddd-0004")


def test_uuid_matching_mig_instance_returns_physical_gpu():
    nv = FakeNvml(["GPU-aaaa", "GPU-bbbb"], mig={1: ["MIG-1111", "MIG-2222"]})
    assert nvml.find_handle_by_uuid(nv, "MIG-2222") == (("dev", 1), True)


def test_nvml_device_readings_and_info():
    nv = FakeNvml(["GPU-aaaa"], energy_mj={0: 123_456})
    dev = nvml.NvmlDevice(nv, ("dev", 0), "aaaa")
    assert dev.energy_j() == pytest.approx(123.456)
    assert dev.power_w() == pytest.approx(312.5)
    info = dev.info()
    assert info == {
        "name": "NVIDIA H200", "uuid": "aaaa", "mig_instance": False, "driver": "570.86.15",
        "power_limit_w": 700.0, "persistence_mode": True, "sm_clock_mhz": 1980, "mem_clock_mhz": 3201,
        "sm_clock_max_mhz": 1980, "mem_clock_max_mhz": 3201, "throttle_reasons": ["gpu_idle", "sw_power_cap"],
    }


def test_open_device_for_cpu_gives_reason():
    dev, reason = nvml.open_device_for(torch.device("cpu"))
    assert dev is None and "cpu" in reason


def test_energy_counter_delta():
    assert nvml.counter_delta_j(1000.0, 1250.5) == 250.5
    assert nvml.counter_delta_j(1000.0, 999.0) is None  # counter reset (driver reload)
    assert nvml.counter_delta_j(None, 5.0) is None


def test_integrate_power_trapezoid_with_edge_interpolation():
    samples = [(0.0, 100.0), (1.0, 200.0), (2.0, 200.0)]
    # window [0.5, 1.5]: P(0.5) = 150 (interpolated), then 200 -> 0.5*(150+200)*0.5 + 0.5*(200+200)*0.5
    assert nvml.integrate_power(samples, 0.5, 1.5) == pytest.approx(187.5)
    assert nvml.integrate_power(samples, 0.0, 2.0) == pytest.approx(150.0 + 200.0)
    # beyond the samples the power is held: 100 W before, 200 W after
    assert nvml.integrate_power(samples, -1.0, 0.0) == pytest.approx(100.0)
    assert nvml.integrate_power(samples, 2.0, 4.0) == pytest.approx(400.0)
    assert nvml.integrate_power([], 0.0, 1.0) is None
    assert nvml.integrate_power(samples, 1.0, 1.0) is None


# ----------------------------------------------------------------------------------- the group
class _A(Callback):
    def __init__(self, log):
        self.log = log
        self.n = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.log.append(("A", batch_idx))

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, sd):
        self.n = sd["n"]


class _B(Callback):
    def __init__(self, log):
        self.log = log

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.log.append(("B", batch_idx))

    def on_fit_start(self, trainer, pl_module):
        self.log.append(("B", "fit"))


def test_group_forwards_in_order_only_to_overriders():
    log = []
    a, b = _A(log), _B(log)
    g = CallbackGroup([a, b])
    assert g._dispatch["on_train_batch_end"] == [a.on_train_batch_end, b.on_train_batch_end]
    assert g._dispatch["on_fit_start"] == [b.on_fit_start]
    assert g._dispatch["on_before_backward"] == []
    g.on_train_batch_end(None, None, None, None, 3)
    g.on_fit_start(None, None)
    assert log == [("A", 3), ("B", 3), ("B", "fit")]
    a.n = 7
    sd = g.state_dict()
    assert sd == {a.state_key: {"n": 7}, b.state_key: {}}
    a2 = _A([])
    CallbackGroup([a2, _B([])]).load_state_dict(sd)
    assert a2.n == 7


def test_group_rejects_bad_members():
    with pytest.raises(CropScaleError, match="at least one"):
        CallbackGroup([])
    with pytest.raises(CropScaleError, match="checkpoint"):
        CallbackGroup([ModelCheckpoint()])
    with pytest.raises(CropScaleError, match="not a Lightning Callback"):
        CallbackGroup([object()])
    with pytest.raises(CropScaleError, match="state_key"):
        CallbackGroup([MemoryCallback(), MemoryCallback()])


def test_iter_callbacks_expands_groups():
    mem, gn = MemoryCallback(), GradNormCallback()
    trainer = SimpleNamespace(callbacks=[ModelCheckpoint(), CallbackGroup([mem, gn])])
    assert scaling_callbacks(trainer) == [mem, gn]


# ------------------------------------------------------------------------------- argument errors
@pytest.mark.parametrize(
    "make",
    [
        lambda: StepTimingCallback(warmup_steps=-1),
        lambda: NonFiniteCallback(policy="ignore"),
        lambda: GradNormCallback(norm_type=0),
        lambda: GradNormCallback(clip_val=-1.0),
        lambda: EnergyCallback(price_per_gpu_hour=-2.0),
        lambda: EnergyCallback(sample_interval_s=0),
        lambda: ThroughputCallback(peak_tflops=0),
        lambda: ThroughputCallback(flops_per_sample=-1),
        lambda: ProvenanceCallback(data_hash="md5"),
        lambda: ProvenanceCallback(data_root="/nonexistent/cropscale-data"),
    ],
)
def test_bad_arguments_raise_cropscale_error(make):
    with pytest.raises(CropScaleError):
        make()


def test_loss_scale_state_dict_defaults():
    cb = LossScaleCallback()
    sd = cb.state_dict()
    assert sd["counts"]["skipped_steps"] == 0 and sd["last_scale"] is None


# ----------------------------------------------------------------------------- dataset revision
def test_dataset_revision_listing_and_content(tmp_path):
    (tmp_path / "DATA_S2").mkdir()
    (tmp_path / "DATA_S2" / "S2_1.npy").write_bytes(b"abc")
    (tmp_path / "metadata.geojson").write_bytes(b"{}")
    rev = dataset_revision(tmp_path)
    lines = "DATA_S2/S2_1.npy\t3\nmetadata.geojson\t2\n"
    assert rev["sha256"] == hashlib.sha256(lines.encode()).hexdigest()
    assert (rev["files"], rev["bytes"], rev["method"]) == (2, 5, "listing")
    content = dataset_revision(tmp_path, "content")
    assert content["sha256"] == hashlib.sha256(lines.encode() + b"abc" + b"{}").hexdigest()
    (tmp_path / "metadata.geojson").write_bytes(b"{ }")
    assert dataset_revision(tmp_path)["sha256"] != rev["sha256"]  # size changed
    with pytest.raises(CropScaleError, match="not a folder"):
        dataset_revision(tmp_path / "missing")


def test_clip_algorithm_from_lightning_enum():
    from lightning.pytorch.utilities import GradClipAlgorithmType

    from cropscale.callbacks.grad_norm import _algorithm

    assert _algorithm(GradClipAlgorithmType.NORM) == "norm"
    assert _algorithm(GradClipAlgorithmType.VALUE) == "value"
    assert _algorithm(None) == "norm" and _algorithm("value") == "value"
