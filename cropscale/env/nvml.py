"""NVML access for the energy and provenance callbacks (``nvidia-ml-py``, imported as ``pynvml``).

Devices are matched by UUID, never by index: CUDA and NVML number devices differently under
``CUDA_VISIBLE_DEVICES`` / ``CUDA_DEVICE_ORDER``. The CUDA side comes from
``torch.cuda.get_device_properties(i).uuid``; the NVML side from ``nvmlDeviceGetUUID`` (``GPU-...``
or, for a MIG instance, ``MIG-...``).

Units: NVML energy is in mJ (``nvmlDeviceGetTotalEnergyConsumption``, Volta and later), power in mW,
clocks in MHz; :class:`NvmlDevice` returns J, W and MHz.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

_THROTTLE_NAMES: tuple[tuple[str, str], ...] = (
    ("GpuIdle", "gpu_idle"),
    ("ApplicationsClocksSetting", "applications_clocks_setting"),
    ("SwPowerCap", "sw_power_cap"),
    ("HwSlowdown", "hw_slowdown"),
    ("SyncBoost", "sync_boost"),
    ("SwThermalSlowdown", "sw_thermal_slowdown"),
    ("HwThermalSlowdown", "hw_thermal_slowdown"),
    ("HwPowerBrakeSlowdown", "hw_power_brake_slowdown"),
    ("DisplayClockSetting", "display_clock_setting"),
)


def normalize_uuid(uuid: Any) -> str:
    """Lower-case UUID without the ``GPU-`` / ``MIG-`` prefix (``bytes`` are decoded)."""
    if isinstance(uuid, bytes):
        uuid = uuid.decode("ascii", "replace")
    s = str(uuid).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if s.startswith(prefix):
            s = s[len(prefix):]
    return s


def load_nvml() -> tuple[Any, str | None]:
    """``(pynvml, None)`` after ``nvmlInit()``, or ``(None, reason)``."""
    try:
        import pynvml
    except ImportError as err:  # pragma: no cover - nvidia-ml-py is a dependency
        return None, f"nvidia-ml-py is not installed ({err})"
    try:
        pynvml.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"NVML could not be initialised: {type(err).__name__}: {err}"
    return pynvml, None


def cuda_uuid(device: torch.device) -> str | None:
    """UUID of a CUDA device as torch sees it (``None`` for other devices)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return str(torch.cuda.get_device_properties(index).uuid)


def find_handle_by_uuid(nvml: Any, uuid: str) -> tuple[Any, bool]:
    """The NVML handle whose UUID equals ``uuid`` (prefix- and case-insensitive).

    Physical GPUs and their MIG instances are searched.

    Args:
        nvml: the initialised ``pynvml`` module (see :func:`load_nvml`).
        uuid: the CUDA device's UUID, with or without the ``GPU-`` / ``MIG-`` prefix.

    Returns:
        ``(handle, is_mig)``; for a MIG instance the handle of its *physical* GPU (power and energy
        are per physical GPU) and ``is_mig=True``.

    Raises:
        LookupError: when no device has that UUID.
    """
    want = normalize_uuid(uuid)
    seen = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        have = normalize_uuid(nvml.nvmlDeviceGetUUID(handle))
        seen.append(have)
        if have == want:
            return handle, False
        try:
            max_mig = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        except Exception:
            max_mig = 0
        for j in range(max_mig or 0):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
                if normalize_uuid(nvml.nvmlDeviceGetUUID(mig)) == want:
                    return handle, True
            except Exception:
                continue
    raise LookupError(f"no NVML device has UUID {uuid!r} (NVML devices: {seen})")


def decode_throttle_reasons(nvml: Any, mask: int) -> list[str]:
    """Names of the clock-event (throttle) reason bits set in ``mask``."""
    names = []
    for suffix, name in _THROTTLE_NAMES:
        bit = getattr(nvml, f"nvmlClocksEventReason{suffix}", None)
        if bit is None:
            bit = getattr(nvml, f"nvmlClocksThrottleReason{suffix}", None)
        if bit is not None and mask & int(bit):
            names.append(name)
    return names


class NvmlDevice:
    """One GPU as NVML sees it; readings in J, W, MHz. Every reading may raise ``pynvml.NVMLError``."""

    def __init__(self, nvml: Any, handle: Any, uuid: str, is_mig: bool = False) -> None:
        self.nvml = nvml
        self.handle = handle
        self.uuid = uuid
        self.is_mig = is_mig

    def energy_j(self) -> float:
        """Total energy since the driver was loaded (J)."""
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3

    def power_w(self) -> float:
        """Power draw (W; an average over the last second on recent GPUs)."""
        return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3

    def has_energy_counter(self) -> tuple[bool, str | None]:
        """Whether the total-energy counter can be read: ``(True, None)`` or ``(False, reason)``."""
        try:
            self.energy_j()
            return True, None
        except Exception as err:
            return False, f"nvmlDeviceGetTotalEnergyConsumption unavailable ({type(err).__name__})"

    def throttle_reasons(self) -> list[str] | None:
        """Names of the current clock-event (throttle) reasons, e.g. ``["sw_power_cap"]``; ``None`` if unreadable."""
        fn = getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            self.nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        if fn is None:
            return None
        try:
            return decode_throttle_reasons(self.nvml, int(fn(self.handle)))
        except Exception:
            return None

    def info(self) -> dict[str, Any]:
        """Static facts recorded once: name, UUID, driver, power limit (W), persistence mode, clocks.

        Also whether it is a MIG instance, the clocks in MHz (current and max) and the clock-event
        (throttle) reasons. Unreadable fields are ``None``.
        """
        nv = self.nvml

        def read(fn: str, *args: Any, scale: float | None = None) -> Any:
            f = getattr(nv, fn, None)
            if f is None:
                return None
            try:
                v = f(*args)
            except Exception:
                return None
            if isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            return v / scale if (scale and v is not None) else v

        h = self.handle
        persistence = read("nvmlDeviceGetPersistenceMode", h)
        return {
            "name": read("nvmlDeviceGetName", h),
            "uuid": self.uuid,
            "mig_instance": self.is_mig,
            "driver": read("nvmlSystemGetDriverVersion"),
            "power_limit_w": read("nvmlDeviceGetEnforcedPowerLimit", h, scale=1e3),
            "persistence_mode": None if persistence is None else bool(persistence),
            "sm_clock_mhz": read("nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1)),
            "mem_clock_mhz": read("nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_MEM", 2)),
            "sm_clock_max_mhz": read("nvmlDeviceGetMaxClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1)),
            "mem_clock_max_mhz": read("nvmlDeviceGetMaxClockInfo", h, getattr(nv, "NVML_CLOCK_MEM", 2)),
            "throttle_reasons": self.throttle_reasons(),
        }


def open_device_for(device: torch.device) -> tuple[NvmlDevice | None, str | None]:
    """The :class:`NvmlDevice` of the CUDA device ``device`` (matched by UUID), or ``(None, reason)``."""
    if device.type != "cuda":
        return None, f"the model runs on {device.type!r}, not on a CUDA GPU: power and energy unavailable"
    uuid = cuda_uuid(device)
    if uuid is None:
        return None, "CUDA is not available to torch"
    nvml, reason = load_nvml()
    if nvml is None:
        return None, reason
    try:
        handle, is_mig = find_handle_by_uuid(nvml, uuid)
    except LookupError as err:
        return None, str(err)
    except Exception as err:
        return None, f"NVML device lookup failed: {type(err).__name__}: {err}"
    return NvmlDevice(nvml, handle, uuid, is_mig), None


# --------------------------------------------------------------------------------------------------
# energy-window arithmetic
# --------------------------------------------------------------------------------------------------
def counter_delta_j(start_j: float | None, end_j: float | None) -> float | None:
    """Energy (J) between two readings of the total-energy counter.

    ``None`` if either reading is missing or the counter went backwards (driver reload).
    """
    if start_j is None or end_j is None or end_j < start_j:
        return None
    return end_j - start_j


def integrate_power(samples: Sequence[tuple[float, float]], t0: float, t1: float) -> float | None:
    """Energy (J) in ``[t0, t1]`` (s) from power samples ``(t, W)`` sorted by time, by the trapezoidal rule.

    Power is interpolated linearly at the window edges and held constant beyond the first/last sample.
    ``None`` without samples or for an empty window.
    """
    if not samples or not t1 > t0:
        return None
    ts = [t for t, _ in samples]
    ws = [w for _, w in samples]

    def power_at(t: float) -> float:
        if t <= ts[0]:
            return ws[0]
        if t >= ts[-1]:
            return ws[-1]
        lo, hi = 0, len(ts) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ts[mid] <= t:
                lo = mid
            else:
                hi = mid
        a, b = ts[lo], ts[hi]
        return ws[lo] + (ws[hi] - ws[lo]) * (t - a) / (b - a) if b > a else ws[lo]

    points = [(t0, power_at(t0))] + [(t, w) for t, w in samples if t0 < t < t1] + [(t1, power_at(t1))]
    energy = 0.0
    for (ta, wa), (tb, wb) in zip(points[:-1], points[1:], strict=False):
        energy += 0.5 * (wa + wb) * (tb - ta)
    return energy if math.isfinite(energy) else None
