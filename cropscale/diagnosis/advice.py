"""What to try for each kind of limit, in this project's own settings (``--data.*``, ``--trainer.*``, ``--model.*``).

Each entry is a setting with the value or direction to try and why, worded for ``python -m cropscale fit``
(``configs/default.yaml`` and its overrides). The rules pass the facts that choose among them (the run's
configuration, the part of the culprit's step, the worker count the loader rate asks for).
"""

from __future__ import annotations

from typing import Any

from cropscale.runs.describe import config_value


def _flag(config: dict[str, Any] | None, key: str) -> Any:
    return config_value(config, key, None) if config else None


def input_pipeline(config: dict[str, Any] | None, workers_needed: int | None, on_gpu: bool) -> list[str]:
    """Loader settings: workers (the count the loader rate asks for), persistence, prefetch, pinned memory."""
    workers = _flag(config, "data.num_workers")
    out = []
    if workers_needed is not None and (workers is None or workers_needed > int(workers)):
        out.append(f"data.num_workers: {workers_needed} (now {workers if workers is not None else 'n/a'}; the "
                   "loader rate above says how many keep up)")
    elif workers is not None:
        out.append(f"data.num_workers above {workers}, if the host has the cores")
    if not _flag(config, "data.persistent_workers"):
        out.append("data.persistent_workers: true (workers are not restarted every epoch; needs num_workers > 0)")
    out.append("data.prefetch_factor: 4 (batches each worker loads ahead; PyTorch's default is 2)")
    if on_gpu and not _flag(config, "data.pin_memory"):
        out.append("data.pin_memory: true (pinned host memory: non-blocking host-to-device copies)")
    return out


def transfer(config: dict[str, Any] | None) -> list[str]:
    """Host-to-device copies: pinned memory, collation off the training thread."""
    out = []
    if not _flag(config, "data.pin_memory"):
        out.append("data.pin_memory: true (copies from pinned memory run asynchronously)")
    if not _flag(config, "data.num_workers"):
        out.append("data.num_workers: 2 or more (collation and pinning leave the training thread)")
    out.append("augmentation on the device, after the copy (on_after_batch_transfer), rather than on the host")
    return out


def communication() -> list[str]:
    """DDP gradient all-reduce: buckets, static graph, more compute per all-reduce."""
    return [
        "trainer.strategy.init_args.bucket_cap_mb: 50 (fewer, larger all-reduce buckets; DDP's default is 25 MiB)",
        "trainer.strategy.init_args.static_graph: true (DDP learns the bucket order once and overlaps better)",
        "trainer.strategy.init_args.gradient_as_bucket_view: true (no gradient copy into the buckets)",
        "a larger data.batch_size or trainer.accumulate_grad_batches (more compute per all-reduce)",
    ]


def overhead() -> list[str]:
    """The loop remainder: logging, bookkeeping, the per-step SIGTERM broadcast under DDP."""
    return [
        "trainer.log_every_n_steps: larger (logging and the log steps' device reads fall in the remainder)",
        "a larger data.batch_size (the fixed cost of a step is spread over more samples)",
    ]


def compute(config: dict[str, Any] | None) -> list[str]:
    """A compute-bound step: precision, batch size, compilation."""
    out = []
    precision = str(_flag(config, "trainer.precision") or "")
    if "mixed" not in precision:
        out.append("trainer.precision: bf16-mixed or 16-mixed (configs/precision/; the report's verdicts say whether"
                   " quality holds)")
    out.append("a larger data.batch_size (arithmetic intensity; compare quality with the report's verdicts)")
    if not _flag(config, "model.compile"):
        out.append("model.compile: true (torch.compile; model.compile_mode)")
    return out


def straggler(rank: int | None, part: str | None) -> list[str]:
    """The culprit rank's node: what to look at for the part of its step that is slow."""
    if rank is None:
        return ["rerun with the same ranks to see whether one of them stays behind; compare their nodes"]
    where = {
        "data_wait": f"rank {rank}'s data: its node's disk and CPU load, data.num_workers on that node",
        "transfer": f"rank {rank}'s host-to-device link: its node's PCIe topology (nvidia-smi topo -m in run.json)",
        "forward": f"rank {rank}'s device: nvidia-smi -q -d PERFORMANCE,CLOCK on its node, other jobs on it",
        "backward_own": f"rank {rank}'s device: nvidia-smi -q -d PERFORMANCE,CLOCK on its node, other jobs on it",
        "optimizer": f"rank {rank}'s host and device (the optimizer step and clipping run there)",
    }
    return [where.get(part or "", f"rank {rank}'s node"),
            f"exclude or replace rank {rank}'s node, then compare the runs with python -m cropscale report"]


def throttling(rank: int, reasons: list[str] | None) -> list[str]:
    """A rank that slowed over the run: its device's clocks and its node's neighbours."""
    out = [f"rank {rank}'s GPU clocks and throttle reasons: nvidia-smi -q -d PERFORMANCE,CLOCK,POWER,TEMPERATURE"]
    if reasons:
        out.append(f"NVML reported {', '.join(reasons)}: cooling, power limit or the board")
    out.append(f"other jobs on rank {rank}'s node (a neighbour taking its CPU, memory bandwidth or PCIe)")
    return out


def validation(config: dict[str, Any] | None) -> list[str]:
    """Validation that weighs on the epoch: less often, fewer tiles, larger tile batches."""
    every = _flag(config, "trainer.check_val_every_n_epoch") or 1
    return [
        f"trainer.check_val_every_n_epoch: {int(every) * 2} (validate less often; now {every})",
        "model.val_stride: larger, up to model.val_window (fewer overlapping tiles per patch)",
        "model.tile_batch_size: larger (more tiles per forward pass)",
        "trainer.limit_val_batches: a subset while tuning speed (not for the reported quality)",
    ]


def checkpoint() -> list[str]:
    """Checkpoint writes that weigh on the epoch: fewer, smaller, to a faster folder."""
    return [
        "every_n_epochs: 2 or more in the ResumableCheckpoint's init_args (fewer checkpoint writes)",
        "save_top_k: 1 (one best file besides last.ckpt)",
        "a local or faster checkpoint folder (ModelCheckpoint dirpath), copied elsewhere after the run",
    ]


def nothing_dominant() -> list[str]:
    """No term to remove: what changes the balance."""
    return ["no single setting: a larger data.batch_size or another trainer.precision changes the balance; "
            "compare the runs with python -m cropscale report"]
