"""The study spec: one YAML file under ``configs/study/``, validated into a :class:`StudySpec` first.

See ``configs/study/cpu.yaml``; nothing runs before the spec is valid.

Every error names the spec file and the key: unknown keys, missing ``devices`` / ``protocols``, bad
protocol fields, a device list without 1, a protocol whose batch arithmetic fails for a listed world
size (:mod:`cropscale.study.protocol`), an override of a key the protocol controls.

Protocols: ``equal-global`` and ``equal-local`` (:class:`ProtocolSpec`, device scaling) and
``batch-sweep`` (:class:`BatchSweepSpec`, quality and speed against the global batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cropscale.errors import CropScaleError
from cropscale.model.optim import OPTIMIZERS
from cropscale.precision import LABELS, STUDY_ALIASES, STUDY_CONFIGS
from cropscale.runs.equivalence import DEFAULT_MARGIN, TARGET_FRACTION
from cropscale.study import protocol as P

REPO_ROOT = Path(__file__).resolve().parents[2]
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
        tolerance: macro IoU (absolute, 0..1) by which a point's mean best macro IoU may fall below the
            baseline's mean and still "hold".
    """

    name: str
    global_batches: tuple[int, ...]
    max_local_batch: int
    optimizers: tuple[SweepOptimizer, ...]
    reference_batch: int | None = None
    max_accumulation: int | None = None
    lr_warmup_epochs: float = 0.0
    lr_schedule: str = "constant"
    baseline_optimizer: str | None = None
    tolerance: float = 0.02

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
        equivalence_margin: macro IoU (absolute) of the quality verdicts (:mod:`cropscale.runs.equivalence`).
        target_fraction: time to target = this fraction of the base configuration's mean best macro IoU.
        source: the YAML file.
    """

    name: str
    devices: tuple[int, ...]
    protocols: tuple[ProtocolSpec | BatchSweepSpec, ...]
    accelerator: str = "cpu"
    precisions: tuple[str, ...] = ("fp32",)
    seeds: tuple[int, ...] = (0,)
    warmup_epochs: int = 1
    measured_epochs: int = 1
    strategy: str = "ddp"
    single_device_strategy: str = "single"
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

    @property
    def max_epochs(self) -> int:
        """``warmup_epochs + measured_epochs``."""
        return self.warmup_epochs + self.measured_epochs


def _int_list(value: Any, key: str, where: str) -> tuple[int, ...]:
    items = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int):
            raise CropScaleError(f"{where}: {key} must be integers, got {v!r}")
        out.append(v)
    if not out:
        raise CropScaleError(f"{where}: {key} must not be empty")
    return tuple(out)


def precision_name(value: str, where: str) -> str:
    """The study precision name (``fp32``, ``amp_fp16``, ``bf16``) of ``value`` or one of its aliases.

    Raises:
        CropScaleError: an unknown precision, naming ``where``.
    """
    name = STUDY_ALIASES.get(str(value), str(value))
    if name not in PRECISION_CONFIGS:
        raise CropScaleError(
            f"{where}: precision {value!r} is not one of {', '.join(PRECISION_CONFIGS)} (or {', '.join(STUDY_ALIASES)})"
        )
    return name


def _check_keys(data: Any, source: str) -> None:
    if not isinstance(data, dict):
        raise CropScaleError(f"{source}: a study spec must be a YAML mapping")
    known = {f for f in StudySpec.__dataclass_fields__ if f != "source"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise CropScaleError(f"{source}: unknown study key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    for key in ("name", "devices", "protocols"):
        if key not in data:
            raise CropScaleError(f"{source}: the study spec needs '{key}'")


def _devices(data: dict, source: str) -> tuple[int, ...]:
    devices = _int_list(data["devices"], "devices", source)
    if any(n < 1 for n in devices) or len(set(devices)) != len(devices):
        raise CropScaleError(f"{source}: devices must be distinct integers >= 1, got {list(devices)}")
    if 1 not in devices:
        raise CropScaleError(f"{source}: devices must include 1: S_N = T_1 / T_N needs the 1-device time")
    return devices


def _positive(value: Any, key: str, where: str, kind: type = int, low: float = 1) -> Any:
    ok = not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int)
    if not ok or not value >= low:
        raise CropScaleError(f"{where}: {key} must be {'a number' if kind is float else 'an integer'} >= {low:g},"
                             f" got {value!r}")
    return kind(value)


def _sweep_optimizers(raw: Any, where: str) -> tuple[SweepOptimizer, ...]:
    if not isinstance(raw, list) or not raw:
        raise CropScaleError(f"{where}: optimizers must be a non-empty list of {{name, lr, lr_scalings}}")
    out = []
    for j, item in enumerate(raw):
        at = f"{where}: optimizers[{j}]"
        if not isinstance(item, dict) or "name" not in item or "lr" not in item:
            raise CropScaleError(f"{at} needs 'name' and 'lr'")
        extra = sorted(set(item) - set(SweepOptimizer.__dataclass_fields__))
        if extra:
            raise CropScaleError(f"{at}: unknown key(s) {', '.join(extra)}; known: name, lr, lr_scalings")
        if item["name"] not in OPTIMIZERS:
            raise CropScaleError(f"{at}: name must be one of {', '.join(OPTIMIZERS)}, got {item['name']!r}")
        lr = item["lr"]
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
            raise CropScaleError(f"{at}: lr must be a positive number, got {lr!r}")
        rules = item.get("lr_scalings", ["sqrt"])
        rules = rules if isinstance(rules, list) else [rules]
        if not rules or any(r not in P.LR_RULES for r in rules) or len(set(rules)) != len(rules):
            raise CropScaleError(f"{at}: lr_scalings must be distinct values of {', '.join(P.LR_RULES)}, got {rules!r}")
        out.append(SweepOptimizer(item["name"], float(lr), tuple(rules)))
    names = [o.name for o in out]
    if len(set(names)) != len(names):
        raise CropScaleError(f"{where}: each optimizer may appear once, got {names}")
    return tuple(out)


def _batch_sweep(raw: dict, data: dict, where: str) -> BatchSweepSpec:
    """Validate a ``batch-sweep`` protocol mapping."""
    extra = sorted(set(raw) - set(BatchSweepSpec.__dataclass_fields__))
    if extra:
        known = ", ".join(sorted(BatchSweepSpec.__dataclass_fields__))
        raise CropScaleError(f"{where}: unknown key(s) {', '.join(extra)}; known: {known}")
    for key in ("global_batches", "max_local_batch", "optimizers"):
        if key not in raw:
            raise CropScaleError(f"{where} (batch-sweep) needs '{key}'")
    batches = _int_list(raw["global_batches"], "global_batches", where)
    if any(g < 1 for g in batches) or len(set(batches)) != len(batches):
        raise CropScaleError(f"{where}: global_batches must be distinct integers >= 1, got {list(batches)}")
    if not data.get("train_samples_per_epoch"):
        raise CropScaleError(f"{where}: batch-sweep needs the spec's train_samples_per_epoch (the optimiser"
                             " updates per epoch, and whether a global batch forms at all, depend on it)")
    optimizers = _sweep_optimizers(raw["optimizers"], where)
    sweep = BatchSweepSpec(
        name=P.BATCH_SWEEP, global_batches=tuple(sorted(batches)),
        max_local_batch=_positive(raw["max_local_batch"], "max_local_batch", where),
        optimizers=optimizers,
        reference_batch=(None if raw.get("reference_batch") is None
                         else _positive(raw["reference_batch"], "reference_batch", where)),
        max_accumulation=(None if raw.get("max_accumulation") is None
                          else _positive(raw["max_accumulation"], "max_accumulation", where)),
        lr_warmup_epochs=_positive(raw.get("lr_warmup_epochs", 0.0), "lr_warmup_epochs", where, float, 0),
        lr_schedule=str(raw.get("lr_schedule", "constant")),
        baseline_optimizer=raw.get("baseline_optimizer"),
        tolerance=_positive(raw.get("tolerance", 0.02), "tolerance", where, float, 0),
    )
    if sweep.lr_schedule not in ("constant", "cosine"):
        raise CropScaleError(f"{where}: lr_schedule must be constant or cosine, got {sweep.lr_schedule!r}")
    if sweep.baseline_optimizer is not None and sweep.baseline_optimizer not in [o.name for o in optimizers]:
        raise CropScaleError(f"{where}: baseline_optimizer {sweep.baseline_optimizer!r} is not one of the"
                             f" sweep's optimizers ({', '.join(o.name for o in optimizers)})")
    return sweep


def _protocols(data: dict, devices: tuple[int, ...], source: str) -> tuple[ProtocolSpec | BatchSweepSpec, ...]:
    raw_protocols = data["protocols"]
    if not isinstance(raw_protocols, list) or not raw_protocols:
        raise CropScaleError(f"{source}: protocols must be a non-empty list of mappings")
    allowed = set(ProtocolSpec.__dataclass_fields__)
    protos: list[ProtocolSpec | BatchSweepSpec] = []
    for i, raw in enumerate(raw_protocols):
        where = f"{source}: protocols[{i}]"
        if isinstance(raw, dict) and raw.get("name") == P.BATCH_SWEEP:
            protos.append(_batch_sweep(raw, data, where))
            continue
        if not isinstance(raw, dict) or "name" not in raw or "local_batch" not in raw:
            raise CropScaleError(f"{where} needs 'name' and 'local_batch' (or name: {P.BATCH_SWEEP})")
        extra = sorted(set(raw) - allowed)
        if extra:
            raise CropScaleError(f"{where}: unknown key(s) {', '.join(extra)}; known: {', '.join(sorted(allowed))}")
        proto = ProtocolSpec(**raw)
        for n in devices:
            try:
                proto.plan(n, float(data.get("lr", 1e-3)))
            except CropScaleError as err:
                raise CropScaleError(f"{where} ({proto.name}) on {n} device(s): {err}") from None
        protos.append(proto)
    names = [p.name for p in protos]
    if len(set(names)) != len(names):
        raise CropScaleError(f"{source}: each protocol may appear once, got {names}")
    return tuple(protos)


def _fields(data: dict, source: str) -> dict[str, Any]:
    """The spec's other fields, converted (tuples, precision names, merged all-reduce assumptions)."""
    kwargs = {k: v for k, v in data.items() if k not in ("devices", "protocols")}
    kwargs["precisions"] = tuple(precision_name(p, source) for p in data.get("precisions", ["fp32"]))
    kwargs["seeds"] = _int_list(data.get("seeds", [0]), "seeds", source)
    for key in ("base_configs", "overrides"):
        kwargs[key] = tuple(str(v) for v in (data.get(key) or ()))
    if data.get("launcher") is not None:
        kwargs["launcher"] = tuple(str(v) for v in data["launcher"])
    if "allreduce" in data:
        merged = dict(StudySpec.__dataclass_fields__["allreduce"].default_factory())
        merged.update({k: float(v) for k, v in (data["allreduce"] or {}).items()})
        kwargs["allreduce"] = merged
    return kwargs


def _check_values(spec: StudySpec, source: str) -> None:
    if spec.accelerator not in ("cpu", "gpu", "cuda", "auto"):
        raise CropScaleError(f"{source}: accelerator must be cpu, gpu (cuda) or auto, got {spec.accelerator!r}")
    if spec.strategy not in ("ddp", "fsdp"):
        raise CropScaleError(f"{source}: strategy must be ddp or fsdp, got {spec.strategy!r}")
    if spec.single_device_strategy not in ("single", "same"):
        raise CropScaleError(f"{source}: single_device_strategy must be 'single' or 'same'")
    for key, low, high in (("equivalence_margin", 0.0, 1.0), ("target_fraction", 1e-9, 1.0)):
        value = getattr(spec, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise CropScaleError(f"{source}: {key} must be a number in [{low:g}, {high:g}], got {value!r}")
    for key, low in (("warmup_epochs", 0), ("measured_epochs", 1)):
        value = getattr(spec, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise CropScaleError(f"{source}: {key} must be an integer >= {low}")


def _check_overrides(spec: StudySpec, source: str) -> None:
    controlled = set(PROTOCOL_KEYS) | {"config", "trainer.logger"}
    if any(isinstance(p, BatchSweepSpec) for p in spec.protocols):
        controlled |= set(SWEEP_KEYS)
    for override in spec.overrides:
        key = override.lstrip("-").split("=", 1)[0]
        if not override.startswith("--") or "=" not in override:
            raise CropScaleError(f"{source}: override {override!r} must look like --key.sub=value")
        if key in controlled:
            raise CropScaleError(
                f"{source}: override {override!r} sets '{key}', which the study protocol controls"
                " (set it through the spec's fields instead)"
            )


def parse_spec(data: dict, source: str = "<spec>") -> StudySpec:
    """Validate a study spec read from YAML.

    Raises:
        CropScaleError: unknown keys, missing ``devices`` / ``protocols``, bad protocol fields, a
            device list without 1, a protocol whose arithmetic fails for a listed world size, or an
            override of a protocol key. The message names ``source`` and the key.
    """
    _check_keys(data, source)
    devices = _devices(data, source)
    spec = StudySpec(devices=devices, protocols=_protocols(data, devices, source), source=source,
                     **_fields(data, source))
    _check_values(spec, source)
    _check_overrides(spec, source)
    return spec


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


def resolve_path(path: str, what: str, hint: str = "") -> Path:
    """``path`` as given if absolute, else relative to the working directory, else to the repository.

    Raises:
        CropScaleError: none of the candidates exists (all are named, with ``hint``).
    """
    p = Path(path).expanduser()
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, REPO_ROOT / p]
    for c in candidates:
        if c.exists():
            return c.resolve()
    tried = " or ".join(str(c) for c in candidates)
    raise CropScaleError(f"{what} not found: {path} (tried {tried}){'; ' + hint if hint else ''}")
