"""Two or more sets of callbacks alternated within one fit, every step timed (``callback-bench``).

On a shared machine the speed of a core drifts by tens of percent within a second, so two configurations
run one after the other differ by more than the overhead looked for. :class:`Interleaver` therefore swaps
the trainer's callback list (and profiler) between blocks of optimizer steps within one fit, so that a
block runs exactly the code of its configuration and the drift hits every configuration alike. Periods in s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lightning.pytorch import Callback, Trainer
from typing_extensions import override

from cropscale.errors import CropScaleError

__all__ = ["CLOCKS", "SETTLE_STEPS", "Interleaver"]

SETTLE_STEPS = 2
"""Steps at the start of each block left out: the first steps after a swap run on cold caches."""

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
"""``--clock``: wall time, or the CPU time of the process (all threads), in s."""


class Interleaver(Callback):
    """Alternates two sets of callbacks in blocks of optimizer steps within one fit and times every step.

    Put it last in the trainer's callbacks, after every callback of ``arms``. Until ``warmup`` steps have
    run, all of them are active; then the trainer's callback list goes round the arms, ``arms[0]``,
    ``arms[1]``, ... (plus this callback), ``block`` steps each, starting with ``arms[0]``; after ``last_step``
    every callback is active again, for the epoch-end and fit-end hooks. With the callback list it swaps
    the trainer's profiler: for an arm without callbacks the one the trainer had when :meth:`bind` was
    called (before a callback such as :class:`~cropscale.callbacks.StepTimingCallback` wrapped it), for the
    other the one found at ``on_train_start``.

    Args:
        arms: two or more ``(name, callbacks)`` pairs; the callbacks must be in the trainer too.
        block: optimizer steps per block (>= ``SETTLE_STEPS + 1``).
        warmup: optimizer steps before the first block.
        last_step: optimizer steps of the fit; later steps (none) are not timed.
        clock: a function returning seconds (``time.perf_counter`` or ``time.process_time``).

    ``periods[name]``: the measured step periods of each arm (s), i.e. the time between this callback's
    consecutive ``on_train_batch_end`` calls, leaving out the first :data:`SETTLE_STEPS` steps of each
    block.
    """

    def __init__(self, arms: list[tuple[str, list[Callback]]], block: int, warmup: int, last_step: int,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if len(arms) < 2 or block <= SETTLE_STEPS:
            raise CropScaleError(f"Interleaver: two arms or more and block > {SETTLE_STEPS} steps")
        self.arms = arms
        self.block, self.warmup, self.last_step = block, warmup, last_step
        self._now = clock
        self.periods: dict[str, list[float]] = {name: [] for name, _ in arms}
        self._steps = 0
        self._last: float | None = None
        self._arm: int | None = None  # index into arms; None during warm-up
        self._in_block = 0
        self._lists: list[list[Callback]] = []
        self._profilers: list[Any] = []
        self._all: list[Callback] = []
        self._profiler_off: Any = None
        self._profiler_on: Any = None

    def bind(self, trainer: Trainer) -> None:
        """Remember ``trainer``'s profiler before ``fit`` (before a callback wraps it)."""
        self._profiler_off = trainer.profiler

    @override
    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        self._all = list(trainer.callbacks)
        self._profiler_on = trainer.profiler
        if self._profiler_off is None:
            self._profiler_off = self._profiler_on
        in_arms = {id(cb) for _, cbs in self.arms for cb in cbs}
        for _, cbs in self.arms:
            mine = {id(cb) for cb in cbs}
            # the arm's callbacks, this callback and any the trainer added itself, in the trainer's order
            self._lists.append([cb for cb in self._all if id(cb) in mine or id(cb) not in in_arms])
            self._profilers.append(self._profiler_on if cbs else self._profiler_off)

    @override
    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        now = self._now()
        self._steps += 1
        if self._arm is not None and self._last is not None and self._in_block > SETTLE_STEPS:
            self.periods[self.arms[self._arm][0]].append(now - self._last)
        if self._steps >= self.last_step:
            trainer.callbacks, trainer.profiler = self._all, self._profiler_on
        elif self._steps >= self.warmup and (self._arm is None or self._in_block >= self.block):
            self._arm = 0 if self._arm is None else (self._arm + 1) % len(self.arms)
            self._in_block = 0
            trainer.callbacks, trainer.profiler = self._lists[self._arm], self._profilers[self._arm]
        self._in_block += 1
        self._last = self._now()  # the swap is in no period
