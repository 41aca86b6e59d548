"""Environment record of a measurement: source hash, invocation, host, device, driver, libraries.

Every benchmark JSON carries the record built by :func:`environment_record`, so that a number can be
traced to the code, the command, the machine and the accelerator settings that produced it
(DESIGN.md, "Evidence before speedup"). Facts that cannot be read are ``None`` with a
``*_reason`` entry beside them, never guessed.

NVML facts (driver version, enforced power limit in W, persistence mode, clocks) and the git record
come from the scaling callbacks' helpers (:mod:`cropscale.env.nvml`, which matches the CUDA
and NVML devices by UUID, not by index; :func:`cropscale.callbacks.provenance.git_info`), so that a
benchmark JSON and a run's ``run.json`` describe a machine the same way.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "current_rss_bytes",
    "device_record",
    "environment_record",
    "git_record",
    "library_versions",
    "load_average",
    "sha256_file",
]

_LIBRARIES = ("torch", "lightning", "torchmetrics", "numpy", "nvidia-ml-py", "tensorboard", "matplotlib",
              "cropscale")


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of the bytes of ``path``."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries that shape a measurement (``None`` = not installed),
    plus the CUDA runtime and cuDNN versions torch was built with."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    if versions["cropscale"] is None:  # running from a source tree that is not pip-installed
        import cropscale

        versions["cropscale"] = f"{cropscale.__version__} (source tree, not installed)"
    versions["torch_cuda"] = torch.version.cuda
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    versions["cudnn"] = str(cudnn) if cudnn is not None else None
    return versions


def current_rss_bytes() -> int | None:
    """Resident set size of this process now (bytes), from ``/proc/self/statm``; ``None`` where
    that file does not exist (non-Linux)."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def load_average() -> list[float] | None:
    """Host load average over 1, 5 and 15 min (``os.getloadavg``; ``None`` where unavailable). On a
    shared CPU host it tells how far other work may have slowed a measurement."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvml_facts(device: torch.device) -> dict[str, Any]:
    """Driver version, enforced power limit (W), persistence mode, clocks (MHz) and clock-event reasons
    of the CUDA ``device`` via the scaling callbacks' NVML helpers (:mod:`cropscale.env.nvml`,
    device matched by UUID); ``None`` fields and ``nvml_reason`` when NVML cannot say."""
    facts: dict[str, Any] = {"driver": None, "power_limit_w": None, "persistence_mode": None}
    try:
        from cropscale.env.nvml import open_device_for
    except ImportError as err:
        facts["nvml_reason"] = f"cropscale.env.nvml cannot be imported: {err}"
        return facts
    nv, reason = open_device_for(device)
    if nv is None:
        facts["nvml_reason"] = reason
        return facts
    info = nv.info()
    facts.update({k: v for k, v in info.items() if k not in ("name", "uuid")})
    for key in ("driver", "power_limit_w", "persistence_mode"):
        if facts.get(key) is None:
            facts[f"{key}_reason"] = f"NVML could not read {key} on this device"
    return facts


def git_record() -> dict[str, Any]:
    """Commit and dirty flag of the source tree (:func:`cropscale.callbacks.provenance.git_info`),
    or ``{"available": False, "reason"}``."""
    try:
        from cropscale.callbacks.provenance import git_info
    except ImportError as err:
        return {"available": False, "reason": f"cropscale.callbacks.provenance cannot be imported: {err}"}
    return git_info(Path(__file__).resolve().parent)


def device_record(device: torch.device) -> dict[str, Any]:
    """Facts about ``device``: type, index, name; for CUDA also compute capability, total memory
    (GiB), UUID and the NVML facts (driver, power limit in W, persistence mode, clocks in MHz,
    clock-event reasons); for CPU the CPU
    model, logical core count and torch's intra-op thread count, with the NVML fields ``None`` and a
    reason."""
    record: dict[str, Any] = {"type": device.type, "index": device.index}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        record.update(
            index=index,
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            total_memory_gib=props.total_memory / 2**30,
            uuid=str(getattr(props, "uuid", "")) or None,
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
        record.update(_nvml_facts(torch.device("cuda", index)))
    else:
        record.update(
            name=_cpu_name(),
            logical_cores=os.cpu_count(),
            torch_threads=torch.get_num_threads(),
            driver=None,
            power_limit_w=None,
            persistence_mode=None,
            nvml_reason=f"device type {device.type!r} is not an NVIDIA GPU",
        )
    return record


def environment_record(source: str | Path, argv: list[str] | None, device: torch.device) -> dict[str, Any]:
    """Everything needed to trace a measurement back to its origin.

    Args:
        source: the measuring source file (its SHA-256 goes into ``source_sha256``).
        argv: the arguments the command was given (``None`` = ``sys.argv[1:]``).
        device: the measured device.

    Returns:
        ``{"source", "source_sha256", "invocation": {"executable", "sys_argv", "argv", "cwd"},
        "git": git_record(), "host": {"hostname", "platform", "machine", "load_average_1_5_15_min"} (at the
        start), "device": device_record(device),
        "libraries": library_versions()}``.
    """
    return {
        "source": str(Path(source).resolve()),
        "source_sha256": sha256_file(source),
        "invocation": {
            "executable": sys.executable,
            "sys_argv": list(sys.argv),
            "argv": list(sys.argv[1:] if argv is None else argv),
            "cwd": os.getcwd(),
        },
        "git": git_record(),
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(), "machine": platform.machine(),
                 "load_average_1_5_15_min": load_average()},
        "device": device_record(device),
        "libraries": library_versions(),
    }
