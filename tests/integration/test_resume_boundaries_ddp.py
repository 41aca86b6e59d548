"""StepTiming and Memory records across a resume at an epoch's last batch, with 2 gloo processes (issue 36).

Lightning 2.6 resumed from the checkpoint at epoch 0's last batch end runs epoch 1 without epoch 0's
``on_train_epoch_end``: ``on_train_start`` closes epoch 0's record there, with a gather over the ranks that every rank
must join (every rank loads the same state, rank 0's). Toy task, 24 samples in batches of 4: 3 batches per rank and
epoch. The first run (1 epoch, a checkpoint after each step) and the resumed one (from ``epoch=0-step=3``, 2 epochs)
are each a subprocess running this file (Lightning's launcher starts the second rank from the same command line).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()


def _worker(out_dir: str, phase: str) -> None:
    import warnings

    import torch
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    from cropscale.callbacks import MemoryCallback, StepTimingCallback
    from cropscale.distributed import finish_distributed
    from cropscale.testing.toy import ToyTask

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    st, mem = StepTimingCallback(warmup_steps=0), MemoryCallback()
    first = phase == "first"
    cbs: list = [st, mem]
    if first:
        cbs.append(ModelCheckpoint(dirpath=f"{out_dir}/ckpt", every_n_train_steps=1, save_top_k=-1,
                                   filename="{epoch}-{step}"))
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1 if first else 2, callbacks=cbs,
                      logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=first,
                      num_sanity_val_steps=0)
    trainer.fit(ToyTask(n_train=24, batch_size=4), ckpt_path=None if first else f"{out_dir}/ckpt/epoch=0-step=3.ckpt")
    result = {"step_timing": [e.to_json() for e in st.epochs], "memory": [e.to_json() for e in mem.epochs]}
    Path(out_dir, f"{phase}.rank{trainer.global_rank}.json").write_text(json.dumps(result))
    assert finish_distributed(trainer) == []


def _run(out: Path, phase: str) -> list[dict]:
    path = os.pathsep.join(filter(None, [str(HERE.parents[2]), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", PYTHONPATH=path)
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run([sys.executable, str(HERE), str(out), phase], cwd=str(out), env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"{phase}.rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp_resume")
    return _run(out, "first"), _run(out, "resumed")


@pytest.mark.slow
def test_step_timing_closes_the_resumed_epoch_on_every_rank_with_rank_0s_saved_steps(runs):
    first, resumed = runs
    for rank in (0, 1):  # both ranks joined the gather of the close: the same records on both
        assert [e["epoch"] for e in resumed[rank]["step_timing"]] == [0, 1]
    before, after = first[0]["step_timing"][0], resumed[0]["step_timing"][0]
    # by hand: 3 steps per rank in epoch 0, the first left out; all before the checkpoint, saved by rank 0
    assert before["steps_measured"] == after["steps_measured"] == 2
    # rank 0's raw step times restored: the same median and p95 as the epoch's record in the first run
    assert after["windows_ms"] == before["windows_ms"]
    assert after["step_ms_per_rank"]["per_rank"] == [before["step_ms_per_rank"]["per_rank"][0], None]
    assert resumed[0]["step_timing"][1]["steps_measured"] == 2
    assert all(v is not None for v in resumed[0]["step_timing"][1]["step_ms_per_rank"]["per_rank"])


@pytest.mark.slow
def test_memory_closes_the_resumed_epoch_on_every_rank_with_rank_0s_saved_figures(runs):
    _, resumed = runs
    for rank in (0, 1):
        assert [e["epoch"] for e in resumed[rank]["memory"]] == [0, 1]
    epoch0, epoch1 = resumed[0]["memory"]
    rss0 = epoch0["per_rank"]["host_rss_gib"]
    assert rss0[0] is not None and rss0[0] > 0 and rss0[1] is None  # rank 1's figures were not in the checkpoint
    assert all(v is not None and v > 0 for v in epoch1["per_rank"]["host_rss_gib"])


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
