"""How a rank ends a Lightning DDP run cleanly: shared by every cropscale entry point that runs DDP.

Two gaps of Lightning 2.6 that this closes:

- Lightning destroys the default process group at exit only for NCCL
  (``lightning.fabric.utilities.distributed._init_dist_connection`` registers its ``atexit`` handler
  for that backend alone). Under gloo (CPU DDP) the group is left to interpreter finalisation, where
  gloo's threads can still be joinable when their owners are destroyed: the process then dies with
  ``terminate called without an active exception`` (SIGABRT, exit status -6) *after* a run that
  succeeded. PyTorch's documentation asks every trainer process to call
  :func:`torch.distributed.destroy_process_group` once communication is over.
- Lightning's single-node launcher (``_SubprocessScriptLauncher``) starts ranks 1..N-1 with
  :class:`subprocess.Popen` and never waits for them: rank 0 returns while the others may still be
  writing their files, and their exit status is lost (Lightning issue #17248). A caller that runs
  configurations one after another (the study runner, a test) would start the next run beside the
  last one's stragglers.
"""

from __future__ import annotations

import subprocess
from typing import Any

#: How long the launching rank waits for its child ranks after a successful run (s).
CHILD_RANK_TIMEOUT_S = 120.0


def destroy_process_group() -> bool:
    """Destroy torch.distributed's default process group (and every sub-group) if one exists.

    Call it on the normal exit path of each rank, after the last collective (``trainer.fit``,
    ``validate`` ... have returned on every rank). Not on an error path: a rank that tears the group
    down while others still wait in a collective can hang them.

    Returns:
        True when a process group was destroyed, False when none was initialised (single process,
        or ``torch.distributed`` unavailable).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.destroy_process_group()
    return True


def child_rank_processes(trainer: Any) -> list[subprocess.Popen]:
    """The processes Lightning's subprocess launcher started for ranks 1..N-1 of this node.

    Empty on those ranks themselves, for a single process, for ``ddp_spawn`` and wherever the
    processes were created externally (torchrun, SLURM).
    """
    launcher = getattr(getattr(trainer, "strategy", None), "launcher", None)
    procs = getattr(launcher, "procs", None) or []
    return [p for p in procs if isinstance(p, subprocess.Popen)]


def finish_distributed(trainer: Any | None, timeout_s: float = CHILD_RANK_TIMEOUT_S) -> list[tuple[int, int]]:
    """End a successful run on this rank: destroy the process group, then wait for the child ranks.

    Only the rank that launched the others waits, for each of them to exit.

    Args:
        trainer: the :class:`~lightning.pytorch.Trainer` that ran (None: only destroy the group).
        timeout_s: how long to wait for each child rank (s).

    Returns:
        ``[(local_rank, exit_status), ...]`` of the child ranks that exited non-zero (empty when all
        succeeded or there were none).

    Raises:
        TimeoutError: a child rank still runs after ``timeout_s`` (its local rank is named).
    """
    destroy_process_group()
    failed = []
    for local_rank, proc in enumerate(child_rank_processes(trainer), start=1):
        try:
            status = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            raise TimeoutError(
                f"DDP local rank {local_rank} (pid {proc.pid}) still runs {timeout_s:g} s after rank 0 finished"
            ) from err
        if status != 0:
            failed.append((local_rank, status))
    return failed
