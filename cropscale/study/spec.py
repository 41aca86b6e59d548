"""The study spec: one YAML file under ``configs/study/``, validated into a :class:`StudySpec` first.

See ``configs/study/cpu.yaml``; nothing runs before the spec is valid.

Every error names the spec file and the key: unknown keys, missing ``devices`` / ``protocols``, bad
protocol fields, a device list without 1, a protocol whose batch arithmetic fails for a listed world
size (:mod:`cropscale.study.protocol`), an override of a key the protocol controls.

Protocols: ``equal-global`` and ``equal-local`` (:class:`ProtocolSpec`, device scaling) and
``batch-sweep`` (:class:`BatchSweepSpec`, quality and speed against the global batch).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cropscale.errors import CropScaleError
from cropscale.model.optim import OPTIMIZERS
from cropscale.numbers import TARGET_FRACTION
from cropscale.options import error_line
from cropscale.precision import LABELS, STUDY_ALIASES, STUDY_CONFIGS
from cropscale.report.equivalence import DEFAULT_MARGIN
from cropscale.study import protocol as P

"""The checkout holding ``configs/`` (paths in a spec may be relative to it)."""

PRECISION_CONFIGS: dict[str, str] = {name: f"configs/precision/{name}.yaml" for name in STUDY_CONFIGS.values()}
"""Study precision name -> its ``fit --config`` file."""
PRECISION_LABELS: dict[str, str] = {name: LABELS[lightning] for lightning, name in STUDY_CONFIGS.items()}
"""Study precision name -> table label: the label of its Lightning precision (:data:`cropscale.precision.LABELS`,
the one table; ``bf16`` is ``bf16-mixed`` = ``AMP BF16``)."""
STRATEGY_CONFIGS = {"ddp": "configs/strategy/ddp.yaml", "fsdp": "configs/strategy/fsdp.yaml",
                    "single": "configs/strategy/single.yaml"}
"""Strategy name -> its ``fit --config`` file."""
PROTOCOL_KEYS = (
    "trainer.devices", "trainer.num_nodes", "trainer.accelerator", "trainer.strategy", "trainer.precision",
    "trainer.max_epochs", "trainer.accumulate_grad_batches", "data.batch_size", "model.lr",
    "model.lr_scaling", "model.reference_batch_size", "seed_everything", "data.root",
    "trainer.logger.init_args.save_dir", "trainer.logger.init_args.name", "trainer.logger.init_args.version",
)
"""Keys the protocol sets on every fit command; an override of one of them would break the protocol."""
SWEEP_KEYS = ("model.optimizer", "model.warmup_steps", "model.warmup_epochs", "model.schedule")
"""Further keys the ``batch-sweep`` protocol sets (refused as overrides when the spec has one)."""


# ----------------------------------------------------------------------------------------- the spec
@dataclass(frozen=True)
class ProtocolSpec:
    """One batch protocol of the study.

    Attributes:
        name: ``equal-global`` or ``equal-local``.
        local_batch: ``L`` (``--data.batch_size``).
        global_batch: ``G`` (``equal-global`` only).
        lr_scaling: ``none | linear | sqrt`` (the task applies it; ``sqrt`` for AdamW).
        reference_batch: global batch of the base LR; default: the 1-rank global batch.
    """

    name: str
    local_batch: int
    global_batch: int | None = None
    lr_scaling: str = "none"
    reference_batch: int | None = None

    def plan(self, world_size: int, base_lr: float) -> P.BatchPlan:
        """The batch plan of this protocol on ``world_size`` ranks (:func:`cropscale.study.protocol.batch_plan`)."""
        return P.batch_plan(self.name, world_size, self.local_batch, self.global_batch, base_lr,
                            self.lr_scaling, self.reference_batch)


@dataclass(frozen=True)
class SweepOptimizer:
    """One optimiser of a batch sweep.

    Attributes:
        name: ``adamw | sgd | lars | lamb`` (``--model.optimizer``).
        lr: learning rate at the sweep's reference batch (``--model.lr``).
        lr_scalings: the LR rules swept for this optimiser (``none | linear | sqrt``).
    """

    name: str
    lr: float
    lr_scalings: tuple[str, ...] = ("sqrt",)

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise StudySpecError(f"name must be one of {', '.join(OPTIMIZERS)}, got {self.name!r}")
        if not self.lr > 0:
            raise StudySpecError(f"lr must be a positive number, got {self.lr!r}")
        rules = self.lr_scalings
        if not rules or any(r not in P.LR_RULES for r in rules) or len(set(rules)) != len(rules):
            raise StudySpecError(f"lr_scalings must be distinct values of {', '.join(P.LR_RULES)}, got {list(rules)!r}")


@dataclass(frozen=True)
class BatchSweepSpec:
    """The ``batch-sweep`` protocol: quality and samples/s against the global batch ``G``.

    Every ``G`` trains the spec's ``warmup_epochs + measured_epochs`` epochs (same samples seen), so the
    optimiser updates fall as ``G`` grows. ``G`` is realised exactly as ``L x N x A``
    (:func:`cropscale.study.protocol.realise_global_batch`) within ``max_local_batch`` (memory),
    the spec's ``devices`` that this machine has, and ``max_accumulation``; a ``G`` beyond these limits,
    or larger than an epoch's samples, is listed as not run.

    Attributes:
        name: ``batch-sweep``.
        global_batches: the ``G`` to sweep, e.g. ``[4, 8, 16, 32]``.
        max_local_batch: the largest local batch that fits in one device's memory.
        optimizers: the optimisers with their reference LR and LR rules (:class:`SweepOptimizer`).
        reference_batch: global batch of every optimiser's ``lr`` (default: the smallest ``G``).
        max_accumulation: the largest gradient accumulation allowed (None = no limit).
        lr_warmup_epochs: linear LR warm-up in epochs, the same for every ``G`` (Goyal et al. 2017).
        lr_schedule: ``constant`` or ``cosine`` after the warm-up.
        baseline_optimizer: optimiser of the small-batch baseline (default: the first listed); the
            baseline is its smallest ``G`` with its first LR rule.
        tolerance: the equivalence margin (macro IoU, absolute, 0..1) of each point's verdict against the
            baseline (:func:`cropscale.report.equivalence.decide`): a point holds when it is equivalent.
    """

    name: str
    global_batches: tuple[int, ...]
    max_local_batch: int
    optimizers: tuple[SweepOptimizer, ...]
    reference_batch: int | None = None
    max_accumulation: int | None = None
    lr_warmup_epochs: float = 0.0
    lr_schedule: Literal["constant", "cosine"] = "constant"
    baseline_optimizer: str | None = None
    tolerance: float = 0.02

    def __post_init__(self) -> None:
        batches = self.global_batches
        if not batches or any(g < 1 for g in batches) or len(set(batches)) != len(batches):
            raise StudySpecError(f"global_batches must be distinct integers >= 1, got {list(batches)}")
        object.__setattr__(self, "global_batches", tuple(sorted(batches)))
        _at_least(self, max_local_batch=1, reference_batch=1, max_accumulation=1, lr_warmup_epochs=0, tolerance=0)
        if not self.optimizers:
            raise StudySpecError("optimizers must be a non-empty list of {name, lr, lr_scalings}")
        names = [o.name for o in self.optimizers]
        if len(set(names)) != len(names):
            raise StudySpecError(f"each optimizer may appear once, got {names}")
        if self.baseline_optimizer is not None and self.baseline_optimizer not in names:
            raise StudySpecError(f"baseline_optimizer {self.baseline_optimizer!r} is not one of the"
                                 f" sweep's optimizers ({', '.join(names)})")

    @property
    def reference(self) -> int:
        """The reference batch: ``reference_batch`` or the smallest ``G``."""
        return self.reference_batch if self.reference_batch is not None else min(self.global_batches)

    @property
    def baseline(self) -> tuple[str, str, int]:
        """(optimiser, LR rule, ``G``) of the small-batch baseline."""
        name = self.baseline_optimizer or self.optimizers[0].name
        opt = next(o for o in self.optimizers if o.name == name)
        return opt.name, opt.lr_scalings[0], min(self.global_batches)

    def plan(self, global_batch: int, optimizer: SweepOptimizer, lr_scaling: str,
             world_sizes: tuple[int, ...]) -> P.BatchPlan:
        """The batch plan of one point (:func:`cropscale.study.protocol.sweep_plan`)."""
        return P.sweep_plan(global_batch, self.max_local_batch, world_sizes, optimizer.lr, lr_scaling,
                            self.reference, self.max_accumulation, optimizer.name)


@dataclass(frozen=True)
class StudySpec:
    """A scaling study (one YAML file under ``configs/study/``).

    Attributes:
        name: study name (default output folder ``runs/study/<name>``).
        accelerator: ``cpu``, ``gpu`` (= ``cuda``) or ``auto`` (GPU if one is visible).
        devices: world sizes ``N`` to study, e.g. ``[1, 2, 4, 8]``; must include 1 (``T_1``).
        precisions: ``fp32``, ``amp_fp16``, ``bf16`` (``configs/precision/<name>.yaml``).
        protocols: the batch protocols (:class:`ProtocolSpec`, :class:`BatchSweepSpec`).
        seeds: ``seed_everything`` values, one run each.
        warmup_epochs, measured_epochs: epochs excluded from / included in the timing statistics;
            ``trainer.max_epochs = warmup_epochs + measured_epochs``.
        strategy: ``ddp`` or ``fsdp`` for ``N > 1`` (``configs/strategy/<name>.yaml``).
        single_device_strategy: strategy of the ``N = 1`` baseline: ``single`` (no wrapper, the
            honest ``T_1``) or the same as ``strategy``.
        base_configs: ``fit --config`` files (relative to the working directory or the repository),
            after ``configs/default.yaml`` which the CLI always reads first.
        overrides: further dotted ``fit`` arguments (``--data.samples_per_patch=4``); protocol keys
            (:data:`PROTOCOL_KEYS`) are refused.
        data_root: ``--data.root`` (None = the base configs' root).
        lr: base learning rate ``--model.lr`` at the reference batch.
        train_samples_per_epoch: ``S`` (training patches x ``data.samples_per_patch``), for the
            planned optimiser updates; None = unknown (taken from the runs when they report it;
            required by ``batch-sweep``).
        max_cpu_processes: CPU processes that may run at once (default ``os.cpu_count()``).
        threads_per_process: ``OMP_NUM_THREADS`` of every rank on CPU (None = Lightning's default).
        max_nodes: nodes available to the launcher (GPU capacity = GPUs per node x ``max_nodes``).
        devices_per_node: ranks per node (default: the visible GPUs, or ``N`` on one node).
        launcher: command tokens replacing ``["{python}", "-m", "cropscale"]``; placeholders
            ``{python}``, ``{nodes}``, ``{devices_per_node}``, ``{world_size}``, ``{node_rank}``;
            ``$VARS`` expanded.
        allreduce: assumptions of the all-reduce model for analytical rows: ``alpha_us`` (per-phase
            latency, µs), ``bandwidth_gb_s`` (effective per-rank bandwidth, 1e9 bytes/s),
            ``bytes_per_element`` (gradient element size, 4 for FP32 parameters, also under AMP).
        num_params: trainable parameters ``P`` for the all-reduce payload (None = counted on the
            network built from ``num_classes`` and ``net_kwargs``).
        num_classes, net_kwargs: the network for the parameter count.
        run_timeout_s: wall-clock limit of one fit process (None = none).
        equivalence_margin: macro IoU (absolute) of the quality verdicts (:mod:`cropscale.report.equivalence`).
        target_fraction: time to target = this fraction of the base configuration's mean best macro IoU.
        source: the YAML file.
    """

    name: str
    devices: tuple[int, ...]
    protocols: tuple[ProtocolSpec | BatchSweepSpec, ...]
    accelerator: Literal["cpu", "gpu", "cuda", "auto"] = "cpu"
    precisions: tuple[str, ...] = ("fp32",)
    seeds: tuple[int, ...] = (0,)
    warmup_epochs: int = 1
    measured_epochs: int = 1
    strategy: Literal["ddp", "fsdp"] = "ddp"
    single_device_strategy: Literal["single", "same"] = "single"
    base_configs: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    data_root: str | None = None
    lr: float = 1e-3
    train_samples_per_epoch: int | None = None
    max_cpu_processes: int | None = None
    threads_per_process: int | None = None
    max_nodes: int = 1
    devices_per_node: int | None = None
    launcher: tuple[str, ...] | None = None
    allreduce: dict[str, float] = field(default_factory=lambda: {"alpha_us": 10.0, "bandwidth_gb_s": 10.0,
                                                                 "bytes_per_element": 4.0})
    num_params: int | None = None
    num_classes: int = 10
    net_kwargs: dict[str, Any] = field(default_factory=dict)
    run_timeout_s: float | None = None
    equivalence_margin: float = DEFAULT_MARGIN
    target_fraction: float = TARGET_FRACTION
    source: str = ""

    def __post_init__(self) -> None:
        where = self.source or "<spec>"
        devices = self.devices
        if not devices or any(n < 1 for n in devices) or len(set(devices)) != len(devices):
            raise StudySpecError(f"{where}: devices must be distinct integers >= 1, got {list(devices)}")
        if 1 not in devices:
            raise StudySpecError(f"{where}: devices must include 1: S_N = T_1 / T_N needs the 1-device time")
        if not self.seeds:
            raise StudySpecError(f"{where}: seeds must not be empty")
        for key, low, high in (("equivalence_margin", 0.0, 1.0), ("target_fraction", 1e-9, 1.0)):
            value = getattr(self, key)
            if not low <= value <= high:
                raise StudySpecError(f"{where}: {key} must be a number in [{low:g}, {high:g}], got {value!r}")
        try:
            _at_least(self, warmup_epochs=0, measured_epochs=1)
        except StudySpecError as err:
            raise StudySpecError(f"{where}: {err}") from None
        _check_overrides(self, where)

    @property
    def max_epochs(self) -> int:
        """``warmup_epochs + measured_epochs``."""
        return self.warmup_epochs + self.measured_epochs


class StudySpecError(CropScaleError):
    """A study spec that is not valid; the message names the spec file and the key (``cpu.yaml: protocols[0]: ...``)."""


def _at_least(spec: Any, **lows: float) -> None:
    """Raise :class:`StudySpecError` naming the field of ``spec`` that is below its low (None: not set)."""
    hints = typing.get_type_hints(type(spec))
    for key, low in lows.items():
        value = getattr(spec, key)
        if value is not None and not value >= low:
            kind = "an integer" if int in (hints[key], *typing.get_args(hints[key])) else "a number"
            raise StudySpecError(f"{key} must be {kind} >= {low:g}, got {value!r}")


@functools.cache
def _parser(cls: type, skip: frozenset[str]) -> Any:
    """A jsonargparse parser of the fields of the dataclass ``cls`` but ``skip`` (types from the annotations)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, as_group=False, skip=set(skip))
    return parser


def _fields(cls: type, data: Any, where: str, what: str = "", skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The fields of the mapping ``data`` checked and converted against ``cls`` by jsonargparse (not ``skip``).

    Raises:
        StudySpecError: ``data`` is no mapping, has unknown keys, lacks a required one or holds a value of
            another type; the message starts with ``where`` and names the key.
    """
    from jsonargparse import ArgumentError

    if not isinstance(data, dict):
        raise StudySpecError(f"{where} must be a YAML mapping")
    known = {f.name for f in dataclasses.fields(cls) if f.init and f.name != "source"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise StudySpecError(f"{where}: unknown {what}key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    given = {k: v for k, v in data.items() if k not in skip}
    try:
        values = _parser(cls, skip | {"source"}).parse_object(given).as_dict()
    except ArgumentError as err:
        raise StudySpecError(f"{where}: {error_line(err, cls, show=str)}") from None
    return {k: v for k, v in values.items() if not k.startswith("__")}


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    """``cls(**values)``; a :class:`StudySpecError` of its checks gets ``where`` in front."""
    try:
        return cls(**values)
    except StudySpecError as err:
        raise StudySpecError(f"{where}: {err}") from None


def precision_name(value: str, where: str) -> str:
    """The study precision name (``fp32``, ``amp_fp16``, ``bf16``) of ``value`` or one of its aliases.

    Raises:
        StudySpecError: an unknown precision, naming ``where``.
    """
    name = STUDY_ALIASES.get(str(value), str(value))
    if name not in PRECISION_CONFIGS:
        raise StudySpecError(
            f"{where}: precision {value!r} is not one of {', '.join(PRECISION_CONFIGS)} (or {', '.join(STUDY_ALIASES)})"
        )
    return name


def _batch_sweep(raw: dict, data: dict, where: str) -> BatchSweepSpec:
    """Validate a ``batch-sweep`` protocol mapping."""
    values = _fields(BatchSweepSpec, raw, where, skip=frozenset({"optimizers"}))
    if "optimizers" not in raw:
        raise StudySpecError(f"{where}: missing optimizers")
    if not isinstance(raw["optimizers"], list):
        raise StudySpecError(f"{where}: optimizers must be a non-empty list of {{name, lr, lr_scalings}}")
    values["optimizers"] = tuple(
        _build(SweepOptimizer, _fields(SweepOptimizer, item, f"{where}: optimizers[{j}]"), f"{where}: optimizers[{j}]")
        for j, item in enumerate(raw["optimizers"]))
    if not data.get("train_samples_per_epoch"):
        raise StudySpecError(f"{where}: batch-sweep needs the spec's train_samples_per_epoch (the optimiser"
                             " updates per epoch, and whether a global batch forms at all, depend on it)")
    return _build(BatchSweepSpec, values, where)


def _protocols(data: dict, source: str) -> tuple[ProtocolSpec | BatchSweepSpec, ...]:
    raw_protocols = data["protocols"]
    if not isinstance(raw_protocols, list) or not raw_protocols:
        raise StudySpecError(f"{source}: protocols must be a non-empty list of mappings")
    protos: list[ProtocolSpec | BatchSweepSpec] = []
    for i, raw in enumerate(raw_protocols):
        where = f"{source}: protocols[{i}]"
        if isinstance(raw, dict) and raw.get("name") == P.BATCH_SWEEP:
            protos.append(_batch_sweep(raw, data, where))
            continue
        proto = _build(ProtocolSpec, _fields(ProtocolSpec, raw, where), where)
        for n in data["devices"]:
            try:
                proto.plan(n, float(data.get("lr", 1e-3)))
            except CropScaleError as err:
                raise StudySpecError(f"{where} ({proto.name}) on {n} device(s): {err}") from None
        protos.append(proto)
    names = [p.name for p in protos]
    if len(set(names)) != len(names):
        raise StudySpecError(f"{source}: each protocol may appear once, got {names}")
    return tuple(protos)


def _check_overrides(spec: StudySpec, source: str) -> None:
    controlled = set(PROTOCOL_KEYS) | {"config", "trainer.logger"}
    if any(isinstance(p, BatchSweepSpec) for p in spec.protocols):
        controlled |= set(SWEEP_KEYS)
    for override in spec.overrides:
        key = override.lstrip("-").split("=", 1)[0]
        if not override.startswith("--") or "=" not in override:
            raise StudySpecError(f"{source}: override {override!r} must look like --key.sub=value")
        if key in controlled:
            raise StudySpecError(
                f"{source}: override {override!r} sets '{key}', which the study protocol controls"
                " (set it through the spec's fields instead)"
            )


def parse_spec(data: dict, source: str = "<spec>") -> StudySpec:
    """Validate a study spec read from YAML.

    jsonargparse checks every key against the field types of :class:`StudySpec`, :class:`ProtocolSpec`,
    :class:`BatchSweepSpec` and :class:`SweepOptimizer` (unknown keys, missing keys, wrong types, values
    outside a ``Literal``); the dataclasses check the ranges (``__post_init__``).

    Raises:
        StudySpecError: unknown keys, missing ``name`` / ``devices`` / ``protocols``, a value of another type,
            bad protocol fields, a device list without 1, a protocol whose arithmetic fails for a listed world
            size, or an override of a protocol key. The message names ``source`` and the key.
    """
    values = _fields(StudySpec, data, source, "study ", skip=frozenset({"protocols"}))
    if "protocols" not in data:
        raise StudySpecError(f"{source}: missing protocols")
    values["precisions"] = tuple(precision_name(p, source) for p in values["precisions"])
    if "allreduce" in data:
        values["allreduce"] = {**StudySpec.__dataclass_fields__["allreduce"].default_factory(), **values["allreduce"]}
    StudySpec(**values, protocols=(), source=source)  # its own checks (the devices) before the protocols' plans
    return StudySpec(**values, protocols=_protocols(data, source), source=source)


def load_spec(path: str | Path) -> StudySpec:
    """Read and validate a study spec YAML file (see :func:`parse_spec`).

    Raises:
        CropScaleError: the file is missing or not valid YAML, or :func:`parse_spec` refuses it.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise CropScaleError(f"study spec not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise CropScaleError(f"{path}: not valid YAML ({err})") from None
    return parse_spec(data, str(path))
