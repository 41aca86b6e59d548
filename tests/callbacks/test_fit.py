"""One-process CPU runs of the scaling callbacks on a tiny task with cropscale dict batches:
run.json fields, TensorBoard prefixes, Extra-P trace, state_dict round trip and resume, exact gradient
norms, throughput arithmetic, energy through a fake NVML (counter and sampled-power paths)."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins import MixedPrecision
from lightning.pytorch.profilers import PassThroughProfiler

from cropscale.callbacks import (
    CallbackGroup,
    EnergyCallback,
    GradNormCallback,
    MemoryCallback,
    NonFiniteCallback,
    StepTimingCallback,
    ThroughputCallback,
    all_scaling_callbacks,
)
from cropscale.env import nvml
from cropscale.runs.schema import SUMMARY_TYPES, Record, RunJson
from cropscale.scaling import extrap
from cropscale.testing.toy import ToyTask

RUN_JSON_FIELDS = {
    "schema", "evidence", "status", "started_utc", "finished_utc", "run_dir", "command", "git", "dataset",
    "config", "config_source", "host", "versions", "devices", "topology", "distributed", "precision",
    "float32_matmul_precision", "seeds", "trainer", "callbacks", "extra", "data_warnings", "summary", "global_step",
    "epochs_completed", "precision_decision", "diagnosis", "validity",
}
SUMMARY_KEYS = {"step_timing", "throughput", "loss_scale", "nonfinite", "grad_norm", "energy", "memory", "trained",
                "checkpoint", "quality", "divergence"}

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),  # Lightning 2.6 on torch 2.13
    pytest.mark.filterwarnings("ignore:NonFiniteCallback"),  # the warning the injected NaNs are meant to raise
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
]


def make_trainer(root: Path, callbacks: list, **kw) -> Trainer:
    args = dict(
        accelerator="cpu", devices=1, max_epochs=2, callbacks=callbacks,
        logger=TensorBoardLogger(str(root), name="run"), log_every_n_steps=2,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    args.update(kw)
    return Trainer(**args)


def scalar_tags(log_dir: str) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(log_dir)
    ea.Reload()
    return set(ea.Tags()["scalars"])


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """Every scaling callback (one group, step trace on) over 2 epochs x 4 steps, FP32, clipping at 0.05."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("full")
    cbs = all_scaling_callbacks()
    cbs[0] = StepTimingCallback(warmup_steps=1, trace_path="trace.rank{rank}.jsonl", trace_params={"local_batch": 4})
    cbs[1] = ThroughputCallback(warmup_steps=1)
    group = CallbackGroup(cbs)
    trainer = make_trainer(root, [group], gradient_clip_val=0.05)
    profiler_before = trainer.profiler
    trainer.fit(ToyTask())
    record = json.loads(Path(trainer.log_dir, "run.json").read_text())
    return {"trainer": trainer, "cbs": cbs, "record": record, "profiler_before": profiler_before}


@pytest.fixture(scope="module")
def fp16_run(tmp_path_factory):
    """Every scaling callback under 16-mixed with a real GradScaler: overflows and a NaN sample (policy skip)."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("fp16")
    cbs = all_scaling_callbacks()
    cbs[3] = NonFiniteCallback(policy="skip")
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    trainer = make_trainer(root, [CallbackGroup(cbs)], plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    trainer.fit(ToyTask(n_train=16, overflow_steps={1}, nan_patch_ids={1009}))
    return {"trainer": trainer, "cbs": cbs, "path": Path(trainer.log_dir, "run.json")}


def _unknown_keys(value, where="run.json"):
    """Keys of the written document that are no field of their record (kept in ``Record.other``)."""
    found = []
    if isinstance(value, Record):
        found += [f"{where}.{k}" for k in value.other]
        for name in vars(value):
            if name != "other":
                found += _unknown_keys(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _unknown_keys(v, f"{where}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            found += _unknown_keys(v, f"{where}.{k}")
    return found


@pytest.mark.parametrize("run", ["full_run", "fp16_run"])
def test_run_json_reads_back_into_the_records_and_writes_back_identically(run, request):
    """The file a real fit wrote: every key is a field of its typed record, and writing the records again gives
    the same bytes (json.dump with indent 2, the provenance callback's format)."""
    fixture = request.getfixturevalue(run)
    path = Path(fixture["trainer"].log_dir, "run.json")
    text = path.read_text()
    record = RunJson.from_json(json.loads(text))
    for key, kind in SUMMARY_TYPES.items():
        assert isinstance(getattr(record.summary, key), kind), key
    assert _unknown_keys(record) == []
    assert json.dumps(record.to_json(), indent=2) + "\n" == text
    if run == "fp16_run":  # the sections that hold records in this run were filled
        assert record.summary.loss_scale.scaler_in_use and record.summary.loss_scale.skipped_steps >= 2
        assert [r.nonfinite_input_patch_id for r in record.summary.nonfinite.records] == [[1009], [1009]]  # 2 epochs


def test_run_json_has_every_field(full_run):
    rec = full_run["record"]
    assert set(rec) == RUN_JSON_FIELDS
    assert rec["status"] == "finished" and rec["evidence"] == "measured-run"
    assert set(rec["summary"]) == SUMMARY_KEYS
    for key, section in rec["summary"].items():
        assert section["evidence"] == "measured-run", key
    assert rec["distributed"]["world_size"] == 1 and rec["precision"] == "32-true"
    assert len(rec["devices"]) == 1 and rec["devices"][0]["device"] == "cpu"
    assert rec["versions"]["torch"] == torch.__version__
    # an independent reading of the checkout the test runs in (git_info reads the working directory first)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True) if shutil.which("git") else None
    if head is not None and head.returncode == 0:
        assert rec["git"]["available"] is True and rec["git"]["commit"] == head.stdout.strip()
    else:
        assert rec["git"]["available"] is False and rec["git"]["reason"]
    assert rec["global_step"] == 8 and rec["epochs_completed"] == 2
    assert rec["trainer"]["gradient_clip_val"] == 0.05


def test_power_unavailable_on_cpu_with_reason(full_run):
    energy = full_run["record"]["summary"]["energy"]
    assert energy["available"] is False
    assert "cpu" in energy["reason"] and "not on a CUDA GPU" in energy["reason"]
    assert full_run["record"]["summary"]["memory"]["gpu_available"] is False
    amp = full_run["record"]["summary"]["loss_scale"]
    assert amp["scaler_in_use"] is False and "no GradScaler" in amp["reason"]


def test_tensorboard_prefixes(full_run):
    tags = scalar_tags(full_run["trainer"].log_dir)
    for prefix in ("perf/", "numerics/", "memory/"):
        assert any(t.startswith(prefix) for t in tags), prefix
    for tag in ("perf/step/forward_ms", "perf/epoch/step_ms_median", "perf/epoch/samples_per_s",
                "numerics/grad_norm", "memory/host_rss_gib"):
        assert tag in tags, tag
    # FP32 on CPU: no scaler, no power; the flags are run.json's (and HPARAMS'), not constant scalars
    assert not any(t.startswith(("amp/", "energy/")) for t in tags), sorted(tags)


def test_step_timing_windows_and_trace(full_run):
    st = full_run["record"]["summary"]["step_timing"]
    assert st["steps_total"] == 8 and st["clock"] == "perf_counter"
    # measured: not warm-up (step 1), not first of an epoch (steps 1 and 5) -> 6 steps
    assert st["steps_measured"] == 6
    assert st["comm_timing"]["available"] is False
    last = st["epochs"][-1]["windows_ms"]
    for name in ("data_wait", "transfer", "forward", "backward", "optimizer", "remainder", "step"):
        assert last[name]["median"] is not None and last[name]["median"] >= 0.0, name  # the fetch was seen
    assert st["epochs"][-1]["step_ms_per_rank"]["slowest_rank"] == 0
    lines = [json.loads(x) for x in Path(st["trace_path"]).read_text().splitlines()]
    assert len(lines) == 8 * 7 - 2  # 7 figures per step, no remainder on the 2 first-of-epoch steps
    assert {x["callpath"] for x in lines} == {"train_step"} | {
        f"train_step->{n}" for n in ("data_wait", "transfer", "forward", "backward", "optimizer", "remainder")}
    for x in lines:  # Extra-P JSON lines: same parameters everywhere, a metric and a numeric value
        assert x["params"] == {"world_size": 1, "local_batch": 4} and x["metric"] == "time"
        assert isinstance(x["value"], float)
    steps = [x for x in lines if x["callpath"] == "train_step"]
    assert [x["step"] for x in steps] == list(range(8)) and [x["warmup"] for x in steps][:2] == [True, False]


def test_profiler_wrapper_removed_after_fit(full_run):
    assert full_run["trainer"].profiler is full_run["profiler_before"]
    assert isinstance(full_run["trainer"].profiler, PassThroughProfiler)


def test_throughput_arithmetic(full_run):
    th = full_run["record"]["summary"]["throughput"]
    for ep in th["epochs"]:
        assert ep["samples"] == 16
        assert ep["samples_per_s"] == pytest.approx(16 / ep["train_s"])
        assert 0 < ep["train_s"] <= ep["wall_s"] - ep["val_s"]  # training stretches only (issue 23)
        assert ep["flops_per_sample"] == 36.0
        assert ep["tflops_per_s_per_gpu"] == pytest.approx(36.0 * 16 / ep["train_s"] / 1e12)
        assert ep["mfu"] is None
        # the two throughputs, named apart: the epoch clock holds what the training loop leaves out
        assert ep["samples_per_s_epoch_clock"] == pytest.approx(16 / ep["wall_s"])
        assert ep["samples_per_s_epoch_clock"] < ep["samples_per_s"]
    assert th["total_wall_s"] == pytest.approx(sum(ep["wall_s"] for ep in th["epochs"]))
    assert th["samples_per_s_epoch_clock"] == pytest.approx(32 / th["total_wall_s"])
    assert "no dense peak for device 'cpu'" in th["mfu_reason"]
    assert th["epochs"][1]["step_latency_ms"]["n"] == 3  # epoch 1: 4 steps, first one after validation


def test_grad_norm_clip_fraction(full_run):
    gn = full_run["record"]["summary"]["grad_norm"]
    assert gn["steps"] == 8 and gn["nonfinite_steps"] == 0 and gn["clip_threshold"] == 0.05
    assert gn["clip_fraction"] == pytest.approx(gn["clipped_steps"] / 8)


def test_state_dict_round_trip_each_callback(full_run):
    for cb in full_run["cbs"]:
        sd = cb.state_dict()
        fresh = type(cb)()
        fresh.load_state_dict(json.loads(json.dumps(sd)))
        assert json.loads(json.dumps(fresh.state_dict())) == json.loads(json.dumps(sd)), type(cb).__name__


class NormSpy(Callback):
    """Independent total L2 norm of the gradients at on_before_optimizer_step (before clipping)."""

    def __init__(self):
        self.norms = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        g = torch.cat([p.grad.flatten() for p in pl_module.parameters() if p.grad is not None])
        self.norms.append(float(torch.linalg.vector_norm(g)))


def test_grad_norm_matches_independent_computation(tmp_path):
    torch.manual_seed(1)
    spy, gn = NormSpy(), GradNormCallback()
    trainer = make_trainer(tmp_path, [spy, gn], max_epochs=1, gradient_clip_val=0.02, gradient_clip_algorithm="norm",
                           log_every_n_steps=3)
    trainer.fit(ToyTask(lr=0.5))
    assert len(spy.norms) == 4 == gn.steps
    ep = gn.epochs[0]
    assert ep.grad_norm_median == pytest.approx(statistics.median(spy.norms), rel=1e-5)
    assert ep.grad_norm_max == pytest.approx(max(spy.norms), rel=1e-5)
    assert ep.clipped_steps == sum(n > 0.02 for n in spy.norms)
    tags = scalar_tags(trainer.log_dir)
    assert {"numerics/grad_norm", "numerics/grad_norm_max", "numerics/grad_clip_fraction"} <= tags


def test_resume_keeps_counts(tmp_path):
    torch.manual_seed(2)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)

    def group():
        return [StepTimingCallback(warmup_steps=0), GradNormCallback(), ThroughputCallback(warmup_steps=0),
                MemoryCallback()]

    first = group()
    make_trainer(tmp_path, [CallbackGroup(first), ckpt], max_epochs=1, enable_checkpointing=True).fit(ToyTask())
    second = group()
    trainer = make_trainer(tmp_path, [CallbackGroup(second)], max_epochs=2)
    trainer.fit(ToyTask(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    st, gn, th, mem = second
    assert st.steps_total == 8 and len(st.epochs) == 2
    assert gn.steps == 8 and [e.epoch for e in gn.epochs] == [0, 1]
    assert th.total_samples == 32 and len(th.epochs) == 2
    assert len(mem.epochs) == 2


def test_gradient_accumulation_counts_optimizer_steps(tmp_path):
    st, th = StepTimingCallback(warmup_steps=0), ThroughputCallback(warmup_steps=0)
    trainer = make_trainer(tmp_path, [st, th], max_epochs=1, accumulate_grad_batches=2)
    trainer.fit(ToyTask())
    assert st.steps_total == 2 and trainer.global_step == 2
    assert th.epochs[0].samples == 16
    assert th.epochs[0].step_latency_ms.n == 1  # 2 steps: the first has no predecessor


def test_mfu_with_peak_override(tmp_path):
    th = ThroughputCallback(peak_tflops=1e-6, warmup_steps=0)
    make_trainer(tmp_path, [th], max_epochs=1).fit(ToyTask())
    ep = th.epochs[0]
    assert ep.peak_tflops == 1e-6
    assert ep.mfu == pytest.approx(ep.tflops_per_s_per_gpu / 1e-6)


# ----------------------------------------------------------------------------- energy via fake NVML
class CountingNvml:
    """The energy counter advances 5000 mJ per read; power is a constant 312.5 W."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def __init__(self, counter_supported: bool = True):
        self.mj = 0
        self.counter_supported = counter_supported

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if not self.counter_supported:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        self.mj += 5000
        return self.mj

    def nvmlDeviceGetPowerUsage(self, h):
        return 312_500

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000


def _fake_open(nv):
    def open_device_for(device):
        return nvml.NvmlDevice(nv, ("dev", 0), "fake-uuid"), None

    return open_device_for


def test_energy_counter_path_with_fake_nvml(tmp_path, monkeypatch):
    nv = CountingNvml()
    monkeypatch.setattr(nvml, "open_device_for", _fake_open(nv))
    en = EnergyCallback(price_per_gpu_hour=2.0, currency="EUR")
    trainer = make_trainer(tmp_path, [en], log_every_n_steps=1000)
    trainer.fit(ToyTask())
    s = en.summary().to_json()
    assert s["available"] is True and s["method"] == "counter"
    # reads: probe (5 J), fit start (10), epoch 0 start/end (15/20), epoch 1 (25/30), fit end (35)
    assert [e["energy_j"] for e in s["epochs"]] == [5.0, 5.0]
    assert s["training"]["energy_j"] == 25.0
    assert s["total_energy_j"] == 10.0 and s["total_samples"] == 32
    assert s["j_per_sample"] == pytest.approx(10.0 / 32)
    ep = s["epochs"][0]
    assert ep["j_per_sample"] == pytest.approx(5.0 / 16)
    assert ep["avg_power_w"] == pytest.approx(5.0 / ep["seconds_per_rank"][0])
    assert ep["cost"] == pytest.approx(2.0 * ep["seconds_per_rank"][0] / 3600)
    dev = s["devices"][0]
    assert dev["name"] == "NVIDIA H200" and dev["power_limit_w"] == 700.0 and dev["uuid"] == "fake-uuid"
    assert {"energy/epoch_j", "energy/j_per_sample", "energy/epoch_cost"} <= scalar_tags(trainer.log_dir)


def test_energy_sampled_power_fallback(tmp_path, monkeypatch):
    nv = CountingNvml(counter_supported=False)
    monkeypatch.setattr(nvml, "open_device_for", _fake_open(nv))
    en = EnergyCallback(sample_interval_s=0.005)
    make_trainer(tmp_path, [en], max_epochs=1).fit(ToyTask())
    s = en.summary().to_json()
    assert s["method"] == "sampled-power"
    assert "counter_unavailable" in s["devices"][0]
    ep = s["epochs"][0]
    assert ep["energy_j"] == pytest.approx(312.5 * ep["seconds_per_rank"][0], rel=1e-9)
    assert en._sampler is None  # the sampling thread was stopped
    assert math.isfinite(s["total_energy_j"])


def test_trace_reads_with_the_extrap_jsonl_reader(tmp_path):
    st = StepTimingCallback(warmup_steps=0, trace_path="trace.jsonl")
    trainer = make_trainer(tmp_path, [st], max_epochs=1)
    trainer.fit(ToyTask())
    data = extrap.read_extrap_jsonl(Path(trainer.log_dir, "trace.jsonl"))
    assert data[("train_step", "time")].keys() == {1.0}  # parameter world_size = 1
    assert len(data[("train_step", "time")][1.0]) == 4  # one repetition per optimizer step
    assert len(data[("train_step->remainder", "time")][1.0]) == 3  # none for the epoch's first step
