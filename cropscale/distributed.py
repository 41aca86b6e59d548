"""How a rank ends a Lightning DDP run, cleanly or not: shared by every cropscale entry point that runs DDP.

Three gaps of Lightning 2.6 that this closes:

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
- When one rank fails, the others print gloo's tracebacks (about 100 lines) after the failing rank's
  own error, and Lightning's child-process observer SIGKILLs the launching rank (rank 0) within 5 s
  of a child's non-zero exit, before it can say what happened. :class:`ChildRankWatch` replaces that
  observer: rank 0 learns which child failed and how (:func:`child_failures`), stops the others
  (:func:`stop_child_ranks`) and prints one line naming the failed rank, its exit status and its
  own error message (:func:`report_rank_error`, written by the child to a file), as the last line.
  A rank 0 stuck after a child failed is bounded by the watch's grace period; a rank that hangs while the
  others wait for it is named by :class:`cropscale.hangs.HangWatch`.
- Under an external launcher (torchrun, ``srun``) every rank is a process of its own and rank 0 has no handle on
  the others: a rank killed outright (SIGKILL, the OOM killer) shows on rank 0 only as a collective's error
  ("Connection closed by peer"). :class:`PeerRanks` gives rank 0 the name: each rank leaves its host and pid in
  the run's TCP store (the process group's rendezvous store at ``MASTER_ADDR:MASTER_PORT``) at setup, and its
  one-line error when it fails; rank 0 then names the rank that left without a word (its pid gone, on rank 0's
  host; or no word within a wait elsewhere) or the one that failed with an error.
"""

from __future__ import annotations

import atexit
import datetime
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

#: How long the launching rank waits for its child ranks after a successful run (s).
CHILD_RANK_TIMEOUT_S = 120.0
#: Environment variable naming the folder where ranks leave their one-line errors for the launching rank.
RANK_ERRORS_ENV = "CROPSCALE_RANK_ERRORS"
#: How a rank's line begins when it stops because another rank left (a consequence, not a cause).
PEER_LEFT = "stopped: another rank left the run"


def elastic_restart_hazard(env: Mapping[str, str] | None = None) -> str | None:
    """The warning line for a torchrun job whose restarts would reuse the rendezvous's shared store, else None.

    With ``--max-restarts`` > 0, torchrun by default hands its workers the rendezvous's shared TCP store
    (``TORCHELASTIC_USE_AGENT_STORE=True``), and that store outlives a restart: the restarted workers' default
    process group, whose keys carry no attempt prefix, can read the first attempt's (dead) peer addresses,
    and gloo's connect is refused or hangs. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in torchrun's environment
    gives each rendezvous round a store of its own.

    Args:
        env: the environment to read (default ``os.environ``): ``TORCHELASTIC_USE_AGENT_STORE`` and
            ``TORCHELASTIC_MAX_RESTARTS``, set by torchrun for its workers.
    """
    env = os.environ if env is None else env
    try:
        restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    except ValueError:
        return None
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or restarts <= 0:
        return None
    return (f"cropscale: warning: torchrun --max-restarts={restarts} with its shared rendezvous store: a restarted"
            " attempt can fail at the process group's connect (the store still holds the first attempt's peer"
            " addresses); export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun")


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
    _PEERS.clear()
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


@dataclass(frozen=True)
class RankFailure:
    """A child rank that ended with a non-zero status.

    Attributes:
        local_rank: the rank on this node (1..N-1; the global rank on a single node).
        pid: its process id.
        status: ``Popen.returncode``: the exit status, or ``-signal`` when a signal killed it.
        message: the one-line error it reported (:func:`report_rank_error`), or "" when it could not
            (killed by a signal).
    """

    local_rank: int
    pid: int
    status: int
    message: str = ""

    def describe(self) -> str:
        """E.g. ``DDP rank 1 (pid 4242) exited with status 2: data.root ...`` or ``... was killed by SIGKILL``."""
        if self.status < 0:
            try:
                name = signal.Signals(-self.status).name
            except ValueError:
                name = f"signal {-self.status}"
            how = f"was killed by {name} (exit status {128 - self.status})"
        else:
            how = f"exited with status {self.status}"
        text = f"DDP rank {self.local_rank} (pid {self.pid}) {how}"
        return f"{text}: {self.message}" if self.message else text


def prepare_rank_reports() -> Path | None:
    """On the launching process, before the ranks start: a folder for their one-line errors, named in the environment.

    The child ranks inherit the environment variable :data:`RANK_ERRORS_ENV`. Does nothing (returns None)
    on a child rank (``LOCAL_RANK`` > 0) or when the variable is already set.
    """
    if os.environ.get(RANK_ERRORS_ENV) or int(os.environ.get("LOCAL_RANK", "0") or 0) > 0:
        return None
    folder = Path(tempfile.mkdtemp(prefix="cropscale-ranks-"))
    os.environ[RANK_ERRORS_ENV] = str(folder)
    _OWN_REPORTS.append(folder)
    atexit.register(cleanup_rank_reports)
    return folder


_OWN_REPORTS: list[Path] = []


def cleanup_rank_reports() -> None:
    """Remove the folder :func:`prepare_rank_reports` made in this process (also run at exit)."""
    while _OWN_REPORTS:
        shutil.rmtree(_OWN_REPORTS.pop(), ignore_errors=True)


def report_rank_error(local_rank: int, message: str) -> None:
    """On a failing child rank: leave its one-line error where the launching rank reads it (best effort)."""
    folder = os.environ.get(RANK_ERRORS_ENV)
    if not folder or local_rank < 1:
        return
    try:
        Path(folder, f"rank{local_rank}.txt").write_text(message, encoding="utf-8")
    except OSError:
        pass


def _reported(local_rank: int) -> str:
    folder = os.environ.get(RANK_ERRORS_ENV)
    if not folder:
        return ""
    try:
        return Path(folder, f"rank{local_rank}.txt").read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def child_failures(trainer: Any, wait_s: float = 0.0) -> list[RankFailure]:
    """The child ranks that have ended with a non-zero status, waiting up to ``wait_s`` for one to end.

    Args:
        trainer: the Trainer whose launcher started the children (see :func:`child_rank_processes`).
        wait_s: how long to wait for a failure to show (s): a rank whose peer died sees a gloo error
            a moment before the dead peer is reaped.
    """
    procs = child_rank_processes(trainer)
    deadline = time.monotonic() + wait_s
    while True:
        failed = [RankFailure(i, p.pid, p.returncode, _reported(i))
                  for i, p in enumerate(procs, start=1) if p.poll() is not None and p.returncode != 0]
        if failed or time.monotonic() >= deadline:
            return failed
        time.sleep(0.1)


def stop_child_ranks(trainer: Any, timeout_s: float = 10.0) -> None:
    """SIGKILL the child ranks that still run and reap them (their gloo errors are not worth printing)."""
    for proc in child_rank_processes(trainer):
        if proc.poll() is None:
            proc.kill()
    for proc in child_rank_processes(trainer):
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass


class ChildRankWatch(Callback):
    """On the launching rank: replace Lightning's child-process observer by one that reports before it kills.

    Lightning's ``_ChildProcessObserver`` (a thread of rank 0) SIGKILLs every rank, rank 0 included, within
    5 s of a child's non-zero exit: rank 0 then ends without a word. At ``setup`` this callback empties
    that observer's process list (it then ends at its next wake-up; pinned by
    ``tests/test_distributed.py``) and starts its own thread, which polls the children every
    ``poll_s``. Rank 0 itself normally notices a dead child first (its next collective fails) and the
    CLI reports it (:func:`child_failures`); when rank 0 is still running ``grace_s`` after a child
    failed (stuck), the thread prints the one line itself, SIGKILLs the other children and ends the
    process with status 1. Nothing of this happens on child ranks or without children. On every rank of
    a multi-process run (whatever launched it) ``setup`` also joins :class:`PeerRanks`
    (:func:`register_peer_ranks`).

    Args:
        grace_s: time left to rank 0 to end by itself after a child failed (s).
        poll_s: polling period (s).
    """

    def __init__(self, grace_s: float = 60.0, poll_s: float = 0.5) -> None:
        super().__init__()
        self.grace_s, self.poll_s = float(grace_s), float(poll_s)
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self.disabled_observers = 0

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        register_peer_ranks(getattr(trainer, "global_rank", 0), getattr(trainer, "world_size", 1))
        procs = child_rank_processes(trainer)
        if not procs or self._thread is not None:
            return
        for thread in threading.enumerate():
            if type(thread).__name__ == "_ChildProcessObserver" and hasattr(thread, "_child_processes"):
                thread._child_processes = []
                self.disabled_observers += 1
        self._thread = threading.Thread(target=self._watch, args=(trainer,), name="cropscale-rank-watch", daemon=True)
        self._thread.start()

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.stop()

    def stop(self) -> None:
        """End the watch (rank 0 is ending by itself)."""
        self._done.set()

    def _watch(self, trainer: Trainer) -> None:
        while not self._done.wait(self.poll_s):
            failed = child_failures(trainer)
            if not failed:
                continue
            if self._done.wait(self.grace_s):
                return  # rank 0 ended by itself and reports it
            stop_child_ranks(trainer)
            print(f"cropscale: error: {failed[0].describe()}; rank 0 did not end within {self.grace_s:g} s and"
                  " was stopped", file=sys.stderr, flush=True)
            os._exit(1)


def launcher_name(env: Mapping[str, str] | None = None) -> str:
    """``torchrun``, ``srun`` or ``its launcher``: what started this process, from the variables each one sets.

    torchrun sets ``TORCHELASTIC_RUN_ID`` for its workers, ``srun`` sets ``SLURM_STEP_ID`` / ``SLURM_JOB_ID`` (a
    torchrun inside a SLURM job is named torchrun: it is the workers' parent).
    """
    env = os.environ if env is None else env
    if env.get("TORCHELASTIC_RUN_ID"):
        return "torchrun"
    if env.get("SLURM_JOB_ID"):
        return "srun"
    return "its launcher"


def _pid_gone(pid: int) -> bool:
    """True when no process ``pid`` runs on this host (none, or a zombie not yet reaped by its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def run_store(prefix: str, timeout_s: float = 5.0) -> Any | None:
    """A new client of the run's TCP store (``MASTER_ADDR:MASTER_PORT``), under ``<prefix>/<torchrun attempt>/``.

    The process group's rendezvous store, set up under torchrun, srun and Lightning's launcher; the attempt
    (``TORCHELASTIC_RESTART_COUNT``) keeps a restarted torchrun job's keys apart (its shared store outlives a
    restart). A client serves one thread at a time: a thread that polls the store makes its own.

    Returns:
        A :class:`torch.distributed.PrefixStore`, or None when the variables are missing or the store does not
        answer within ``timeout_s``.
    """
    import torch.distributed as dist

    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None
    try:
        client = dist.TCPStore(addr, int(port), is_master=False, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError):  # DistNetworkError, DistStoreError are RuntimeErrors
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"{prefix}/{attempt}", client)


class PeerRanks:
    """The ranks of a multi-process run as its TCP store knows them: who runs where, and who said what at the end.

    Keys (under ``cropscale/ranks/<torchrun attempt>/``: torchrun's shared store outlives a restart):
    ``rank<r>`` = ``"<host> <pid>"`` (written by :meth:`register`) and ``rank<r>/said`` = ``"own|<line>"`` (the
    rank failed) or ``"peer|<line>"`` (it stopped because another rank left) (:meth:`report`).

    Args:
        store: a :class:`torch.distributed.Store` shared by the ranks (a ``TCPStore`` client; a ``HashStore`` in tests).
        rank: this process's global rank.
        world_size: the number of ranks.
        launcher: what started the ranks (:func:`launcher_name`), for the lines.
    """

    def __init__(self, store: Any, rank: int, world_size: int, launcher: str = "its launcher") -> None:
        self.store, self.rank, self.world_size, self.launcher = store, int(rank), int(world_size), launcher

    @classmethod
    def connect(cls, rank: int, world_size: int, timeout_s: float = 5.0) -> PeerRanks | None:
        """A client of the store at ``MASTER_ADDR:MASTER_PORT`` (set under torchrun, srun and Lightning's launcher).

        Returns None when the variables are missing or the store does not answer within ``timeout_s``.
        """
        store = run_store("cropscale/ranks", timeout_s)
        return None if store is None else cls(store, rank, world_size, launcher_name())

    def register(self) -> None:
        """Leave this rank's host and pid in the store (call on every rank once the process group is up)."""
        self.store.set(f"rank{self.rank}", f"{socket.gethostname()} {os.getpid()}")

    def report(self, line: str) -> None:
        """Leave this rank's last line (best effort); one beginning with :data:`PEER_LEFT` is marked a consequence."""
        kind = "peer" if line.startswith(PEER_LEFT) else "own"
        try:
            self.store.set(f"rank{self.rank}/said", f"{kind}|{line}")
        except RuntimeError:
            pass

    def _read(self, key: str) -> str | None:
        try:
            return self.store.get(key).decode() if self.store.check([key]) else None
        except RuntimeError:
            return None

    def departed(self, wait_s: float = 10.0, poll_s: float = 0.2) -> list[str]:
        """On rank 0 after a collective failed: one text per other rank that caused it, the failed ones first.

        A rank that reported its own error is named with it; a rank on this host whose process is gone without a
        word was killed by a signal (SIGKILL, the OOM killer: nothing to report); a rank elsewhere that said
        nothing within ``wait_s`` is named as silent. Ranks that stopped because a peer left are not named.

        Args:
            wait_s: how long to wait for the ranks not yet accounted for (s).
            poll_s: the polling period (s).

        Returns:
            E.g. ``["rank 1 (pid 4242, host n1) left the run without a word: killed by a signal (its exit status is
            with srun; SIGKILL and the OOM killer leave no message)"]``; empty when every other rank is accounted
            for by a peer's departure or the store does not answer.
        """
        deadline = time.monotonic() + wait_s
        here = socket.gethostname()
        while True:
            failed, silent, waiting = [], [], False
            for r in range(self.world_size):
                if r == self.rank:
                    continue
                who = (self._read(f"rank{r}") or "").split()
                host, pid = (who[0], int(who[1])) if len(who) == 2 and who[1].isdigit() else ("?", 0)
                name = f"rank {r} (pid {pid}, host {host})" if pid else f"rank {r}"
                said = self._read(f"rank{r}/said")
                if said is not None:
                    kind, _, line = said.partition("|")
                    if kind == "own":
                        failed.append(f"{name} failed: {line.removeprefix(f'rank {r}: ')}")
                elif pid and host == here and _pid_gone(pid):
                    silent.append(f"{name} left the run without a word: killed by a signal (its exit status is with"
                                  f" {self.launcher}; SIGKILL and the OOM killer leave no message)")
                elif time.monotonic() < deadline:
                    waiting = True
                else:
                    silent.append(f"{name} said nothing within {wait_s:g} s: killed, or its host lost (its exit"
                                  f" status is with {self.launcher})")
            if not waiting:
                return failed + silent
            time.sleep(poll_s)


_PEERS: list[PeerRanks] = []


def register_peer_ranks(rank: int, world_size: int) -> PeerRanks | None:
    """On every rank of a multi-process run, once its process group is up: join :class:`PeerRanks` (best effort).

    Replaces this process's previous registration. Returns the registration (also kept for :func:`peer_ranks`),
    or None (and none is kept) for one process or without a store.
    """
    _PEERS.clear()
    if world_size < 2:
        return None
    peers = PeerRanks.connect(rank, world_size)
    if peers is None:
        return None
    try:
        peers.register()
    except RuntimeError:
        return None
    _PEERS[:] = [peers]
    return peers


def peer_ranks() -> PeerRanks | None:
    """This process's :class:`PeerRanks` (None before :func:`register_peer_ranks` or without one)."""
    return _PEERS[0] if _PEERS else None


def peer_line(text: str, trainer: Any | None = None, wait_s: float = 10.0) -> str:
    """The last line of a failing rank, with :class:`PeerRanks`: left for rank 0, or on rank 0 naming who left.

    On a rank other than 0: leaves ``text`` in the store and returns it. On rank 0, when ``text`` begins with
    :data:`PEER_LEFT` (a collective failed because another rank left): the line naming that rank
    (:meth:`PeerRanks.departed`) and where rank 0 stopped. Otherwise, or without :func:`register_peer_ranks`,
    ``text`` unchanged.

    Args:
        text: the rank's one-line error (without ``cropscale: error:``).
        trainer: the Trainer that ran (for rank 0's epoch and global step), or None.
        wait_s: how long rank 0 waits for a rank to be accounted for (s).
    """
    peers = peer_ranks()
    if peers is None:
        return text
    if peers.rank != 0:
        peers.report(text)
        return text
    if not text.startswith(PEER_LEFT):
        return text
    departed = peers.departed(wait_s=wait_s)
    if not departed:
        return text
    where = (f" at epoch {trainer.current_epoch}, global step {trainer.global_step}"
             if trainer is not None and hasattr(trainer, "global_step") else "")
    return f"{departed[0]}; rank 0 stopped{where}"
