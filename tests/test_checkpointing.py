"""cropscale.checkpointing: atomic checkpoint writes (full disk, kill mid-write), ``last.ckpt`` always the latest
state, SIGTERM stops with a resumable checkpoint, ``--ckpt_path last`` resolution; cropscale.files'
writability check. Tiny Lightning modules on CPU; the CLI runs are in tests/integration/test_resilience.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader

from cropscale import CropScaleError, checkpointing
from cropscale.checkpointing import (
    AtomicCheckpointIO,
    ResumableCheckpoint,
    StopOnSigterm,
    TrainingState,
    completed_run,
    find_last_checkpoint,
    find_resume_state,
    launch_resume_command,
    resume_command,
    run_version,
)
from cropscale.files import check_writable_folder
from cropscale.testing.faults import FullDiskCheckpointIO
from tests.conftest import tmpfs_mount

REPO = Path(__file__).resolve().parents[1]


class Tiny(LightningModule):
    """A linear model on 12 fixed samples; logs ``score = -epoch`` (so epoch 0 is the best by ``max``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 1)
        g = torch.Generator().manual_seed(1)
        self.data = [torch.randn(4, generator=g) for _ in range(12)]

    def training_step(self, batch, batch_idx):
        return (self.lin(batch) ** 2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("score", -float(self.current_epoch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=3)

    def val_dataloader(self):
        return DataLoader(self.data[:3], batch_size=3)


def _trainer(tmp_path, epochs, callbacks=(), plugins=None):
    ckpt = ResumableCheckpoint(dirpath=tmp_path / "ckpt", monitor="score", mode="max", filename="best-{epoch}")
    return Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                   enable_model_summary=False, callbacks=[ckpt, *callbacks], plugins=plugins), ckpt


def _weights(path):
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def test_last_ckpt_is_the_final_state_when_the_best_epoch_is_earlier(tmp_path):
    trainer, _ = _trainer(tmp_path, 3)
    model = Tiny()
    trainer.fit(model)
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)
    assert (last["epoch"], last["global_step"]) == (2, 12)  # the final epoch (4 steps per epoch)
    for k, v in model.state_dict().items():
        assert torch.equal(last["state_dict"][k], v), k
    best = torch.load(tmp_path / "ckpt" / "best-epoch=0.ckpt", map_location="cpu", weights_only=False)
    assert best["epoch"] == 0  # the best epoch is still kept by score


def test_plain_model_checkpoint_keeps_last_at_the_best_epoch(tmp_path):
    """What Lightning 2.6's own ModelCheckpoint(save_last=True) does (why ResumableCheckpoint exists)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    cb = ModelCheckpoint(dirpath=tmp_path, monitor="score", mode="max", save_last=True)
    Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[cb]).fit(Tiny())
    assert torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=False)["epoch"] == 0


class SendSigterm(Callback):
    def __init__(self, epoch, batch):
        self.at = (epoch, batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (trainer.current_epoch, batch_idx) == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_saves_a_resumable_last_ckpt(tmp_path):
    """One process: the stop is at the signalled step, last.ckpt holds it and a resume runs to the end.

    (That the resumed run then equals the uninterrupted one needs the resumable training order of
    cropscale's data module: tests/integration/test_resilience.py.)"""
    stop = StopOnSigterm()
    trainer, ckpt = _trainer(tmp_path / "run", 3, callbacks=[SendSigterm(1, 1), stop])
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SIGTERMException):
        trainer.fit(Tiny())
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler is given back
    last = Path(ckpt.last_model_path)
    state = torch.load(last, map_location="cpu", weights_only=False)
    assert stop.stopped_at_step == state["global_step"] == 6  # epoch 1, batch 1: the 6th optimiser step
    for k, v in state["state_dict"].items():
        assert torch.isfinite(v).all(), k
    resumed_trainer = _trainer(tmp_path / "run", 3)[0]
    resumed_trainer.fit(Tiny(), ckpt_path=str(last))
    assert resumed_trainer.global_step == 12
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 12


def test_sigterm_waits_for_the_end_of_an_accumulation_window(tmp_path):
    stop = StopOnSigterm()
    trainer = Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, accumulate_grad_batches=3,
                      callbacks=[SendSigterm(0, 0), stop])
    with pytest.raises(SIGTERMException):
        trainer.fit(Tiny())
    assert stop.stopped_at_step == 1 and trainer.fit_loop.epoch_loop.batch_progress.current.completed == 2


def test_full_disk_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    first = {"state_dict": {"w": torch.arange(1000.0)}, "epoch": 0}
    io = FullDiskCheckpointIO(on_save=2)
    io.save_checkpoint(first, path)
    with pytest.raises(CropScaleError) as err:
        io.save_checkpoint({"state_dict": {"w": torch.zeros(1000)}, "epoch": 1}, path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "No space left on device" in message
    assert "the previous last.ckpt is unchanged" in message
    assert torch.equal(torch.load(path, weights_only=True)["state_dict"]["w"], first["state_dict"]["w"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # the partial temporary file is removed


def test_a_kill_in_the_middle_of_a_save_leaves_the_previous_checkpoint(tmp_path):
    script = (
        "import sys, torch\n"
        "from cropscale.testing.faults import KillDuringSave\n"
        "io = KillDuringSave(on_save=2, fraction=0.5)\n"
        "io.save_checkpoint({'w': torch.arange(100000.0), 'epoch': 0}, sys.argv[1])\n"
        "io.save_checkpoint({'w': torch.zeros(100000), 'epoch': 1}, sys.argv[1])\n"
    )
    path = tmp_path / "last.ckpt"
    proc = subprocess.run([sys.executable, "-c", script, str(path)], cwd=REPO, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["epoch"] == 0 and torch.equal(ckpt["w"], torch.arange(100000.0))
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "last.ckpt"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".last.ckpt.") and leftovers[0].endswith(".tmp")


def test_find_last_checkpoint_takes_the_newest_and_names_where_it_looked(tmp_path):
    runs = tmp_path / "runs"
    with pytest.raises(CropScaleError, match=rf"no last.ckpt under {runs}/default/version_\*/checkpoints/"):
        find_last_checkpoint(runs, "default")
    paths = []
    for version in (0, 3, 1):
        p = runs / "default" / f"version_{version}" / "checkpoints" / "last.ckpt"
        p.parent.mkdir(parents=True)
        p.write_bytes(b"x")
        paths.append(p)
    (runs / "default" / "version_7" / "checkpoints").mkdir(parents=True)  # a run that saved nothing yet
    now = time.time()
    for age, p in zip((30, 20, 10), paths, strict=True):  # version_1 is the newest by time
        os.utime(p, (now - age, now - age))
    assert find_last_checkpoint(runs, "default") == paths[2]
    os.utime(paths[0], (now, now))  # version_0 resumed later: its last.ckpt is now the latest state
    assert find_last_checkpoint(runs, "default") == paths[0]
    assert run_version(paths[1], runs, "default") == 3
    assert run_version(tmp_path / "elsewhere" / "last.ckpt", runs, "default") is None


def test_writable_folder_check(tmp_path):
    assert check_writable_folder(tmp_path / "a" / "b") == tmp_path / "a" / "b"  # created later: parent checked
    assert not (tmp_path / "a").exists()
    (tmp_path / "f").write_text("x")
    with pytest.raises(CropScaleError, match=f"run folder {tmp_path}/f/x cannot be created: {tmp_path}/f is a file"):
        check_writable_folder(tmp_path / "f" / "x", what="run folder")


@pytest.fixture
def read_only_mount(tmp_path):
    """A read-only tmpfs (root and mount(8) needed; skipped otherwise)."""
    with tmpfs_mount(tmp_path / "ro", "1m", "to make a read-only file system") as mnt:
        (mnt / "runs").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True, capture_output=True)
        yield mnt


def test_writable_folder_check_on_a_read_only_file_system(read_only_mount):
    assert os.access(read_only_mount / "runs", os.W_OK) is False or os.geteuid() == 0
    with pytest.raises(CropScaleError, match=f"run folder {read_only_mount}/runs/default is not writable .*"
                                             "Read-only file system"):
        check_writable_folder(read_only_mount / "runs" / "default", what="run folder")
    with pytest.raises(CropScaleError, match="Read-only file system.*no last.ckpt was written"):
        AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(3)}, read_only_mount / "runs" / "last.ckpt")


# ------------------------------------------------------------------------------- --ckpt_path auto resolution
def _state_file(path: Path, global_step: int, epochs_done: int) -> Path:
    """A checkpoint with Lightning's progress keys, written by hand (the numbers the resolution must read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {"w": torch.zeros(1)}, "global_step": global_step, "epoch": epochs_done,
                "pytorch-lightning_version": "2.6.0",
                "loops": {"fit_loop": {"epoch_progress": {"current": {"processed": epochs_done}}}}}, path)
    return path


def test_auto_resume_takes_this_runs_most_advanced_state_not_the_newest_file_or_name(tmp_path):
    runs = tmp_path / "runs"
    ck = runs / "default" / "version_0" / "checkpoints"
    ahead = _state_file(ck / "hpc_ckpt_1.ckpt", 7, 1)
    _state_file(ck / "hpc_ckpt_9.ckpt", 3, 0)  # the highest number, less progress
    time.sleep(0.01)
    _state_file(ck / "last.ckpt", 5, 1)  # the newest file, less progress
    _state_file(ck / "best-epoch00.ckpt", 9, 1)  # a best-by-metric file is not a latest state
    (ck / "hpc_ckpt_10.ckpt").write_bytes(b"truncated")  # unreadable: skipped
    _state_file(runs / "other" / "version_3" / "checkpoints" / "last.ckpt", 99, 9)  # another run's
    (runs / "default" / "version_1").mkdir()  # an attempt that failed before its first save
    state = find_resume_state(runs, "default")
    assert (state.path, state.global_step, state.epochs_done) == (ahead, 7, 1)
    assert find_resume_state(runs, "default", version=1) is None
    assert find_resume_state(runs, "nothing") is None


def test_a_run_is_complete_by_its_epochs_or_steps():
    state = TrainingState(Path("x.ckpt"), global_step=12, epoch=1, epochs_done=2)
    assert completed_run(state, 2, -1) == "2 of trainer.max_epochs=2 epochs done (global step 12)"
    assert completed_run(state, 3, -1) is None
    assert completed_run(state, 3, 12) == "global step 12 of trainer.max_steps=12"
    assert completed_run(TrainingState(Path("x.ckpt"), 11, 1, 1), 2, None) is None  # stopped inside epoch 1


def test_the_resume_command_replaces_any_ckpt_path_by_auto():
    assert resume_command(["fit", "--ckpt_path", "last", "--data.root=a b"]) == (
        "python -m cropscale fit '--data.root=a b' --ckpt_path auto")
    assert resume_command(["fit", "--ckpt_path=x.ckpt"]) == "python -m cropscale fit --ckpt_path auto"


def _stopped_trainer() -> SimpleNamespace:
    """What :func:`stop_line` reads of a Trainer that SIGTERM stopped at epoch 1, global step 5 (no checkpoint)."""
    return SimpleNamespace(callbacks=[], checkpoint_callbacks=[], current_epoch=1, global_step=5)


AGENT = ["/usr/bin/python3", "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--max-restarts=1",
         "-m", "cropscale", "fit", "--ckpt_path", "last", "--data.root=a b"]


def _launcher_env(monkeypatch, env: dict[str, str]) -> None:
    for name in [n for n in os.environ if n.startswith(("SLURM_", "TORCHELASTIC_"))]:
        monkeypatch.delenv(name)
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(("env", "expected"), [
    ({}, "resume with: python -m cropscale fit '--data.root=a b' --ckpt_path auto"),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"},
     "resume with (the job script's command, then sbatch it): srun python -m cropscale fit '--data.root=a b'"
     " --ckpt_path auto"),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"},
     "resume with (the job script's command, then sbatch it): python -m cropscale fit '--data.root=a b'"
     " --ckpt_path auto"),
])
def test_the_stop_line_gives_the_resume_command_of_the_launcher(monkeypatch, env, expected):
    _launcher_env(monkeypatch, env)
    line = checkpointing.stop_line(_stopped_trainer(), ["fit", "--ckpt_path", "last", "--data.root=a b"])
    assert line == ("cropscale: stopped by SIGTERM at epoch 1, global step 5; no checkpoint saved (no ModelCheckpoint"
                    f" with save_last); {expected}")


@pytest.mark.parametrize(("env", "parent", "expected"), [
    # one node: the agent's own command (the worker's parent), --ckpt_path auto at its end
    ({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, AGENT,
     ": python -m torch.distributed.run --nnodes=1 --nproc-per-node=2 --max-restarts=1 -m cropscale fit"
     " '--data.root=a b' --ckpt_path auto"),
    ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"},
     ["/opt/venv/bin/torchrun", "--nnodes=2", "--node-rank=0", "-m", "cropscale", "fit"],
     " (this node's torchrun command; every node reruns its own torchrun command so): torchrun --nnodes=2"
     " --node-rank=0 -m cropscale fit --ckpt_path auto"),
    ({}, [],  # the agent's command line not readable
     ": the same torchrun command, with the script arguments of python -m cropscale fit '--data.root=a b'"
     " --ckpt_path auto"),
])
def test_under_torchrun_the_resume_command_is_the_agents(monkeypatch, env, parent, expected):
    _launcher_env(monkeypatch, {"TORCHELASTIC_RUN_ID": "j", **env})
    assert launch_resume_command(["fit", "--ckpt_path", "last", "--data.root=a b"], parent_cmdline=parent) == expected


class SendSignal(Callback):
    def __init__(self, signum: int, epoch: int, batch: int) -> None:
        self.signum, self.at = signum, (epoch, batch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (trainer.current_epoch, batch_idx) == self.at:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGINT])
def test_sigusr1_and_ctrl_c_stop_with_a_resumable_checkpoint_like_sigterm(tmp_path, signum):
    stop = StopOnSigterm()
    trainer, ckpt = _trainer(tmp_path / "run", 3, callbacks=[SendSignal(signum, 1, 1), stop])
    previous = signal.getsignal(signum)
    with pytest.raises(SIGTERMException):
        trainer.fit(Tiny())
    assert signal.getsignal(signum) == previous
    state = torch.load(ckpt.last_model_path, map_location="cpu", weights_only=False)
    assert stop.stopped_at_step == state["global_step"] == 6 and stop.stopped_by == signal.Signals(signum).name


class Validations(Callback):
    def __init__(self) -> None:
        self.epochs: list[int] = []

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.epochs.append(trainer.current_epoch)


def test_a_signal_at_the_last_step_of_an_epoch_stops_after_its_validation(tmp_path):
    stop, seen = StopOnSigterm(), Validations()
    trainer, ckpt = _trainer(tmp_path / "run", 3, callbacks=[SendSignal(signal.SIGTERM, 1, 3), stop, seen])
    with pytest.raises(SIGTERMException):
        trainer.fit(Tiny())
    state = torch.load(ckpt.last_model_path, map_location="cpu", weights_only=False)
    assert stop.stopped_at_step == state["global_step"] == 8  # epoch 1's 4 steps done
    assert seen.epochs == [0, 1]  # epoch 1 validated before the stop
    resumed, again = _trainer(tmp_path / "run", 3)[0], Validations()
    resumed.callbacks.append(again)
    resumed.fit(Tiny(), ckpt_path=ckpt.last_model_path)
    assert again.epochs == [2] and resumed.global_step == 12
