"""The study plan: every configuration with its exact batch plan, and whether it can run here.

A device-scaling configuration is a protocol x precision x world size; it runs when this machine (or
allocation) has enough ranks. A ``batch-sweep`` configuration is an optimiser x LR rule x precision x
global batch ``G``, realised on the spec's device counts that this machine has; it runs when ``G`` fits
the spec's limits there and an epoch holds at least one full global batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from cropscale.errors import CropScaleError
from cropscale.files import find_resource
from cropscale.study import protocol as P
from cropscale.study.spec import BatchSweepSpec, StudySpec


@dataclass(frozen=True)
class Configuration:
    """One row of the study: protocol x precision x world size, with its batch plan.

    Attributes:
        updates_per_epoch: planned optimizer updates per epoch (None: training samples unknown).
        runnable: False when it needs more ranks than are available (or, for a batch sweep, does not fit
            the spec's limits here); ``reason`` says why.
        runs_as: key of an identical configuration whose runs this one shares (a batch sweep's point at
            the reference batch, where every LR rule gives the same LR); None = its own runs.
        notes: what qualifies the plan (e.g. a short last update per epoch).
    """

    protocol: str
    precision: str
    world_size: int
    plan: P.BatchPlan
    updates_per_epoch: int | None
    runnable: bool
    reason: str = ""
    runs_as: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The run folder name.

        ``<protocol>_<precision>_n<N>``, or for a batch sweep ``batch-sweep_<optimizer>_<rule>_<precision>_g<G>``.
        """
        if self.protocol == P.BATCH_SWEEP:
            plan = self.plan
            return f"{self.protocol}_{plan.optimizer}_{plan.lr_scaling}_{self.precision}_g{plan.global_batch}"
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
    """Every configuration of ``spec``, protocol by protocol in the spec's order.

    Device scaling: precision, then world size; configurations needing more than ``available`` ranks
    are planned but not runnable. Batch sweep: :func:`plan_sweep`.
    """
    configs = []
    for proto in spec.protocols:
        if isinstance(proto, BatchSweepSpec):
            configs += plan_sweep(spec, proto, available, why)
            continue
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


def _sweep_point(spec: StudySpec, sweep: BatchSweepSpec, precision: str, g: int, optimizer, rule: str,
                 sizes: tuple[int, ...], limits: str) -> Configuration:
    """One batch-sweep configuration: realised ``G``, its updates per epoch, and whether it can run."""
    samples = int(spec.train_samples_per_epoch or 0)
    try:
        plan = sweep.plan(g, optimizer, rule, sizes)
    except CropScaleError as err:
        lr = P.scale_learning_rate(optimizer.lr, g, sweep.reference, rule)
        plan = P.BatchPlan(P.BATCH_SWEEP, 0, 0, 0, g, rule, sweep.reference, optimizer.lr, lr, optimizer.name)
        short = f"; and an epoch holds only {samples} training samples" if g > samples else ""
        return Configuration(P.BATCH_SWEEP, precision, 0, plan, None, False, f"too large for this machine: {err}"
                             f" ({limits}){short}")
    windows = P.update_windows(samples, plan.local_batch, plan.world_size, plan.accumulation)
    if windows.full_updates < 1:
        return Configuration(
            P.BATCH_SWEEP, precision, plan.world_size, plan, windows.updates, False,
            f"the batch does not form: an epoch of {samples} training samples holds no full global batch of {g}"
            f" (its one update would average {windows.last_update_samples} samples)")
    notes = ()
    if windows.last_update_samples != g:
        notes = (f"the last of the {windows.updates} updates per epoch averages {windows.last_update_samples} of"
                 f" G = {g} samples (short accumulation window; the loss is still divided by A ="
                 f" {plan.accumulation})",)
    return Configuration(P.BATCH_SWEEP, precision, plan.world_size, plan, windows.updates, True, notes=notes)


def plan_sweep(spec: StudySpec, sweep: BatchSweepSpec, available: int, why: str = "") -> list[Configuration]:
    """The configurations of a ``batch-sweep`` protocol: optimiser x LR rule x precision x ``G``.

    ``G`` is realised (:func:`cropscale.study.protocol.realise_global_batch`) on the spec's device counts
    that do not exceed ``available``, with at most ``max_local_batch`` samples per device and
    ``max_accumulation`` micro-batches per update. Not runnable, with the reason: a ``G`` beyond these
    limits ("too large for this machine"), or one that an epoch of ``train_samples_per_epoch`` samples
    cannot fill once. A point identical to an earlier one (same optimiser, precision, batch plan and LR:
    the reference batch under another LR rule) shares its runs (``runs_as``).
    """
    sizes = tuple(n for n in spec.devices if n <= available)
    limits = (f"local batch <= {sweep.max_local_batch}, world size in {list(sizes) or '[]'} of {list(spec.devices)}"
              f" ({available} available: {why}), accumulation <= {sweep.max_accumulation or 'any'}")
    configs: list[Configuration] = []
    seen: dict[tuple, str] = {}
    for optimizer in sweep.optimizers:
        for rule in optimizer.lr_scalings:
            for precision in spec.precisions:
                for g in sweep.global_batches:
                    config = _sweep_point(spec, sweep, precision, g, optimizer, rule, sizes, limits)
                    p = config.plan
                    twin = (optimizer.name, precision, p.world_size, p.local_batch, p.accumulation, g, p.lr)
                    if config.runnable and twin in seen:
                        config = replace(config, runs_as=seen[twin])
                    elif config.runnable:
                        seen[twin] = config.key
                    configs.append(config)
    return configs


def configured_data_root(spec: StudySpec) -> str | None:
    """``data.root`` as the fit configs leave it (None when the last one to set it says ``null``).

    ``configs/default.yaml`` is read first, then the spec's base configs; the last one that sets it wins.
    """
    import yaml

    root = None
    for cfg in ("configs/default.yaml", *spec.base_configs):
        try:
            data = yaml.safe_load(find_resource(cfg, "config").read_text()) or {}
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
