"""Runs that hold through a kill: `python -m cropscale fit` on the bundled sample, 1 and 2 CPU processes (gloo).

- a SIGKILL in the middle of epoch 3, then ``--ckpt_path last``: the same final weights, per-epoch val/mIoU and
  scaling-callback counters as the uninterrupted run;
- SIGTERM in the middle of an epoch and at its last step: status 0, a resumable ``last.ckpt``, and the resumed
  run equal to the uninterrupted one (weights, per-epoch val/mIoU, per-epoch sample counts);
- a kill, a full disk (injected, and a real small tmpfs where this user may mount one) during a checkpoint
  write, and a read-only run folder: the previous checkpoint stays loadable and one line names the path;
- a DDP rank that raises or is SIGKILLed: every rank ends, the status is non-zero and the last line names the
  failed rank, its exit status and its error;
- ``last.ckpt`` is the final epoch's state, not the best epoch's;
- evaluation settings given on the command line apply to a checkpoint; architecture changes are refused.

Faults are injected from the run's own configuration (:mod:`cropscale.testing.faults`). ``make test-resilience``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from tests.conftest import tmpfs_mount
from tests.integration.test_cli import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*LeafSpec")]

REPO = Path(__file__).resolve().parents[2]
#: 2 training patches x 3 crops, batch 2: 3 batches per epoch on one process, 2 on two; 4 dates (fast)
SMALL = ["--data.samples_per_patch=3", "--data.batch_size=2", "--data.t2=4", "--data.t1=2",
         "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
DDP = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp"]


def _fit(cwd: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return run_cli(["fit", *args], cwd=cwd, timeout=timeout,
                   env_extra={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})


def _fail_at(epoch: int, batch: int, how: str, rank: int = 0) -> list[str]:
    return ["--trainer.callbacks+=cropscale.testing.faults.FailAt", f"--trainer.callbacks.epoch={epoch}",
            f"--trainer.callbacks.batch={batch}", f"--trainer.callbacks.rank={rank}", f"--trainer.callbacks.how={how}"]


def _ckpt(run: Path, name: str = "last.ckpt") -> dict:
    return torch.load(run / "checkpoints" / name, map_location="cpu", weights_only=False)


def _val_miou(run: Path) -> dict[int, float]:
    """val/mIoU by step from every TensorBoard event file of the run folder (the last write of a step wins)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values: dict[int, float] = {}
    for f in sorted(run.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        if "val/mIoU" in acc.Tags()["scalars"]:
            values.update({e.step: e.value for e in acc.Scalars("val/mIoU")})
    return values


def _counters(run: Path) -> dict:
    s = json.loads((run / "run.json").read_text())["summary"]
    return {
        "steps_total": s["step_timing"]["steps_total"],
        "samples": s["throughput"]["total_samples"],
        "samples_per_epoch": [(e["epoch"], e["samples"]) for e in s["throughput"]["epochs"]],
        "nonfinite": (s["nonfinite"]["nonfinite_batches_rank0"], s["nonfinite"]["skipped_steps_rank0"]),
        "grad_steps": (s["grad_norm"]["steps"], s["grad_norm"]["clipped_steps"], s["grad_norm"]["nonfinite_steps"]),
        "grad_per_epoch": [(e["epoch"], e["steps"], e["clipped_steps"]) for e in s["grad_norm"]["epochs"]],
    }


def _assert_same_run(a: Path, b: Path) -> None:
    ca, cb = _ckpt(a), _ckpt(b)
    assert (ca["epoch"], ca["global_step"]) == (cb["epoch"], cb["global_step"])
    diff = max(float((ca["state_dict"][k].float() - cb["state_dict"][k].float()).abs().max()) for k in ca["state_dict"])
    assert diff <= 1e-6, diff
    ma, mb = _val_miou(a), _val_miou(b)
    assert len(ma) == ca["epoch"] + 1 and ma == mb, (ma, mb)  # one val/mIoU per epoch, equal


def _last_line(res: subprocess.CompletedProcess) -> str:
    return res.stderr.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------------ exact resume
@pytest.mark.parametrize("devices", [1, 2])
def test_sigkill_in_epoch_3_then_resume_gives_the_uninterrupted_run(tmp_path, flanders_root, devices):
    args = ["--config", str(REPO / "configs/default.yaml"), "--config", str(REPO / "callbacks/scaling.yaml"),
            f"--data.root={flanders_root}", *SMALL, "--trainer.max_epochs=5", *(DDP if devices > 1 else [])]
    assert _fit(tmp_path / "u", *args).returncode == 0
    killed = _fit(tmp_path / "r", *args, *_fail_at(epoch=3, batch=1, how="sigkill"))
    assert killed.returncode == -9 or killed.returncode == 137, killed.stderr[-2000:]
    run = tmp_path / "r" / "runs" / "default" / "version_0"
    assert _ckpt(run)["epoch"] == 2  # last.ckpt: the end of epoch 2, whatever the best epoch
    resumed = _fit(tmp_path / "r", *args, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "r" / "runs" / "default").iterdir()) == ["version_0"]  # same folder
    uninterrupted = tmp_path / "u" / "runs" / "default" / "version_0"
    _assert_same_run(uninterrupted, run)
    assert _counters(run) == _counters(uninterrupted)


@pytest.mark.parametrize("devices,batch", [(1, 0), (2, 0), (1, 5)])
def test_sigterm_mid_epoch_saves_a_resumable_checkpoint_and_exits_cleanly(tmp_path, flanders_root, devices, batch):
    """SIGTERM at the first batch of epoch 2, or at its last (6 batches on one process): stop, save, resume.

    The resumed run equals the uninterrupted one: weights, one val/mIoU per epoch (the last-batch stop
    validates epoch 2 before it stops) and each epoch's sample count in run.json."""
    args = [f"--data.root={flanders_root}", *SMALL, "--data.samples_per_patch=6", "--trainer.max_epochs=4",
            *(DDP if devices > 1 else [])]
    assert _fit(tmp_path / "u", *args).returncode == 0
    stopped = _fit(tmp_path / "r", *args, *_fail_at(epoch=2, batch=batch, how="sigterm"))
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    run = tmp_path / "r" / "runs" / "default" / "version_0"
    ckpt = _ckpt(run)
    batches = 6 if devices == 1 else 3
    # one process stops at the signalled step, two one optimiser step later; at an epoch's last step, after it
    assert ckpt["global_step"] == 2 * batches + batch + (1 if devices == 1 else 2)
    assert _last_line(stopped).startswith(
        f"cropscale: stopped by SIGTERM at epoch 2, global step {ckpt['global_step']}; resumable checkpoint"
        " runs/default/version_0/checkpoints/last.ckpt; resume with: python -m cropscale fit ")
    assert _last_line(stopped).endswith(" --ckpt_path auto")
    assert "Traceback" not in stopped.stderr
    resumed = _fit(tmp_path / "r", *args, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_run(tmp_path / "u" / "runs" / "default" / "version_0", run)
    assert _counters(run) == _counters(tmp_path / "u" / "runs" / "default" / "version_0")


# ---------------------------------------------------------------------------------------- checkpoint writes
def _plugin_config(tmp_path: Path, cls: str, **init_args) -> str:
    path = tmp_path / f"{cls}.yaml"
    path.write_text(json.dumps({"trainer": {"plugins": [
        {"class_path": f"cropscale.testing.faults.{cls}", "init_args": init_args}]}}))
    return str(path)


def test_a_kill_during_a_checkpoint_write_then_resume(tmp_path, flanders_root):
    args = ["--config", str(REPO / "configs/default.yaml"), f"--data.root={flanders_root}", *SMALL,
            "--trainer.max_epochs=3"]
    # saves: epoch 0 best + last; the third is epoch 1's first write, killed half way
    killed = _fit(tmp_path, *args, "--config", _plugin_config(tmp_path, "KillDuringSave", on_save=3))
    assert killed.returncode in (-9, 137)
    run = tmp_path / "runs" / "default" / "version_0"
    assert _ckpt(run)["epoch"] == 0  # the previous complete last.ckpt
    assert list((run / "checkpoints").glob(".*.tmp"))  # the half-written temporary file, not a checkpoint
    resumed = _fit(tmp_path, *args, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _ckpt(run)["epoch"] == 2 and not list((run / "checkpoints").glob(".*.tmp"))


def test_a_full_disk_during_a_save_ends_with_one_line_and_the_previous_checkpoint(tmp_path, flanders_root):
    args = [f"--data.root={flanders_root}", *SMALL, "--trainer.max_epochs=3"]
    res = _fit(tmp_path, *args, "--config", _plugin_config(tmp_path, "FullDiskCheckpointIO", on_save=3))
    assert res.returncode == 2, res.stderr[-3000:]
    line = _last_line(res)
    assert line.startswith("cropscale: error: checkpoint not saved: cannot write runs/default/version_0/checkpoints/")
    # the third save is epoch 1's first: a new best-epoch01.ckpt, or last.ckpt when epoch 1 is not better
    assert "No space left on device (" in line and line.endswith(("is unchanged)", "was written)"))
    assert "Traceback" not in res.stderr
    assert _ckpt(tmp_path / "runs" / "default" / "version_0")["epoch"] == 0


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 40 MiB tmpfs: room for one checkpoint (23 MB) and the run's other files, not for a second one."""
    with tmpfs_mount(tmp_path / "disk", "40m", "for a real small file system") as mnt:
        yield mnt


def test_a_really_full_disk_and_a_read_only_folder(tmp_path, flanders_root, small_tmpfs):
    args = [f"--data.root={flanders_root}", *SMALL, "--trainer.max_epochs=3",
            f"--trainer.logger.init_args.save_dir={small_tmpfs}/runs"]
    res = _fit(tmp_path, *args)
    assert res.returncode == 2, res.stderr[-3000:]
    run = small_tmpfs / "runs" / "default" / "version_0"
    assert _last_line(res).startswith(f"cropscale: error: checkpoint not saved: cannot write {run}/checkpoints/")
    assert "No space left on device" in _last_line(res) and "Traceback" not in res.stderr
    first = _ckpt(run, "best-epoch00.ckpt")  # the one complete checkpoint is intact and loadable
    assert first["epoch"] == 0
    # the same folder, now read-only: refused before any training, the checkpoint untouched
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    res = _fit(tmp_path, *args, "--ckpt_path", str(run / "checkpoints" / "best-epoch00.ckpt"))
    assert res.returncode == 2
    assert _last_line(res).startswith(f"cropscale: error: run folder {run} is not writable")
    assert "Read-only file system" in _last_line(res) and "Epoch 0" not in res.stdout + res.stderr
    assert _ckpt(run, "best-epoch00.ckpt")["global_step"] == first["global_step"]


# -------------------------------------------------------------------------------------------- a failed rank
@pytest.mark.parametrize("how,rank", [("raise", 1), ("sigkill", 1), ("raise", 0)])
def test_a_failed_rank_ends_every_rank_with_one_last_line(tmp_path, flanders_root, how, rank):
    res = _fit(tmp_path, f"--data.root={flanders_root}", *SMALL, "--trainer.max_epochs=3", *DDP,
               *_fail_at(epoch=1, batch=0, how=how, rank=rank), timeout=600)
    assert res.returncode != 0
    line = _last_line(res)
    if rank == 1:
        status = "was killed by SIGKILL (exit status 137)" if how == "sigkill" else "exited with status 1"
        assert line.startswith("cropscale: error: DDP rank 1 (pid ") and status in line, line
        if how == "raise":
            assert line.endswith("RuntimeError: injected failure on rank 1 at epoch 1, batch 0")
    else:
        assert line == "cropscale: error: RuntimeError: injected failure on rank 0 at epoch 1, batch 0", line
    # no gloo traceback from the rank that did not fail: at most the failing rank's own traceback
    assert res.stderr.count("Traceback (most recent call last)") <= (1 if how == "raise" else 0)
    assert "pair.cc" not in res.stderr.replace(line, "") or rank == 1  # gloo's text only inside a one-line error
    assert _ckpt(tmp_path / "runs" / "default" / "version_0")["epoch"] == 0  # epoch 0's checkpoint intact
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert leftover == [], "a rank still runs"


# ------------------------------------------------------------------------------ last.ckpt and evaluation settings
class SaveFinalState(Callback):
    """Writes the LightningModule's weights at the end of fit to ``final.pt`` in the working directory."""

    def on_fit_end(self, trainer, pl_module):
        torch.save({k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}, "final.pt")


def test_after_the_default_fit_last_ckpt_is_the_final_epoch(tmp_path, flanders_root):
    """`make fit`'s configuration (configs/default.yaml, shortened to 3 epochs of 4 crops per patch)."""
    res = _fit(tmp_path, f"--data.root={flanders_root}", "--trainer.max_epochs=3", "--data.samples_per_patch=4",
               "--trainer.enable_progress_bar=false",
               "--trainer.callbacks+=tests.integration.test_resilience.SaveFinalState")
    assert res.returncode == 0, res.stderr[-3000:]
    last = _ckpt(tmp_path / "runs" / "default" / "version_0")
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert last["epoch"] == 2 and set(last["state_dict"]) == set(final)
    for k, v in final.items():
        assert torch.equal(last["state_dict"][k], v), k


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, flanders_root):
    cwd = tmp_path_factory.mktemp("ckpt")
    res = _fit(cwd, f"--data.root={flanders_root}", *SMALL, "--trainer.max_epochs=1")
    assert res.returncode == 0, res.stderr[-3000:]
    return cwd / "runs" / "default" / "version_0" / "checkpoints" / "last.ckpt"


def _evaluate(cwd: Path, ckpt: Path, *args: str) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return run_cli(["validate", f"--ckpt_path={ckpt}", *SMALL, *args], cwd=cwd,
                   env_extra={"OMP_NUM_THREADS": "1"})


def test_an_attempt_that_fails_before_restoring_keeps_the_run_json(checkpoint, flanders_root):
    """A resume attempt that fails at setup (as a torchrun restart that fails at gloo's connect) in the run's folder."""
    record = checkpoint.parent.parent / "run.json"
    before = json.loads(record.read_text())
    assert (before["status"], before["global_step"]) == ("finished", 3)  # 1 epoch of 3 batches
    res = _fit(checkpoint.parents[4], f"--data.root={flanders_root}", *SMALL, "--trainer.max_epochs=2",
               f"--ckpt_path={checkpoint}", "--trainer.callbacks+=cropscale.testing.faults.FailAt",
               "--trainer.callbacks.at_setup=true")
    assert res.returncode != 0 and "injected failure on rank 0 at setup" in _last_line(res), res.stderr[-2000:]
    assert json.loads(record.read_text()) == before


def test_evaluation_settings_on_the_command_line_apply_to_a_checkpoint(tmp_path, checkpoint, flanders_root):
    import yaml

    from cropscale.data.datamodule import PastisHDDataModule
    from cropscale.metrics import SegmentationMetrics
    from cropscale.model.task import CropMappingTask

    res = _evaluate(tmp_path, checkpoint, f"--data.root={flanders_root}", "--model.val_stride=32",
                    "--model.tile_batch_size=3")
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "runs" / "default" / "validate" / "version_0"
    hp = yaml.safe_load((run / "hparams.yaml").read_text())
    assert (hp["val_stride"], hp["tile_batch_size"], hp["val_window"]) == (32, 3, 32)  # the checkpoint has 16, 16
    # the logged val/mIoU is the one of stride 32, computed here without the CLI
    task = CropMappingTask.load_from_checkpoint(checkpoint, map_location="cpu", val_stride=32).eval()
    dm = PastisHDDataModule(str(flanders_root), t2=4, t1=2)
    dm.setup("validate")
    seg = SegmentationMetrics(dm.num_classes)
    with torch.no_grad():
        for batch in dm.val_dataloader():
            seg.update(task._tiled_forward(batch)["semantic"], batch["semantic"])
    assert _val_miou(run)[0] == pytest.approx(float(seg.compute()["mIoU"]), abs=1e-6)
    bad = _evaluate(tmp_path / "bad", checkpoint, f"--data.root={flanders_root}", "--model.val_stride=33")
    assert bad.returncode == 2 and _last_line(bad) == (
        "cropscale: error: model.val_stride=33 must be between 1 and model.val_window=32, or every pixel would not"
        " be covered by a tile")


def test_architecture_settings_that_cannot_apply_to_a_checkpoint_are_refused(tmp_path, checkpoint, flanders_root,
                                                                           pastis_mini_root):
    res = _evaluate(tmp_path / "w", checkpoint, f"--data.root={flanders_root}", "--model.net_kwargs={width: 32}")
    assert res.returncode == 2
    assert "net_kwargs.width=56, but this run asks for net_kwargs.width=32" in _last_line(res)
    res = _evaluate(tmp_path / "c", checkpoint, f"--data.root={pastis_mini_root}", "--data.train_folds=[2]",
                    "--data.val_folds=[1]", "--data.t2=3", "--data.t1=3")
    assert res.returncode == 2
    assert "model.num_classes=10, but this run asks for model.num_classes=20" in _last_line(res)
    res = _fit(tmp_path / "lr", f"--data.root={flanders_root}", *SMALL, "--trainer.max_epochs=2",
               f"--ckpt_path={checkpoint}", "--model.lr=0.01")
    assert res.returncode == 2 and "--model.lr=0.01 cannot apply when resuming" in _last_line(res)
    res = _fit(tmp_path / "sgd", f"--data.root={flanders_root}", *SMALL, "--trainer.max_epochs=2",
               f"--ckpt_path={checkpoint}", "--model.optimizer=sgd")
    assert res.returncode == 2 and "--model.optimizer=sgd cannot apply when resuming" in _last_line(res)


# ------------------------------------------------------------------------------------------- more ranks than patches
def test_three_processes_on_two_validation_patches(tmp_path, flanders_root, checkpoint):
    """The bundled sample's 2 validation patches on 3 gloo ranks: fit runs, and validate equals 1 process."""
    res = _fit(tmp_path / "fit", f"--data.root={flanders_root}", *SMALL, "--trainer.max_epochs=1",
               "--trainer.accelerator=cpu", "--trainer.devices=3", "--trainer.strategy=ddp")
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = []
    for devices in (1, 3):
        extra = ["--trainer.accelerator=cpu", f"--trainer.devices={devices}"]
        if devices > 1:
            extra.append("--trainer.strategy=ddp")
        res = _evaluate(tmp_path / f"v{devices}", checkpoint, f"--data.root={flanders_root}", *extra)
        assert res.returncode == 0, res.stderr[-3000:]
        metrics.append(_val_miou(tmp_path / f"v{devices}" / "runs" / "default" / "validate" / "version_0"))
    assert metrics[0] == metrics[1] and metrics[0]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-m", "slow", "-q"]))
