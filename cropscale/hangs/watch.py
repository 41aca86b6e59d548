"""The hang watch of a DDP fit: every rank reports its progress, rank 0 names the rank that stopped.

A hung rank does not enter the next collective, so rank 0 cannot learn about it through one. Instead, from
``on_train_start``, a thread of every rank reads its own Trainer's progress counters (Lightning's batch
progress: nothing is added to a training step) once per ``poll_s`` and leaves a :class:`~cropscale.hangs.judge.Progress`
in the run's TCP store (:class:`ProgressBoard`); once its position stops moving it adds where its main thread
is (:func:`where_is`, from the Python stack). Rank 0's thread reads every rank's report and feeds
:class:`~cropscale.hangs.judge.HangJudge`. When the judge names a hang, rank 0: asks every rank to dump its
Flight Recorder where one records (:mod:`cropscale.hangs.recorder`), tells the listeners (the provenance
callback writes ``run.json`` with ``status: failed`` and ``hang_watch.hang``), tells the other ranks to end
(they exit with status 1), SIGKILLs the child ranks it launched, prints one last line naming the hung rank,
every rank's last progress and the command that resumes the run from its newest checkpoint, and exits with
:data:`HANG_EXIT_STATUS`.

Exit status 1: the run failed, as when a rank fails (:mod:`cropscale.cli.exits`); not 2, which says the
user's input was wrong; not 0, which says a stop signal saved a checkpoint at the step it stopped (nothing
is saved at a hang: the steps since the newest checkpoint are lost).

Limits: a process whose C code holds the GIL stops its own reporting thread too (its heartbeat stops: the
line says so); a rank 0 in that state cannot name anyone, and the collective's own timeout remains. Where a
rank is comes from its Python stack: an NCCL collective returns at once and hangs later at a
synchronisation, so there the Flight Recorder's dumps tell more.
"""

from __future__ import annotations

import dataclasses
import datetime
import linecache
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from cropscale.checkpointing import find_resume_state, launch_resume_command
from cropscale.distributed import ChildRankWatch, child_rank_processes, run_store, stop_child_ranks
from cropscale.errors import ConfigError
from cropscale.hangs.judge import TRAINING, Hang, HangBound, HangJudge, Progress
from cropscale.hangs.recorder import dump_function, flight_recorder_record, place_dumps, recording, write_dump
from cropscale.runs.schema import FlightRecorderRecord, HangRecord, HangWatchRecord, RankProgress

#: The exit status of a run the watch ended (module docstring).
HANG_EXIT_STATUS = 1
_ENDING = threading.Event()


class RankHang(RuntimeError):
    """The error a run ended by the hang watch records (``run.json["error"]["type"]``)."""


def ending() -> bool:
    """True once the hang watch has named a hang in this process and is ending the run."""
    return _ENDING.is_set()


def wait_while_ending(timeout_s: float = 120.0) -> None:
    """On the main thread: while the hang watch ends the run, wait (it exits the process).

    The other ranks' end makes this rank's collective fail; that error is a consequence, not worth a line.
    """
    if _ENDING.is_set():
        threading.Event().wait(timeout_s)


# ------------------------------------------------------------------------------------------ progress
@dataclass
class Marks:
    """What the rare hooks note for the reporting thread (no per-step hook).

    Attributes:
        val_at: the training position at which the last validation started (-1: none yet).
        val_state: 1 while validating, 2 after ``on_validation_end`` (checkpoint writes follow).
        completed_at_start: training batches completed when this fit's training started (resume included).
    """

    val_at: int = -1
    val_state: int = 0
    completed_at_start: int = 0


def train_position(trainer: Any) -> int:
    """The sum of Lightning's four training batch counters (ready, started, processed, completed; cumulative).

    Each batch moves it by 4: after it is fetched, before its step, after its step and after
    ``on_train_batch_end``. The ranks of a DDP fit run the same batches, so equal values mean the same point.
    """
    total = trainer.fit_loop.epoch_loop.batch_progress.total
    return total.ready + total.started + total.processed + total.completed


def read_progress(trainer: Any, marks: Marks, rank: int, beat: int) -> Progress:
    """This rank's :class:`~cropscale.hangs.judge.Progress`, read from the Trainer (any thread).

    The position is ``(training position, validation state at it, done with its own validation batches, the
    validation batch counters, epoch)``: validation runs at the same training position on every rank, a rank
    with fewer validation batches (DDP shards patches unevenly) counts as ahead once it has done them, and the
    epoch moves at the epoch end.
    """
    loop = trainer.fit_loop.epoch_loop
    current = loop.batch_progress.current
    t = train_position(trainer)
    state = marks.val_state if marks.val_at == t else 0
    val = loop.val_loop.batch_progress.current
    val_pos = val.ready + val.started + val.processed + val.completed if state == 1 else 0
    done = int(state == 1 and val.completed >= sum(trainer.num_val_batches or [0]))
    if loop.batch_progress.total.completed <= marks.completed_at_start:
        phase = "warm-up"
    elif state:
        phase = "validation"
    elif current.ready == 0:
        phase = "epoch start"
    elif current.completed >= trainer.num_training_batches:
        phase = "epoch end"
    else:
        phase = TRAINING
    stage = ("no batch yet" if current.ready == 0 else "before its step" if current.ready > current.started
             else "in its step" if current.started > current.processed
             else "after its step" if current.processed > current.completed else "done")
    return Progress(rank=rank, position=(t, state, done, val_pos, int(trainer.current_epoch)),
                    epoch=int(trainer.current_epoch), batch=max(current.ready - 1, 0), stage=stage,
                    global_step=int(trainer.global_step), phase=phase, beat=beat)


_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2]) + os.sep


def _short(path: str) -> str:
    """A frame's file, relative to ``site-packages``, to this checkout or to the working directory."""
    if "site-packages" + os.sep in path:
        return path.rsplit("site-packages" + os.sep, 1)[1]
    if path.startswith(_PACKAGE_PARENT):
        return path[len(_PACKAGE_PARENT):]
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


_DISTRIBUTED = f"{os.sep}torch{os.sep}distributed{os.sep}"
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def _stdlib(path: str) -> bool:
    """A frame of Python's standard library (``threading``, ``queue``, ...)."""
    return path.startswith(_STDLIB) and "site-packages" not in path


def _library(path: str) -> bool:
    """A frame of torch or Lightning (not the caller a line should name)."""
    return any(f"{os.sep}{lib}{os.sep}" in path for lib in ("torch", "lightning", "lightning_fabric"))


def where_is(stack: list[tuple[str, int, str]]) -> tuple[str, bool | None]:
    """Where a thread is, from its Python stack, innermost frame first: ``(text, in_collective)``.

    Judged on the innermost frame outside the standard library (a wait on a lock or queue is inside it):

    - in ``torch/distributed``: ``in a collective: <function>, called from <the first frame outside
      torch.distributed>`` (True);
    - in ``torch/autograd``: in backward, where DDP waits for its gradient all-reduce (True);
    - in ``torch/utils/data``: waiting for data in the DataLoader (False: its own input, not another rank);
    - the innermost frame itself, on a line that waits on a work handle (``.wait(``): a collective started
      earlier (True);
    - otherwise its own code, ``at <file>:<line> in <function>`` (False).

    Args:
        stack: ``(filename, line, function)`` of each frame, innermost first.
    """
    if not stack:
        return "where: no Python frame", None
    file, line, func = next((f for f in stack if not _stdlib(f[0])), stack[0])
    if _DISTRIBUTED in file:
        caller = next((f"{_short(f)}:{n} in {fn}" for f, n, fn in stack if _DISTRIBUTED not in f), "?")
        return f"in a collective: {func}, called from {caller}", True
    if f"{os.sep}torch{os.sep}autograd{os.sep}" in file:
        return "in backward (where DDP waits for its gradient all-reduce)", True
    if f"{os.sep}torch{os.sep}utils{os.sep}data{os.sep}" in file:
        caller = next((f"{_short(f)}:{n} in {fn}" for f, n, fn in stack if not _library(f) and not _stdlib(f)), "?")
        return f"waiting for data in the DataLoader, called from {caller}", False
    if file == stack[0][0] and ".wait(" in linecache.getline(file, line):
        return f"waiting for a collective it started, at {_short(file)}:{line} in {func}", True
    return f"in its own code at {_short(file)}:{line} in {func}", False


def thread_stack(ident: int) -> list[tuple[str, int, str]]:
    """The Python stack of thread ``ident``, innermost frame first (empty when it has none)."""
    frame = sys._current_frames().get(ident)
    stack = []
    while frame is not None:
        stack.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return stack


# ------------------------------------------------------------------------------------------ channel
class ProgressBoard:
    """The ranks' reports in a store shared by the ranks (keys under ``cropscale/progress/<attempt>/``).

    ``rank<r>`` = the rank's last :class:`~cropscale.hangs.judge.Progress` line; ``dump`` and ``stop`` = rank 0's
    requests; ``dump/rank<r>`` = a rank's answer (its dump's path, or ``error: ...``). Store errors are
    swallowed: a report that cannot be written or read is simply not seen.

    Args:
        store: a :class:`torch.distributed.Store` (a ``TCPStore`` client of its own; a ``HashStore`` in tests).
        rank: this process's global rank.
        world_size: the number of ranks.
    """

    def __init__(self, store: Any, rank: int, world_size: int) -> None:
        self.store, self.rank, self.world_size = store, int(rank), int(world_size)

    @classmethod
    def connect(cls, rank: int, world_size: int, timeout_s: float = 10.0) -> ProgressBoard | None:
        """A board on a new client of the run's TCP store (:func:`~cropscale.distributed.run_store`), or None."""
        store = run_store("cropscale/progress", timeout_s)
        return None if store is None else cls(store, rank, world_size)

    def _get(self, key: str) -> str | None:
        try:
            return self.store.get(key).decode() if self.store.check([key]) else None
        except RuntimeError:
            return None

    def _set(self, key: str, value: str) -> None:
        try:
            self.store.set(key, value)
        except RuntimeError:
            pass

    def publish(self, progress: Progress) -> None:
        """Leave this rank's report."""
        self._set(f"rank{self.rank}", progress.to_text())

    def read(self) -> dict[int, Progress]:
        """Every rank's last report that can be read (ranks that never reported are absent)."""
        found = {}
        for r in range(self.world_size):
            text = self._get(f"rank{r}")
            progress = Progress.from_text(text) if text is not None else None
            if progress is not None:
                found[r] = progress
        return found

    def ask(self, what: str, text: str = "1") -> None:
        """Rank 0: request ``what`` (``dump``, ``stop``) of every rank."""
        self._set(what, text)

    def asked(self, what: str) -> str | None:
        """The request ``what``'s text, or None while not requested."""
        return self._get(what)

    def answer(self, what: str, text: str) -> None:
        """Answer the request ``what``."""
        self._set(f"{what}/rank{self.rank}", text)

    def answers(self, what: str) -> dict[int, str]:
        """The other ranks' answers to ``what``, by rank."""
        found = {r: self._get(f"{what}/rank{r}") for r in range(self.world_size) if r != self.rank}
        return {r: text for r, text in found.items() if text is not None}


def hang_record(hang: Hang, message: str, dumps: list[str]) -> HangRecord:
    """The ``run.json`` record of ``hang`` (``hang_watch.hang``)."""
    ranks = [RankProgress(rank=s.rank, published=s.progress is not None, still_s=s.still_s, heartbeat=s.heartbeat,
                          **({} if s.progress is None else {
                              "epoch": s.progress.epoch, "batch": s.progress.batch, "stage": s.progress.stage,
                              "global_step": s.progress.global_step, "phase": s.progress.phase,
                              "where": s.progress.where, "in_collective": s.progress.in_collective}))
             for s in hang.ranks]
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
    return HangRecord(hung_ranks=list(hang.hung), separated=hang.separated, still_s=hang.still_s,
                      bound_s=hang.bound_s, bound_kind=hang.kind, bound_rule=hang.rule, detected_utc=now,
                      ranks=ranks, message=message, flight_recorder_dumps=dumps)


def resume_hint(trainer: Any, argv: list[str]) -> str:
    """``no checkpoint was saved at the hang, the newest is <path> (epoch e, global step g); resume with: ...``.

    The newest is the state ``--ckpt_path auto`` resumes (:func:`~cropscale.checkpointing.find_resume_state`
    over the logger's run folder).
    """
    logger = getattr(trainer, "logger", None)
    try:
        state = find_resume_state(logger.save_dir, logger.name, logger.version) if logger is not None else None
    except (AttributeError, TypeError, OSError):  # a logger without a run folder
        state = None
    newest = (f"the newest is {os.path.relpath(state.path)} (epoch {state.epoch}, global step {state.global_step})"
              if state is not None else "none was saved before it")
    return f"no checkpoint was saved at the hang, {newest}; resume with{launch_resume_command(argv)}"


def watch_of(trainer: Any) -> HangWatch | None:
    """The first :class:`HangWatch` of the Trainer's callbacks, members of a callback group included, or None.

    A configured one comes before the CLI's default (LightningCLI appends its ``trainer_defaults`` callbacks).
    """
    for cb in getattr(trainer, "callbacks", []):
        members = getattr(cb, "callbacks", None) if getattr(cb, "_is_callback_group", False) else None
        for member in members if isinstance(members, list) else [cb]:
            if isinstance(member, HangWatch):
                return member
    return None


class HangWatch(Callback):
    """Name a DDP rank that stops reaching its next step, within a bound, and end the run with its resume command.

    The bound (:class:`~cropscale.hangs.judge.HangBound`) is how long no rank may move: during ordinary steps
    ``max(floor_s, factor x the longest stillness of ordinary steps so far)``; while the rank furthest behind is
    in a pause (the first batch of the fit or of an epoch, validation, the epoch end with its checkpoint writes)
    ``max(pause_floor_s, factor x the longest pause so far)``. The defaults:

    - ``factor=10``: the measure is already the *longest* stillness the healthy run showed (a log step, a
      collection by Python's garbage collector, a slow batch read), so ten times it is far outside the run's own
      spread; a hang is unbounded, so a larger factor only delays the line.
    - ``floor_s=60``: a step takes milliseconds on a GPU and seconds on a CPU, so ten steps can be shorter than a
      stall no step has shown yet (a page-cache miss on a network file system, a swap-in); a minute covers those
      and is still far below the collective timeout (30 min under Lightning) that would otherwise end the run
      without naming anyone.
    - ``pause_floor_s=600``: validation reports every batch, so a pause is one validation batch, one checkpoint
      write (gigabytes on a parallel file system can take minutes) or the start of an epoch's DataLoader workers
      on a cold cache; ten minutes covers them and is a third of the collective timeout.

    The reports are read once per ``poll_s`` (the line comes at most one period after the bound). Each rank's
    reporting thread costs nothing per step (it reads Lightning's counters); a report is one store write a
    second. One process, ``enabled=False`` or no TCP store: nothing runs (``run.json`` says why). Only the
    first ``HangWatch`` of the Trainer's callbacks watches. See :mod:`cropscale.hangs.watch` for the ending.

    Args:
        floor_s: the least stillness named during ordinary steps (s).
        pause_floor_s: the least stillness named during a pause (s).
        factor: the bound's multiple of the longest stillness of the same kind measured so far.
        poll_s: the reporting and reading period (s).
        enabled: False: no watch.
        dump_wait_s: how long rank 0 waits for the ranks' Flight Recorder dumps after naming a hang (s).

    Raises:
        ConfigError: a floor, the factor or ``poll_s`` not a positive number, or a negative ``dump_wait_s``.

    Example (a ``--config`` file; the CLI adds one with the defaults after the configured callbacks)::

        trainer:
          callbacks:
            - class_path: cropscale.hangs.HangWatch
              init_args: {floor_s: 120, pause_floor_s: 1800}
    """

    def __init__(self, floor_s: float = 60.0, pause_floor_s: float = 600.0, factor: float = 10.0,
                 poll_s: float = 1.0, enabled: bool = True, dump_wait_s: float = 10.0) -> None:
        super().__init__()
        self.bound = HangBound(floor_s, pause_floor_s, factor)
        if not (isinstance(poll_s, int | float) and 0 < poll_s < float("inf")):
            raise ConfigError(f"HangWatch(poll_s={poll_s!r}): must be a positive number")
        if not (isinstance(dump_wait_s, int | float) and dump_wait_s >= 0):
            raise ConfigError(f"HangWatch(dump_wait_s={dump_wait_s!r}): must be a number >= 0")
        self.poll_s, self.dump_wait_s, self.enabled = float(poll_s), float(dump_wait_s), bool(enabled)
        self.active, self.reason = False, "not set up for fit"
        self.hang: HangRecord | None = None
        self.flight_recorder: FlightRecorderRecord | None = None
        self._backend: str | None = None
        self._prefix: str | None = None
        self._board: ProgressBoard | None = None
        self._marks = Marks()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._listeners: list[Callable[[HangWatchRecord, str], None]] = []
        self._argv = list(sys.argv[1:])

    def add_listener(self, listener: Callable[[HangWatchRecord, str], None]) -> None:
        """Call ``listener(record, line)`` on rank 0 when a hang is named, before the run ends (at most 10 s)."""
        self._listeners.append(listener)

    def record(self) -> HangWatchRecord:
        """``run.json["hang_watch"]``: the settings, whether it watches, the Flight Recorder, the hang named."""
        b = self.bound
        return HangWatchRecord(enabled=self.active, reason=None if self.active else self.reason,
                               floor_s=b.floor_s, pause_floor_s=b.pause_floor_s, factor=b.factor, poll_s=self.poll_s,
                               channel="tcp-store" if self.active else None,
                               flight_recorder=self.flight_recorder, hang=self.hang)

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        world, grouped = int(trainer.world_size), dist.is_available() and dist.is_initialized()
        first = watch_of(trainer) is self
        self._backend = str(dist.get_backend()) if grouped and world > 1 else None
        if first and self._backend is not None:
            folder = trainer.log_dir or trainer.default_root_dir  # a collective under DDP: every rank calls it
            self._prefix = place_dumps(folder) if recording(self._backend) else None
        self.flight_recorder = flight_recorder_record(self._backend, self._prefix)
        self.reason = ("another HangWatch of the run's callbacks watches it" if not first
                       else "HangWatch(enabled=False)" if not self.enabled
                       else "one process: no rank waits for another" if world < 2
                       else "no process group" if not grouped else None)
        if self.reason is None:
            self._board = ProgressBoard.connect(trainer.global_rank, world)
            if self._board is None:
                self.reason = "no TCP store at MASTER_ADDR:MASTER_PORT to report progress through"
        self.active = self.reason is None

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.active or self._thread is not None:
            return
        self._marks = Marks(completed_at_start=trainer.fit_loop.epoch_loop.batch_progress.total.completed)
        self._done.clear()
        judge = HangJudge(trainer.world_size, self.bound, self.poll_s) if trainer.global_rank == 0 else None
        self._thread = threading.Thread(target=self._run, args=(trainer, threading.get_ident(), judge),
                                        name="cropscale-hang-watch", daemon=True)
        self._thread.start()

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._marks.val_at, self._marks.val_state = train_position(trainer), 1

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._marks.val_state = 2

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._done.set()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._done.set()

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._done.set()
        self._thread = None

    # ------------------------------------------------------------------------ the reporting thread
    def _run(self, trainer: Trainer, main_ident: int, judge: HangJudge | None) -> None:
        assert self._board is not None
        beat, last, dumped = 0, None, False
        while not self._done.wait(self.poll_s):
            beat += 1
            try:
                progress = read_progress(trainer, self._marks, trainer.global_rank, beat)
            except Exception:  # the Trainer between two states (read from another thread): the next beat
                continue
            if progress.position == last:
                where, in_collective = where_is(thread_stack(main_ident))
                progress = dataclasses.replace(progress, where=where, in_collective=in_collective)
            last = progress.position
            self._board.publish(progress)
            if judge is None:
                dumped = self._follow(trainer.global_rank, dumped)
                continue
            reports = self._board.read()
            reports[trainer.global_rank] = progress
            hang = judge.observe(time.monotonic(), reports)
            if hang is not None:
                self._end(trainer, hang)
                return

    def _follow(self, rank: int, dumped: bool) -> bool:
        """A rank other than 0: answer rank 0's dump request once; end the process at its stop request."""
        assert self._board is not None
        if not dumped and self._board.asked("dump") is not None:
            self._board.answer("dump", self._dump(rank))
            dumped = True
        if self._board.asked("stop") is not None:
            print(f"cropscale: error: rank {rank}: stopped: rank 0 ended the run after naming a hanging rank",
                  file=sys.stderr, flush=True)
            os._exit(HANG_EXIT_STATUS)
        return dumped

    def _dump(self, rank: int) -> str:
        """This rank's Flight Recorder dump: its path, or ``error: ...``."""
        dump = dump_function(self._backend) if self._backend else None
        if dump is None or self._prefix is None:
            return "error: no Flight Recorder in this process"
        try:
            return write_dump(dump, self._prefix, rank)
        except (OSError, RuntimeError) as err:
            return f"error: {type(err).__name__}: {err}"

    def _collect_dumps(self, world_size: int) -> list[str]:
        """Rank 0: every rank's Flight Recorder dump (its own first), waiting up to ``dump_wait_s`` for the others."""
        assert self._board is not None
        self._board.ask("dump")
        own = self._dump(0)
        deadline, answers = time.monotonic() + self.dump_wait_s, self._board.answers("dump")
        while len(answers) < world_size - 1 and time.monotonic() < deadline:
            time.sleep(0.1)
            answers = self._board.answers("dump")
        return [p for p in (own, *(answers[r] for r in sorted(answers))) if not p.startswith("error:")]

    def _notify(self, line: str) -> None:
        """Call the listeners in a thread of their own, waiting for them at most 10 s (they must not hold the line)."""
        record = self.record()

        def call() -> None:
            for listener in self._listeners:
                try:
                    listener(record, line)
                except Exception as err:  # a listener's failure must not keep the run from ending
                    print(f"cropscale: warning: hang listener failed: {type(err).__name__}: {err}", file=sys.stderr)

        thread = threading.Thread(target=call, name="cropscale-hang-record", daemon=True)
        thread.start()
        thread.join(timeout=10.0)

    def _end(self, trainer: Trainer, hang: Hang) -> None:
        """Rank 0: dumps, the record, the other ranks stopped, the last line, exit (module docstring)."""
        assert self._board is not None
        _ENDING.set()
        message = hang.describe()
        try:
            applies = self.flight_recorder is not None and self.flight_recorder.applies
            dumps = self._collect_dumps(trainer.world_size) if applies else []
            self.hang = hang_record(hang, message, dumps)
            self._notify(message)
            self._board.ask("stop", "hang")
            for cb in trainer.callbacks:
                if isinstance(cb, ChildRankWatch):
                    cb.stop()
            if child_rank_processes(trainer):
                stop_child_ranks(trainer)
            else:  # ranks of torchrun or srun: give them time to read the stop request (the store may be ours)
                time.sleep(min(3 * self.poll_s, 10.0))
            message = f"{message}; {resume_hint(trainer, self._argv)}"
        finally:  # whatever failed above, the run ends with the line
            print(f"cropscale: error: {message}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(HANG_EXIT_STATUS)
