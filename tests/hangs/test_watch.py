"""cropscale.hangs.watch and .recorder: where a thread is, the progress a Trainer shows, the store board, the
Flight Recorder's settings and the resume hint (the end-to-end hangs: tests/integration/test_hangs.py)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch import Callback, Trainer

from cropscale.errors import ConfigError
from cropscale.hangs import HangWatch, Progress, recorder
from cropscale.hangs.watch import ProgressBoard, read_progress, resume_hint, thread_stack, where_is
from cropscale.testing.toy import ToyTask

TORCH = os.path.dirname(torch.__file__)


# ------------------------------------------------------------------------------------------ where_is
def test_where_is_reads_the_innermost_frame_outside_the_standard_library():
    collective = [(f"{TORCH}/distributed/distributed_c10d.py", 3245, "all_reduce"),
                  (f"{TORCH}/distributed/c10d_logger.py", 83, "wrapper"),
                  ("/x/cropscale/testing/faults.py", 180, "on_train_batch_end")]
    assert where_is(collective) == ("in a collective: all_reduce, called from /x/cropscale/testing/faults.py:180 in"
                                    " on_train_batch_end", True)
    backward = [(f"{TORCH}/autograd/graph.py", 841, "_engine_run_backward"), ("/x/task.py", 9, "step")]
    assert where_is(backward) == ("in backward (where DDP waits for its gradient all-reduce)", True)
    threading_py = threading.__file__
    data = [(threading_py, 327, "wait"), (f"{TORCH}/utils/data/dataloader.py", 1133, "_try_get_data"),
            (f"{TORCH}/utils/data/dataloader.py", 1295, "_get_data"), ("/x/loop.py", 5, "advance")]
    assert where_is(data) == ("waiting for data in the DataLoader, called from /x/loop.py:5 in advance", False)
    assert where_is([]) == ("where: no Python frame", None)


def _blocked(ev: threading.Event) -> None:
    ev.wait()


def test_where_is_names_the_line_a_real_thread_waits_on():
    ev = threading.Event()
    worker = threading.Thread(target=_blocked, args=(ev,), daemon=True)
    worker.start()
    try:
        for _ in range(200):  # until the thread is inside Event.wait
            stack = thread_stack(worker.ident)
            if stack and stack[0][2] == "wait":
                break
            threading.Event().wait(0.01)
        text, in_collective = where_is(stack)
    finally:
        ev.set()
    source, first = inspect.getsourcelines(_blocked)
    line = first + next(i for i, s in enumerate(source) if "ev.wait()" in s)
    assert in_collective is False
    assert text == f"in its own code at tests/hangs/test_watch.py:{line} in _blocked"


BLOCKED_IN_ALL_REDUCE = textwrap.dedent("""
    import json, os, sys, threading, time
    import torch, torch.distributed as dist
    from cropscale.hangs.watch import thread_stack, where_is

    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)

    def reduce():
        dist.all_reduce(torch.ones(1))  # rank 1 never enters it

    if rank == 1:
        time.sleep(60)
    worker = threading.Thread(target=reduce, daemon=True)
    worker.start()
    time.sleep(1.0)
    print(json.dumps(where_is(thread_stack(worker.ident))), flush=True)
    os._exit(0)
""")


def test_where_is_names_a_real_gloo_all_reduce_that_the_other_rank_never_entered(tmp_path):
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKED_IN_ALL_REDUCE)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    args = [sys.executable, str(script)]
    other = subprocess.Popen([*args, "1", str(tmp_path / "store")], env=env)
    try:
        out = subprocess.run([*args, "0", str(tmp_path / "store")], env=env, capture_output=True, text=True,
                             timeout=60)
    finally:
        other.kill()
        other.wait()
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(i + 1 for i, s in enumerate(BLOCKED_IN_ALL_REDUCE.splitlines()) if "dist.all_reduce(" in s)
    text, in_collective = json.loads(out.stdout)
    assert in_collective is True
    assert text == f"in a collective: all_reduce, called from {script}:{line} in reduce"


# ---------------------------------------------------------------------------------- progress of a Trainer
class ProgressProbe(Callback):
    """Reads the progress as the watch's thread would, at hooks whose counters are known (4 per batch)."""

    def __init__(self, watch: HangWatch) -> None:
        self.watch, self.seen = watch, []

    def _read(self, trainer, hook):
        self.seen.append((hook, read_progress(trainer, self.watch._marks, 0, 0)))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._read(trainer, "batch_start")

    def on_before_backward(self, trainer, pl_module, loss):
        self._read(trainer, "in_step")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._read(trainer, "batch_end")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._read(trainer, "val_batch_end")

    def on_validation_epoch_end(self, trainer, pl_module):
        self._read(trainer, "val_epoch_end")

    def on_train_epoch_end(self, trainer, pl_module):
        self._read(trainer, "epoch_end")


def test_the_progress_read_from_a_trainer_moves_through_every_batch_and_pause(tmp_path):
    """ToyTask: 4 training batches and 2 validation batches per epoch, 2 epochs. Counted by hand: batch n of
    the fit (0-based) is at training position 4n+1 at its start, 4n+2 in its step, 4n+3 at its end."""
    watch = HangWatch()
    probe = ProgressProbe(watch)
    trainer = Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      callbacks=[watch, probe], default_root_dir=tmp_path)
    trainer.fit(ToyTask(n_train=16, batch_size=4))
    seen = [(hook, p.position, p.phase, p.stage, p.epoch, p.batch) for hook, p in probe.seen]
    expected = []
    for epoch in range(2):
        for b in range(4):
            n = 4 * epoch + b
            phase = "warm-up" if n == 0 else "training"
            expected += [("batch_start", (4 * n + 1, 0, 0, 0, epoch), phase, "before its step", epoch, b),
                         ("in_step", (4 * n + 2, 0, 0, 0, epoch), phase, "in its step", epoch, b),
                         ("batch_end", (4 * n + 3, 0, 0, 0, epoch), phase, "after its step", epoch, b)]
        t = 4 * (4 * epoch + 4)
        # at validation batch v's end 4v + 3 of its counters have moved (completed follows the hook); at the
        # validation epoch end all 8 have, and the rank is done with its own validation batches
        expected += [("val_batch_end", (t, 1, 0, 3, epoch), "validation", "done", epoch, 3),
                     ("val_batch_end", (t, 1, 0, 7, epoch), "validation", "done", epoch, 3),
                     ("val_epoch_end", (t, 1, 1, 8, epoch), "validation", "done", epoch, 3),
                     ("epoch_end", (t, 2, 0, 0, epoch), "validation", "done", epoch, 3)]
    assert seen == expected
    positions = [p for _, p, *_ in seen]
    assert positions == sorted(positions)  # the order the ranks are compared in follows the fit
    assert watch.record().enabled is False and watch.record().reason == "one process: no rank waits for another"


def test_only_the_first_hang_watch_of_a_run_watches(tmp_path):
    first, second = HangWatch(floor_s=5), HangWatch()
    trainer = Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      callbacks=[first, second], default_root_dir=tmp_path)
    trainer.fit(ToyTask(n_train=4, batch_size=4))
    assert first.reason == "one process: no rank waits for another"
    assert second.reason == "another HangWatch of the run's callbacks watches it"
    assert first.record().floor_s == 5 and first.record().flight_recorder.reason == (
        "one process: no collectives to record")


@pytest.mark.parametrize("kwargs,text", [({"poll_s": 0}, r"HangWatch\(poll_s=0\): must be a positive number"),
                                         ({"dump_wait_s": -1}, r"HangWatch\(dump_wait_s=-1\): must be a number >= 0"),
                                         ({"factor": 0}, r"HangWatch\(factor=0\): must be a positive number")])
def test_a_bad_setting_is_refused_with_its_name(kwargs, text):
    with pytest.raises(ConfigError, match=text):
        HangWatch(**kwargs)


# ---------------------------------------------------------------------------------------------- the board
def test_the_board_carries_reports_requests_and_answers_between_ranks():
    store = dist.HashStore()
    boards = [ProgressBoard(store, r, 3) for r in range(3)]
    reports = [Progress(rank=r, position=(4 * r + 1, 0, 0, 0, 0), beat=r) for r in (0, 2)]
    for p in reports:
        boards[p.rank].publish(p)
    assert boards[0].read() == {0: reports[0], 2: reports[1]}  # rank 1 never reported: absent
    assert boards[1].asked("dump") is None
    boards[0].ask("dump")
    assert boards[1].asked("dump") == "1" and boards[2].asked("stop") is None
    boards[2].answer("dump", "/run/flight_recorder/trace_rank_2")
    assert boards[0].answers("dump") == {2: "/run/flight_recorder/trace_rank_2"}


class BrokenStore:
    """A store whose every call fails as a TCPStore client does when its server is gone."""

    def set(self, *args):
        raise RuntimeError("Connection reset by peer")

    check = get = set


def test_a_store_that_fails_is_only_not_seen():
    board = ProgressBoard(BrokenStore(), 0, 2)
    board.publish(Progress(rank=0, position=(1, 0, 0, 0, 0)))
    board.ask("stop")
    assert board.read() == {} and board.asked("stop") is None and board.answers("dump") == {}


# --------------------------------------------------------------------------------------- Flight Recorder
def _ddp_trainer(backend: str) -> SimpleNamespace:
    return SimpleNamespace(world_size=2, strategy=SimpleNamespace(_get_process_group_backend=lambda: backend))


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(recorder, "SET_HERE", {})


def test_nccl_gets_the_flight_recorder_unless_the_user_set_it(fresh, tmp_path):
    env: dict[str, str] = {}
    recorder.prepare_flight_recorder(_ddp_trainer("nccl"), env)
    assert env == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    prefix = recorder.place_dumps(tmp_path, env)
    assert prefix == str(tmp_path.resolve() / "flight_recorder" / "trace_rank_")
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix
    record = recorder.flight_recorder_record("nccl", prefix, env)
    applies = recorder.dump_function("nccl") is not None
    if applies:
        assert (record.applies, record.trace_buffer_size, record.dump_on_timeout, record.dump_prefix,
                record.set_by) == (True, 2000, True, prefix, "cropscale")
    else:  # a PyTorch build without any Flight Recorder
        assert record.reason == "this PyTorch build has no Flight Recorder"


def test_what_the_user_set_is_kept_and_said(fresh, tmp_path):
    env = {"TORCH_FR_BUFFER_SIZE": "64", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/d/t_"}
    recorder.prepare_flight_recorder(_ddp_trainer("nccl"), env)
    assert env == {"TORCH_FR_BUFFER_SIZE": "64", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
                   "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/d/t_"}
    assert recorder.place_dumps(tmp_path, env) == "/d/t_"
    record = recorder.flight_recorder_record("nccl", "/d/t_", env)
    if recorder.dump_function("nccl") is not None:
        assert (record.trace_buffer_size, record.dump_on_timeout, record.set_by) == (64, False, "user")
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}
    assert recorder.flight_recorder_record("nccl", None, env).reason == (
        "TORCH_NCCL_TRACE_BUFFER_SIZE=0, set by the user")
    assert recorder.flight_recorder_record("nccl", None, {}).reason.startswith(
        "TORCH_NCCL_TRACE_BUFFER_SIZE was not set before the process group was created")


def test_gloo_is_left_alone_unless_the_user_turned_its_recorder_on(fresh):
    env: dict[str, str] = {}
    recorder.prepare_flight_recorder(_ddp_trainer("gloo"), env)
    assert env == {}
    record = recorder.flight_recorder_record("gloo", None, env)
    assert not record.applies and record.reason.startswith(
        "cropscale turns the Flight Recorder on for NCCL only; this run's backend is gloo")
    if recorder.dump_function("gloo") is not None:  # this PyTorch records gloo's collectives
        record = recorder.flight_recorder_record("gloo", "/d/t_", {"TORCH_FR_BUFFER_SIZE": "100"})
        assert (record.applies, record.trace_buffer_size, record.dump_on_timeout, record.set_by) == (
            True, 100, None, "user")


# ------------------------------------------------------------------------------------------ resume hint
def test_the_resume_hint_names_the_state_ckpt_path_auto_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for var in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    folder = tmp_path / "runs" / "default" / "version_3" / "checkpoints"
    folder.mkdir(parents=True)
    torch.save({"state_dict": {}, "global_step": 4, "epoch": 1}, folder / "last.ckpt")
    torch.save({"state_dict": {}, "global_step": 2, "epoch": 0}, folder / "best-epoch00.ckpt")
    trainer = SimpleNamespace(logger=SimpleNamespace(save_dir="runs", name="default", version=3))
    assert resume_hint(trainer, ["fit", "--trainer.devices=2"]) == (
        "no checkpoint was saved at the hang, the newest is runs/default/version_3/checkpoints/last.ckpt (epoch 1,"
        " global step 4); resume with: python -m cropscale fit --trainer.devices=2 --ckpt_path auto")
    assert resume_hint(SimpleNamespace(logger=None), ["fit"]) == (
        "no checkpoint was saved at the hang, none was saved before it; resume with: python -m cropscale fit"
        " --ckpt_path auto")


# ------------------------------------------------------------------------------------------ the record
def test_the_hang_record_reads_back_from_its_json_and_omits_what_is_unset():
    from cropscale.hangs import HangBound, HangJudge
    from cropscale.hangs.watch import hang_record
    from cropscale.runs.schema import RunJson

    judge = HangJudge(2, HangBound(floor_s=8.0))
    judge.observe(0.0, {0: Progress(rank=0, position=(9, 0, 0, 0, 1), epoch=1, batch=1, stage="done", global_step=5,
                                    where="in a collective: broadcast", in_collective=True)})
    hang = judge.observe(600.0, {})
    assert hang is not None and hang.hung == (1,)  # rank 1 never reported
    watch = HangWatch(floor_s=8.0)
    watch.hang = hang_record(hang, hang.describe(), [])
    doc = {"schema": "cropscale.run/1", "hang_watch": watch.record().to_json()}
    out = RunJson.from_json(json.loads(json.dumps(doc))).to_json()
    assert out["hang_watch"] == doc["hang_watch"]
    saved = out["hang_watch"]
    assert (saved["enabled"], saved["reason"], saved["floor_s"]) == (False, "not set up for fit", 8.0)
    assert "channel" not in saved and saved["hang"]["hung_ranks"] == [1] and saved["hang"]["bound_kind"] == "pause"
    assert saved["hang"]["ranks"][0]["where"] == "in a collective: broadcast"
    assert saved["hang"]["ranks"][1] == {"rank": 1, "published": False, "epoch": None, "batch": None, "stage": None,
                                         "global_step": None, "phase": None, "where": None, "in_collective": None,
                                         "still_s": None, "heartbeat": False}
    assert "hang" not in HangWatch().record().to_json()  # only a run the watch ended has one
