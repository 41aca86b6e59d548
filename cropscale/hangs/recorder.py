"""PyTorch's Flight Recorder for a DDP fit: turned on for NCCL, its dumps in the run folder.

The Flight Recorder keeps, on every rank, a ring buffer of the last collectives the rank entered (operation,
process group, sequence number, sizes, state, Python stack). Comparing the ranks' dumps shows the collective
that one rank never entered, or entered alone: ``torchfrtrace <run folder>/flight_recorder`` (PyTorch's
analyser) reads them.

- NCCL (a DDP fit on CUDA): before the process group exists (:func:`prepare_flight_recorder`, called by the CLI
  when the Trainer is built, in every process before it spawns or joins the others) cropscale sets
  ``TORCH_NCCL_TRACE_BUFFER_SIZE=2000`` and ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, each unless the user set it
  (``TORCH_FR_BUFFER_SIZE`` counts as the buffer's); at ``setup``, when the run folder is known,
  ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE=<run folder>/flight_recorder/trace_rank_`` unless set (PyTorch reads it at
  its first dump, not before). PyTorch dumps each rank to ``<prefix><rank>`` when a collective times out;
  :class:`~cropscale.hangs.HangWatch` names a hang long before that timeout (30 min under Lightning) and then
  asks every rank to dump to the same files (:func:`dump_function`).
- gloo: nothing is turned on (it costs a Python stack capture per collective); where the user set
  ``TORCH_FR_BUFFER_SIZE`` and this PyTorch records gloo's collectives (``_dump_fr_trace``), the hang watch dumps
  it the same way.
- one process: nothing to record.

:func:`flight_recorder_record` says which applies, for ``run.json["hang_watch"]["flight_recorder"]``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import torch

from cropscale.runs.schema import FlightRecorderRecord

ENV_BUFFER = "TORCH_NCCL_TRACE_BUFFER_SIZE"
ENV_FR_BUFFER = "TORCH_FR_BUFFER_SIZE"
ENV_DUMP = "TORCH_NCCL_DUMP_ON_TIMEOUT"
ENV_FILE = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
#: Entries kept per rank: PyTorch's documented example value; a DDP step enters one collective per gradient
#: bucket (a few) plus cropscale's stop-signal flag, so 2000 covers hundreds of steps.
BUFFER_ENTRIES = 2000
#: The folder of the run folder that holds the dumps, and the dumps' file prefix (``torchfrtrace`` reads it).
DUMP_FOLDER, DUMP_PREFIX = "flight_recorder", "trace_rank_"

#: The variables this process set (rank 0's are the run's record).
SET_HERE: dict[str, str] = {}


def process_group_backend(trainer: Any) -> str | None:
    """The backend the Trainer's DDP strategy will use (``nccl``, ``gloo``), known before its process group exists.

    None for a strategy without a process group (one device).
    """
    strategy = getattr(trainer, "strategy", None)
    chooser = getattr(strategy, "_get_process_group_backend", None)
    if chooser is None or getattr(trainer, "world_size", 1) < 2:
        return None
    try:
        return str(chooser())
    except Exception:  # a strategy not set up enough to say: nothing is turned on
        return None


def prepare_flight_recorder(trainer: Any, env: MutableMapping[str, str] | None = None) -> None:
    """Before the process group exists: turn on the Flight Recorder of a DDP fit on NCCL (module docstring).

    Call it in every process (the CLI does, when it builds the Trainer): a process started by Lightning's
    launcher inherits what its parent set; one started by torchrun or srun sets its own.
    """
    env = os.environ if env is None else env
    if process_group_backend(trainer) != "nccl":
        return
    if ENV_BUFFER not in env and ENV_FR_BUFFER not in env:
        env[ENV_BUFFER] = SET_HERE[ENV_BUFFER] = str(BUFFER_ENTRIES)
    if ENV_DUMP not in env:
        env[ENV_DUMP] = SET_HERE[ENV_DUMP] = "1"


def place_dumps(run_folder: str | os.PathLike, env: MutableMapping[str, str] | None = None) -> str:
    """The dumps' prefix: the user's ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, else ``<run folder>/flight_recorder/...``.

    The latter is then set in ``env``, for PyTorch's own dump at a collective timeout.
    """
    env = os.environ if env is None else env
    if ENV_FILE in env:
        return env[ENV_FILE]
    prefix = str(Path(run_folder).resolve() / DUMP_FOLDER / DUMP_PREFIX)
    env[ENV_FILE] = SET_HERE[ENV_FILE] = prefix
    return prefix


def _buffer_size(env: MutableMapping[str, str]) -> int:
    try:
        return int(env.get(ENV_FR_BUFFER) or env.get(ENV_BUFFER) or 0)
    except ValueError:
        return 0


def recording(backend: str | None, env: MutableMapping[str, str] | None = None) -> bool:
    """True when this process's Flight Recorder records ``backend``'s collectives and can be dumped."""
    env = os.environ if env is None else env
    return backend is not None and _buffer_size(env) > 0 and dump_function(backend) is not None


def flight_recorder_record(backend: str | None, prefix: str | None,
                           env: MutableMapping[str, str] | None = None) -> FlightRecorderRecord:
    """What applies to this run, for ``run.json`` (module docstring).

    Args:
        backend: the process group's backend (None: one process).
        prefix: the dumps' prefix (:func:`place_dumps`), or None.
        env: the environment (default ``os.environ``).
    """
    env = os.environ if env is None else env
    size = _buffer_size(env)
    if backend is None:
        return FlightRecorderRecord(applies=False, reason="one process: no collectives to record")
    if backend != "nccl" and (size <= 0 or dump_function(backend) is None):
        hint = (f"; this PyTorch records {backend}'s collectives too if {ENV_FR_BUFFER} is set"
                if dump_function(backend) is not None else "")
        return FlightRecorderRecord(applies=False, backend=backend,
                                    reason=f"cropscale turns the Flight Recorder on for NCCL only; this run's backend"
                                           f" is {backend}{hint}")
    if size <= 0:
        why = (f"{ENV_BUFFER}=0, set by the user" if ENV_BUFFER in env or ENV_FR_BUFFER in env else
               f"{ENV_BUFFER} was not set before the process group was created (cropscale's CLI sets it; with a"
               " Trainer of your own call cropscale.hangs.prepare_flight_recorder(trainer) before fit)")
        return FlightRecorderRecord(applies=False, backend=backend, reason=why)
    if dump_function(backend) is None:
        return FlightRecorderRecord(applies=False, backend=backend, reason="this PyTorch build has no Flight Recorder")
    mine = [v for v in (ENV_BUFFER, ENV_DUMP, ENV_FILE) if v in SET_HERE]
    theirs = [v for v in (ENV_BUFFER, ENV_FR_BUFFER, ENV_DUMP, ENV_FILE) if v in env and v not in SET_HERE]
    set_by = " and ".join(who for who, names in (("cropscale", mine), ("user", theirs)) if names)
    return FlightRecorderRecord(
        applies=True, backend=backend, trace_buffer_size=size,
        dump_on_timeout=env.get(ENV_DUMP, "0").lower() in ("1", "true") if backend == "nccl" else None,
        dump_prefix=prefix, set_by=set_by or None)


def dump_function(backend: str) -> Callable[[], bytes] | None:
    """PyTorch's dump of this process's Flight Recorder for ``backend`` (pickled bytes), or None where absent."""
    c10d = getattr(torch._C, "_distributed_c10d", None)
    names = ("_dump_nccl_trace", "_dump_fr_trace") if backend == "nccl" else ("_dump_fr_trace",)
    for name in names:
        found = getattr(c10d, name, None)
        if found is not None:
            return found
    return None


def write_dump(dump: Callable[[], bytes], prefix: str, rank: int) -> str:
    """Write this rank's dump to ``<prefix><rank>`` (the folder made) and return the path.

    Raises:
        OSError: the file cannot be written; RuntimeError: PyTorch's dump failed.
    """
    path = Path(f"{prefix}{rank}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(dump())
    return str(path)
