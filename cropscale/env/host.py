"""Provenance facts of a measurement: git commit, dataset revision, library versions, host, device and GPU topology.

Also the invocation (:func:`environment_record`). Layer 1: the one definition used by ``run.json``, the
benchmark JSON and the study record.

Facts that cannot be read are ``None`` or ``{"available": False, "reason": ...}``, never guessed.
NVML facts (driver version, enforced power limit in W, persistence mode, clocks) come from
:mod:`cropscale.env.nvml`, which matches the CUDA and NVML devices by UUID, not by index.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

import cropscale
from cropscale.env.nvml import open_device_for
from cropscale.env.sources import PACKAGE_DIR, source_digests
from cropscale.errors import ConfigError, CropScaleError

__all__ = [
    "ThreadChoice",
    "choose_torch_threads",
    "set_torch_threads",
    "torch_threads",
    "cpu_bf16_units",
    "current_rss_bytes",
    "dataset_revision",
    "device_record",
    "environment_record",
    "git_info",
    "gpu_topology",
    "library_versions",
    "load_average",
    "sha256_file",
    "usable_cores",
    "utc_now",
]

_LIBRARIES = ("cropscale", "torch", "lightning", "torchmetrics", "numpy", "jsonargparse", "nvidia-ml-py",
              "tensorboard", "matplotlib")


def utc_now() -> str:
    """The current time in UTC, ISO 8601 to the second (``2026-12-01T11:44:00+00:00``)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _run(cmd: list[str], cwd: str | None = None, timeout: float = 10.0) -> str | None:
    """Standard output of ``cmd``, or ``None`` when it cannot run, fails or times out."""
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_info(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """Commit, dirty flag (tracked files modified) and top folder of the git repository holding ``path``.

    Args:
        path: a folder inside the repository; ``None`` tries the working directory, then the cropscale
            package.

    Returns:
        ``{"available": True, "repo", "commit", "dirty"}`` or ``{"available": False, "reason"}``.
    """
    if shutil.which("git") is None:
        return {"available": False, "reason": "git is not installed"}
    candidates = [str(path)] if path else [os.getcwd(), str(PACKAGE_DIR)]
    for cwd in candidates:
        top = _run(["git", "rev-parse", "--show-toplevel"], cwd=cwd)
        if not top:
            continue
        commit = (_run(["git", "rev-parse", "HEAD"], cwd=cwd) or "").strip() or None
        status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd)
        return {
            "available": True,
            "repo": top.strip(),
            "commit": commit,
            "dirty": None if status is None else bool(status.strip()),
        }
    return {"available": False, "reason": f"not inside a git repository: {candidates}"}


def dataset_revision(root: str | os.PathLike, method: Literal["listing", "content"] = "listing") -> dict[str, Any]:
    """SHA-256 revision of the data folder ``root``.

    ``listing``: hash of the sorted ``relative/path<TAB>size-in-bytes`` lines (fast; catches added,
    removed and resized files). ``content``: hash of the same lines followed by each file's bytes.

    Returns:
        ``{"root", "method", "sha256", "files", "bytes"}``.

    Raises:
        CropScaleError: if ``root`` is not a folder or ``method`` is unknown.
    """
    root_path = Path(root)
    if not root_path.is_dir():
        raise CropScaleError(f"dataset revision: {str(root_path)!r} is not a folder")
    if method not in ("listing", "content"):
        raise CropScaleError(f"dataset revision: method {method!r} is not 'listing' or 'content'")
    files = sorted(p for p in root_path.rglob("*") if p.is_file())
    h = hashlib.sha256()
    total = 0
    for p in files:
        size = p.stat().st_size
        total += size
        h.update(f"{p.relative_to(root_path).as_posix()}\t{size}\n".encode())
    if method == "content":
        for p in files:
            with open(p, "rb") as f:
                for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                    h.update(chunk)
    return {"root": str(root_path.resolve()), "method": method, "sha256": h.hexdigest(), "files": len(files),
            "bytes": total}


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of the bytes of ``path``."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def library_versions(names: tuple[str, ...] = _LIBRARIES) -> dict[str, Any]:
    """Versions of Python, the libraries ``names`` and the CUDA, cuDNN and NCCL builds torch uses.

    Args:
        names: distribution names to look up (a ``None`` version: not installed).

    Returns:
        ``{"python", <name>: str | None ..., "cuda": str | None, "cudnn": int | None (e.g. 90100),
        "nccl": "2.21.5" | None}``; ``cropscale`` is ``"<version> (source tree, not installed)"`` when
        the package runs from a checkout that pip does not know.
    """
    versions: dict[str, Any] = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    if "lightning" in names and versions["lightning"] is None:
        try:
            versions["lightning"] = importlib.metadata.version("pytorch-lightning")
        except importlib.metadata.PackageNotFoundError:
            pass
    if "cropscale" in names and versions["cropscale"] is None:
        versions["cropscale"] = f"{cropscale.__version__} (source tree, not installed)"
    versions["cuda"] = torch.version.cuda
    versions["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # no NCCL in this build
            nccl = None
    versions["nccl"] = nccl
    return versions


def gpu_topology() -> dict[str, Any]:
    """``nvidia-smi topo -m`` (the GPU interconnect matrix).

    Returns:
        ``{"available": True, "nvidia_smi_topo_m": text}`` or ``{"available": False, "reason"}``.
    """
    if shutil.which("nvidia-smi") is None:
        return {"available": False, "reason": "nvidia-smi not found"}
    out = _run(["nvidia-smi", "topo", "-m"], timeout=20.0)
    if out is None:
        return {"available": False, "reason": "nvidia-smi topo -m failed"}
    return {"available": True, "nvidia_smi_topo_m": out}


def host_record() -> dict[str, Any]:
    """``{"hostname", "platform", "cpu_count"}`` of this process's machine."""
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "cpu_count": os.cpu_count()}


def usable_cores() -> int:
    """CPU cores this process may run on, at least 1.

    ``len(os.sched_getaffinity(0))``: the CPU set that a container, ``taskset`` or SLURM gives the process,
    which can be fewer than the machine's (``os.cpu_count()``, used where the platform has no affinity call).
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class ThreadChoice:
    """Torch intra-op threads of one process and where the number comes from."""

    threads: int
    """``torch.set_num_threads`` value (>= 1)."""
    why: str
    """``"<cores> cores / <processes> processes"``, ``"--threads N"`` or ``"OMP_NUM_THREADS=N"``."""

    def line(self) -> str:
        """The one line a command prints: ``cropscale: torch threads per process: N (why); override with ...``."""
        return (f"cropscale: torch threads per process: {self.threads} ({self.why}); override with --threads N"
                " or OMP_NUM_THREADS")


def choose_torch_threads(cores: int, processes: int, option: int | None = None,
                         omp_num_threads: str | None = None) -> ThreadChoice:
    """Torch threads per process on a CPU shared by ``processes`` local processes.

    ``--threads`` (``option``) wins; then ``OMP_NUM_THREADS`` when it is a positive integer (what torch
    itself starts with); else ``max(1, cores // processes)``, so that the processes of one machine (DDP
    ranks on CPU) do not oversubscribe its cores (torch's default is every core in every process).

    Args:
        cores: usable cores (:func:`usable_cores`).
        processes: processes on this machine sharing them (``LOCAL_WORLD_SIZE``, or the Trainer's devices).
        option: the ``--threads`` value, or None.
        omp_num_threads: the ``OMP_NUM_THREADS`` environment value, or None when unset.

    Raises:
        ConfigError: ``option`` < 1.
    """
    if option is not None:
        if option < 1:
            raise ConfigError(f"--threads must be >= 1; got {option}")
        return ThreadChoice(int(option), f"--threads {option}")
    text = (omp_num_threads or "").strip()
    if text.isdigit() and int(text) >= 1:
        return ThreadChoice(int(text), f"OMP_NUM_THREADS={int(text)}")
    return ThreadChoice(max(1, cores // max(1, processes)), f"{cores} cores / {processes} processes")


def set_torch_threads(threads: int | None) -> int:
    """Set torch's intra-op threads (``torch.set_num_threads``): the one place the package sets them.

    Args:
        threads: the count (a :class:`ThreadChoice`'s ``threads``, a command's ``--threads``); None leaves
            torch's own choice.

    Returns:
        The count in effect before.

    Raises:
        ConfigError: ``threads`` below 1.
    """
    before = torch.get_num_threads()
    if threads is not None:
        if int(threads) < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(int(threads))
    return before


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """:func:`set_torch_threads` for the block, the previous count restored after it (None: leave them).

    Raises:
        ConfigError: ``threads`` below 1.
    """
    before = set_torch_threads(threads)
    try:
        yield
    finally:
        if threads is not None:
            torch.set_num_threads(before)


def current_rss_bytes() -> int | None:
    """Resident set size of this process now (bytes), from ``/proc/self/statm``.

    ``None`` where that file does not exist (non-Linux).
    """
    try:
        fields = Path("/proc/self/statm").read_text().split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def load_average() -> list[float] | None:
    """Host load average over 1, 5 and 15 min (``os.getloadavg``; ``None`` where unavailable).

    On a shared CPU host it tells how far other work may have slowed a measurement.
    """
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


#: /proc/cpuinfo flags of x86 units that run bfloat16 arithmetic natively (AVX512-BF16, AMX-BF16)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_units(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU has bfloat16 arithmetic units (``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``).

    Without them, ``torch.autocast("cpu", dtype=torch.bfloat16)`` converts to and from bfloat16 around
    FP32 arithmetic, and a bf16-mixed step is several times slower than an FP32 one.

    Args:
        cpuinfo: the text of ``/proc/cpuinfo`` (``None``: read it).

    Returns:
        ``True`` or ``False`` from the ``flags`` lines; ``None`` where there is no such text (not Linux,
        not x86: unknown).
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.lower().startswith("flags"):
            flags.update(line.split(":", 1)[-1].split())
    if not flags:
        return None
    return any(f in flags for f in BF16_CPU_FLAGS)


def _nvml_facts(device: torch.device) -> dict[str, Any]:
    """NVML facts of the CUDA ``device``: driver version, enforced power limit (W), persistence mode, clocks.

    Clocks are in MHz, and the clock-event reasons are included. Read via the scaling callbacks' NVML
    helpers (:mod:`cropscale.env.nvml`, device matched by UUID); ``None`` fields and ``nvml_reason``
    when NVML cannot say.
    """
    facts: dict[str, Any] = {"driver": None, "power_limit_w": None, "persistence_mode": None}
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


def device_record(device: torch.device) -> dict[str, Any]:
    """Facts about ``device``: type, index and name, plus the CUDA or CPU details below.

    For CUDA also compute capability, total memory (GiB), UUID and the NVML facts (driver, power
    limit in W, persistence mode, clocks in MHz, clock-event reasons); for CPU the CPU model, logical
    core count and torch's intra-op thread count, with the NVML fields ``None`` and a reason.
    """
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
        source: the measuring command's module file; it and every package module it imports are hashed
            (:func:`cropscale.env.sources.source_digests`).
        argv: the arguments the command was given (``None`` = ``sys.argv[1:]``).
        device: the measured device.

    Returns:
        ``{"source", "source_files", "source_files_sha256", "invocation": {"executable", "sys_argv", "argv",
        "cwd"}, "git": git_info(PACKAGE_DIR), "host": {"hostname", "platform", "machine",
        "load_average_1_5_15_min"} (at the start), "device": device_record(device),
        "libraries": library_versions()}``; ``source_files`` maps each file of the measured code path
        (``cropscale/bench/step/run.py``, ...) to its hex SHA-256, ``source_files_sha256`` is the SHA-256 of
        their ``sha256sum`` listing (one digest for the whole code path).
    """
    files, combined = source_digests(source)
    return {
        "source": str(Path(source).resolve()),
        "source_files": files,
        "source_files_sha256": combined,
        "invocation": {
            "executable": sys.executable,
            "sys_argv": list(sys.argv),
            "argv": list(sys.argv[1:] if argv is None else argv),
            "cwd": os.getcwd(),
        },
        "git": git_info(PACKAGE_DIR),
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(), "machine": platform.machine(),
                 "load_average_1_5_15_min": load_average()},
        "device": device_record(device),
        "libraries": library_versions(),
    }
