"""cropscale.checkpointing at the points a mutation run found untested (issue 36, sample s5): the non-finite count's
device and single-parameter models, remote paths of the atomic writer, which stage and rank clears a kill's
leftovers, the Ctrl-C message, the all-reduced stop decision, what a state file's progress is read from and how it
is read, the torchrun agent's command, the SLURM requeue and the stop line. Fake trainers and hand-driven hooks;
the runs that exercise the same code are in tests/integration/test_resilience.py and test_launchers.py."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import fsspec
import pytest
import torch
import torch.distributed as dist
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from cropscale.checkpointing import (
    AtomicCheckpointIO,
    ResumableCheckpoint,
    StopOnSignal,
    launch_resume_command,
    nonfinite_parameters,
    requeue_slurm_job,
    stop_line,
    training_state,
)
from tests.test_checkpointing import SendSigterm, Tiny, _launcher_env

SCRIPT = ["fit", "--data.root=a b"]


# ------------------------------------------------------------------------------------------ nonfinite_parameters
class _Summing:
    """A strategy stand-in: the other ranks add ``others`` non-finite tensors; records the device it was given."""

    def __init__(self, others: int) -> None:
        self.others, self.devices = others, []

    def reduce(self, tensor, reduce_op):
        self.devices.append(tensor.device)
        own = 0.0 if tensor.is_meta else float(tensor)  # a meta tensor holds no value: nothing to add there
        return torch.tensor(own + self.others)


def test_a_model_with_one_parameter_tensor_is_counted():
    lin = torch.nn.Linear(3, 1, bias=False)  # one tensor: params[0] is the only one
    assert nonfinite_parameters(SimpleNamespace(world_size=1), lin) == (0, 1)
    with torch.no_grad():
        lin.weight[0, 2] = float("inf")
    assert nonfinite_parameters(SimpleNamespace(world_size=1), lin) == (1, 1)
    strategy = _Summing(others=2)  # two bad tensors on the other ranks
    assert nonfinite_parameters(SimpleNamespace(world_size=3, strategy=strategy), lin) == (3, 1)


def test_a_model_of_empty_tensors_sends_its_zero_count_from_the_models_device():
    """No tensor to check: the count handed to the all-reduce is still on the module's device (NCCL wants it there)."""
    module = torch.nn.Module()
    module.a = torch.nn.Parameter(torch.empty(0, device="meta"))
    module.b = torch.nn.Parameter(torch.empty(0, 4, device="meta"))
    strategy = _Summing(others=1)
    assert nonfinite_parameters(SimpleNamespace(world_size=2, strategy=strategy), module) == (1, 2)
    assert strategy.devices == [torch.device("meta")]


# ------------------------------------------------------------------------------------------- AtomicCheckpointIO
def test_a_remote_path_goes_to_lightnings_writer_with_the_checkpoint(tmp_path, monkeypatch):
    """``memory://`` (an fsspec file system) is written there, not as a local file named ``memory:/...``."""
    monkeypatch.chdir(tmp_path)
    fs = fsspec.filesystem("memory")
    url = "memory://cropscale-mutants/run/last.ckpt"
    try:
        AtomicCheckpointIO().save_checkpoint({"w": torch.arange(3.0), "epoch": 4}, url)
        with fs.open(url, "rb") as f:
            saved = torch.load(f, weights_only=True)
    finally:
        if fs.exists("/cropscale-mutants"):
            fs.rm("/cropscale-mutants", recursive=True)
    assert saved["epoch"] == 4 and torch.equal(saved["w"], torch.tensor([0.0, 1.0, 2.0]))
    assert list(tmp_path.iterdir()) == []  # nothing written locally


# ----------------------------------------------------------------------------------- ResumableCheckpoint.setup
def _leftover_dir(tmp_path: Path) -> tuple[Path, Path, Path]:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    leftover = folder / ".last.ckpt.k3j2.tmp"
    leftover.write_bytes(b"half")
    last = folder / "last.ckpt"
    last.write_bytes(b"x")
    return folder, leftover, last


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
@pytest.mark.parametrize(("stage", "global_zero", "removed"), [
    ("fit", True, True), ("fit", False, False), ("validate", True, False), ("test", True, False)])
def test_only_rank_0_at_fit_removes_the_leftovers_of_a_killed_save(tmp_path, stage, global_zero, removed):
    folder, leftover, last = _leftover_dir(tmp_path)
    trainer = SimpleNamespace(strategy=SimpleNamespace(broadcast=lambda x: x), is_global_zero=global_zero)
    ResumableCheckpoint(dirpath=folder).setup(trainer, None, stage)
    assert leftover.exists() is not removed
    assert last.read_bytes() == b"x"  # a checkpoint is never touched


# ---------------------------------------------------------------------------------- ResumableCheckpoint.on_exception
class LastWithEpoch(ResumableCheckpoint):
    CHECKPOINT_NAME_LAST = "last-{epoch}"  # Lightning's documented way to put metrics into last's name


def test_a_stop_saves_a_last_checkpoint_whose_name_holds_the_epoch(tmp_path):
    ckpt = LastWithEpoch(dirpath=tmp_path / "ckpt", monitor="score", mode="max", filename="best-{epoch}")
    trainer = Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[ckpt, SendSigterm(1, 1), StopOnSignal()])
    with pytest.raises(SIGTERMException):
        trainer.fit(Tiny())
    assert Path(ckpt.last_model_path).name == "last-epoch=1.ckpt"
    assert torch.load(ckpt.last_model_path, map_location="cpu", weights_only=False)["global_step"] == 6


def _interrupted(monkeypatch, tmp_path, last_model_path: str) -> str:
    """The line ResumableCheckpoint prints on rank 0 after a second Ctrl-C at epoch 2, global step 9."""
    _launcher_env(monkeypatch, {})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["cropscale", *SCRIPT, "--ckpt_path", "last"])
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    ckpt = ResumableCheckpoint(dirpath=tmp_path / "ckpt")
    ckpt.last_model_path = last_model_path
    trainer = SimpleNamespace(is_global_zero=True, current_epoch=2, global_step=9)
    ckpt.on_exception(trainer, None, KeyboardInterrupt())
    return err.getvalue()


def test_ctrl_c_twice_names_the_newest_checkpoint_and_its_progress(monkeypatch, tmp_path):
    path = tmp_path / "ckpt" / "last.ckpt"
    path.parent.mkdir()
    torch.save({"state_dict": {}, "global_step": 8, "epoch": 1,
                "loops": {"fit_loop": {"epoch_progress": {"current": {"processed": 2}}}}}, path)
    assert _interrupted(monkeypatch, tmp_path, str(path)) == (
        "cropscale: interrupted at epoch 2, global step 9, without a save; the newest checkpoint is ckpt/last.ckpt"
        " (epoch 1, global step 8); resume with: python -m cropscale fit '--data.root=a b' --ckpt_path auto\n")


def test_ctrl_c_twice_before_any_save_says_so(monkeypatch, tmp_path):
    assert _interrupted(monkeypatch, tmp_path, "") == (
        "cropscale: interrupted at epoch 2, global step 9, without a save; no checkpoint was saved; resume with:"
        " python -m cropscale fit '--data.root=a b' --ckpt_path auto\n")


# ------------------------------------------------------------------------------------------------ StopOnSignal
def test_the_first_ctrl_c_says_what_happens_at_once_even_on_a_buffered_stderr(monkeypatch):
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(raw, encoding="utf-8", line_buffering=False))
    stop = StopOnSignal()
    stop._handler(signal.SIGINT, None)
    assert raw.getvalue().decode() == (  # flushed: not waiting in the wrapper's buffer
        "cropscale: Ctrl-C: stopping at the next step with a resumable checkpoint (Ctrl-C again to stop now,"
        " without a save)\n")
    with pytest.raises(KeyboardInterrupt):
        stop._handler(signal.SIGINT, None)


def _fake_trainer(world_size: int, step: int = 0) -> SimpleNamespace:
    return SimpleNamespace(world_size=world_size, accumulate_grad_batches=1, num_training_batches=10, global_step=step)


def test_the_side_group_for_the_stop_flag_is_a_gloo_group_under_nccl(monkeypatch):
    made = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(dist, "new_group", lambda **kw: made.append(kw) or "side group")
    stop = StopOnSignal()
    stop.setup(_fake_trainer(2), None, "fit")
    assert made == [{"backend": "gloo"}] and stop._group == "side group"


def test_several_ranks_without_torch_distributed_read_the_flag_directly():
    """A strategy with world_size > 1 but no torch.distributed group (XLA's): no all-reduce, the local flag."""
    assert not dist.is_initialized()
    stop, trainer = StopOnSignal(), _fake_trainer(2, step=3)
    stop.setup(trainer, None, "fit")
    stop._handler(signal.SIGTERM, None)
    with pytest.raises(SIGTERMException):
        stop.on_train_batch_end(trainer, None, None, None, 0)
    assert (stop.stopped_by, stop.stopped_at_step) == ("SIGTERM", 3)


@pytest.fixture
def gloo_group(tmp_path):
    """A one-process gloo group in this process (the collectives run for real; removed afterwards)."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_under_a_process_group_the_stop_comes_one_boundary_after_the_signal(gloo_group):
    """The flag is all-reduced without waiting; its result decides at the next optimiser-step boundary."""
    stop = StopOnSignal()
    stop.setup(_fake_trainer(2), None, "fit")
    assert stop._group is None  # the default group is already gloo
    stop.on_train_batch_end(_fake_trainer(2, step=1), None, None, None, 0)  # nothing signalled
    stop._handler(signal.SIGUSR1, None)
    stop.on_train_batch_end(_fake_trainer(2, step=2), None, None, None, 1)  # decides the flag sent at step 1: 0
    assert stop.stopped_by is None
    with pytest.raises(SIGTERMException):
        stop.on_train_batch_end(_fake_trainer(2, step=3), None, None, None, 2)
    assert (stop.stopped_by, stop.stopped_at_step) == ("SIGUSR1", 3)
    stop.on_train_end(_fake_trainer(2), None)  # the all-reduce started at step 3 is waited for
    assert stop._pending is None


# --------------------------------------------------------------------------------------------- training_state
def test_epochs_done_come_from_the_fit_loop_not_the_epoch(tmp_path):
    """Saved at an epoch's end, Lightning's ``epoch`` is the epoch trained and ``processed`` one more."""
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "global_step": 8, "epoch": 1,
                "loops": {"fit_loop": {"epoch_progress": {"current": {"processed": 2, "completed": 2}}}}}, path)
    state = training_state(path)
    assert (state.global_step, state.epoch, state.epochs_done) == (8, 1, 2)


def _read_chars() -> int:
    return int(re.search(r"^rchar: (\d+)$", Path("/proc/self/io").read_text(), re.M).group(1))


@pytest.mark.skipif(not Path("/proc/self/io").is_file(), reason="needs Linux /proc/self/io")
def test_the_training_state_reads_no_tensor_data(tmp_path):
    """Memory-mapped: a 20 MB checkpoint's progress costs kilobytes of reads (``rchar``), not the file's size."""
    path = tmp_path / "big.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(5_000_000)}, "global_step": 3, "epoch": 0}, path)
    before = _read_chars()
    assert training_state(path).global_step == 3
    read = _read_chars() - before
    assert read < 1_000_000, f"{read} bytes read for a {path.stat().st_size}-byte file"


class _Loud:
    unpickled = 0

    def __reduce__(self):
        return (_Loud._mark, ())

    @staticmethod
    def _mark() -> None:
        _Loud.unpickled += 1


def test_a_state_file_never_runs_pickled_code_even_when_torch_is_told_to(tmp_path, monkeypatch):
    """``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` turns torch's default off; the resolution still loads weights only."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "global_step": 3, "hyper_parameters": _Loud()}, path)
    _Loud.unpickled = 0
    assert training_state(path) is None  # not a plain-data file: not a state to resume
    assert _Loud.unpickled == 0


# ------------------------------------------------------------------------------- the torchrun agent's command
@pytest.mark.parametrize(("parent", "expected"), [
    # the agent's program word among the first three: found
    (["/usr/bin/python3", "-u", "/venv/bin/torchrun", "--nnodes=1", "-m", "cropscale", "fit"],
     ": torchrun --nnodes=1 -m cropscale fit --ckpt_path auto"),
    (["/usr/bin/python3", "-X", "dev", "-m", "torch.distributed.run", "--nnodes=1", "-m", "cropscale", "fit"],
     ": the same torchrun command, with the script arguments of python -m cropscale fit '--data.root=a b'"
     " --ckpt_path auto"),  # "-m" as the 4th word: not looked at
    (["/usr/bin/python3", "-X", "dev", "/venv/bin/torchrun", "--nnodes=1", "-m", "cropscale", "fit"],
     ": the same torchrun command, with the script arguments of python -m cropscale fit '--data.root=a b'"
     " --ckpt_path auto"),  # the 4th word: not looked at
    (["/usr/bin/python3", "-m", "my_launcher", "--nnodes=1", "-m", "cropscale", "fit"],  # another module's -m
     ": the same torchrun command, with the script arguments of python -m cropscale fit '--data.root=a b'"
     " --ckpt_path auto"),
])
def test_the_torchrun_agent_is_found_only_in_the_first_three_words(monkeypatch, parent, expected):
    _launcher_env(monkeypatch, {"TORCHELASTIC_RUN_ID": "j"})
    assert launch_resume_command(SCRIPT, parent_cmdline=parent) == expected


def test_an_explicit_environment_is_the_one_read(monkeypatch):
    _launcher_env(monkeypatch, {})  # this process: no launcher
    assert launch_resume_command(SCRIPT, env={"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}) == (
        " (the job script's command, then sbatch it): srun python -m cropscale fit '--data.root=a b' --ckpt_path auto")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert launch_resume_command(SCRIPT, env={}) == ": python -m cropscale fit '--data.root=a b' --ckpt_path auto"


@pytest.fixture
def fake_agent():
    """A process whose command line is ``/opt/venv/bin/torchrun -c <sleep> --data.root=<not UTF-8>`` (Python)."""
    proc = subprocess.Popen([b"/opt/venv/bin/torchrun", b"-c", b"import time; time.sleep(60)", b"--data.root=\xff"],
                            executable=sys.executable)
    try:
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        for _ in range(1000):  # the kernel fills it in once the exec is through (empty before)
            if cmdline.read_bytes():
                break
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_the_agents_command_is_read_from_the_parent_process(monkeypatch, fake_agent):
    _launcher_env(monkeypatch, {"TORCHELASTIC_RUN_ID": "j", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    monkeypatch.setattr(os, "getppid", lambda: fake_agent.pid)
    assert launch_resume_command(SCRIPT) == (
        ": torchrun -c 'import time; time.sleep(60)' '--data.root=\ufffd' --ckpt_path auto")


def test_an_unreadable_parent_command_line_gives_the_generic_torchrun_advice(monkeypatch):
    _launcher_env(monkeypatch, {"TORCHELASTIC_RUN_ID": "j"})
    monkeypatch.setattr(os, "getppid", lambda: 2 ** 22 + 12345)  # above any pid_max: no such /proc entry
    assert launch_resume_command(SCRIPT) == (
        ": the same torchrun command, with the script arguments of python -m cropscale fit '--data.root=a b'"
        " --ckpt_path auto")


# --------------------------------------------------------------------------------------------- SLURM requeue
@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """A stand-in ``scontrol`` first on PATH: logs its arguments; ``SCONTROL_MODE`` fail/hang changes what it does."""
    bin_dir, log = tmp_path / "bin", tmp_path / "scontrol.log"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\necho "$@" >> "$SCONTROL_LOG"\n'
        'case "$SCONTROL_MODE" in\n'
        '  fail) echo "scontrol: error:   Invalid job id specified" >&2; exit 1;;\n'
        '  hang) exec sleep 30;;\n'
        'esac\n')
    (bin_dir / "scontrol").chmod(0o755)
    _launcher_env(monkeypatch, {})
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SCONTROL_LOG", str(log))
    return log


def test_the_job_is_requeued_by_its_id(scontrol, monkeypatch):
    assert requeue_slurm_job() == "not under SLURM: not requeued"
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert requeue_slurm_job() == "SLURM job 4242 requeued"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4200")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "7")  # an array task: <array job>_<task>
    assert requeue_slurm_job() == "SLURM job 4200_7 requeued"
    assert scontrol.read_text() == "requeue 4242\nrequeue 4200_7\n"


def test_a_failed_requeue_says_why_in_one_line(scontrol, monkeypatch, capfd):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SCONTROL_MODE", "fail")
    assert requeue_slurm_job() == (
        "scontrol requeue 4242 failed with status 1 (scontrol: error: Invalid job id specified)")
    assert capfd.readouterr().err == ""  # captured, not passed through


def test_a_hanging_scontrol_is_given_up_after_the_timeout(scontrol, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SCONTROL_MODE", "hang")
    assert requeue_slurm_job(timeout_s=0.5) == "scontrol requeue 4242 failed (TimeoutExpired)"


def test_without_scontrol_nothing_is_run(tmp_path, monkeypatch):
    _launcher_env(monkeypatch, {"SLURM_JOB_ID": "4242"})
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder
    assert requeue_slurm_job() == "SLURM job 4242 not requeued (no scontrol on PATH)"


# --------------------------------------------------------------------------------------------------- stop_line
def _stopped(by: str, *checkpoints) -> SimpleNamespace:
    stop = StopOnSignal()
    stop.stopped_by = by
    return SimpleNamespace(callbacks=[stop], checkpoint_callbacks=list(checkpoints), current_epoch=1, global_step=5)


def test_the_stop_line_names_the_last_checkpoint_beside_a_checkpoint_callback_without_one():
    saved = ResumableCheckpoint()
    saved.last_model_path = "runs/default/version_0/checkpoints/last.ckpt"
    line = stop_line(_stopped("SIGTERM", Checkpoint(), saved), SCRIPT)
    assert line.startswith("cropscale: stopped by SIGTERM at epoch 1, global step 5; resumable checkpoint"
                           " runs/default/version_0/checkpoints/last.ckpt; resume with")


@pytest.mark.parametrize(("argv", "note"), [
    (SCRIPT, " (it reruns the job script as it is: without --ckpt_path auto a fresh run)"),
    ([*SCRIPT, "--ckpt_path", "auto"], ""),
    ([*SCRIPT, "--ckpt_path=auto"], ""),
])
def test_after_sigusr1_under_slurm_the_job_is_requeued_and_a_fresh_restart_is_named(scontrol, monkeypatch, argv, note):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    line = stop_line(_stopped("SIGUSR1"), argv)
    assert line == (
        "cropscale: stopped by SIGUSR1 at epoch 1, global step 5; no checkpoint saved (no ModelCheckpoint with"
        f" save_last); SLURM job 4242 requeued{note}; resume with (the job script's command, then sbatch it):"
        " python -m cropscale fit '--data.root=a b' --ckpt_path auto")
    assert scontrol.read_text() == "requeue 4242\n"
    assert stop_line(_stopped("SIGTERM"), argv).count("requeued") == 0  # SIGTERM: no requeue
    assert scontrol.read_text() == "requeue 4242\n"

