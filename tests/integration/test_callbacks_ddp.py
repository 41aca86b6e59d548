"""Two-process CPU DDP (gloo) run of every scaling callback, launched as a subprocess running this file
(Lightning's subprocess launcher starts the second rank from the same command line).

What it shows (issue 12): with ``accumulate_grad_batches=2`` and NaN in one sample that only rank 1
sees (each rank reads its own 16 samples: no distributed sampler) -> both ranks skip the same optimizer
step (flag all-reduced), training finishes on both ranks without a hang, the skipped steps leave the
parameters untouched on both ranks, rank 1's record names the micro-batch and the bad sample (patch id
and crop); the gradient all-reduce is timed by the comm hook under gloo; per-rank figures are gathered
at epoch end; ``run.json`` lists both ranks' devices and all ranks' non-finite records.
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
ACC = 2  # accumulate_grad_batches
NAN_ID = 1021  # rank 1's sample 5: micro-batch 2 (ids 1020, 1021) = index 0 of optimizer step 2 of each epoch
NAN_YX = [8, 8]  # crop_yx of sample 5: [8 (5 % 4), 8 (5 // 4)]
PEAK_TFLOPS = 1e-9  # ThroughputCallback(peak_tflops=...): the toy's TFLOP/s per process are of this order


def _worker(out_dir: str) -> None:
    import warnings

    import torch
    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.loggers import TensorBoardLogger

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
    from cropscale.distributed import finish_distributed
    from cropscale.testing.toy import ToyDataset, ToyTask

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)

    class ParamSpy(Callback):
        """Per optimizer step (ACC micro-batches): its sample ids and whether it changed the parameters."""

        def __init__(self):
            self.changed = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx % ACC == 0:
                self._before = [p.detach().clone() for p in pl_module.parameters()]
                self._ids = []
            self._ids += batch["patch_id"].tolist()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx % ACC == ACC - 1:
                after = list(pl_module.parameters())
                self.changed.append({"ids": self._ids, "changed": not all(
                    torch.equal(a, b.detach()) for a, b in zip(self._before, after, strict=True))})

    class RankTask(ToyTask):
        """Rank r reads its own samples, patch ids 1000 + 16 r .. 1015 + 16 r; only rank 1 holds the NaN one."""

        def train_dataloader(self):
            rank = self.trainer.global_rank
            ds = ToyDataset(16, t=1, c=self.lin.in_features, first_id=1000 + 16 * rank,
                            nan_patch_ids={NAN_ID} if rank == 1 else ())
            return torch.utils.data.DataLoader(ds, batch_size=2)

    # a peak for the CPU run (the table has none for CPUs), so that MFU is computed and checked here too
    st, th = StepTimingCallback(warmup_steps=1), ThroughputCallback(warmup_steps=1, peak_tflops=PEAK_TFLOPS)
    nf, gn, mem = NonFiniteCallback(policy="skip"), GradNormCallback(), MemoryCallback()
    group = CallbackGroup([st, th, LossScaleCallback(), nf, gn, EnergyCallback(), mem, ProvenanceCallback()])
    spy = ParamSpy()
    trainer = Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, callbacks=[group, spy],
        logger=TensorBoardLogger(out_dir, name="ddp", version=0), log_every_n_steps=2,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        num_sanity_val_steps=0, accumulate_grad_batches=ACC, use_distributed_sampler=False,
    )
    task = RankTask(optimizer="adamw", weight_decay=0.5, lr=0.05)
    trainer.fit(task)
    result = {
        "rank": trainer.global_rank,
        "global_step": trainer.global_step,
        "spy": spy.changed,
        "params": [p.detach().double().sum().item() for p in task.parameters()],
        "adam_steps": [int(trainer.optimizers[0].state[p]["step"]) for p in task.parameters()],
        "nonfinite": {"batches": nf.nonfinite_batches, "skipped": nf.skipped_steps,
                      "records": [r.to_json() for r in nf.records]},
        "step_timing": st.summary().to_json(),
        "throughput": [e.to_json() for e in th.epochs],
        "grad_norm": gn.summary().to_json(),
        "memory": [e.to_json() for e in mem.epochs],
        "log_dir": trainer.log_dir,
    }
    Path(out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(result))
    # as cropscale's CLI does: destroy the gloo group (left to interpreter exit it can abort) and let rank 0
    # return only after rank 1 has written its file and exited 0
    assert finish_distributed(trainer) == []


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    # this checkout's package first (an editable install may point at another checkout)
    path = os.pathsep.join(filter(None, [str(HERE.parents[2]), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", PYTHONPATH=path)
    env.pop("LOCAL_RANK", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE), str(out)], cwd=str(out), env=env, capture_output=True,
                          text=True, timeout=300)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    record = json.loads(Path(ranks[0]["log_dir"], "run.json").read_text())
    return {"ranks": ranks, "record": record, "elapsed": elapsed}


def _bad_steps(rank_result):
    """Optimizer steps (0-based, as the records number them) whose micro-batches on this rank held the NaN sample."""
    return [i for i, s in enumerate(rank_result["spy"]) if NAN_ID in s["ids"]]


def test_skip_is_consistent_across_ranks(ddp_run):
    r0, r1 = ddp_run["ranks"]
    assert r0["global_step"] == r1["global_step"] == 8  # both ranks finished: no hang (2 epochs x 4 steps)
    assert _bad_steps(r0) == [] and _bad_steps(r1) == [1, 5]  # only rank 1 ever saw the NaN sample
    for r in (r0, r1):  # the same steps skipped on both ranks, parameters untouched there
        assert r["nonfinite"]["skipped"] == 2
        assert [not s["changed"] for s in r["spy"]] == [i in (1, 5) for i in range(8)]
        assert r["adam_steps"] == [6, 6]
    assert r0["params"] == r1["params"]  # replicas stayed identical
    assert r0["nonfinite"]["records"] == []  # rank 0's losses were finite: rank 1 owns the record
    recs = r1["nonfinite"]["records"]
    assert [rec["global_step"] for rec in recs] == [1, 5]
    for rec in recs:
        assert (rec["rank"], rec["micro_batch"], rec["batch_idx"]) == (1, 0, 2)
        assert rec["patch_id"] == [1020, NAN_ID] and rec["crop_yx"] == [[0, 8], NAN_YX]
        assert rec["nonfinite_input_patch_id"] == [NAN_ID] and rec["nonfinite_input_crop_yx"] == [NAN_YX]
        assert rec["loss_finite"] is False and rec["input_finite"] is False and rec["grads_finite"] is False


def test_run_json_gathers_both_ranks(ddp_run):
    rec = ddp_run["record"]
    assert rec["status"] == "finished" and rec["distributed"]["world_size"] == 2
    assert [d["global_rank"] for d in rec["devices"]] == [0, 1]
    nf = rec["summary"]["nonfinite"]
    assert [(r["rank"], r["global_step"], r["patch_id"]) for r in nf["records"]] == [
        (1, 1, [1020, NAN_ID]), (1, 5, [1020, NAN_ID])]
    assert nf["per_rank"] == [{"nonfinite_batches": 0, "skipped_steps": 2},
                              {"nonfinite_batches": 2, "skipped_steps": 2}]
    assert rec["summary"]["energy"]["available"] is False


def test_comm_hook_times_the_allreduce_under_gloo(ddp_run):
    st = ddp_run["ranks"][0]["step_timing"]
    assert st["comm_timing"] == {"available": True, "backend": "gloo", "clock": "perf_counter"}
    last = st["epochs"][-1]
    assert last["windows_ms"]["comm"]["median"] > 0.0
    assert 0.0 <= last["windows_ms"]["comm_exposed"]["median"] <= last["windows_ms"]["backward"]["p95"]
    assert len(last["step_ms_per_rank"]["per_rank"]) == 2
    per_rank = last["step_ms_per_rank"]["per_rank"]
    assert last["step_ms_per_rank"]["slowest_rank"] == max(range(2), key=lambda r: per_rank[r])
    assert last["step_ms_per_rank"]["max"] == max(per_rank)


def test_per_rank_gathers(ddp_run):
    r0 = ddp_run["ranks"][0]
    for ep in r0["throughput"]:
        assert ep["samples_per_rank"] == [16, 16] and ep["samples"] == 32
        assert ep["samples_per_s"] == pytest.approx(32 / max(ep["train_s_per_rank"]))
        # TFLOP/s per GPU: FLOPs of the 32 samples (the toy task's 6 features: 6 x 6 = 36 per sample) over the
        # slowest rank's seconds, divided by the world size 2; MFU: that over the peak of one GPU
        flops = 36.0
        assert ep["flops_per_sample"] == flops
        assert ep["tflops_per_s_per_gpu"] == pytest.approx(flops * 32 / max(ep["train_s_per_rank"]) / 2 / 1e12)
        assert ep["peak_tflops"] == PEAK_TFLOPS
        assert ep["mfu"] == pytest.approx(ep["tflops_per_s_per_gpu"] / PEAK_TFLOPS)
    assert len(r0["memory"][0]["per_rank"]["host_rss_gib"]) == 2
    assert r0["grad_norm"]["steps"] == 8 and r0["grad_norm"]["nonfinite_steps"] == 2


if __name__ == "__main__":
    _worker(sys.argv[1])
