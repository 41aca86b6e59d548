"""cropscale.distributed, in this process (issue 36, mutation testing): the child-rank watch's end of a stuck rank 0
with ``os._exit`` recorded instead of run, the peer registration of ``ChildRankWatch.setup``, the rank-error
folder's edges, ``_pid_gone`` on live processes (one whose name holds ``) Z``), the store client's arguments, and
``PeerRanks.departed``'s waiting on a fake clock (its default wait, its polling period, the deadline itself).
The same paths across processes: tests/test_distributed.py, tests/test_distributed_edges.py."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from cropscale import distributed
from cropscale.distributed import (
    PEER_LEFT,
    RANK_ERRORS_ENV,
    ChildRankWatch,
    PeerRanks,
    RankFailure,
    child_failures,
    cleanup_rank_reports,
    peer_line,
    peer_ranks,
    prepare_rank_reports,
    register_peer_ranks,
    report_rank_error,
    run_store,
)
from tests.test_distributed import _trainer_with_children


def _children(*codes: str):
    """tests/test_distributed.py's trainer with child processes, as rank 0 of a world of 1."""
    trainer, procs = _trainer_with_children(*codes)
    trainer.global_rank, trainer.world_size = 0, 1
    return trainer, procs


# ------------------------------------------------------------------ RankFailure, the rank-error folder
def test_a_status_of_0_is_an_exit_not_a_signal():
    assert RankFailure(1, 9, 0).describe() == "DDP rank 1 (pid 9) exited with status 0"


def test_the_launching_process_without_local_rank_makes_the_folder_and_rank_1_reports_into_it(monkeypatch):
    monkeypatch.setenv(RANK_ERRORS_ENV, "")  # empty: no folder named (and restored after the test)
    monkeypatch.delenv("LOCAL_RANK", raising=False)  # a plain `python -m cropscale fit`: no LOCAL_RANK at all
    folder = prepare_rank_reports()
    try:
        assert folder is not None and folder.is_dir() and folder.name.startswith("cropscale-ranks-")
        report_rank_error(1, "rank 1: out of memory")  # the first child rank
        assert (folder / "rank1.txt").read_text() == "rank 1: out of memory"
        folder.joinpath("rank1.txt").unlink()
        folder.rmdir()  # already gone (removed by hand): the cleanup at exit is still no error
        cleanup_rank_reports()
    finally:
        cleanup_rank_reports()


def test_a_failure_without_a_rank_error_folder_has_no_message(monkeypatch):
    monkeypatch.delenv(RANK_ERRORS_ENV, raising=False)
    trainer, procs = _children("raise SystemExit(2)")
    procs[0].wait()
    (failed,) = child_failures(trainer)
    assert (failed.local_rank, failed.status, failed.message) == (1, 2, "")
    assert failed.describe() == f"DDP rank 1 (pid {procs[0].pid}) exited with status 2"


# ------------------------------------------------------------------ ChildRankWatch
def test_the_watch_stops_the_children_and_ends_a_stuck_rank_0_with_status_1(monkeypatch, capsys):
    trainer, procs = _children("raise SystemExit(5)", "import time; time.sleep(60)")
    watch = ChildRankWatch(grace_s=0.3, poll_s=0.05)
    exits = []

    def _exit(code):  # os._exit, recorded: the watch's thread then ends with the watch
        exits.append(code)
        watch.stop()

    monkeypatch.setattr(os, "_exit", _exit)
    try:
        watch.setup(trainer, None, "fit")
        assert watch._thread.daemon  # never keeps the interpreter alive at exit
        watch._thread.join(timeout=30)
        assert not watch._thread.is_alive()
        assert procs[1].poll() == -signal.SIGKILL  # the still-running child was stopped (and reaped) by the watch
    finally:
        watch.stop()
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert exits == [1]
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"cropscale: error: DDP rank 1 (pid {procs[0].pid}) exited with status 5; rank 0 did not end within 0.3 s"
        " and was stopped")


@pytest.fixture
def store_env(monkeypatch):
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    yield server
    register_peer_ranks(0, 1)  # forget the registration


def test_the_watch_setup_registers_the_trainer_s_rank_in_the_run_store(store_env):
    ChildRankWatch().setup(SimpleNamespace(global_rank=1, world_size=2), None, "fit")
    peers = peer_ranks()
    assert (peers.rank, peers.world_size) == (1, 2)
    assert store_env.get("cropscale/ranks/0/rank1") == f"{socket.gethostname()} {os.getpid()}".encode()
    ChildRankWatch().setup(SimpleNamespace(world_size=2), None, "fit")  # no global_rank: rank 0
    assert (peer_ranks().rank, peer_ranks().world_size) == (0, 2)
    ChildRankWatch().setup(SimpleNamespace(global_rank=0), None, "fit")  # no world_size: one process
    assert peer_ranks() is None


# ------------------------------------------------------------------ _pid_gone
def _live_child(executable: str) -> subprocess.Popen:
    """A sleeping child that dies on SIGHUP (the default action; a parent run under nohup ignores it), once ready."""
    code = ("import signal, sys, time; signal.signal(signal.SIGHUP, signal.SIG_DFL); print('ready', flush=True);"
            " time.sleep(60)")
    proc = subprocess.Popen([executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_live_process_is_not_gone_and_asking_sends_it_no_signal(tmp_path):
    named = tmp_path / "a) Z b"  # its /proc/<pid>/stat: "<pid> (a) Z b) S ...": the state follows the LAST ")"
    named.symlink_to(sys.executable)
    for proc in (_live_child(sys.executable), _live_child(str(named))):
        try:
            assert distributed._pid_gone(proc.pid) is False
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)  # still running: no SIGHUP was sent
        finally:
            proc.kill()
            proc.wait()


def test_a_process_of_another_user_is_not_gone(monkeypatch):
    def kill(pid, sig):
        raise PermissionError(1, "Operation not permitted")  # what os.kill(pid, 0) raises for another user's pid

    monkeypatch.setattr(os, "kill", kill)
    assert distributed._pid_gone(1) is False


# ------------------------------------------------------------------ run_store
def test_run_store_asks_the_master_for_a_client_with_its_timeout(monkeypatch):
    calls = []

    def tcp_store(*args, **kwargs):
        calls.append((args, kwargs))
        return dist.HashStore()

    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    monkeypatch.setattr(dist, "TCPStore", tcp_store)
    store = run_store("cropscale/x")
    assert calls == [(("10.0.0.7", 29500), {"is_master": False, "wait_for_workers": False,
                                            "timeout": datetime.timedelta(seconds=5)})]
    store.set("k", "v")
    assert store.get("k") == b"v"


@pytest.mark.parametrize("missing", ["MASTER_ADDR", "MASTER_PORT"])
def test_run_store_without_either_variable_is_none(monkeypatch, missing):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.delenv(missing)
    assert run_store("cropscale/x", timeout_s=0.1) is None


# ------------------------------------------------------------------ PeerRanks.departed on a fake clock
@pytest.fixture
def clock(monkeypatch):
    """distributed's ``time`` replaced: ``monotonic`` advances only by the ``sleep`` calls, which are recorded."""
    state = SimpleNamespace(now=100.0, sleeps=[])

    def sleep(s):
        state.sleeps.append(s)
        state.now += s

    monkeypatch.setattr(distributed, "time", SimpleNamespace(monotonic=lambda: state.now, sleep=sleep))
    return state


def _silent_store() -> dist.HashStore:
    store = dist.HashStore()
    store.set("rank1", "elsewhere 4242")  # registered on another host, says nothing
    return store


SILENT = "rank 1 (pid 4242, host elsewhere) said nothing within {} s: killed, or its host lost (its exit status is with"


def test_departed_waits_10_s_by_default_polling_every_0_2_s(clock):
    named = PeerRanks(_silent_store(), 0, 2, launcher="srun").departed()
    assert named == [SILENT.format(10) + " srun)"]
    assert clock.sleeps == [0.2] * 50  # 50 polls of 0.2 s reach the 10 s deadline


def test_departed_waits_until_the_deadline_and_not_one_poll_more(clock):
    assert PeerRanks(_silent_store(), 0, 2).departed(wait_s=1.0, poll_s=0.5) == [SILENT.format(1) + " its launcher)"]
    assert clock.sleeps == [0.5, 0.5]  # at 1.0 s the deadline is reached: named, no third poll
    clock.sleeps.clear()
    assert PeerRanks(_silent_store(), 0, 2).departed(wait_s=0.0) == [SILENT.format(0) + " its launcher)"]
    assert clock.sleeps == []


def test_peer_line_waits_10_s_by_default_and_names_no_step_without_one(monkeypatch, clock):
    monkeypatch.setattr(distributed, "_PEERS", [PeerRanks(_silent_store(), 0, 2)])
    line = f"{PEER_LEFT} (RuntimeError: Connection closed by peer)"
    assert peer_line(line, SimpleNamespace(current_epoch=1, global_step=7)) == (
        SILENT.format(10) + " its launcher); rank 0 stopped at epoch 1, global step 7")
    assert peer_line(line, SimpleNamespace(current_epoch=1), wait_s=0.0) == (  # no global_step: no place named
        SILENT.format(0) + " its launcher); rank 0 stopped")



def test_a_process_whose_stat_cannot_be_read_is_not_gone(monkeypatch):
    # os.kill(pid, 0) found it, but /proc/<pid>/stat cannot be read (hidepid, another namespace): it is running
    monkeypatch.setattr(os, "kill", lambda pid, sig: None)

    def unreadable(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(distributed.Path, "read_text", unreadable)
    assert distributed._pid_gone(12345) is False
