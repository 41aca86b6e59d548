"""The study plan: every configuration with its exact batch plan, and whether it can run here.

A configuration is a protocol x precision x world size; it runs when this machine (or allocation) has
enough ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cropscale.errors import CropScaleError
from cropscale.study import protocol as P
from cropscale.study.spec import StudySpec, resolve_path


@dataclass(frozen=True)
class Configuration:
    """One row of the study: protocol x precision x world size, with its batch plan.

    Attributes:
        updates_per_epoch: planned optimizer updates per epoch (None: training samples unknown).
        runnable: False when it needs more ranks than are available; ``reason`` says why.
    """

    protocol: str
    precision: str
    world_size: int
    plan: P.BatchPlan
    updates_per_epoch: int | None
    runnable: bool
    reason: str = ""

    @property
    def key(self) -> str:
        """``<protocol>_<precision>_n<N>``: the run folder name of the configuration."""
        return f"{self.protocol}_{self.precision}_n{self.world_size}"


def resolve_accelerator(spec: StudySpec) -> str:
    """``cpu`` or ``gpu`` (``auto``: ``gpu`` when ``torch.cuda.is_available()``)."""
    if spec.accelerator in ("gpu", "cuda"):
        return "gpu"
    if spec.accelerator == "auto":
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    return "cpu"


def available_devices(spec: StudySpec, accelerator: str | None = None) -> tuple[int, str]:
    """Ranks this machine (or allocation) can run at once, and where the figure comes from.

    GPUs: ``torch.cuda.device_count()`` (honours ``CUDA_VISIBLE_DEVICES``) x ``max_nodes``;
    CPU: ``max_cpu_processes`` (default ``os.cpu_count()``).
    """
    accelerator = accelerator or resolve_accelerator(spec)
    if accelerator == "gpu":
        import torch

        per_node = spec.devices_per_node if spec.devices_per_node is not None else torch.cuda.device_count()
        source = "devices_per_node" if spec.devices_per_node is not None else "torch.cuda.device_count()"
        return per_node * spec.max_nodes, f"{per_node} GPU(s) per node from {source} x {spec.max_nodes} node(s)"
    if spec.max_cpu_processes is not None:
        return int(spec.max_cpu_processes), "max_cpu_processes of the spec"
    return int(os.cpu_count() or 1), "os.cpu_count()"


def plan_study(spec: StudySpec, available: int, why: str = "") -> list[Configuration]:
    """Every configuration of ``spec`` (protocol-major, then precision, then world size).

    Configurations needing more than ``available`` ranks are planned but not runnable.
    """
    configs = []
    for proto in spec.protocols:
        for precision in spec.precisions:
            for n in sorted(spec.devices):
                plan = proto.plan(n, spec.lr)
                updates = None
                if spec.train_samples_per_epoch:
                    updates = P.optimizer_updates_per_epoch(
                        spec.train_samples_per_epoch, plan.local_batch, n, plan.accumulation
                    )
                runnable = n <= available
                reason = "" if runnable else f"needs {n} device(s), {available} available ({why})"
                configs.append(Configuration(proto.name, precision, n, plan, updates, runnable, reason))
    return configs


def configured_data_root(spec: StudySpec) -> str | None:
    """``data.root`` as the fit configs leave it (None when the last one to set it says ``null``).

    ``configs/default.yaml`` is read first, then the spec's base configs; the last one that sets it wins.
    """
    import yaml

    root = None
    for cfg in ("configs/default.yaml", *spec.base_configs):
        try:
            data = yaml.safe_load(resolve_path(cfg, "config").read_text()) or {}
        except (CropScaleError, OSError, yaml.YAMLError):
            continue
        section = data.get("data") if isinstance(data, dict) else None
        if isinstance(section, dict) and "root" in section:
            root = section["root"]
    return None if root is None else str(root)


def node_layout(spec: StudySpec, n: int, accelerator: str) -> tuple[int, int]:
    """(nodes, devices per node) for world size ``n``.

    Raises:
        CropScaleError: ``n`` is not a multiple of the devices per node.
    """
    if spec.devices_per_node is not None:
        per = spec.devices_per_node
    elif accelerator == "gpu" and spec.max_nodes > 1:
        import torch

        per = max(1, torch.cuda.device_count())
    else:
        per = n
    if n <= per:
        return 1, n
    if n % per:
        raise CropScaleError(f"world size {n} is not a multiple of {per} devices per node")
    return n // per, per
