"""Per-optimizer-step time decomposition: data-loader wait, host-to-device transfer, forward, backward
(with the exposed gradient all-reduce), optimizer, and the remainder.

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
(``Event.query()`` at log steps, one ``Event.synchronize()`` at each epoch end); no per-step host
sync unless ``sync_cuda=True``. On CPU the boundaries are ``time.perf_counter`` readings.

Statistics per epoch (median, p95) leave out warm-up steps, the first step of each epoch (its data
wait includes worker start-up, reported apart as ``first_batch_wait_ms``) and the first step after a
validation run. Per-rank medians are gathered at epoch end (max, median, slowest rank).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.profilers import Profiler
from lightning.pytorch.utilities import rank_zero_info

from cropscale.callbacks._batches import batch_size
from cropscale.callbacks._clock import CudaEventClock, HostClock, clock_for
from cropscale.callbacks._dist import gather_vectors, rank_stats
from cropscale.callbacks._logging import log_metrics
from cropscale.callbacks.base import ScalingCallback
from cropscale.errors import CropScaleError
from cropscale.evidence import MEASURED_RUN
from cropscale.numbers import median_p95

COMPONENTS: tuple[str, ...] = ("data_wait", "transfer", "forward", "backward", "optimizer", "remainder")
"""The windows of one optimizer step, in order."""
COMM_COMPONENTS: tuple[str, ...] = ("comm", "comm_exposed")
ALL_FIGURES: tuple[str, ...] = (*COMPONENTS, "step", *COMM_COMPONENTS)

_FETCH_ACTION = "train_dataloader_next"
# indices of the marks of one micro-batch
_F0, _F1, _S, _B0, _B1, _E = range(6)
_DATA_WAIT, _REMAINDER = ALL_FIGURES.index("data_wait"), ALL_FIGURES.index("remainder")


class _StepTimingProfiler(Profiler):
    """Delegates everything to the trainer's profiler and marks the training fetch start and stop.

    ``profile()`` is the inner profiler's own bound method (no extra cost per hook); only the direct
    ``start``/``stop`` calls (made by the data fetchers) pass through here. Private contract of
    Lightning 2.6 (``_TrainingEpochLoop._on_before_fetch``), pinned by a test.
    """

    def __init__(self, inner: Profiler, owner: StepTimingCallback) -> None:
        super().__init__()
        self.inner = inner
        self._owner = owner
        self.profile = inner.profile  # type: ignore[method-assign]

    def start(self, action_name: str) -> None:
        if action_name.endswith(_FETCH_ACTION):
            self._owner._on_fetch_start()
        self.inner.start(action_name)

    def stop(self, action_name: str) -> None:
        if action_name.endswith(_FETCH_ACTION):
            self._owner._on_fetch_end()
        self.inner.stop(action_name)

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
    """Decomposes every optimizer step into data wait, transfer, forward, backward, optimizer and
    remainder (see the module docstring for what each window contains), plus the DDP all-reduce.

    Args:
        warmup_steps: optimizer steps at the start of ``fit`` left out of the statistics (cuDNN
            autotuning, compilation, allocator growth).
        sync_cuda: call ``torch.cuda.synchronize()`` after every step (perturbs the run; only to
            compare with host timing). Default: lazy CUDA events, no per-step sync.
        time_comm: time the DDP gradient all-reduce with a communication hook.
        trace_path: write one JSON line per window and step (Extra-P JSON-lines format: ``params``,
            ``callpath`` like ``train_step->forward``, ``metric`` ``time``, ``value`` in seconds, plus
            ``rank``, ``step``, ``epoch``, ``warmup``). ``{rank}`` is replaced by the global rank; a
            relative path is taken inside ``trainer.log_dir``. ``None``: no trace.
        trace_params: Extra-P modelling parameters written in every line besides ``world_size``
            (e.g. ``{"local_batch": 8}``).
        max_pending: steps kept unresolved at most; beyond it the oldest is waited for.

    Logged (TensorBoard, at log steps): ``perf/step/<window>_ms`` means over the steps resolved since
    the last log step (warm-up included); at epoch end ``perf/epoch/<window>_ms_median`` and
    ``_p95`` (all ranks' statistics on rank 0's log: the per-rank medians), ``perf/epoch/
    step_ms_rank_max``, ``perf/epoch/step_ms_rank_median``, ``perf/epoch/slowest_rank``,
    ``perf/epoch/first_batch_wait_ms``.

    ``state_dict`` keeps the step counts and the per-epoch summaries, so a resumed run continues them.
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
        self.epochs: list[dict[str, Any]] = []
        # run state
        self._clock: HostClock | CudaEventClock = HostClock()
        self._profiler: _StepTimingProfiler | None = None
        self._cur: list[Any] | None = None
        self._micros: list[list[Any]] = []
        self._buckets: list[list[Any]] = []
        self._micro_comm: list[list[Any]] = []
        self._prev_end: Any = None
        self._stepped = False
        self._first_in_epoch = True
        self._after_val = False
        self._steps_this_fit = 0
        self._pending: list[tuple] = []
        self._interval: list[list[float | None]] = []
        self._epoch_rows: list[list[float | None]] = []
        self._epoch = 0
        self._first_batch_wait: float | None = None
        self._comm_status: dict[str, Any] = {"available": False, "reason": "not a multi-process DDP run"}
        self._trace: Any = None
        self._trace_file: str | None = None
        self._rank = 0
        self._world = 1

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"steps_total": self.steps_total, "steps_measured": self.steps_measured, "epochs": list(self.epochs)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps_total = int(state_dict.get("steps_total", 0))
        self.steps_measured = int(state_dict.get("steps_measured", 0))
        self.epochs = list(state_dict.get("epochs", []))

    # ------------------------------------------------------------------ set-up
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit" or isinstance(trainer.profiler, _StepTimingProfiler):
            return
        self._profiler = _StepTimingProfiler(trainer.profiler, self)
        trainer.profiler = self._profiler

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._profiler is not None and trainer.profiler is self._profiler:
            trainer.profiler = self._profiler.inner
        self._profiler = None
        self._close_trace()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._clock = clock_for(pl_module.device)
        self._rank, self._world = trainer.global_rank, trainer.world_size
        self._steps_this_fit = 0
        self._pending.clear()
        self._interval.clear()
        self._start_log_schedule(trainer)
        self._register_comm_hook(trainer)
        if self.trace_path:
            path = self.trace_path.replace("{rank}", str(self._rank))
            if not os.path.isabs(path):
                log_dir = trainer.log_dir or trainer.default_root_dir  # a collective: every rank calls it
                path = os.path.join(log_dir, path)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._trace_file = path
            self._trace = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in teardown

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

        rec = [self._clock.mark(), None]
        self._buckets.append(rec)
        fut = default_hooks.allreduce_hook(state, bucket)

        def _done(f):
            rec[1] = self._clock.mark()
            return f.value()

        return fut.then(_done)

    # ------------------------------------------------------------------ boundaries
    def _on_fetch_start(self) -> None:
        cur = self._cur
        if cur is not None:  # an orphan record (prefetch outside a step, or the epoch's last fetch)
            self._clock.release(cur)
        self._cur = [self._clock.mark(), None, None, None, None, None]

    def _on_fetch_end(self) -> None:
        cur = self._cur
        if cur is not None:
            cur[_F1] = self._clock.mark()

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch = trainer.current_epoch
        self._first_in_epoch = True
        self._after_val = False
        self._epoch_rows = []
        self._first_batch_wait = None
        self._micros = []
        self._micro_comm = []
        if self._prev_end is not None:
            self._clock.release([self._prev_end])
        self._prev_end = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        cur = self._cur
        if cur is None:  # no fetch seen (dataloader_iter-style training_step)
            cur = self._cur = [None, None, None, None, None, None]
        cur[_S] = self._clock.mark()
        self._stepped = False

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        cur = self._cur
        if cur is not None and cur[_B0] is None:
            cur[_B0] = self._clock.mark()

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        cur = self._cur
        if cur is not None:
            if cur[_B1] is not None:
                self._clock.release([cur[_B1]])
            cur[_B1] = self._clock.mark()
        if self._buckets:
            self._micro_comm.extend(self._buckets)
            self._buckets = []

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        self._stepped = True

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._after_val = True

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        cur = self._cur
        if cur is None:
            return
        cur[_E] = self._clock.mark()
        self._cur = None
        self._micros.append(cur)
        if not self._stepped:  # accumulating: the optimizer step spans more micro-batches
            return
        self.steps_total += 1
        self._steps_this_fit += 1
        log_now = self._count_step()
        flags = (
            self._steps_this_fit <= self.warmup_steps,
            self._first_in_epoch,
            self._after_val,
        )
        self._pending.append(
            (self._micros, self._micro_comm, self._prev_end, flags, self._gstep, self._epoch,
             batch_size(batch) if self._trace is not None else None)
        )
        self._prev_end = cur[_E]
        self._micros = []
        self._micro_comm = []
        self._first_in_epoch = False
        self._after_val = False
        if self.sync_cuda and self._clock.device_timeline:
            torch.cuda.synchronize()
        if len(self._pending) > self.max_pending:
            self._resolve(block=True, limit=len(self._pending) - self.max_pending)
        if log_now:
            self._resolve(block=False)
            self._log_interval(trainer)

    # ------------------------------------------------------------------ resolution
    def _resolve(self, block: bool, limit: int | None = None) -> None:
        """Turn pending steps into durations, oldest first; stop at the first unfinished one unless
        ``block``."""
        clock = self._clock
        done = 0
        while self._pending and (limit is None or done < limit):
            micros, comm, prev_end, flags, step, epoch, nsamples = self._pending[0]
            last = micros[-1][_E]
            if comm:
                last_comm = comm[-1][1]
                if last_comm is not None and not clock.ready(last_comm):
                    if not block:
                        break
                    clock.wait(last_comm)
            if not clock.ready(last):
                if not block:
                    break
                clock.wait(last)
            try:
                row = self._durations(micros, comm, prev_end, flags)
            except RuntimeError:  # an earlier CUDA event of the step is still pending
                if not block:
                    break
                clock.wait_all()
                row = self._durations(micros, comm, prev_end, flags)
            self._pending.pop(0)
            done += 1
            self._interval.append(row)
            warm, first, after_val = flags
            if first and self._first_batch_wait is None:
                self._first_batch_wait = row[_DATA_WAIT]
            if not (warm or first or after_val) and row[_REMAINDER] is not None:
                self._epoch_rows.append(row)
                self.steps_measured += 1
            if self._trace is not None:
                self._write_trace(row, step, epoch, warm, nsamples)
            if clock.device_timeline:  # recycle every event except this step's end (the next prev_end)
                for m in micros[:-1]:
                    clock.release(m)
                clock.release(micros[-1][:_E])
                if prev_end is not None:
                    clock.release([prev_end])
                for rec in comm:
                    clock.release(rec)

    def _durations(self, micros: list[list[Any]], comm: list[list[Any]], prev_end: Any, flags: tuple) -> list[float | None]:
        """The figures of one step in :data:`ALL_FIGURES` order (seconds; ``None`` where unmeasured)."""
        sec = self._clock.seconds
        dw = tr = fw = bw = op = None
        for f0, f1, s, b0, b1, e in micros:
            if f0 is not None and f1 is not None:
                dw = sec(f0, f1) + (dw or 0.0)
            if f1 is not None and s is not None:
                tr = sec(f1, s) + (tr or 0.0)
            if s is not None and b0 is not None:
                fw = sec(s, b0) + (fw or 0.0)
            if b0 is not None and b1 is not None:
                bw = sec(b0, b1) + (bw or 0.0)
            if b1 is not None and e is not None:
                op = sec(b1, e) + (op or 0.0)
        # remainder: the gap before the first fetch (unless first of epoch / after validation) and the
        # gaps between micro-batches
        rem = None
        first_start = micros[0][_F0] if micros[0][_F0] is not None else micros[0][_S]
        if prev_end is not None and not flags[1] and not flags[2] and first_start is not None:
            rem = sec(prev_end, first_start)
            for a, b in zip(micros[:-1], micros[1:], strict=False):
                b_start = b[_F0] if b[_F0] is not None else b[_S]
                if a[_E] is not None and b_start is not None:
                    rem += sec(a[_E], b_start)
        parts = [v for v in (dw, tr, fw, bw, op, rem) if v is not None]
        comm_busy = comm_exposed = None
        if comm:
            done = [(r[0], r[1]) for r in comm if r[0] is not None and r[1] is not None]
            if done:
                base = done[0][0]
                iv = sorted((sec(base, a), sec(base, b)) for a, b in done)
                busy, cur_a, cur_b = 0.0, iv[0][0], iv[0][1]
                for a, b in iv[1:]:
                    if a > cur_b:
                        busy += cur_b - cur_a
                        cur_a, cur_b = a, b
                    else:
                        cur_b = max(cur_b, b)
                busy += cur_b - cur_a
                comm_busy = busy
                comm_exposed = max(0.0, max(b for _, b in iv) - max(a for a, _ in iv))
        return [dw, tr, fw, bw, op, rem, sum(parts) if parts else None, comm_busy, comm_exposed]

    def _write_trace(self, row: list[float | None], step: int, epoch: int, warm: bool, nsamples: int | None) -> None:
        params = {"world_size": self._world, **self.trace_params}
        lines = []
        for name, value in zip(ALL_FIGURES, row, strict=True):
            if value is None:
                continue
            callpath = "train_step" if name == "step" else f"train_step->{name}"
            lines.append(json.dumps({
                "params": params, "callpath": callpath, "metric": "time", "value": value,
                "rank": self._rank, "step": step, "epoch": epoch, "warmup": warm, "samples": nsamples,
            }))
        if lines:
            self._trace.write("\n".join(lines) + "\n")

    def _close_trace(self) -> None:
        if self._trace is not None:
            self._trace.close()
            self._trace = None

    # ------------------------------------------------------------------ logging
    def _log_interval(self, trainer: Trainer) -> None:
        rows, self._interval = self._interval, []
        if not rows:
            return
        metrics: dict[str, float | None] = {}
        for i, name in enumerate(ALL_FIGURES):
            vals = [r[i] for r in rows if r[i] is not None]
            if vals:
                metrics[f"perf/step/{name}_ms"] = 1e3 * sum(vals) / len(vals)
        log_metrics(trainer, metrics)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._cur is not None and self._cur[_S] is None:  # the fetch that ended the epoch
            self._clock.release(self._cur)
            self._cur = None
        self._resolve(block=True)
        rows = self._epoch_rows
        stats = {name: median_p95([r[i] for r in rows if r[i] is not None], scale=1e3)
                 for i, name in enumerate(ALL_FIGURES)}
        medians = [stats[name]["median"] for name in ALL_FIGURES]
        per_rank = gather_vectors(trainer, pl_module, [*medians, self._first_batch_wait])
        step_idx = ALL_FIGURES.index("step")
        step_ranks = rank_stats([row[step_idx] for row in per_rank])
        first_wait = [None if row[-1] is None else row[-1] * 1e3 for row in per_rank]
        record = {
            "epoch": trainer.current_epoch,
            "steps_measured": len(rows),
            "windows_ms": stats,
            "step_ms_per_rank": step_ranks,
            "window_median_ms_per_rank": {
                name: [row[i] for row in per_rank] for i, name in enumerate(ALL_FIGURES)
            },
            "first_batch_wait_ms_per_rank": first_wait,
        }
        self.epochs.append(record)
        metrics: dict[str, float | None] = {}
        for name in ALL_FIGURES:
            metrics[f"perf/epoch/{name}_ms_median"] = stats[name]["median"]
            metrics[f"perf/epoch/{name}_ms_p95"] = stats[name]["p95"]
        metrics["perf/epoch/step_ms_rank_max"] = step_ranks["max"]
        metrics["perf/epoch/step_ms_rank_median"] = step_ranks["median"]
        metrics["perf/epoch/slowest_rank"] = step_ranks["slowest_rank"]
        metrics["perf/epoch/first_batch_wait_ms"] = max((w for w in first_wait if w is not None), default=None)
        log_metrics(trainer, metrics)
        self._epoch_rows = []

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._resolve(block=True)
        self._close_trace()
        if trainer.is_global_zero and self.epochs:
            last = self.epochs[-1]["windows_ms"]["step"]["median"]
            if last is not None:
                rank_zero_info(f"StepTimingCallback: median step {last:.3f} ms (last epoch, rank 0, measured-run)")

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._close_trace()

    # ------------------------------------------------------------------ summary
    def summary(self) -> dict[str, Any]:
        return {
            "evidence": MEASURED_RUN,
            "clock": self._clock.kind,
            "warmup_steps": self.warmup_steps,
            "sync_cuda": self.sync_cuda,
            "steps_total": self.steps_total,
            "steps_measured": self.steps_measured,
            "comm_timing": dict(self._comm_status),
            "trace_path": self._trace_file,
            "windows": list(ALL_FIGURES),
            "epochs": list(self.epochs),
        }
