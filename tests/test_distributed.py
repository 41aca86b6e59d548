"""cropscale.distributed: the gloo process group is destroyed before interpreter exit, and the launching
rank waits for (and reports) the child ranks Lightning's subprocess launcher started."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from cropscale.distributed import (
    PEER_LEFT,
    PeerRanks,
    child_rank_processes,
    destroy_process_group,
    finish_distributed,
    peer_line,
    peer_ranks,
    register_peer_ranks,
)


def _trainer_with_children(*codes: str):
    procs = [subprocess.Popen([sys.executable, "-c", code]) for code in codes]
    return SimpleNamespace(strategy=SimpleNamespace(launcher=SimpleNamespace(procs=procs))), procs


def test_destroy_only_what_exists(tmp_path):
    assert destroy_process_group() is False  # nothing initialised: nothing to do
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert dist.is_initialized()
    assert destroy_process_group() is True
    assert not dist.is_initialized()


def test_waits_for_every_child_and_reports_failures():
    trainer, procs = _trainer_with_children("import time; time.sleep(0.5)", "raise SystemExit(3)", "pass")
    t0 = time.perf_counter()
    assert finish_distributed(trainer) == [(2, 3)]  # local rank 2 (the second child) exited with 3
    assert time.perf_counter() - t0 >= 0.4  # returned only after the sleeping child ended
    assert [p.returncode for p in procs] == [0, 3, 0]


def test_no_children_outside_the_launching_rank():
    assert finish_distributed(None) == []
    assert child_rank_processes(SimpleNamespace(strategy=SimpleNamespace(launcher=None))) == []
    assert child_rank_processes(SimpleNamespace()) == []


def test_a_hanging_child_is_named():
    trainer, procs = _trainer_with_children("import time; time.sleep(30)")
    try:
        with pytest.raises(TimeoutError, match=r"local rank 1 \(pid \d+\) still runs 0.2 s"):
            finish_distributed(trainer, timeout_s=0.2)
    finally:
        procs[0].kill()
        procs[0].wait()


def test_rank_failure_lines():
    from cropscale.distributed import RankFailure

    assert RankFailure(1, 4242, 2, "data.root: not found").describe() == (
        "DDP rank 1 (pid 4242) exited with status 2: data.root: not found")
    assert RankFailure(3, 7, -9).describe() == "DDP rank 3 (pid 7) was killed by SIGKILL (exit status 137)"


def test_child_failures_read_the_reported_message(tmp_path, monkeypatch):
    from cropscale.distributed import RANK_ERRORS_ENV, child_failures, report_rank_error

    monkeypatch.setenv(RANK_ERRORS_ENV, str(tmp_path))
    trainer, procs = _trainer_with_children("pass", "raise SystemExit(2)")
    report_rank_error(2, "rank 2 had no data")
    failed = child_failures(trainer, wait_s=30)
    assert [(f.local_rank, f.status, f.message) for f in failed] == [(2, 2, "rank 2 had no data")]
    for p in procs:
        p.wait()


def test_lightning_child_observer_is_replaced_by_the_watch():
    """Pins Lightning 2.6's ``_ChildProcessObserver`` (private): it SIGKILLs ``main_pid`` within its polling
    period once a child exits non-zero. With ChildRankWatch's setup its list is emptied and it ends without
    killing; the watch itself gives rank 0 ``grace_s`` to report first."""
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    from cropscale.distributed import ChildRankWatch

    stand_in_main = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # what it would kill
    trainer, procs = _trainer_with_children("raise SystemExit(3)")
    observer = _ChildProcessObserver(main_pid=stand_in_main.pid, child_processes=procs, sleep_period=1)
    watch = ChildRankWatch(grace_s=600, poll_s=0.1)
    try:
        watch.setup(trainer, None, "fit")
        observer.start()
        assert watch.disabled_observers == 0  # started after setup: not found, so replace it now as setup does
        watch._thread = None
        watch.setup(trainer, None, "fit")
        assert watch.disabled_observers == 1 and observer._child_processes == []
        procs[0].wait()
        time.sleep(2.5)  # two polling periods of the observer
        assert stand_in_main.poll() is None and not observer.is_alive()
    finally:
        watch.stop()
        stand_in_main.kill()
        stand_in_main.wait()
    # without the watch, Lightning's observer kills the launching process (here a stand-in) with SIGKILL
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    _, failing = _trainer_with_children("raise SystemExit(3)")
    _ChildProcessObserver(main_pid=victim.pid, child_processes=failing, sleep_period=1).start()
    assert victim.wait(timeout=30) == -9


def test_elastic_restart_hazard_names_the_setting_only_for_restarts_on_the_shared_store():
    from cropscale.distributed import elastic_restart_hazard

    shared = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "1"}
    line = elastic_restart_hazard(shared)
    assert line is not None and "--max-restarts=1" in line and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in line
    assert elastic_restart_hazard({**shared, "TORCHELASTIC_MAX_RESTARTS": "0"}) is None  # no restart to go wrong
    assert elastic_restart_hazard({**shared, "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None  # store per round
    assert elastic_restart_hazard({}) is None  # not under torchrun


# ------------------------------------------------------------------ ranks started by torchrun / srun (issue 26)
def _dead_pid() -> int:
    """The pid of a process of this host that has ended (reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_rank_0_names_the_rank_that_left_and_not_those_that_followed():
    store, here = dist.HashStore(), socket.gethostname()
    dead = _dead_pid()
    store.set("rank1", f"{here} {dead}")                 # killed: gone from this host without a word
    store.set("rank2", f"{here} {os.getpid()}")          # failed with its own error
    store.set("rank2/said", "own|rank 2: data.root /x: no such folder")
    store.set("rank3", f"{here} {os.getpid()}")          # stopped because another rank left: not a cause
    store.set("rank3/said", f"peer|{PEER_LEFT} (RuntimeError: Connection closed by peer)")
    store.set("rank4", f"elsewhere {os.getpid()}")       # another host, silent: named after the wait
    started = time.monotonic()
    named = PeerRanks(store, rank=0, world_size=5, launcher="srun").departed(wait_s=0.5, poll_s=0.05)
    assert time.monotonic() - started >= 0.5
    assert named == [
        f"rank 2 (pid {os.getpid()}, host {here}) failed: data.root /x: no such folder",
        f"rank 1 (pid {dead}, host {here}) left the run without a word: killed by a signal (its exit status is with"
        " srun; SIGKILL and the OOM killer leave no message)",
        f"rank 4 (pid {os.getpid()}, host elsewhere) said nothing within 0.5 s: killed, or its host lost (its exit"
        " status is with srun)",
    ]


def test_a_zombie_counts_as_gone_and_a_live_process_does_not():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z":  # ended, not reaped
        assert time.monotonic() < deadline
        time.sleep(0.05)
    store = dist.HashStore()
    store.set("rank1", f"{socket.gethostname()} {proc.pid}")
    assert "left the run without a word" in PeerRanks(store, 0, 2).departed(wait_s=5.0)[0]
    proc.wait()
    store.set("rank1", f"{socket.gethostname()} {os.getpid()}")  # alive and silent: named only after the wait
    assert "said nothing within 0.2 s" in PeerRanks(store, 0, 2).departed(wait_s=0.2)[0]


def test_peer_line_through_the_run_store(monkeypatch):
    """Ranks 0 and 1 register in a real TCPStore (MASTER_ADDR:MASTER_PORT); rank 1's own error reaches rank 0."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    try:
        one = register_peer_ranks(1, 2)
        assert peer_line("rank 1: injected failure", None) == "rank 1: injected failure"  # left for rank 0
        key = "cropscale/ranks/1/rank1/said"  # PrefixStore joins with "/"
        assert server.check([key]) and server.get(key) == b"own|rank 1: injected failure"
        assert register_peer_ranks(0, 2) is not None and peer_ranks() is not one
        trainer = SimpleNamespace(current_epoch=1, global_step=4)
        assert peer_line(f"{PEER_LEFT} (RuntimeError: Broken pipe)", trainer, wait_s=0.0) == (
            f"rank 1 (pid {os.getpid()}, host {socket.gethostname()}) failed: injected failure; rank 0 stopped at"
            " epoch 1, global step 4")
        assert peer_line("rank 0's own error", trainer) == "rank 0's own error"  # not a peer's departure
    finally:
        register_peer_ranks(0, 1)
    assert peer_ranks() is None
