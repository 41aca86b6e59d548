"""Per-optimizer-step time decomposition: data wait, host-to-device transfer, forward, backward, optimizer, remainder.

The data wait is the data loader's; the backward window holds the exposed gradient all-reduce.

Windows and what Lightning 2.6 puts in them (hook order of one automatic-optimisation step, see
``loops/training_epoch_loop.py`` and ``plugins/precision/precision.py``):

=============  =====================================================  =====================================
window         from -> to                                             also contains
=============  =====================================================  =====================================
``data_wait``  start -> stop of the profiler action                   the loader's ``__next__`` (collate,
               ``[_TrainingEpochLoop].train_dataloader_next``         waiting for workers)
``transfer``   end of the fetch -> ``on_train_batch_start``           ``convert_input``,
                                                                      ``on_before_batch_transfer``,
                                                                      ``transfer_batch_to_device``
                                                                      (non-blocking copies),
                                                                      ``on_after_batch_transfer`` (GPU
                                                                      augmentation), batch-size extraction
``forward``    ``on_train_batch_start`` -> ``on_before_backward``     ``training_step``, ``zero_grad`` (first
                                                                      micro-batch), AMP loss scaling
``backward``   ``on_before_backward`` -> ``on_after_backward``        ``backward`` and the **exposed** DDP
                                                                      gradient all-reduce (the reducer
                                                                      waits for every bucket at its end)
``optimizer``  ``on_after_backward`` -> ``on_train_batch_end``        AMP ``unscale_``,
                                                                      ``on_before_optimizer_step`` hooks,
                                                                      gradient clipping, ``optimizer.step``
                                                                      (``scaler.step`` + ``update``), the
                                                                      step-interval LR-scheduler step
``remainder``  previous ``on_train_batch_end`` -> this fetch start    loop bookkeeping, logging, under DDP
                                                                      the per-step SIGTERM broadcast with
                                                                      ``.item()`` (a host sync, Lightning
                                                                      issue #21487)
``step``       sum of the six windows                                 the whole optimizer-step period
=============  =====================================================  =====================================

Under gradient accumulation the windows are summed over the micro-batches of one optimizer step (the
gaps between micro-batches go to ``remainder``). With DDP the gradient all-reduce is timed by a
communication hook wrapping the default all-reduce, registered on the wrapped model (Lightning
registers comm hooks for CUDA only): ``comm`` is the union of the bucket intervals (launch ->
completion), ``comm_exposed`` the part after the last bucket was launched (gradient computation
finished), i.e. communication not overlapped with backward.

On CUDA every boundary is a ``torch.cuda.Event`` on the current stream, resolved lazily
(``Event.query()`` at the end of each step for the steps not resolved yet, one ``Event.synchronize()`` at
each epoch end); no per-step host sync unless ``sync_cuda=True``. On CPU the boundaries are
``time.perf_counter`` readings, resolved at the end of their step. Resolving as the steps come keeps the log
step cheap: it only logs the interval's means.

The trace (``trace_path``) is buffered as rows of host numbers and handed at each log step to a background
thread that formats and writes them (:class:`~cropscale.callbacks._trace.TraceWriter`): no JSON formatting
on the training thread. The file holds only whole lines; it is drained at each epoch end, at the end of
training and on an exception (a SIGTERM that Lightning handles included).

Two clocks, two names. The windows above are on the run's clock (``summary.step_timing.clock``): on CUDA
the **device timeline** (a window is the device time between the events recorded at its two ends, so
``data_wait`` there is what the GPU did while the host fetched — queued work of the previous step, or
idle — not the fetch's duration). The data wait and the transfer are also timed on the **host clock**
(``time.perf_counter``): ``data_wait_host`` (the loader's ``__next__`` as the host lived it) and
``transfer_host`` (the host time to enqueue the copies and hooks), per epoch in ``host_windows_ms`` (this
rank's median and p95 over the same measured steps). A CPU run has the host clock only: its ``data_wait``
and ``transfer`` are host times, and ``data_wait_host`` / ``transfer_host`` equal them.

Statistics per epoch (median, p95) leave out warm-up steps, the first step of each epoch (its data
wait includes worker start-up, reported apart as ``first_batch_wait_ms``) and the first step after a
validation run. Per-rank medians are gathered at epoch end (max, median, slowest rank).

The callback only records marks in its hooks; the window arithmetic and the statistics live in
:mod:`cropscale.callbacks._windows` (:class:`~cropscale.callbacks._windows.StepMarks` ->
:class:`~cropscale.callbacks._windows.StepWindows` -> :class:`~cropscale.callbacks._windows.WindowAccumulator`).
"""

from __future__ import annotations

import os
from time import perf_counter
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.profilers import PassThroughProfiler, Profiler
from typing_extensions import override

from cropscale.callbacks._batches import batch_size
from cropscale.callbacks._clock import CudaEventClock, HostClock, clock_for
from cropscale.callbacks._dist import gather_named, rank_stats
from cropscale.callbacks._logging import log_metrics
from cropscale.callbacks._trace import TraceRow, TraceWriter
from cropscale.callbacks._windows import (
    COMM_FIGURES,
    FIGURES,
    STEP_WINDOWS,
    BucketMarks,
    MicroBatchMarks,
    StepMarks,
    StepWindows,
    WindowAccumulator,
)
from cropscale.callbacks.base import ScalingCallback, resumed_epoch
from cropscale.errors import CropScaleError
from cropscale.runs.schema import RankStats, StepTimingEpoch, StepTimingSummary, WindowStats

COMPONENTS: tuple[str, ...] = STEP_WINDOWS
"""The windows of one optimizer step, in order (:data:`cropscale.callbacks.STEP_WINDOWS`)."""
COMM_COMPONENTS: tuple[str, ...] = COMM_FIGURES
ALL_FIGURES: tuple[str, ...] = FIGURES
HOST_FIGURES: tuple[str, ...] = ("data_wait_host", "transfer_host")
"""The data wait and transfer on the host clock (``perf_counter``), beside the run clock's windows."""

_FETCH_ACTION = "train_dataloader_next"


class _StepTimingProfiler(Profiler):
    """Delegates everything to the trainer's profiler and marks the training fetch start and stop.

    ``profile()`` is the inner profiler's own bound method (no extra cost per hook); only the direct
    ``start``/``stop`` calls (made by the data fetchers) pass through here. Private contract of
    Lightning 2.6 (``_TrainingEpochLoop._on_before_fetch``), pinned by a test. The default
    ``PassThroughProfiler``'s ``start``/``stop`` do nothing, so they are not called.
    """

    def __init__(self, inner: Profiler, owner: StepTimingCallback) -> None:
        super().__init__()
        self.inner = inner
        self._owner = owner
        self.profile = inner.profile  # type: ignore[method-assign]
        passthrough = type(inner) is PassThroughProfiler
        self._inner_start = None if passthrough else inner.start
        self._inner_stop = None if passthrough else inner.stop

    def start(self, action_name: str) -> None:
        if action_name.endswith(_FETCH_ACTION):
            self._owner._on_fetch_start()
        if self._inner_start is not None:
            self._inner_start(action_name)

    def stop(self, action_name: str) -> None:
        if action_name.endswith(_FETCH_ACTION):
            self._owner._on_fetch_end()
        if self._inner_stop is not None:
            self._inner_stop(action_name)

    def summary(self) -> str:
        return self.inner.summary()

    def describe(self) -> None:
        self.inner.describe()

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        self.inner.setup(stage, local_rank=local_rank, log_dir=log_dir)

    def teardown(self, stage: str | None) -> None:
        self.inner.teardown(stage)

    def __del__(self) -> None:  # the inner profiler tears itself down
        pass

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class StepTimingCallback(ScalingCallback):
    """Decomposes every optimizer step into data wait, transfer, forward, backward, optimizer and remainder.

    Also times the DDP gradient all-reduce. The module docstring says what each window contains.

    Args:
        warmup_steps: optimizer steps at the start of ``fit`` left out of the statistics (cuDNN
            autotuning, compilation, allocator growth).
        sync_cuda: call ``torch.cuda.synchronize()`` after every step (perturbs the run; only to
            compare with host timing). Default: lazy CUDA events, no per-step sync.
        time_comm: time the DDP gradient all-reduce with a communication hook.
        trace_path: write one JSON line per window and step (Extra-P JSON-lines format: ``params``,
            ``callpath`` like ``train_step->forward``, ``metric`` ``time``, ``value`` in seconds, plus
            ``rank``, ``step``, ``epoch``, ``warmup``), from a background thread. ``{rank}`` is replaced by
            the global rank; a relative path is taken inside ``trainer.log_dir``. ``None`` (default): no
            trace (``configs/default.yaml`` and the presets turn it on).
        trace_params: Extra-P modelling parameters written in every line besides ``world_size``
            (e.g. ``{"local_batch": 8}``).
        max_pending: steps kept unresolved at most; beyond it the oldest is waited for.

    Logged (TensorBoard, at log steps): ``perf/step/<window>_ms`` means over the steps resolved since
    the last log step (warm-up included); at epoch end ``perf/epoch/<window>_ms_median`` and
    ``_p95`` (all ranks' statistics on rank 0's log: the per-rank medians), ``perf/epoch/
    step_ms_rank_max``, ``perf/epoch/step_ms_rank_median``, ``perf/epoch/slowest_rank``,
    ``perf/epoch/first_batch_wait_ms``.

    ``state_dict`` keeps the step counts and the per-epoch summaries, so a resumed run continues them, and inside an
    epoch its measured steps so far (their raw window durations and host windows, this rank's: rank 0's in the
    checkpoint). Resumed inside an epoch, rank 0's statistics of it hold the steps before the checkpoint and those
    after the restart (the first step after the restart has no previous step end in the process: left out like an
    epoch's first). From a checkpoint at an epoch's last batch end Lightning goes on with the next epoch without the
    resumed one's ``on_train_epoch_end``: ``on_train_start`` closes its record there with the saved steps (the
    per-rank figures of that record hold rank 0's only).

    Example::

        from lightning.pytorch import Trainer
        from cropscale.callbacks import StepTimingCallback

        trainer = Trainer(callbacks=[StepTimingCallback(warmup_steps=5, trace_path="step_trace.rank{rank}.jsonl")])

        # command line: the preset's settings replace the member of configs/default.yaml's CallbackGroup
        #   python -m cropscale fit --config callbacks/step_timing.yaml
    """

    summary_key = "step_timing"

    def __init__(
        self,
        warmup_steps: int = 5,
        sync_cuda: bool = False,
        time_comm: bool = True,
        trace_path: str | None = None,
        trace_params: dict[str, float] | None = None,
        max_pending: int = 1024,
    ) -> None:
        if warmup_steps < 0:
            raise CropScaleError(f"StepTimingCallback(warmup_steps={warmup_steps}): must be >= 0")
        if max_pending < 1:
            raise CropScaleError(f"StepTimingCallback(max_pending={max_pending}): must be >= 1")
        self.warmup_steps = warmup_steps
        self.sync_cuda = sync_cuda
        self.time_comm = time_comm
        self.trace_path = trace_path
        self.trace_params = dict(trace_params or {})
        self.max_pending = max_pending
        # persistent state
        self.steps_total = 0
        self.steps_measured = 0
        self.epochs: list[StepTimingEpoch] = []
        # run state
        self._clock: HostClock | CudaEventClock = HostClock()
        self._mark: Any = self._clock.mark  # the clock's mark function, looked up once per fit
        self._profiler: _StepTimingProfiler | None = None
        self._cur: MicroBatchMarks | None = None
        self._micros: list[MicroBatchMarks] = []
        self._buckets: list[BucketMarks] = []
        self._micro_comm: list[BucketMarks] = []
        self._prev_end: Any = None
        self._stepped = False
        self._first_in_epoch = True
        self._after_val = False
        self._steps_this_fit = 0
        self._pending: list[StepMarks] = []
        self._stats = WindowAccumulator()
        self._epoch = 0
        self._in_epoch = False  # between the start of an epoch (or of the fit) and its end
        self._resumed_in_epoch: dict[str, Any] | None = None  # the checkpoint's "in_epoch" state, until on_train_start
        self._comm_status: dict[str, Any] = {"available": False, "reason": "not a multi-process DDP run"}
        self._trace: TraceWriter | None = None
        self._trace_rows: list[TraceRow] = []
        self._trace_file: str | None = None
        self._rank = 0
        self._world = 1
        self._host_fetch: tuple[float | None, float | None] = (None, None)  # this micro-batch's fetch, host s
        self._host_step = [0.0, 0.0]  # data_wait_host, transfer_host of the step so far (s)
        self._host_epoch: list[tuple[float, float]] = []

    # ------------------------------------------------------------------ state
    @override
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"steps_total": self.steps_total, "steps_measured": self.steps_measured,
                                 "epochs": [e.to_json() for e in self.epochs]}
        if self._in_epoch:  # a checkpoint inside an epoch: its measured steps so far (resolving waits for them)
            self._resolve(block=True)
            state["in_epoch"] = {"epoch": self._epoch, **self._stats.epoch_state(),
                                 "host": [list(row) for row in self._host_epoch]}
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps_total = int(state_dict.get("steps_total", 0))
        self.steps_measured = int(state_dict.get("steps_measured", 0))
        self.epochs = [StepTimingEpoch.from_json(e) for e in state_dict.get("epochs", [])]
        self._resumed_in_epoch = state_dict.get("in_epoch")

    # ------------------------------------------------------------------ set-up
    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit" or isinstance(trainer.profiler, _StepTimingProfiler):
            return
        self._profiler = _StepTimingProfiler(trainer.profiler, self)
        trainer.profiler = self._profiler

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._profiler is not None and trainer.profiler is self._profiler:
            trainer.profiler = self._profiler.inner
        self._profiler = None
        self._close_trace()

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._clock = clock_for(pl_module.device)
        self._mark = self._clock.mark
        self._rank, self._world = trainer.global_rank, trainer.world_size
        self._steps_this_fit = 0
        self._pending.clear()
        self._stats = WindowAccumulator()
        self._cur, self._prev_end = None, None  # marks of an earlier fit are not this one's (nor its clock's)
        self._open_epoch(trainer)  # Lightning calls no on_train_epoch_start for an epoch resumed inside
        self._start_log_schedule(trainer)
        self._register_comm_hook(trainer)
        if self.trace_path:
            path = self.trace_path.replace("{rank}", str(self._rank))
            if not os.path.isabs(path):
                log_dir = trainer.log_dir or trainer.default_root_dir  # a collective: every rank calls it
                path = os.path.join(log_dir, path)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._trace_file = path
            self._trace_rows = []
            self._trace = TraceWriter(path, ALL_FIGURES, {"world_size": self._world, **self.trace_params},
                                      self._rank)
        self._resume_epoch(trainer, pl_module)

    def _resume_epoch(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Continue the epoch of the checkpoint's ``in_epoch`` state, or close it when the trainer has moved on.

        The saved steps are rank 0's: rank 0 restores them, the other ranks start the epoch empty. Every rank
        loaded the same state, so every rank takes the same branch and joins the gather of :meth:`_close_epoch`.
        """
        resumed, over = resumed_epoch(self._resumed_in_epoch, trainer)
        self._resumed_in_epoch = None
        if resumed is None:
            return
        if trainer.global_rank == 0:
            self._stats.restore_epoch(resumed)
            self._host_epoch = [(float(a), float(b)) for a, b in resumed.get("host", [])]
        if over:  # the resumed epoch's last batch end: its record closes here, the next epoch starts
            self._close_epoch(trainer, pl_module, int(resumed["epoch"]))
            self._open_epoch(trainer)

    def _register_comm_hook(self, trainer: Trainer) -> None:
        if not self.time_comm:
            self._comm_status = {"available": False, "reason": "time_comm=False"}
            return
        if trainer.world_size <= 1:
            self._comm_status = {"available": False, "reason": "single process: no gradient all-reduce"}
            return
        model = trainer.strategy.model
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            self._comm_status = {
                "available": False,
                "reason": f"strategy {type(trainer.strategy).__name__} does not wrap the model in "
                "DistributedDataParallel (comm hooks exist for DDP only)",
            }
            return
        try:
            model.register_comm_hook(state=model.process_group, hook=self._comm_hook)
        except RuntimeError as err:  # a hook is already registered (DDPStrategy(ddp_comm_hook=...))
            self._comm_status = {"available": False, "reason": f"could not register a comm hook: {err}"}
            return
        backend = torch.distributed.get_backend(model.process_group) if torch.distributed.is_initialized() else "?"
        self._comm_status = {"available": True, "backend": str(backend), "clock": self._clock.kind}

    def _comm_hook(self, state, bucket):  # no annotations: DDP checks the hook signature
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        rec = BucketMarks(self._clock.mark())
        self._buckets.append(rec)
        fut = default_hooks.allreduce_hook(state, bucket)

        def _done(f):
            rec.done = self._clock.mark()
            return f.value()

        return fut.then(_done)

    # ------------------------------------------------------------------ boundaries
    def _on_fetch_start(self) -> None:
        cur = self._cur
        if cur is not None:  # an orphan record (prefetch outside a step, or the epoch's last fetch)
            self._clock.release(cur.marks())
        self._host_fetch = (perf_counter(), None)
        self._cur = MicroBatchMarks(fetch_start=self._mark())

    def _on_fetch_end(self) -> None:
        cur = self._cur
        if cur is not None:
            cur.fetch_end = self._mark()
            self._host_fetch = (self._host_fetch[0], perf_counter())

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._open_epoch(trainer)

    def _open_epoch(self, trainer: Trainer) -> None:
        """Start epoch ``trainer.current_epoch``: no step measured yet, its first step to come."""
        self._epoch = trainer.current_epoch
        self._in_epoch = True
        self._first_in_epoch = True
        self._after_val = False
        self._stats.start_epoch()
        self._host_epoch = []
        self._host_step = [0.0, 0.0]
        self._micros = []
        self._micro_comm = []
        if self._prev_end is not None:
            self._clock.release([self._prev_end])
        self._prev_end = None

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        cur = self._cur
        if cur is None:  # no fetch seen (dataloader_iter-style training_step)
            cur = self._cur = MicroBatchMarks()
        cur.batch_start = self._mark()
        start, end = self._host_fetch
        if start is not None and end is not None:
            host = perf_counter()
            self._host_step[0] += end - start
            self._host_step[1] += host - end
        self._host_fetch = (None, None)
        self._stepped = False

    @override
    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        cur = self._cur
        if cur is not None and cur.backward_start is None:
            cur.backward_start = self._mark()

    @override
    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        cur = self._cur
        if cur is not None:
            if cur.backward_end is not None:
                self._clock.release([cur.backward_end])
            cur.backward_end = self._mark()
        if self._buckets:
            self._micro_comm.extend(self._buckets)
            self._buckets = []

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._after_val = True

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        cur = self._cur
        if cur is None:
            return
        cur.batch_end = self._mark()
        self._cur = None
        self._micros.append(cur)
        if not self._stepped:  # accumulating: the optimizer step spans more micro-batches
            return
        self.steps_total += 1
        self._steps_this_fit += 1
        step = self._gstep  # this optimizer step's index (trainer.global_step before it), counted just below
        log_now = self._count_step()
        self._pending.append(StepMarks(
            self._micros, self._micro_comm, self._prev_end, warmup=self._steps_this_fit <= self.warmup_steps,
            first_in_epoch=self._first_in_epoch, after_validation=self._after_val, step=step,
            epoch=self._epoch, samples=batch_size(batch) if self._trace is not None else None,
        ))
        if not (self._pending[-1].excluded or self._pending[-1].prev_end is None):
            self._host_epoch.append((self._host_step[0], self._host_step[1]))
        self._host_step = [0.0, 0.0]
        self._prev_end = cur.batch_end
        self._micros = []
        self._micro_comm = []
        self._first_in_epoch = False
        self._after_val = False
        if self.sync_cuda and self._clock.device_timeline:
            torch.cuda.synchronize()
        if len(self._pending) > self.max_pending:
            self._resolve(block=True, limit=len(self._pending) - self.max_pending)
        self._resolve(block=False)  # host marks: this step; CUDA events: the steps the device has finished
        if log_now:
            self._log_interval(trainer)
            if self._trace is not None and self._trace_rows:
                rows, self._trace_rows = self._trace_rows, []
                self._trace.put(rows)

    # ------------------------------------------------------------------ resolution
    def _resolve(self, block: bool, limit: int | None = None) -> None:
        """Turn pending steps into windows, oldest first; stop at the first unfinished one unless ``block``.

        Args:
            block: wait for an unfinished step instead of stopping there.
            limit: resolve at most this many steps (``None``: every pending step).
        """
        done = 0
        while self._pending and (limit is None or done < limit):
            marks = self._pending[0]
            windows = self._windows_when_ready(marks, block)
            if windows is None:
                break
            self._pending.pop(0)
            done += 1
            if self._stats.update(marks, windows):
                self.steps_measured += 1
            if self._trace is not None:
                self._trace_rows.append((windows.figures(), marks.step, marks.epoch, marks.warmup, marks.samples))
            if self._clock.device_timeline:  # recycle every event except this step's end (the next prev_end)
                self._clock.release(marks.spent_marks())

    def _windows_when_ready(self, marks: StepMarks, block: bool) -> StepWindows | None:
        """The step's windows once its last marks completed; ``None`` if not yet and not ``block``."""
        clock = self._clock
        for mark in marks.completion_marks():
            if not clock.ready(mark):
                if not block:
                    return None
                clock.wait(mark)
        try:
            return marks.windows(clock.seconds)
        except RuntimeError:  # an earlier CUDA event of the step is still pending
            if not block:
                return None
            clock.wait_all()
            return marks.windows(clock.seconds)

    def _hand_over_trace(self, wait: bool) -> None:
        """Give the buffered trace rows to the writer thread; with ``wait``, until they are on disk."""
        if self._trace is None:
            return
        rows, self._trace_rows = self._trace_rows, []
        self._trace.put(rows)
        if wait:
            self._trace.drain()

    def _close_trace(self) -> None:
        if self._trace is not None:
            trace, self._trace = self._trace, None
            rows, self._trace_rows = self._trace_rows, []
            trace.put(rows)
            trace.close()

    # ------------------------------------------------------------------ logging
    def _log_interval(self, trainer: Trainer) -> None:
        means = self._stats.interval_means_ms()
        if means:
            log_metrics(trainer, {f"perf/step/{name}_ms": value for name, value in means.items()})

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close_epoch(trainer, pl_module, trainer.current_epoch)

    def _close_epoch(self, trainer: Trainer, pl_module: LightningModule, epoch: int) -> None:
        """Append ``epoch``'s record from its measured steps and log its figures; gathers over ranks (a collective)."""
        self._in_epoch = False
        if self._cur is not None and self._cur.batch_start is None:  # the fetch that ended the epoch
            self._clock.release(self._cur.marks())
            self._cur = None
        self._resolve(block=True)
        self._hand_over_trace(wait=True)
        stats = self._stats.epoch_stats_ms()
        mine = {**{name: stats[name].median for name in ALL_FIGURES}, "first_batch_wait": self._stats.first_batch_wait}
        ranks = gather_named(trainer, pl_module, mine)  # every rank's medians (ms) and first wait (s), by name
        step_ranks = rank_stats([r["step"] for r in ranks])
        first_wait = [None if r["first_batch_wait"] is None else r["first_batch_wait"] * 1e3 for r in ranks]
        self.epochs.append(StepTimingEpoch(
            epoch=epoch,
            steps_measured=self._stats.epoch_steps,
            windows_ms=stats,
            step_ms_per_rank=RankStats(**step_ranks),
            window_median_ms_per_rank={name: [r[name] for r in ranks] for name in ALL_FIGURES},
            first_batch_wait_ms_per_rank=first_wait,
            host_windows_ms={name: WindowStats.of([row[i] for row in self._host_epoch], scale=1e3)
                             for i, name in enumerate(HOST_FIGURES)},
        ))
        metrics: dict[str, float | None] = {}
        for name in ALL_FIGURES:
            metrics[f"perf/epoch/{name}_ms_median"] = stats[name].median
            metrics[f"perf/epoch/{name}_ms_p95"] = stats[name].p95
        metrics["perf/epoch/step_ms_rank_max"] = step_ranks["max"]
        metrics["perf/epoch/step_ms_rank_median"] = step_ranks["median"]
        metrics["perf/epoch/slowest_rank"] = step_ranks["slowest_rank"]
        metrics["perf/epoch/first_batch_wait_ms"] = max((w for w in first_wait if w is not None), default=None)
        log_metrics(trainer, metrics)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._resolve(block=True)
        self._close_trace()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._close_trace()

    # ------------------------------------------------------------------ summary
    @override
    def summary(self) -> StepTimingSummary:
        return StepTimingSummary(
            clock=self._clock.kind,
            warmup_steps=self.warmup_steps,
            sync_cuda=self.sync_cuda,
            steps_total=self.steps_total,
            steps_measured=self.steps_measured,
            comm_timing=dict(self._comm_status),
            trace_path=self._trace_file,
            windows=list(ALL_FIGURES),
            epochs=list(self.epochs),
        )
