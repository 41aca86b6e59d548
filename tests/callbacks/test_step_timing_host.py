"""Issue 24, item 6: the data wait and transfer on the host clock (``data_wait_host``, ``transfer_host``) beside
the run clock's windows, named apart in run.json. On a CPU run both are host times of the same fetch."""

from __future__ import annotations

import time

import torch
from lightning.pytorch import Trainer

from cropscale.callbacks import StepTimingCallback
from cropscale.callbacks.step_timing import HOST_FIGURES
from cropscale.testing.toy import ToyTask, toy_batches

SLEEP_S = 0.02


class _SlowBatches(torch.utils.data.IterableDataset):
    """Ready-made toy batches, each handed out after ``time.sleep(SLEEP_S)``: a known data wait."""

    def __init__(self, n: int) -> None:
        self.batches = toy_batches(n, batch=2, features=6)

    def __iter__(self):
        for b in self.batches:
            time.sleep(SLEEP_S)
            yield b


def test_host_data_wait_is_the_loaders_sleep_and_equals_the_cpu_window(tmp_path):
    torch.manual_seed(0)
    cb = StepTimingCallback(warmup_steps=1)
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[cb], logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=str(tmp_path))
    loader = torch.utils.data.DataLoader(_SlowBatches(10), batch_size=None)
    trainer.fit(ToyTask(features=6), train_dataloaders=loader)
    epoch = cb.summary().epochs[-1]
    assert set(epoch.host_windows_ms) == set(HOST_FIGURES) == {"data_wait_host", "transfer_host"}
    host_wait, wait = epoch.host_windows_ms["data_wait_host"], epoch.windows_ms["data_wait"]
    assert host_wait.n == epoch.steps_measured == 9  # 10 steps less the first (warm-up and first of the epoch)
    # the clock outside the code: time.sleep(0.02) inside every fetch; the host window holds it, and not much more
    assert SLEEP_S * 1e3 <= host_wait.median < SLEEP_S * 1e3 + 50.0
    # on a CPU run the run clock is the host's: the two windows time the same fetch (marks taken back to back)
    assert abs(host_wait.median - wait.median) < 0.5
    transfer_host, transfer = epoch.host_windows_ms["transfer_host"], epoch.windows_ms["transfer"]
    assert 0.0 <= transfer_host.median < 5.0 and abs(transfer_host.median - transfer.median) < 0.5
    as_json = epoch.to_json()
    assert "data_wait_host" in as_json["host_windows_ms"] and "data_wait_host" not in as_json["windows_ms"]


def test_report_rule_takes_the_median_over_measured_epochs_and_is_empty_for_older_runs():
    from cropscale.runs import rules
    from cropscale.runs.schema import RunSummary

    def epoch(i, wait, transfer):
        return {"epoch": i, "windows_ms": {}, "host_windows_ms": {
            "data_wait_host": {"median": wait, "p95": wait, "n": 3},
            "transfer_host": {"median": transfer, "p95": transfer, "n": 3}}}

    summary = RunSummary.from_json({"step_timing": {"epochs": [epoch(0, 100.0, 9.0), epoch(1, 2.0, 1.0),
                                                                epoch(2, 4.0, 3.0)]}})
    # epoch 0 is the warm-up epoch here: the medians of epochs 1 and 2, by hand (2 + 4) / 2 and (1 + 3) / 2
    assert rules.host_windows(summary, warmup_epochs=1) == {"data_wait_host": 3.0, "transfer_host": 2.0}
    older = RunSummary.from_json({"step_timing": {"epochs": [{"epoch": 1, "windows_ms": {}}]}})
    assert rules.host_windows(older, warmup_epochs=0) == {}
