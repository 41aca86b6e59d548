"""Launching the study's fit runs: the command, the launcher, and the check of batch and LR.

The exact ``python -m cropscale fit`` command of a configuration and seed; a launcher that runs it as
one child process (Lightning starts the DDP ranks inside it); the check that the run used the planned
batch and learning rate.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cropscale.files import CHECKOUT, find_resource
from cropscale.study import protocol as P
from cropscale.study.plan import Configuration, node_layout
from cropscale.study.spec import (
    PRECISION_CONFIGS,
    STRATEGY_CONFIGS,
    BatchSweepSpec,
    StudySpec,
)

_BATCH_LINE = re.compile(
    r"global batch (\d+) = local (\d+) x world size (\d+) x accumulation (\d+).*?lr (\S+) -> ([0-9.eE+-]+)"
    r"(?:; optimizer '(\w+)')?"
)


def fit_command(
    spec: StudySpec, config: Configuration, seed: int, run_root: Path, accelerator: str, data_root: str | None,
    node_rank: int = 0,
) -> list[str]:
    """The ``python -m cropscale fit ...`` command of one configuration and seed.

    Order: base configs, precision config, strategy config, the spec's overrides, then the protocol
    arguments (which therefore win): accelerator, devices / nodes, epochs, accumulation, local
    batch, LR and its rule, seed, logger folder ``run_root/<config>/seed<k>``, data root; for a batch
    sweep also the optimiser, the warm-up in epochs and the schedule.
    """
    nodes, per_node = node_layout(spec, config.world_size, accelerator)
    values = {"python": sys.executable, "nodes": str(nodes), "devices_per_node": str(per_node),
              "world_size": str(config.world_size), "node_rank": str(node_rank)}
    prefix = spec.launcher or ("{python}", "-m", "cropscale")
    cmd = [os.path.expandvars(tok.format(**values)) for tok in prefix]
    cmd.append("fit")
    for cfg in spec.base_configs:
        cmd += ["--config", str(find_resource(cfg, f"base config of {spec.source}", hint="see base_configs"))]
    cmd += ["--config", str(find_resource(PRECISION_CONFIGS[config.precision], "precision config"))]
    strategy = spec.strategy
    if config.world_size == 1 and spec.single_device_strategy == "single":
        strategy = "single"
    cmd += ["--config", str(find_resource(STRATEGY_CONFIGS[strategy], "strategy config"))]
    cmd += list(spec.overrides)
    plan = config.plan
    cmd += [
        f"--trainer.accelerator={accelerator}",
        f"--trainer.devices={per_node}",
        f"--trainer.num_nodes={nodes}",
        f"--trainer.max_epochs={spec.max_epochs}",
        f"--trainer.accumulate_grad_batches={plan.accumulation}",
        f"--data.batch_size={plan.local_batch}",
        f"--model.lr={plan.base_lr!r}",
        f"--model.lr_scaling={plan.lr_scaling}",
        f"--model.reference_batch_size={plan.reference_batch}",
        f"--seed_everything={seed}",
        f"--trainer.logger.init_args.save_dir={run_root}",
        f"--trainer.logger.init_args.name={config.key}",
        f"--trainer.logger.init_args.version=seed{seed}",
    ]
    if data_root is not None:
        cmd.append(f"--data.root={data_root}")
    if config.protocol == P.BATCH_SWEEP:
        sweep = next(p for p in spec.protocols if isinstance(p, BatchSweepSpec))
        cmd += [f"--model.optimizer={plan.optimizer}", "--model.warmup_steps=0",
                f"--model.warmup_epochs={sweep.lr_warmup_epochs!r}", f"--model.schedule={sweep.lr_schedule}"]
    return cmd


# ---------------------------------------------------------------------------------------- launch
@dataclass
class LaunchResult:
    """What a launcher returns for one fit process."""

    returncode: int
    wall_s: float
    log_path: str


Launcher = Callable[[list[str], dict[str, str], Path, float | None], LaunchResult]


def subprocess_launcher(cmd: list[str], env: dict[str, str], log_path: Path, timeout_s: float | None) -> LaunchResult:
    """Run ``cmd`` as one child process, stdout and stderr to ``log_path``.

    Lightning starts the DDP ranks inside it; a timeout kills the child's whole process group.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.write(f"\ncropscale study: killed after the run timeout of {timeout_s} s\n")
            rc = 124
    return LaunchResult(rc, time.perf_counter() - start, str(log_path))


def child_env(spec: StudySpec, accelerator: str) -> dict[str, str]:
    """The environment of a fit process: the parent's, with unbuffered output and this package first.

    ``OMP_NUM_THREADS`` is set on CPU, and the folder of this very ``cropscale`` package comes first on
    ``PYTHONPATH`` (every run executes the same code).
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    package_parent = str(CHECKOUT)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != package_parent]
    env["PYTHONPATH"] = os.pathsep.join([package_parent, *paths])
    if accelerator == "cpu" and spec.threads_per_process is not None:
        env["OMP_NUM_THREADS"] = str(spec.threads_per_process)
    return env


def check_batch_line(log_text: str, plan: P.BatchPlan) -> tuple[bool | None, str]:
    """Compare the task's printed global-batch and LR line with the plan.

    The line reads ``global batch G = local L x world size N x accumulation A ... lr a -> b; optimizer 'o'``;
    the optimiser is compared for a batch sweep (the one protocol that sets it).
    Returns (True/False, detail), or (None, reason) when the log has no such line.
    """
    m = _BATCH_LINE.search(log_text)
    if not m:
        return None, "the fit log has no 'global batch ... lr ... -> ...' line"
    g, loc, n, a = (int(m.group(i)) for i in range(1, 5))
    lr = float(m.group(6))
    ok = (g, loc, n, a) == (plan.global_batch, plan.local_batch, plan.world_size, plan.accumulation) and math.isclose(
        lr, plan.lr, rel_tol=1e-4
    )
    detail = (f"run: G={g} L={loc} N={n} A={a} lr={lr:g}; plan: G={plan.global_batch} L={plan.local_batch}"
              f" N={plan.world_size} A={plan.accumulation} lr={plan.lr:g}")
    if plan.protocol == P.BATCH_SWEEP:
        ok = ok and m.group(7) == plan.optimizer
        detail += f"; optimizer run {m.group(7)!r}, plan {plan.optimizer!r}"
    return ok, detail


# ------------------------------------------------------------------------------------ CPU share of a run
@dataclass(frozen=True)
class CpuSample:
    """Host CPU counters at one instant: ``/proc/stat`` busy and total jiffies, children's CPU seconds, clock (s)."""

    busy_jiffies: int | None
    total_jiffies: int | None
    children_cpu_s: float
    clock_s: float


def cpu_sample() -> CpuSample:
    """Sample the host's CPU counters (``/proc/stat`` where it exists) and this process's children's CPU time."""
    import resource

    busy = total = None
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
        busy = total - fields[3] - fields[4]
    except (OSError, ValueError, IndexError):
        pass
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return CpuSample(busy, total, usage.ru_utime + usage.ru_stime, time.monotonic())


def session_scheduling(path: str | Path = "/proc/sys/kernel/sched_autogroup_enabled") -> bool | None:
    """True when the Linux scheduler groups threads by session (autogroup), False when not, None when unknown."""
    try:
        return Path(path).read_text().strip() == "1"
    except OSError:
        return None


def cpu_usage(before: CpuSample, after: CpuSample) -> dict[str, float | int | bool | None]:
    """Cores busy on the host, used by the run, and used by other work, averaged over the run (``measured-run``).

    ``busy_cores`` = busy share of ``/proc/stat`` x the cores of this process's CPU set; ``own_cores`` = the
    run's processes' CPU seconds (``RUSAGE_CHILDREN``: the fit and the ranks it waited for) / wall seconds;
    ``other_cores`` = ``busy_cores - own_cores`` (>= 0): work of other processes sharing the cores; ``autogroup``:
    the kernel shares the cores between sessions first, then between a session's threads (Linux
    ``/proc/sys/kernel/sched_autogroup_enabled``; None where it cannot be read).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    wall = max(after.clock_s - before.clock_s, 1e-9)
    own = (after.children_cpu_s - before.children_cpu_s) / wall
    out: dict[str, float | int | bool | None] = {"cores": cores, "own_cores": own, "busy_cores": None,
                                                 "other_cores": None, "autogroup": session_scheduling()}
    counted = before.total_jiffies is not None and after.total_jiffies is not None
    if counted and after.total_jiffies > before.total_jiffies:
        share = (after.busy_jiffies - before.busy_jiffies) / (after.total_jiffies - before.total_jiffies)
        busy = share * (os.cpu_count() or cores)
        out["busy_cores"] = busy
        out["other_cores"] = max(0.0, busy - own)
    return out
