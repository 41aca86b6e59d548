"""Torch threads per process on CPU (issue 28): usable cores // local processes, overridable, printed once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cropscale.env.host import choose_torch_threads, usable_cores
from cropscale.errors import ConfigError


def _brute_force(cores: int, processes: int) -> int:
    """The most threads t with t x processes <= cores, and at least one."""
    best = 1
    for t in range(1, cores + 1):
        if t * processes <= cores:
            best = t
    return best


@pytest.mark.parametrize("cores", range(1, 9))
@pytest.mark.parametrize("processes", range(1, 5))
def test_threads_are_the_cores_shared_among_the_local_processes(cores, processes):
    choice = choose_torch_threads(cores, processes)
    assert choice.threads == _brute_force(cores, processes)
    assert choice.why == f"{cores} cores / {processes} processes"


def test_the_option_wins_then_omp_num_threads():
    assert choose_torch_threads(8, 2, option=3, omp_num_threads="4").threads == 3
    assert choose_torch_threads(8, 2, option=3).why == "--threads 3"
    env = choose_torch_threads(8, 2, omp_num_threads="4")
    assert (env.threads, env.why) == (4, "OMP_NUM_THREADS=4")
    for unusable in ("", "0", "two", "-1"):  # not a thread count: the computed one
        assert choose_torch_threads(8, 2, omp_num_threads=unusable).threads == 4
    with pytest.raises(ConfigError, match=r"^--threads must be >= 1; got 0"):
        choose_torch_threads(8, 2, option=0)


def test_the_line_names_the_count_its_source_and_the_overrides():
    assert choose_torch_threads(2, 2).line() == ("cropscale: torch threads per process: 1 (2 cores / 2 processes);"
                                                 " override with --threads N or OMP_NUM_THREADS")


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_usable_cores_follow_the_affinity_mask():
    """Under ``taskset -c 0`` one core is usable whatever the machine has."""
    assert usable_cores() == len(os.sched_getaffinity(0))
    code = "from cropscale.env.host import usable_cores; print(usable_cores())"
    try:
        out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, check=True).stdout
    except FileNotFoundError:
        pytest.skip("taskset is not installed")
    assert out.strip() == "1"


def test_one_thread_setter_sets_scopes_and_refuses_zero():
    """:func:`cropscale.env.host.set_torch_threads` is the package's only ``torch.set_num_threads`` caller (the CLI,
    the analysis commands' ``--threads`` and the benchmarks' scoped counts all go through it)."""
    import ast
    from pathlib import Path

    import torch

    from cropscale.env.host import set_torch_threads, torch_threads

    start = torch.get_num_threads()
    other = 1 if start != 1 else 2
    try:
        assert set_torch_threads(None) == start and torch.get_num_threads() == start  # None: torch's own choice
        with torch_threads(other):
            assert torch.get_num_threads() == other
        assert torch.get_num_threads() == start  # restored
        assert set_torch_threads(other) == start and torch.get_num_threads() == other
        with pytest.raises(ConfigError, match="threads must be >= 1, got 0"):
            set_torch_threads(0)
        assert torch.get_num_threads() == other
    finally:
        torch.set_num_threads(start)
    package = Path(__file__).resolve().parents[2] / "cropscale"
    callers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                     if any(isinstance(n, ast.Attribute) and n.attr == "set_num_threads"
                            for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))))
    assert callers == ["env/host.py"]
