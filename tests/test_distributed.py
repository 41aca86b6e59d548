"""cropscale.distributed: the gloo process group is destroyed before interpreter exit, and the launching
rank waits for (and reports) the child ranks Lightning's subprocess launcher started."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from cropscale.distributed import child_rank_processes, destroy_process_group, finish_distributed


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
