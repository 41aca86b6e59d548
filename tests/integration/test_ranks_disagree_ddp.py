"""Two gloo processes whose ranks disagree, where only a run can show how the callbacks combine them (slow).

Rank 0 trains on batches of 4 samples, rank 1 on batches of 2 (the same 8 steps); rank 1's training loss is
non-finite from optimizer step 3 on (its value only: the gradients stay finite), rank 0's never is. What the run must
show (issues 36, 37):

- the divergence decision is "any rank" and taken together: both ranks reach the same verdict and stop at the same
  step, though rank 0's own losses are finite (an "every rank" rule would train on; a rank stopping alone would hang
  the other);
- samples are summed over ranks (4 + 2 per step), not averaged or taken from rank 0; samples/s is that sum over
  the slowest rank's training seconds;
- the gradient norm is the global one: under DDP both ranks read the all-reduced gradients at
  ``on_before_optimizer_step``, so their norms agree although their batches differ;
- TrainedCallback counts changed parameter tensors over ranks (replicas: twice the tensors).

The unit tests of the same combinations with fake collectives: tests/callbacks/test_dist.py,
test_throughput_ranks.py, test_divergence.py, test_trained_hooks.py. Launched as a subprocess running this
file (Lightning's subprocess launcher starts the second rank from the same command line); about 10-30 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
STEPS = 8
WINDOW = 2  # DivergenceCallback window: rank 1's losses of steps 3 and 4 -> stop at global step 5
BAD_FROM = 3  # rank 1's loss is NaN from this global step on


def _worker(out_dir: str) -> None:
    import warnings

    import torch
    from lightning.pytorch import Trainer

    from cropscale.callbacks import DivergenceCallback, GradNormCallback, ThroughputCallback, TrainedCallback
    from cropscale.distributed import finish_distributed
    from cropscale.testing.toy import ToyDataset, ToyTask

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)

    class RankTask(ToyTask):
        """Rank r: batches of 4 / (r + 1) of its own samples; rank 1's loss is NaN from BAD_FROM on.

        The NaN is added as a constant: the loss's value is NaN, its gradient (that of the finite loss) is not, so
        the weights and the other callbacks' figures stay finite on both ranks and only the divergence rule sees it.
        """

        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            if self.trainer.global_rank == 1 and self.global_step >= BAD_FROM:
                loss = loss + torch.tensor(float("nan"))
            return loss

        def train_dataloader(self):
            rank = self.trainer.global_rank
            batch = 4 // (rank + 1)
            ds = ToyDataset(STEPS * batch, t=1, c=self.lin.in_features, seed=rank, first_id=1000 * (rank + 1))
            return torch.utils.data.DataLoader(ds, batch_size=batch)

    div = DivergenceCallback(window=WINDOW)
    th, gn, tr = ThroughputCallback(warmup_steps=0), GradNormCallback(), TrainedCallback()
    trainer = Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, callbacks=[div, th, gn, tr], logger=False,
        log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        num_sanity_val_steps=0, limit_val_batches=0, use_distributed_sampler=False,
    )
    task = RankTask(optimizer="sgd", lr=0.05)
    trainer.fit(task)
    result = {
        "rank": trainer.global_rank,
        "global_step": trainer.global_step,
        "stopped_at_step": div.stopped_at_step,
        "verdict_diverged": div.diverged,
        "throughput": [e.to_json() for e in th.epochs],
        "grad_norm": gn.summary().to_json(),
        "trained": tr.summary().to_json(),
        "tensors": len(list(task.parameters())),
    }
    Path(out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(result))
    assert finish_distributed(trainer) == []


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp_disagree")
    # this checkout's package first (an editable install may point at another checkout)
    path = os.pathsep.join(filter(None, [str(HERE.parents[2]), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", PYTHONPATH=path)
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run([sys.executable, str(HERE), str(out)], cwd=str(out), env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_any_rank_diverged_stops_every_rank_at_the_same_step(ranks):
    r0, r1 = ranks
    # rank 1's window of WINDOW non-finite losses is full at step BAD_FROM + WINDOW - 1 (the callback sees it in
    # on_train_batch_end, after the optimizer step: global_step = BAD_FROM + WINDOW there)
    stop = BAD_FROM + WINDOW
    assert r0["verdict_diverged"] is r1["verdict_diverged"] is True  # rank 0's finite losses do not outvote rank 1
    assert r0["stopped_at_step"] == r1["stopped_at_step"] == stop  # and stop together (no hang, no rank alone)
    assert r0["global_step"] == r1["global_step"] == stop < STEPS


@pytest.mark.slow
def test_samples_are_summed_over_ranks_and_rates_use_the_slowest_rank(ranks):
    r0, r1 = ranks
    stop = BAD_FROM + WINDOW
    for r in (r0, r1):  # every rank holds the gathered figures
        (ep,) = r["throughput"]
        assert ep["samples_per_rank"] == [4 * stop, 2 * stop] and ep["samples"] == 6 * stop
        assert ep["samples_per_s"] == pytest.approx(6 * stop / max(ep["train_s_per_rank"]))
        assert ep["samples_per_s_per_rank"] == [pytest.approx(n / t) for n, t in
                                                zip(ep["samples_per_rank"], ep["train_s_per_rank"], strict=True)]
    gathered = ("samples", "samples_per_rank", "samples_per_s", "train_s_per_rank", "wall_s")
    assert [r0["throughput"][0][k] for k in gathered] == [r1["throughput"][0][k] for k in gathered]


@pytest.mark.slow
def test_the_gradient_norm_is_the_all_reduced_one_on_both_ranks(ranks):
    r0, r1 = ranks
    g0, g1 = r0["grad_norm"], r1["grad_norm"]
    assert g0["steps"] == g1["steps"] == BAD_FROM + WINDOW and g0["nonfinite_steps"] == 0
    (e0,), (e1,) = g0["epochs"], g1["epochs"]
    # different batches on the two ranks, one averaged gradient: the same norms (a local norm would differ)
    assert (e0["grad_norm_median"], e0["grad_norm_max"]) == pytest.approx((e1["grad_norm_median"],
                                                                            e1["grad_norm_max"]), rel=1e-6)


@pytest.mark.slow
def test_changed_tensors_are_counted_over_ranks(ranks):
    for r in ranks:
        t = r["trained"]
        assert t["weights_changed"] is True and t["parameters"] == r["tensors"] == 2  # weight and bias
        assert t["parameters_changed"] == 2 * r["tensors"]  # both tensors on both replicas (docs/run_json.md)
        assert t["optimizer_steps"] == BAD_FROM + WINDOW


if __name__ == "__main__":
    _worker(sys.argv[1])
