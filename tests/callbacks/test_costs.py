"""What the callbacks cost per step, counted (never timed): torch ops and device-to-host reads on ordinary and
log steps, from ``callback-bench --count``'s counter, for the default group under 32-true and 16-mixed with a
real GradScaler; the counter itself on a hand-made callback; the trace file after an exception at a log step;
the trace switch of ``configs/default.yaml``."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.plugins import MixedPrecision

from cropscale.bench import callback_counts as bench
from cropscale.bench.counts import HookCostCounter
from cropscale.callbacks import CallbackGroup, LossScaleCallback, StepTimingCallback
from cropscale.testing.toy import ToyTask, toy_batches

pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec"),
              pytest.mark.filterwarnings("ignore:The number of training batches")]



@pytest.fixture(scope="module", params=["32-true", "16-mixed"])
def counted(request, tmp_path_factory):
    torch.manual_seed(0)
    return bench.count_fit(request.param, steps=40, log_every=10, root=str(tmp_path_factory.mktemp("count")))


def test_ordinary_steps_run_no_torch_op_and_read_nothing(counted):
    assert counted["steps"]["ordinary"] >= 25 and counted["steps"]["log"] >= 3  # steps 11..40 counted
    group = counted["arms"]["CallbackGroup"]["ordinary"]
    assert group["max_torch_ops"] == 0 and group["max_reads"] == 0
    for name, kinds in counted["members"]["CallbackGroup"].items():
        assert kinds["ordinary"]["max_torch_ops"] == 0 and kinds["ordinary"]["max_reads"] == 0, name
    assert group["python_calls"] > 0  # the group did run: the counter saw its hooks


def test_a_log_step_reads_once_for_the_whole_group(counted):
    log = counted["arms"]["CallbackGroup"]["log"]
    assert log["max_reads"] == 1 and log["reads"] == 1.0  # one copy, on every log step
    per_member = {n: k["log"]["reads"] for n, k in counted["members"]["CallbackGroup"].items()}
    assert per_member["CallbackGroup"] == 1.0 and sum(per_member.values()) == 1.0  # the group's batch read


def test_log_step_calls_stay_at_or_below_lightnings_monitors(counted):
    """Python calls and C calls, each, at or below Lightning's three monitors' with DeviceStatsMonitor(cpu_stats=False)
    (the smaller reference: psutil's CPU stats are about 770 C calls a log step), in the same fit."""
    group, lightning = counted["arms"]["CallbackGroup"]["log"], counted["arms"][bench.LIGHTNING_NO_CPU_ARM]["log"]
    assert lightning["python_calls"] > 0 and lightning["c_calls"] > 0
    for figure in ("python_calls", "c_calls"):
        assert group[figure] <= lightning[figure], (figure, group[figure], lightning[figure])
    with_cpu = counted["arms"][bench.LIGHTNING_ARM]["log"]
    assert with_cpu["c_calls"] >= lightning["c_calls"]  # the same three, DeviceStatsMonitor's CPU stats on or off


class _Probe(Callback):
    """By hand: per step one Python call of a helper and one in-place add (1 C call, 1 torch op); at every
    third step one ``tolist()`` (1 C call, 1 read)."""

    def __init__(self):
        self.t = torch.zeros(3)
        self.n = 0  # optimizer steps (no trainer property: each read of one is a few Python calls)

    def on_train_batch_end(self, trainer, *args):
        self._add()
        self.n += 1
        if self.n % 3 == 0:
            self.t.tolist()

    def _add(self):
        self.t.add_(1)


def test_the_counter_matches_a_hand_counted_callback(tmp_path):
    probe = _Probe()
    counter = HookCostCounter({id(probe): "probe"}, {__file__})
    cut = bench.StepCounts(counter, skip=0)
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=9, max_epochs=1, logger=False, callbacks=[probe, cut],
                      log_every_n_steps=3, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path))
    with counter:
        trainer.fit(ToyTask(features=4), train_dataloaders=torch.utils.data.DataLoader(
            toy_batches(10, 1, 4), batch_size=None))
    ordinary = [r["probe"] for r in cut.steps["ordinary"]]
    log = [r["probe"] for r in cut.steps["log"]]
    assert len(ordinary) == 6 and len(log) == 3
    # (Python calls: hook + _add; C calls: add_; torch ops: add_; reads: none); log steps: + tolist
    assert set(ordinary) == {(2, 1, 1, 0)}
    assert set(log) == {(2, 2, 1, 1)}


class _Boom(Callback):
    def __init__(self, at):
        self.at = at

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.at:
            raise RuntimeError("killed at a log step")


def test_trace_is_complete_after_an_exception_at_a_log_step(tmp_path):
    st = StepTimingCallback(warmup_steps=0, trace_path="trace.jsonl")
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=20, max_epochs=1, logger=False,
                      callbacks=[CallbackGroup([st]), _Boom(6)], log_every_n_steps=3, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                      default_root_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="killed at a log step"):
        trainer.fit(ToyTask(features=4), train_dataloaders=torch.utils.data.DataLoader(
            toy_batches(21, 1, 4), batch_size=None))
    lines = [json.loads(x) for x in (tmp_path / "trace.jsonl").read_text().splitlines()]  # whole JSON lines only
    steps = sorted(x["step"] for x in lines if x["callpath"] == "train_step")
    assert steps == [0, 1, 2, 3, 4, 5]  # the trace numbers steps from 0: step 5 ends at global step 6
    assert all(x["value"] >= 0 for x in lines)


def test_loss_scale_under_a_fused_optimizer_reads_the_scalers_found_inf(tmp_path):
    """Fused AdamW unscales inside step(), so its step hook fires on skipped steps too: the skips come from
    the scaler's found_inf. Overflows at steps 3 and 7 with growth after 3 clean steps, by hand as in
    test_amp: 2 back-offs, 2 growths, final scale 1024."""
    torch.manual_seed(0)
    amp = LossScaleCallback()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)

    class Fused(ToyTask):
        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3, fused=True)

    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=10, callbacks=[amp],
                      plugins=[MixedPrecision("16-mixed", "cpu", scaler)], logger=False, log_every_n_steps=4,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=str(tmp_path))
    trainer.fit(Fused(n_train=40, overflow_steps={3, 7}))
    c = amp.counts
    assert (c["steps"], c["backoff_events"], c["skipped_steps"], c["growth_events"]) == (10, 2, 2, 2)
    assert amp.summary().final_scale == scaler.get_scale() == 1024.0


def test_the_trace_switch_of_the_default_config(tmp_path, flanders_root, monkeypatch):
    """configs/default.yaml writes the trace (it costs less than the rest of the group, docs/measuring.md);
    ``trace_path: null`` in a later config switches it off."""
    from cropscale.cli.main import DEFAULT_CONFIG, CropScaleCLI
    from cropscale.data.datamodule import PastisHDDataModule
    from cropscale.model.task import CropMappingTask

    monkeypatch.setattr(sys, "argv", ["cropscale"])

    def step_timing(*configs):
        args = ["--config", str(DEFAULT_CONFIG)] + [a for c in configs for a in ("--config", c)]
        args += [f"--data.root={flanders_root}", f"--trainer.logger.init_args.save_dir={tmp_path}"]
        cli = CropScaleCLI(CropMappingTask, PastisHDDataModule, run=False, args=args)
        (group,) = [c for c in cli.trainer.callbacks if isinstance(c, CallbackGroup)]
        return group.callbacks[0]

    assert step_timing().trace_path == "step_trace.rank{rank}.jsonl"
    off = tmp_path / "no_trace.yaml"
    off.write_text("trainer:\n  callbacks+:\n    - class_path: cropscale.callbacks.StepTimingCallback\n"
                   "      init_args:\n        trace_path: null\n")
    assert step_timing(str(off)).trace_path is None
