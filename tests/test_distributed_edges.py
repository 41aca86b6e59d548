"""cropscale.distributed at its edges: signals beyond the named ones, the rank-error folder on each kind of rank,
children that fail later than asked, a watch whose rank 0 never ends, stores that fail (issue 36).
The main paths: test_distributed.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from cropscale import distributed
from cropscale.distributed import (
    PEER_LEFT,
    RANK_ERRORS_ENV,
    PeerRanks,
    RankFailure,
    child_failures,
    cleanup_rank_reports,
    elastic_restart_hazard,
    finish_distributed,
    launcher_name,
    peer_line,
    prepare_rank_reports,
    register_peer_ranks,
    report_rank_error,
    stop_child_ranks,
)

REPO = Path(__file__).resolve().parents[1]


def _children(*codes: str):
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in codes]
    return SimpleNamespace(strategy=SimpleNamespace(launcher=SimpleNamespace(procs=procs))), procs


def test_the_elastic_hazard_line_and_what_is_no_restart():
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3"}
    assert elastic_restart_hazard(env) == (
        "cropscale: warning: torchrun --max-restarts=3 with its shared rendezvous store: a restarted attempt can fail"
        " at the process group's connect (the store still holds the first attempt's peer addresses); export"
        " TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun")
    assert elastic_restart_hazard({**env, "TORCHELASTIC_MAX_RESTARTS": ""}) is None
    assert elastic_restart_hazard({**env, "TORCHELASTIC_MAX_RESTARTS": "many"}) is None
    assert elastic_restart_hazard({**env, "TORCHELASTIC_MAX_RESTARTS": "-1"}) is None


def test_rank_failure_lines_for_every_kind_of_end():
    assert RankFailure(2, 9, 1).describe() == "DDP rank 2 (pid 9) exited with status 1"
    assert RankFailure(1, 9, -15, "x").describe() == "DDP rank 1 (pid 9) was killed by SIGTERM (exit status 143): x"
    assert RankFailure(1, 9, -200).describe() == "DDP rank 1 (pid 9) was killed by signal 200 (exit status 328)"


def test_the_rank_error_folder_is_made_once_on_the_launching_process_only(monkeypatch, tmp_path):
    monkeypatch.delenv(RANK_ERRORS_ENV, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert prepare_rank_reports() is None and RANK_ERRORS_ENV not in os.environ  # a child rank makes none
    monkeypatch.setenv("LOCAL_RANK", "0")
    folder = prepare_rank_reports()
    try:
        assert folder.is_dir() and os.environ[RANK_ERRORS_ENV] == str(folder)
        assert prepare_rank_reports() is None  # already named: the children inherit it, none is made again
        report_rank_error(0, "rank 0 reports to itself")  # not a child: nothing written
        report_rank_error(3, "rank 3: no data")
        assert sorted(p.name for p in folder.iterdir()) == ["rank3.txt"]
        assert (folder / "rank3.txt").read_text() == "rank 3: no data"
    finally:
        cleanup_rank_reports()
    assert not folder.exists()
    cleanup_rank_reports()  # idempotent
    monkeypatch.setenv(RANK_ERRORS_ENV, str(tmp_path / "gone"))
    report_rank_error(1, "best effort")  # a folder that went away: no error
    monkeypatch.delenv(RANK_ERRORS_ENV)
    report_rank_error(1, "no folder named")


def test_child_failures_now_and_after_a_wait(monkeypatch, tmp_path):
    monkeypatch.setenv(RANK_ERRORS_ENV, str(tmp_path))
    trainer, procs = _children("import time; time.sleep(0.5); raise SystemExit(4)")
    t0 = time.monotonic()
    assert child_failures(trainer) == []  # not ended yet, no wait
    assert time.monotonic() - t0 < 0.4
    failed = child_failures(trainer, wait_s=30)
    assert [(f.local_rank, f.status, f.message) for f in failed] == [(1, 4, "")]  # it reported nothing
    procs[0].wait()


def test_stop_child_ranks_kills_what_runs_and_leaves_what_ended():
    trainer, procs = _children("pass", "import time; time.sleep(60)")
    procs[0].wait()
    stop_child_ranks(trainer, timeout_s=10)
    assert [p.returncode for p in procs] == [0, -9]
    assert finish_distributed(trainer) == [(2, -9)]


@pytest.mark.parametrize(("env", "name"), [
    ({"TORCHELASTIC_RUN_ID": "j", "SLURM_JOB_ID": "1"}, "torchrun"), ({"SLURM_JOB_ID": "1"}, "srun"),
    ({"SLURM_JOB_ID": ""}, "its launcher"), ({}, "its launcher")])
def test_launcher_name(env, name):
    assert launcher_name(env) == name


def test_a_rank_that_said_its_last_line_marks_a_peer_departure_apart():
    store = dist.HashStore()
    PeerRanks(store, 1, 3).report("rank 1: out of memory")
    PeerRanks(store, 2, 3).report(f"{PEER_LEFT} (RuntimeError: Connection reset)")
    assert store.get("rank1/said") == b"own|rank 1: out of memory"
    assert store.get("rank2/said").decode().startswith("peer|stopped: another rank left the run")


class BrokenStore:
    def set(self, key, value):
        raise RuntimeError("store gone")

    def check(self, keys):
        raise RuntimeError("store gone")


def test_a_store_that_fails_is_no_error_and_names_nobody():
    peers = PeerRanks(BrokenStore(), 0, 2)
    peers.report("rank 0: anything")  # best effort
    assert peers._read("rank1") is None
    assert peers.departed(wait_s=0.0) == ["rank 1 said nothing within 0 s: killed, or its host lost (its exit status"
                                          " is with its launcher)"]


def test_a_rank_registered_without_a_pid_is_named_by_its_rank_only():
    store = dist.HashStore()
    store.set("rank1", "hostonly")
    assert PeerRanks(store, 0, 2).departed(wait_s=0.0) == [
        "rank 1 said nothing within 0 s: killed, or its host lost (its exit status is with its launcher)"]


def test_no_registration_without_peers_or_a_store(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert register_peer_ranks(0, 1) is None and distributed.peer_ranks() is None
    assert register_peer_ranks(0, 2) is None  # no MASTER_ADDR / MASTER_PORT
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")  # nothing listens there
    t0 = time.monotonic()
    assert PeerRanks.connect(0, 2, timeout_s=0.5) is None and time.monotonic() - t0 < 30
    assert peer_line("rank 0: x") == "rank 0: x"


def test_rank_0_keeps_its_line_when_no_other_rank_is_to_blame(monkeypatch):
    store = dist.HashStore()
    store.set("rank1", "elsewhere 4242")
    store.set("rank1/said", f"peer|{PEER_LEFT} (also)")  # rank 1 stopped because of another departure too
    monkeypatch.setattr(distributed, "_PEERS", [PeerRanks(store, 0, 2)])
    line = f"{PEER_LEFT} (RuntimeError: Connection closed by peer)"
    assert peer_line(line, SimpleNamespace(current_epoch=0, global_step=3), wait_s=0.0) == line
    store.set("rank1/said", "own|rank 1: bad batch")
    assert peer_line(line, None, wait_s=0.0) == "rank 1 (pid 4242, host elsewhere) failed: bad batch; rank 0 stopped"


def test_the_watch_ends_rank_0_that_does_not_end_after_a_child_failed(tmp_path):
    """Rank 0 stuck after a child failed: after the grace period the watch prints one line and exits 1."""
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        from types import SimpleNamespace
        sys.path.insert(0, {str(REPO)!r})
        from cropscale.distributed import ChildRankWatch
        procs = [subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"]),
                 subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])]
        trainer = SimpleNamespace(global_rank=0, world_size=1,
                                  strategy=SimpleNamespace(launcher=SimpleNamespace(procs=procs)))
        ChildRankWatch(grace_s=0.3, poll_s=0.05).setup(trainer, None, "fit")
        time.sleep(60)  # rank 0 stuck
    """)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and time.monotonic() - t0 < 50
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("cropscale: error: DDP rank 1 (pid ")
    assert lines[-1].endswith(") exited with status 5; rank 0 did not end within 0.3 s and was stopped")


def test_the_watch_leaves_rank_0_alone_when_it_ends_by_itself():
    from cropscale.distributed import ChildRankWatch

    trainer, procs = _children("raise SystemExit(5)")
    watch = ChildRankWatch(grace_s=30, poll_s=0.05)
    watch.setup(SimpleNamespace(global_rank=0, world_size=1, strategy=trainer.strategy), None, "fit")
    procs[0].wait()
    time.sleep(0.3)  # the watch has seen the failure and waits for rank 0
    watch.teardown(None, None, "fit")
    watch._thread.join(timeout=5)
    assert not watch._thread.is_alive()  # it returned without ending the process
    none = ChildRankWatch()
    none.setup(SimpleNamespace(global_rank=1, world_size=1), None, "fit")  # a child rank: no children, no thread
    assert none._thread is None
