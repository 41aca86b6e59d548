"""Global samples/s under DDP excludes what is not training (issue 23, item 2).

A 2-process gloo fit of the real network (small widths) on the bundled sample with a mid-epoch and an
end-of-epoch validation, a ModelCheckpoint that writes on rank 0 after each validation (its barrier makes
rank 1 wait), a rank 0 that sleeps ``SLOW_S`` in ``on_validation_end`` and ``on_train_epoch_end``, and a
DataLoader worker that sleeps ``SLOW_S`` at start-up. The test keeps its own clock in a probe callback
(``time.perf_counter`` at its own hooks, after the ThroughputCallback's, and its own barrier before the first
batch of a stretch): per rank, the epoch's wall time minus the time from the epoch start to the first batch
(worker start-up) and from each validation start to the next batch, both up to the moment every rank is
ready to train (a rank-0 epoch end that is slow makes rank 1 wait at its next all-reduce otherwise); the
global reference rate is the samples the probe saw on both ranks / the slower rank's training time. The
ThroughputCallback's global samples/s must be within 10 % of it. Before, ``train_s`` was epoch wall minus
validation and held the sleeps, the checkpoint write and the wait at its barrier (checked below: that
definition is off by more than 10 % in this run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
SLOW_S = 1.5
SMALL = dict(s2_dim=16, s2_depth=1, s2_heads=2, s1_dim=8, s1_depth=1, s1_heads=2, width=8, fpn_dim=16,
             head_dim=8, decoder_dim=8, hr_dim=4)


def _slow_worker_init(worker_id: int) -> None:
    from cropscale.data.datamodule import seed_worker

    time.sleep(SLOW_S)
    seed_worker(worker_id)


def _worker(out_dir: str, data_root: str) -> None:
    import warnings

    import torch
    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    from cropscale.callbacks import ThroughputCallback
    from cropscale.data.datamodule import PastisHDDataModule
    from cropscale.distributed import finish_distributed
    from cropscale.model.task import CropMappingTask

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    out = Path(out_dir)

    class SlowStart(PastisHDDataModule):
        def train_dataloader(self):
            loader = super().train_dataloader()
            loader.worker_init_fn = _slow_worker_init
            return loader

    class Clock(Callback):
        """The test's own clock: epoch wall minus worker start-up and validation-to-next-batch, per rank."""

        def __init__(self):
            self.train_s, self.samples, self._t0, self._gap_from = 0.0, 0, None, None

        def on_train_epoch_start(self, trainer, pl_module):
            self._t0 = self._gap_from = time.perf_counter()
            self._excluded = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self._gap_from is not None:  # training resumes once every rank is ready: the test's own barrier
                torch.distributed.barrier()
                self._excluded += time.perf_counter() - self._gap_from
                self._gap_from = None

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.samples += int(batch["s2"].shape[0])
            self._last_end = time.perf_counter()

        def on_validation_start(self, trainer, pl_module):
            if not trainer.sanity_checking:
                self._gap_from = self._last_end

        def on_train_epoch_end(self, trainer, pl_module):
            end = self._last_end if self._gap_from is None else self._gap_from  # validation at the epoch end
            self.train_s += (end - self._t0) - self._excluded

    class SlowRank0(Callback):
        def on_validation_end(self, trainer, pl_module):
            if trainer.global_rank == 0 and not trainer.sanity_checking:
                time.sleep(SLOW_S)

        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.global_rank == 0:
                time.sleep(SLOW_S)

    dm = SlowStart(data_root, batch_size=1, t2=4, t1=2, samples_per_patch=4, num_workers=1)
    task = CropMappingTask(num_classes=dm.num_classes, net_kwargs=SMALL, val_window=32, val_stride=32)
    clock, tp = Clock(), ThroughputCallback(warmup_steps=0)
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, val_check_interval=2,
                      limit_val_batches=1, num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(out),
                      callbacks=[tp, clock, SlowRank0(), ModelCheckpoint(dirpath=str(out / "ckpt"), save_last=True)])
    trainer.fit(task, datamodule=dm)
    rank = trainer.global_rank
    (out / f"clock{rank}.json").write_text(json.dumps({"train_s": clock.train_s, "samples": clock.samples}))
    if rank == 0:
        (out / "throughput.json").write_text(json.dumps(tp.summary().to_json()))
    finish_distributed(trainer)


@pytest.mark.slow
def test_global_samples_per_s_leaves_out_validation_checkpoints_waits_and_worker_start(tmp_path, flanders_root):
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run([sys.executable, str(HERE), str(tmp_path), str(flanders_root)], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    clocks = [json.loads((tmp_path / f"clock{r}.json").read_text()) for r in (0, 1)]
    th = json.loads((tmp_path / "throughput.json").read_text())
    samples = sum(c["samples"] for c in clocks)
    assert th["total_samples"] == samples
    reference = samples / max(c["train_s"] for c in clocks)
    measured = th["samples_per_s"]
    old = samples / sum(e["wall_s"] - e["val_s"] for e in th["epochs"])  # the old train_s: wall - validation
    print(f"\nglobal samples/s: ThroughputCallback {measured:.3f}, test clock {reference:.3f} "
          f"(samples {samples}, train_s per rank by the test {[round(c['train_s'], 3) for c in clocks]}, by the "
          f"callback {[e['train_s_per_rank'] for e in th['epochs']]}); old definition (wall - val) {old:.3f}")
    assert measured == pytest.approx(reference, rel=0.10)
    assert abs(old / reference - 1) > 0.10  # the injected delays are large enough to matter


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
