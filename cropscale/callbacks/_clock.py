"""Clocks for the step-timing windows: host ``perf_counter`` or CUDA events resolved lazily.

A *mark* is a point in time: a float (seconds, ``time.perf_counter``) for :class:`HostClock`, a
recorded ``torch.cuda.Event`` for :class:`CudaEventClock`. Marks are resolved into durations later,
once :meth:`ready` says so, so that timing a step never blocks the host on the device (no
``torch.cuda.synchronize()``, no ``.item()``).
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import torch


class HostClock:
    """Host wall clock (``time.perf_counter``, seconds). Marks are always ready."""

    kind = "perf_counter"
    device_timeline = False

    mark = staticmethod(perf_counter)
    """A mark: ``time.perf_counter()`` itself (s), no Python frame on the per-step path."""

    @staticmethod
    def ready(mark: Any) -> bool:
        return True

    @staticmethod
    def wait(mark: Any) -> None:
        return None

    @staticmethod
    def seconds(start: Any, end: Any) -> float:
        """``end - start`` in seconds."""
        return end - start

    @staticmethod
    def release(marks: Any) -> None:
        return None

    @staticmethod
    def wait_all() -> None:
        return None


class CudaEventClock:
    """CUDA events (``enable_timing=True``) recorded on the current stream; durations on the device timeline.

    Durations are read with ``Event.elapsed_time`` (ms) once both events completed.

    Events are recycled through a free list. ``mark`` may be called from the autograd thread (DDP
    communication hooks) as well as the main thread; list ``pop``/``append`` are atomic in CPython.
    """

    kind = "cuda-events"
    device_timeline = True

    def __init__(self, device: torch.device | None = None) -> None:
        self._free: list[torch.cuda.Event] = []
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else device

    def mark(self) -> torch.cuda.Event:
        """Record an event on the current stream *of this clock's device*.

        The device is explicit because comm-hook callbacks may run on a thread whose current device is
        another GPU.
        """
        try:
            ev = self._free.pop()
        except IndexError:
            ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    @staticmethod
    def ready(mark: torch.cuda.Event) -> bool:
        """Non-blocking: ``cudaEventQuery``."""
        return bool(mark.query())

    @staticmethod
    def wait(mark: torch.cuda.Event) -> None:
        """Block until ``mark`` completed (used at epoch ends only)."""
        mark.synchronize()

    @staticmethod
    def seconds(start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        """Device time between two completed events (s); raises ``RuntimeError`` if one is pending."""
        return start.elapsed_time(end) / 1e3

    def wait_all(self) -> None:
        """Block until the device finished all queued work (epoch ends only)."""
        torch.cuda.synchronize(self.device)

    def release(self, marks: Any) -> None:
        """Return resolved events to the free list."""
        for m in marks:
            if m is not None:
                self._free.append(m)


def clock_for(device: torch.device) -> HostClock | CudaEventClock:
    """:class:`CudaEventClock` for a CUDA device, :class:`HostClock` otherwise."""
    if device.type == "cuda" and torch.cuda.is_available():
        return CudaEventClock(device)
    return HostClock()
