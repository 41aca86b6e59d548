"""The scaling-study runner: ``python -m cropscale study --config configs/study/<name>.yaml``.

A study spec (YAML, see ``configs/study/cpu.yaml`` and ``configs/study/gpu_full.yaml``) lists
device counts, precisions, batch protocols (``equal-global`` / ``equal-local``, see
:mod:`cropscale.study.protocol`), seeds, warm-up and measured epochs, the strategy (``ddp`` /
``fsdp``), the base ``fit`` config files and overrides, and the accelerator. The runner

1. plans every configuration (protocol x precision x world size) with the exact batch arithmetic
   (local batch, accumulation, global batch, learning rate after the rule, optimiser updates per
   epoch);
2. launches one ``python -m cropscale fit ...`` process per configuration and seed (Lightning's own
   launchers start the DDP ranks; the study never builds a process group), each with the scaling
   callbacks on, all landing in one study folder;
3. does **not** run configurations that need more devices than exist (GPUs:
   ``torch.cuda.device_count()`` x ``max_nodes``; CPU processes: ``max_cpu_processes``, default
   ``os.cpu_count()``): they appear as ``analytical-scenario`` rows predicted from the measured ones
   (Karp-Flatt serial fraction, :mod:`cropscale.scaling.amdahl`, plus the growth of the ring
   all-reduce time, :mod:`cropscale.scaling.allreduce`), never as measurements;
4. writes the study table (Markdown + CSV) and figures through :mod:`cropscale.report.cli`.

Study folder layout (``--out``, default ``runs/study/<name>``)::

    study.json                 spec, plan, commands, exit codes, environment, git commit
    runs/<config>/seed<k>/     the fit run (Lightning log dir: run.json, events, config.yaml)
    logs/<config>_seed<k>.log  stdout + stderr of the fit process
    study_table.md / .csv      one row per configuration, measured-run rows first
    figures/*.png

Several nodes: the ``launcher`` spec field replaces ``python -m cropscale`` by a launcher prefix
(``srun ...`` inside a SLURM allocation, ``torchrun ...``); Lightning's environment detection
(SLURMEnvironment, TorchElasticEnvironment) then sets the ranks. See the README.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cropscale.env.host import PACKAGE_DIR, environment_record, git_info, gpu_topology, sha256_file
from cropscale.errors import CropScaleError
from cropscale.model.network import CropMappingNet
from cropscale.report import cli as report
from cropscale.report.cli import Column, figure, load_run, load_scalars
from cropscale.scaling import allreduce as ar
from cropscale.scaling.amdahl import karp_flatt
from cropscale.study import protocol as P

REPO_ROOT = Path(__file__).resolve().parents[2]
MEASURED = "measured-run"
ANALYTICAL = "analytical-scenario"

PRECISION_CONFIGS: dict[str, tuple[str, str]] = {
    "fp32": ("configs/precision/fp32.yaml", "FP32"),
    "amp_fp16": ("configs/precision/amp_fp16.yaml", "AMP FP16"),
    "bf16": ("configs/precision/bf16.yaml", "BF16"),
}
PRECISION_ALIASES = {"32": "fp32", "32-true": "fp32", "amp": "amp_fp16", "16-mixed": "amp_fp16",
                     "fp16": "amp_fp16", "bf16-mixed": "bf16"}
STRATEGY_CONFIGS = {"ddp": "configs/strategy/ddp.yaml", "fsdp": "configs/strategy/fsdp.yaml",
                    "single": "configs/strategy/single.yaml"}
# Keys the protocol sets on every fit command; an override of one of them would break the protocol.
PROTOCOL_KEYS = (
    "trainer.devices", "trainer.num_nodes", "trainer.accelerator", "trainer.strategy", "trainer.precision",
    "trainer.max_epochs", "trainer.accumulate_grad_batches", "data.batch_size", "model.lr",
    "model.lr_scaling", "model.reference_batch_size", "seed_everything", "data.root",
    "trainer.logger.init_args.save_dir", "trainer.logger.init_args.name", "trainer.logger.init_args.version",
)
_BATCH_LINE = re.compile(
    r"global batch (\d+) = local (\d+) x world size (\d+) x accumulation (\d+).*?lr (\S+) -> ([0-9.eE+-]+)"
)


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
        return P.batch_plan(self.name, world_size, self.local_batch, self.global_batch, base_lr,
                            self.lr_scaling, self.reference_batch)


@dataclass(frozen=True)
class StudySpec:
    """A scaling study (one YAML file under ``configs/study/``).

    Attributes:
        name: study name (default output folder ``runs/study/<name>``).
        accelerator: ``cpu``, ``gpu`` (= ``cuda``) or ``auto`` (GPU if one is visible).
        devices: world sizes ``N`` to study, e.g. ``[1, 2, 4, 8]``; must include 1 (``T_1``).
        precisions: ``fp32``, ``amp_fp16``, ``bf16`` (``configs/precision/<name>.yaml``).
        protocols: the batch protocols (:class:`ProtocolSpec`).
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
            planned optimiser updates; None = unknown (taken from the runs when they report it).
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
        source: the YAML file.
    """

    name: str
    devices: tuple[int, ...]
    protocols: tuple[ProtocolSpec, ...]
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
    source: str = ""

    @property
    def max_epochs(self) -> int:
        return self.warmup_epochs + self.measured_epochs


def _int_list(value, key: str, where: str) -> tuple[int, ...]:
    items = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int):
            raise CropScaleError(f"{where}: {key} must be integers, got {v!r}")
        out.append(v)
    if not out:
        raise CropScaleError(f"{where}: {key} must not be empty")
    return tuple(out)


def _precision_name(value: str, where: str) -> str:
    name = PRECISION_ALIASES.get(str(value), str(value))
    if name not in PRECISION_CONFIGS:
        raise CropScaleError(
            f"{where}: precision {value!r} is not one of {', '.join(PRECISION_CONFIGS)} (or {', '.join(PRECISION_ALIASES)})"
        )
    return name


def parse_spec(data: dict, source: str = "<spec>") -> StudySpec:
    """Validate a study spec read from YAML.

    Raises:
        CropScaleError: unknown keys, missing ``devices`` / ``protocols``, bad protocol fields, a
            device list without 1, a protocol whose arithmetic fails for a listed world size, or an
            override of a protocol key. The message names ``source`` and the key.
    """
    if not isinstance(data, dict):
        raise CropScaleError(f"{source}: a study spec must be a YAML mapping")
    known = {f for f in StudySpec.__dataclass_fields__ if f != "source"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise CropScaleError(f"{source}: unknown study key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    for key in ("name", "devices", "protocols"):
        if key not in data:
            raise CropScaleError(f"{source}: the study spec needs '{key}'")
    devices = _int_list(data["devices"], "devices", source)
    if any(n < 1 for n in devices) or len(set(devices)) != len(devices):
        raise CropScaleError(f"{source}: devices must be distinct integers >= 1, got {list(devices)}")
    if 1 not in devices:
        raise CropScaleError(f"{source}: devices must include 1: S_N = T_1 / T_N needs the 1-device time")
    protos = []
    raw_protocols = data["protocols"]
    if not isinstance(raw_protocols, list) or not raw_protocols:
        raise CropScaleError(f"{source}: protocols must be a non-empty list of mappings")
    allowed = set(ProtocolSpec.__dataclass_fields__)
    for i, raw in enumerate(raw_protocols):
        where = f"{source}: protocols[{i}]"
        if not isinstance(raw, dict) or "name" not in raw or "local_batch" not in raw:
            raise CropScaleError(f"{where} needs 'name' and 'local_batch'")
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
    kwargs = {k: v for k, v in data.items() if k not in ("devices", "protocols")}
    kwargs["precisions"] = tuple(_precision_name(p, source) for p in data.get("precisions", ["fp32"]))
    kwargs["seeds"] = _int_list(data.get("seeds", [0]), "seeds", source)
    for key in ("base_configs", "overrides"):
        kwargs[key] = tuple(str(v) for v in (data.get(key) or ()))
    if data.get("launcher") is not None:
        kwargs["launcher"] = tuple(str(v) for v in data["launcher"])
    if "allreduce" in data:
        merged = dict(StudySpec.__dataclass_fields__["allreduce"].default_factory())
        merged.update({k: float(v) for k, v in (data["allreduce"] or {}).items()})
        kwargs["allreduce"] = merged
    spec = StudySpec(devices=devices, protocols=tuple(protos), source=source, **kwargs)
    if spec.accelerator not in ("cpu", "gpu", "cuda", "auto"):
        raise CropScaleError(f"{source}: accelerator must be cpu, gpu (cuda) or auto, got {spec.accelerator!r}")
    if spec.strategy not in ("ddp", "fsdp"):
        raise CropScaleError(f"{source}: strategy must be ddp or fsdp, got {spec.strategy!r}")
    if spec.single_device_strategy not in ("single", "same"):
        raise CropScaleError(f"{source}: single_device_strategy must be 'single' or 'same'")
    for key in ("warmup_epochs", "measured_epochs"):
        value = getattr(spec, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "warmup_epochs" else 1):
            raise CropScaleError(f"{source}: {key} must be an integer >= {0 if key == 'warmup_epochs' else 1}")
    for override in spec.overrides:
        key = override.lstrip("-").split("=", 1)[0]
        if not override.startswith("--") or "=" not in override:
            raise CropScaleError(f"{source}: override {override!r} must look like --key.sub=value")
        if key in PROTOCOL_KEYS or key in ("config", "trainer.logger"):
            raise CropScaleError(
                f"{source}: override {override!r} sets '{key}', which the study protocol controls"
                " (set it through the spec's fields instead)"
            )
    return spec


def load_spec(path: str | Path) -> StudySpec:
    """Read and validate a study spec YAML file (see :func:`parse_spec`)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise CropScaleError(f"study spec not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise CropScaleError(f"{path}: not valid YAML ({err})") from None
    return parse_spec(data, str(path))


# ------------------------------------------------------------------------------------------ plan
@dataclass(frozen=True)
class Configuration:
    """One row of the study: protocol x precision x world size, with its batch plan."""

    protocol: str
    precision: str
    world_size: int
    plan: P.BatchPlan
    updates_per_epoch: int | None
    runnable: bool
    reason: str = ""

    @property
    def key(self) -> str:
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


def _resolve_path(path: str, what: str, hint: str = "") -> Path:
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


def configured_data_root(spec: StudySpec) -> str | None:
    """``data.root`` as the fit configs leave it: ``configs/default.yaml`` then the spec's base
    configs, the last one that sets it wins (None when the last says ``null``)."""
    import yaml

    root = None
    for cfg in ("configs/default.yaml", *spec.base_configs):
        try:
            data = yaml.safe_load(_resolve_path(cfg, "config").read_text()) or {}
        except (CropScaleError, OSError, yaml.YAMLError):
            continue
        section = data.get("data") if isinstance(data, dict) else None
        if isinstance(section, dict) and "root" in section:
            root = section["root"]
    return None if root is None else str(root)


def _nodes(spec: StudySpec, n: int, accelerator: str) -> tuple[int, int]:
    """(nodes, devices per node) for world size ``n``."""
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


def fit_command(
    spec: StudySpec, config: Configuration, seed: int, run_root: Path, accelerator: str, data_root: str | None,
    node_rank: int = 0,
) -> list[str]:
    """The ``python -m cropscale fit ...`` command of one configuration and seed.

    Order: base configs, precision config, strategy config, the spec's overrides, then the protocol
    arguments (which therefore win): accelerator, devices / nodes, epochs, accumulation, local
    batch, LR and its rule, seed, logger folder ``run_root/<config>/seed<k>``, data root.
    """
    nodes, per_node = _nodes(spec, config.world_size, accelerator)
    values = {"python": sys.executable, "nodes": str(nodes), "devices_per_node": str(per_node),
              "world_size": str(config.world_size), "node_rank": str(node_rank)}
    prefix = spec.launcher or ("{python}", "-m", "cropscale")
    cmd = [os.path.expandvars(tok.format(**values)) for tok in prefix]
    cmd.append("fit")
    for cfg in spec.base_configs:
        cmd += ["--config", str(_resolve_path(cfg, f"base config of {spec.source}", "see base_configs"))]
    cmd += ["--config", str(_resolve_path(PRECISION_CONFIGS[config.precision][0], "precision config"))]
    strategy = spec.strategy
    if config.world_size == 1 and spec.single_device_strategy == "single":
        strategy = "single"
    cmd += ["--config", str(_resolve_path(STRATEGY_CONFIGS[strategy], "strategy config"))]
    cmd += list(spec.overrides)
    plan = config.plan
    cmd += [
        f"--trainer.accelerator={accelerator}",
        f"--trainer.devices={per_node}",
        f"--trainer.num_nodes={nodes}",
        f"--trainer.max_epochs={spec.max_epochs}",
        f"--trainer.accumulate_grad_batches={plan.accumulation}",
        f"--data.batch_size={plan.local_batch}",
        f"--model.lr={plan.base_lr!r}",
        f"--model.lr_scaling={plan.lr_scaling}",
        f"--model.reference_batch_size={plan.reference_batch}",
        f"--seed_everything={seed}",
        f"--trainer.logger.init_args.save_dir={run_root}",
        f"--trainer.logger.init_args.name={config.key}",
        f"--trainer.logger.init_args.version=seed{seed}",
    ]
    if data_root is not None:
        cmd.append(f"--data.root={data_root}")
    return cmd


# ---------------------------------------------------------------------------------------- launch
@dataclass
class LaunchResult:
    """What a launcher returns for one fit process."""

    returncode: int
    wall_s: float
    log_path: str


Launcher = Callable[[list[str], dict[str, str], Path, float | None], LaunchResult]


def subprocess_launcher(cmd: list[str], env: dict[str, str], log_path: Path, timeout_s: float | None) -> LaunchResult:
    """Run ``cmd`` as one child process (its DDP ranks are started by Lightning inside it),
    stdout and stderr to ``log_path``; a timeout kills the child's whole process group."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            import signal

            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.write(f"\ncropscale study: killed after the run timeout of {timeout_s} s\n")
            rc = 124
    return LaunchResult(rc, time.perf_counter() - start, str(log_path))


def _child_env(spec: StudySpec, accelerator: str) -> dict[str, str]:
    """The parent's environment, unbuffered output, ``OMP_NUM_THREADS`` on CPU, and the folder of
    this very ``cropscale`` package first on ``PYTHONPATH`` (every run executes the same code)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    package_parent = str(Path(__file__).resolve().parents[2])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != package_parent]
    env["PYTHONPATH"] = os.pathsep.join([package_parent, *paths])
    if accelerator == "cpu" and spec.threads_per_process is not None:
        env["OMP_NUM_THREADS"] = str(spec.threads_per_process)
    return env


def check_batch_line(log_text: str, plan: P.BatchPlan) -> tuple[bool | None, str]:
    """Compare the task's printed ``global batch G = local L x world size N x accumulation A ...
    lr a -> b`` line with the plan. Returns (True/False, detail) or (None, reason) when absent."""
    m = _BATCH_LINE.search(log_text)
    if not m:
        return None, "the fit log has no 'global batch ... lr ... -> ...' line"
    g, loc, n, a = (int(m.group(i)) for i in range(1, 5))
    lr = float(m.group(6))
    ok = (g, loc, n, a) == (plan.global_batch, plan.local_batch, plan.world_size, plan.accumulation) and math.isclose(
        lr, plan.lr, rel_tol=1e-4
    )
    return ok, f"run: G={g} L={loc} N={n} A={a} lr={lr:g}; plan: G={plan.global_batch} L={plan.local_batch}" \
               f" N={plan.world_size} A={plan.accumulation} lr={plan.lr:g}"


# --------------------------------------------------------------------------------- run results
@dataclass
class RunMetrics:
    """Figures of one fit run (one configuration, one seed), all ``measured-run``.

    Times in s (epochs) and ms (steps); shares are fractions of the training step time.
    ``None`` = not recorded by the run (e.g. energy without NVML), with the reason in ``notes``.
    """

    step_median_ms: float | None = None
    step_p95_ms: float | None = None
    samples_per_s: float | None = None
    train_epoch_s: list[float] = field(default_factory=list)
    val_epoch_s: list[float] = field(default_factory=list)
    e2e_epoch_s: list[float] = field(default_factory=list)
    loader_wait_share: float | None = None
    exposed_comm_share: float | None = None
    energy_per_sample_j: float | None = None
    optimizer_steps_per_epoch: float | None = None
    miou_final: float | None = None
    miou_best: float | None = None
    notes: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)
    record: dict[str, Any] | None = field(default=None, repr=False)


def _median(values) -> float | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(vals) if vals else None


def _measured(epochs: Sequence[dict[str, Any]], warmup_epochs: int) -> list[dict[str, Any]]:
    return [e for e in epochs if isinstance(e, dict) and int(e.get("epoch", -1)) >= warmup_epochs]


def metrics_from_run(run_dir: str | Path, warmup_epochs: int) -> RunMetrics:
    """Read one fit run: ``run.json`` (schema ``cropscale.run/1``, docs/run_json.md) and the
    TensorBoard scalars ``val/mIoU``.

    Only epochs with index >= ``warmup_epochs`` count (each callback also leaves out its own
    warm-up steps and the first step of every epoch). Per run:

    - step median / p95 (ms): median over measured epochs of ``summary.step_timing`` epoch
      statistics of the ``step`` window (one optimizer step, all its micro-batches), falling back
      to ``summary.throughput`` step latency;
    - data-loader wait share and exposed communication share: median over measured epochs of
      ``data_wait`` median / ``step`` median and ``comm_exposed`` median / ``step`` median;
    - samples/s: samples / training time summed over measured epochs (``summary.throughput``);
      training-only, validation-only and end-to-end epoch times: the measured epochs' ``train_s``,
      ``val_s``, ``wall_s``;
    - energy per sample (J): energy / samples over measured epochs (``summary.energy``, NVML);
    - optimizer updates per epoch: ``global_step / trainer.max_epochs``;
    - macro IoU: last value (final) and maximum (best) of ``val/mIoU``.
    """

    run_dir = Path(run_dir)
    m = RunMetrics()
    try:
        m.record = load_run(run_dir)
    except CropScaleError as err:
        m.notes.append(str(err))
        return m
    path = run_dir / "run.json"
    if not path.is_file():
        m.notes.append(f"no run.json in {run_dir} (fit without callbacks/scaling.yaml)")
        doc: dict[str, Any] = {}
    else:
        doc = json.loads(path.read_text())
        if doc.get("status") != "finished":
            m.notes.append(f"run.json status {doc.get('status')!r}")
    for key, column in (("energy_j_per_sample", "energy_per_sample_j"), ("median_step_ms", "step_median_ms")):
        why = ((m.record.get("figures") or {}).get(key) or {}).get("why")
        if why:
            m.why[column] = why
    summary = doc.get("summary") or {}
    timing = _measured((summary.get("step_timing") or {}).get("epochs") or [], warmup_epochs)
    steps = [e["windows_ms"]["step"] for e in timing if (e.get("windows_ms") or {}).get("step", {}).get("median")]
    if steps:
        m.step_median_ms = _median(s["median"] for s in steps)
        m.step_p95_ms = _median(s["p95"] for s in steps)

        def share(window: str) -> float | None:
            vals = []
            for e in timing:
                w, st = e["windows_ms"].get(window) or {}, e["windows_ms"]["step"]
                if w.get("median") is not None and st.get("median"):
                    vals.append(w["median"] / st["median"])
            return _median(vals)

        m.loader_wait_share = share("data_wait")
        m.exposed_comm_share = share("comm_exposed")
    through = _measured((summary.get("throughput") or {}).get("epochs") or [], warmup_epochs)
    if through:
        if m.step_median_ms is None:
            lat = [e.get("step_latency_ms") or {} for e in through]
            m.step_median_ms = _median(x.get("median") for x in lat)
            m.step_p95_ms = _median(x.get("p95") for x in lat)
        m.train_epoch_s = [float(e["train_s"]) for e in through if e.get("train_s")]
        m.val_epoch_s = [float(e["val_s"]) for e in through if e.get("val_s") is not None]
        m.e2e_epoch_s = [float(e["wall_s"]) for e in through if e.get("wall_s")]
        samples = sum(int(e.get("samples") or 0) for e in through)
        if m.train_epoch_s and samples:
            m.samples_per_s = samples / sum(m.train_epoch_s)
    elif doc:
        m.notes.append(f"no measured epoch (>= {warmup_epochs}) in run.json summary.throughput")
    energy = summary.get("energy") or {}
    if energy.get("available"):
        rows = [e for e in _measured(energy.get("epochs") or [], warmup_epochs)
                if e.get("energy_j") is not None and e.get("samples")]
        if rows:
            m.energy_per_sample_j = sum(e["energy_j"] for e in rows) / sum(e["samples"] for e in rows)
    max_epochs = (doc.get("trainer") or {}).get("max_epochs")
    if doc.get("global_step") is not None and max_epochs:
        m.optimizer_steps_per_epoch = doc["global_step"] / max_epochs
    miou = load_scalars(run_dir).get("val/mIoU", [])  # (step, value, wall time), by wall time
    if miou:
        m.miou_final = miou[-1][1]
        m.miou_best = max(v for _, v, _ in miou)
    else:
        m.why["miou_final"] = m.why["miou_best"] = "no val/mIoU in the run's TensorBoard events"
    if m.exposed_comm_share is None:
        comm = (summary.get("step_timing") or {}).get("comm_timing") or {}
        m.why["exposed_comm_share"] = (
            "no gradient all-reduce on 1 rank" if (doc.get("distributed") or {}).get("world_size") == 1
            else f"not timed: {comm.get('reason') or comm or 'no comm_exposed window in run.json'}"
        )
    return m


# -------------------------------------------------------------------------------------- analysis
def _mean_sd(values) -> tuple[float | None, float | None]:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)


def measured_row(config: Configuration, runs: Sequence[RunMetrics], train_samples: int | None) -> dict[str, Any]:
    """Aggregate the seeds of one measured configuration into a table row.

    Per run: the median over measured epochs; per configuration: the median over seeds
    (times, steps, rates, shares) and mean and sample standard deviation over seeds (macro IoU).
    ``train_epoch_cv`` is the coefficient of variation of all measured training-epoch times
    (seeds x epochs): the dispersion.
    """
    row = base_row(config, MEASURED)
    row["seeds"] = len(runs)
    row["step_median_ms"] = _median(r.step_median_ms for r in runs)
    row["step_p95_ms"] = _median(r.step_p95_ms for r in runs)
    row["samples_per_s"] = _median(r.samples_per_s for r in runs)
    row["train_epoch_s"] = _median(_median(r.train_epoch_s) for r in runs)
    row["val_epoch_s"] = _median(_median(r.val_epoch_s) for r in runs)
    row["e2e_epoch_s"] = _median(_median(r.e2e_epoch_s) for r in runs)
    pooled = [t for r in runs for t in r.train_epoch_s]
    if len(pooled) > 1 and statistics.fmean(pooled) > 0:
        row["train_epoch_cv"] = statistics.stdev(pooled) / statistics.fmean(pooled)
    elif len(pooled) == 1:
        row["why"]["train_epoch_cv"] = "one measured epoch in all: no dispersion"
    row["loader_wait_share"] = _median(r.loader_wait_share for r in runs)
    row["exposed_comm_share"] = _median(r.exposed_comm_share for r in runs)
    row["energy_per_sample_j"] = _median(r.energy_per_sample_j for r in runs)
    if row["energy_per_sample_j"] is not None:
        row["figure_notes"]["energy_per_sample_j"] = (
            "GPU board energy (NVML) of the measured epochs, their validation included, per training sample;"
            " excludes CPU, storage, network, cooling")
    measured_updates = _median(r.optimizer_steps_per_epoch for r in runs)
    if measured_updates is not None:
        if config.updates_per_epoch is None:
            row["updates_per_epoch"] = measured_updates
        elif not math.isclose(measured_updates, config.updates_per_epoch):
            row["notes"].append(
                f"measured {measured_updates:g} optimizer updates/epoch, planned {config.updates_per_epoch}"
            )
    row["miou_final"], row["miou_final_sd"] = _mean_sd(r.miou_final for r in runs)
    row["miou_best"], row["miou_best_sd"] = _mean_sd(r.miou_best for r in runs)
    if row["samples_per_s"] is None and train_samples and row["train_epoch_s"]:
        row["samples_per_s"] = train_samples / row["train_epoch_s"]
        row["notes"].append("samples/s = training samples per epoch / median training-epoch time")
    for r in runs:
        row["notes"].extend(n for n in r.notes if n not in row["notes"])
        for key, why in r.why.items():
            row["why"].setdefault(key, why)
    if len(runs) < 2:
        row["why"].setdefault("miou_final_sd", "one seed: no spread")
        row["why"].setdefault("miou_best_sd", "one seed: no spread")
    return row


def base_row(config: Configuration, evidence: str) -> dict[str, Any]:
    """The planned (exact) columns of a configuration's row."""
    plan = config.plan
    return {
        "evidence": evidence, "protocol": config.protocol, "precision": PRECISION_CONFIGS[config.precision][1],
        "world_size": config.world_size, "local_batch": plan.local_batch, "accumulation": plan.accumulation,
        "global_batch": plan.global_batch, "lr": plan.lr, "lr_scaling": plan.lr_scaling,
        "updates_per_epoch": config.updates_per_epoch, "seeds": 0,
        "step_median_ms": None, "step_p95_ms": None, "samples_per_s": None, "train_epoch_s": None,
        "train_epoch_cv": None, "val_epoch_s": None, "e2e_epoch_s": None, "speedup": None, "efficiency": None,
        "serial_fraction": None, "loader_wait_share": None, "exposed_comm_share": None,
        "energy_per_sample_j": None, "miou_final": None, "miou_final_sd": None, "miou_best": None,
        "miou_best_sd": None, "notes": [], "why": {}, "figure_notes": {},
    }


def comm_time_per_update(spec: StudySpec, num_params: int, world_size: int, bucket_bytes: Sequence[float]) -> float:
    """Modelled gradient-synchronisation time of one optimiser update on ``N`` ranks (s), no overlap.

    DDP: one ring all-reduce per bucket (:func:`cropscale.scaling.allreduce.ddp_allreduce_time`);
    FSDP (FULL_SHARD): two all-gathers and one reduce-scatter of the whole payload.
    """

    alpha = spec.allreduce["alpha_us"] * 1e-6
    bw = spec.allreduce["bandwidth_gb_s"] * 1e9
    if world_size == 1:
        return 0.0
    if spec.strategy == "fsdp":
        m = ar.payload_bytes(num_params, spec.allreduce["bytes_per_element"])
        return 3.0 * ar.reduce_scatter_time(m, world_size, alpha, bw)
    return ar.ddp_allreduce_time(bucket_bytes, world_size, alpha, bw)


def gradient_buckets(spec: StudySpec) -> tuple[int, list[float], str]:
    """(P, DDP bucket sizes in bytes, source) of the study's network."""

    if spec.num_params is not None:
        m = ar.payload_bytes(int(spec.num_params), spec.allreduce["bytes_per_element"])
        k = ar.estimated_bucket_count(m)
        first, cap = ar.DDP_FIRST_BUCKET_MB * ar.MIB, ar.DDP_BUCKET_CAP_MB * ar.MIB
        sizes = [min(m, first)] + [min(cap, m - first - i * cap) for i in range(k - 1)]
        return int(spec.num_params), sizes, "num_params of the spec"

    net = CropMappingNet(num_classes=spec.num_classes, **spec.net_kwargs)
    payload = ar.gradient_payload(net)
    sizes = [float(b.nbytes) for b in payload.buckets()]
    return payload.num_params, sizes, f"CropMappingNet(num_classes={spec.num_classes}) parameters"


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """S_N = T_1 / T_N, E_N = S_N / N and the Karp-Flatt fraction for measured rows, in place,
    against the measured 1-rank row of the same protocol and precision (T = median training epoch)."""

    t1 = {(r["protocol"], r["precision"]): r["train_epoch_s"] for r in rows
          if r["evidence"] == MEASURED and r["world_size"] == 1}
    for r in rows:
        if r["evidence"] != MEASURED or r["train_epoch_s"] is None:
            continue
        base = t1.get((r["protocol"], r["precision"]))
        if base is None:
            continue
        r["speedup"] = P.speedup(base, r["train_epoch_s"])
        r["efficiency"] = P.efficiency(r["speedup"], r["world_size"])
        if r["world_size"] > 1:
            r["serial_fraction"] = karp_flatt(r["speedup"], r["world_size"])


def analytical_rows(
    spec: StudySpec, configs: Sequence[Configuration], measured: Sequence[dict[str, Any]],
    buckets: tuple[int, list[float], str] | None = None,
) -> list[dict[str, Any]]:
    """``analytical-scenario`` rows for the configurations that were not run.

    For each (protocol, precision): ``T_1`` is the measured 1-rank training-epoch time; ``e`` the
    Karp-Flatt serial fraction at the largest measured ``N_ref > 1`` (``e = 0`` and
    ``N_ref = 1`` when only one rank was measured: ideal compute scaling); then
    ``T_N = T_1 (e + (1 - e) / N) + U_N (t_c(N) - t_c(N_ref))``
    (:func:`cropscale.study.protocol.predicted_epoch_time`) with the modelled all-reduce time
    ``t_c`` (:func:`comm_time_per_update`); ``S_N = T_1 / T_N``, ``E_N = S_N / N``, samples/s
    ``= samples/s_1 x S_N``. Step times, shares, energy and IoU are not predicted.
    """
    rows = []
    cache = buckets
    for config in configs:
        if config.runnable:
            continue
        row = base_row(config, ANALYTICAL)
        same = [r for r in measured if r["protocol"] == row["protocol"] and r["precision"] == row["precision"]
                and r["train_epoch_s"] is not None]
        one = next((r for r in same if r["world_size"] == 1), None)
        if one is None:
            row["notes"].append("no prediction: the 1-rank configuration has no measured training-epoch time")
            rows.append(row)
            continue
        refs = [r for r in same if r["world_size"] > 1 and r["serial_fraction"] is not None]
        ref = max(refs, key=lambda r: r["world_size"]) if refs else None
        e, n_ref = (ref["serial_fraction"], ref["world_size"]) if ref else (0.0, 1)
        updates = config.updates_per_epoch
        comm_note = ""
        comm_n = comm_ref = 0.0
        if updates is not None:
            if cache is None:
                cache = gradient_buckets(spec)
            num_params, sizes, source = cache
            comm_n = comm_time_per_update(spec, num_params, config.world_size, sizes)
            comm_ref = comm_time_per_update(spec, num_params, n_ref, sizes)
            comm_note = (
                f"; + {updates} updates x ({1e3 * comm_n:.3f} - {1e3 * comm_ref:.3f}) ms modelled {spec.strategy}"
                f" sync (P = {num_params} from {source}; alpha {spec.allreduce['alpha_us']:g} us,"
                f" B_eff {spec.allreduce['bandwidth_gb_s']:g} GB/s, no overlap)"
            )
        else:
            comm_note = "; all-reduce growth not modelled (train_samples_per_epoch unknown)"
        t_n = P.predicted_epoch_time(one["train_epoch_s"], config.world_size, e, updates or 0, comm_n, comm_ref)
        row["train_epoch_s"] = t_n
        row["speedup"] = P.speedup(one["train_epoch_s"], t_n)
        row["efficiency"] = P.efficiency(row["speedup"], config.world_size)
        row["serial_fraction"] = e
        if one["samples_per_s"] is not None:
            row["samples_per_s"] = one["samples_per_s"] * row["speedup"]
        basis = (f"Karp-Flatt e = {e:.3f} from measured N = {n_ref}" if ref
                 else "ideal compute scaling (e = 0: only N = 1 measured)")
        row["notes"].append(f"not run ({config.reason}); predicted: {basis}{comm_note}")
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------ study
def _topology(accelerator: str) -> str | None:
    """``nvidia-smi topo -m`` (the GPU interconnect matrix), recorded with GPU studies."""
    return gpu_topology().get("nvidia_smi_topo_m") if accelerator == "gpu" else None


def _data_record(data_root: str | None) -> dict[str, Any]:
    """The data revision: SHA-256 of ``metadata.geojson`` under the root (when there is one)."""
    if data_root is None:
        return {"root": None}
    meta = Path(data_root) / "metadata.geojson"

    return {"root": data_root, "metadata_sha256": sha256_file(meta) if meta.is_file() else None}


def run_study(
    spec: StudySpec,
    out: Path,
    *,
    data_root: str | None = None,
    launcher: Launcher = subprocess_launcher,
    available: int | None = None,
    dry_run: bool = False,
    resume: bool = False,
    node_rank: int = 0,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Plan, launch and analyse a study; returns the ``study.json`` document.

    Args:
        spec: the study.
        out: the study folder.
        data_root: ``--data.root`` for every run (default: the spec's ``data_root``).
        launcher: runs one fit command (tests pass a fake; default :func:`subprocess_launcher`).
        available: ranks that can run at once (default :func:`available_devices`).
        dry_run: plan and print the commands, launch nothing, write nothing.
        resume: keep runs of an earlier call that finished (exit 0 and a ``run.json``).
        node_rank: 0 on the node that runs every configuration and writes the study; ``R > 0`` on
            the other nodes of a multi-node torchrun study: launch only the configurations that
            span several nodes (same order, ``{node_rank}`` = R in the launcher), analyse nothing,
            record the runs in ``study_node<R>.json``.
        echo: progress printer.

    Raises:
        CropScaleError: the data root does not exist; bad spec values.
    """
    accelerator = resolve_accelerator(spec)
    if available is None:
        available, why = available_devices(spec, accelerator)
    else:
        why = "--max-devices"
    root = data_root if data_root is not None else spec.data_root
    if root is not None:
        root = str(_resolve_path(root, "data root", "give it with --data-root, or run `make data`"))
    elif configured_data_root(spec) is None:
        message = (f"{spec.source}: no data root: the spec's data_root and the fit configs' data.root are"
                   " empty; give it with --data-root /path/to/PASTIS-HD")
        if not dry_run:
            raise CropScaleError(message)
        echo(f"warning: {message}")
    configs = plan_study(spec, available, why)
    out = Path(out).resolve()
    run_root = out / "runs"
    doc: dict[str, Any] = {
        "study": spec.name, "spec": {k: v for k, v in asdict(spec).items()}, "accelerator": accelerator,
        "available_devices": available, "available_reason": why, "data": _data_record(root),
        "git": git_info(PACKAGE_DIR), "topology": _topology(accelerator), "runs": [], "rows": [],
    }
    echo(f"study {spec.name}: {len(configs)} configurations x {len(spec.seeds)} seed(s); {available} rank(s)"
         f" available ({why}); folder {out}")
    for config in configs:
        plan = config.plan
        head = (f"  {config.key:<24} L={plan.local_batch} A={plan.accumulation} G={plan.global_batch}"
                f" lr={plan.lr:.6g} updates/epoch={config.updates_per_epoch}")
        echo(head + ("" if config.runnable else f"  -> {ANALYTICAL} ({config.reason})"))
    env = _child_env(spec, accelerator)
    if dry_run:
        for config in configs:
            if config.runnable:
                for seed in spec.seeds:
                    echo(" ".join(fit_command(spec, config, seed, run_root, accelerator, root, node_rank)))
        return doc
    out.mkdir(parents=True, exist_ok=True)
    try:
        import torch

        doc["environment"] = environment_record(
            __file__, None, torch.device("cuda" if accelerator == "gpu" and torch.cuda.is_available() else "cpu"))
    except Exception as err:  # noqa: BLE001 - provenance must not stop a study
        doc["environment"] = {"reason": f"environment record failed: {err}"}
    previous = _previous_runs(out) if resume else {}
    metrics: dict[str, list[RunMetrics]] = {}
    failures: dict[str, int] = {}
    failed = 0
    for config in configs:
        if not config.runnable or (node_rank > 0 and _nodes(spec, config.world_size, accelerator)[0] == 1):
            continue
        for seed in spec.seeds:
            cmd = fit_command(spec, config, seed, run_root, accelerator, root, node_rank)
            run_dir = run_root / config.key / f"seed{seed}"
            log_path = out / "logs" / f"{config.key}_seed{seed}.log"
            record = {"config": config.key, "seed": seed, "command": cmd, "run_dir": str(run_dir),
                      "log": str(log_path), "plan": config.plan.as_dict()}
            old = previous.get((config.key, seed))
            if old and old.get("returncode") == 0 and (run_dir / "run.json").is_file():
                record.update({k: old[k] for k in ("returncode", "wall_s", "batch_check") if k in old})
                record["resumed"] = True
                echo(f"  {config.key} seed {seed}: kept from an earlier call")
            else:
                if run_dir.exists():
                    shutil.rmtree(run_dir)
                echo(f"  {config.key} seed {seed}: running ...")
                result = launcher(cmd, env, log_path, spec.run_timeout_s)
                record.update(returncode=result.returncode, wall_s=result.wall_s)
                log_text = Path(result.log_path).read_text(errors="replace") if Path(result.log_path).is_file() else ""
                ok, detail = check_batch_line(log_text, config.plan)
                record["batch_check"] = {"ok": ok, "detail": detail}
                echo(f"  {config.key} seed {seed}: exit {result.returncode} after {result.wall_s:.1f} s"
                     + ("" if ok is not False else f"; BATCH MISMATCH {detail}"))
            doc["runs"].append(record)
            (out / ("study.json" if node_rank == 0 else f"study_node{node_rank}.json")).write_text(
                json.dumps(doc, indent=2, default=str))  # progress: --resume can pick up from here
            if node_rank > 0:
                continue
            if record["returncode"] != 0:
                failed += 1
                failures[config.key] = failures.get(config.key, 0) + 1
                continue
            m = metrics_from_run(run_dir, spec.warmup_epochs)
            if record["batch_check"]["ok"] is False:
                m.notes.append(f"batch/LR differs from the plan: {record['batch_check']['detail']}")
            metrics.setdefault(config.key, []).append(m)
    if node_rank > 0:
        (out / f"study_node{node_rank}.json").write_text(json.dumps(doc, indent=2, default=str))
        return doc
    rows = []
    for config in configs:
        if config.runnable and metrics.get(config.key):
            rows.append(measured_row(config, metrics[config.key], spec.train_samples_per_epoch))
            if failures.get(config.key):
                rows[-1]["notes"].append(
                    f"{failures[config.key]} of {len(spec.seeds)} runs failed (see logs/): left out")
        elif config.runnable:
            row = base_row(config, MEASURED)
            row["notes"].append("every run of this configuration failed: see logs/")
            rows.append(row)
    add_speedups(rows)
    rows += analytical_rows(spec, configs, rows)
    doc["rows"] = rows
    doc["failed_runs"] = failed
    (out / "study.json").write_text(json.dumps(doc, indent=2, default=str))
    records = [m.record for ms in metrics.values() for m in ms if m.record]
    doc["outputs"] = {k: str(v) for k, v in write_outputs(rows, out, spec, records).items()}
    (out / "study.json").write_text(json.dumps(doc, indent=2, default=str))
    return doc


def _previous_runs(out: Path) -> dict[tuple[str, int], dict[str, Any]]:
    path = out / "study.json"
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}
    return {(r["config"], int(r["seed"])): r for r in doc.get("runs", [])}


# ------------------------------------------------------------------------------------ table, figures
def _columns():
    return (
        Column("protocol", "Protocol", figure=False),
        Column("precision", "Precision", figure=False),
        Column("world_size", "N", "d", figure=False),
        Column("local_batch", "L", "d", figure=False),
        Column("accumulation", "A", "d", figure=False),
        Column("global_batch", "G", "d", figure=False),
        Column("lr", "LR", ".4g", figure=False),
        Column("updates_per_epoch", "Updates/epoch", "g", figure=False),
        Column("seeds", "Seeds", "d", figure=False),
        Column("step_median_ms", "Median step (ms)", ".1f"),
        Column("step_p95_ms", "p95 step (ms)", ".1f"),
        Column("samples_per_s", "Samples/s", ".3f"),
        Column("train_epoch_s", "Train epoch (s)", ".2f"),
        Column("train_epoch_cv", "Train epoch CV", ".1%"),
        Column("val_epoch_s", "Val epoch (s)", ".2f"),
        Column("e2e_epoch_s", "End-to-end epoch (s)", ".2f"),
        Column("speedup", "S_N", ".3f"),
        Column("efficiency", "E_N", ".1%"),
        Column("serial_fraction", "Karp-Flatt e", ".3f"),
        Column("loader_wait_share", "Loader wait share", ".1%"),
        Column("exposed_comm_share", "Exposed comm share", ".1%"),
        Column("energy_per_sample_j", "J/sample", ".3f"),
        Column("miou_final", "Final mIoU", ".4f"),
        Column("miou_final_sd", "Final mIoU sd", ".4f"),
        Column("miou_best", "Best mIoU", ".4f"),
        Column("miou_best_sd", "Best mIoU sd", ".4f"),
    )


_PREDICTED = ("train_epoch_s", "samples_per_s", "speedup", "efficiency", "serial_fraction")


def _table_row(row: dict[str, Any]) -> dict[str, Any]:
    """A study row as a report row: every figure a ``report.figure`` with its evidence, the reason
    when n/a, and the row's notes attached to the training-epoch time."""

    out = {k: v for k, v in row.items() if k not in ("notes", "why", "figure_notes")}
    figures = {}
    for col in _columns():
        if not col.figure:
            continue
        value = row.get(col.key)
        why = row["why"].get(col.key)
        if value is None and why is None:
            if row["evidence"] == ANALYTICAL and col.key not in _PREDICTED:
                why = "not run: only epoch time, samples/s, S_N, E_N are predicted"
            elif col.key == "serial_fraction" and row["world_size"] == 1:
                why = "Karp-Flatt e is undefined at N = 1"
            elif col.key in ("speedup", "efficiency", "serial_fraction"):
                why = "no measured 1-rank training-epoch time of this protocol and precision"
            else:
                why = "not recorded by the run(s)"
        note = row["figure_notes"].get(col.key)
        if col.key == "train_epoch_s" and row["notes"]:
            note = "; ".join(row["notes"])
        figures[col.key] = figure(value, row["evidence"], why, note)
    out["figures"] = figures
    return out


def write_outputs(rows: Sequence[dict[str, Any]], out: Path, spec: StudySpec,
                  runs: Sequence[dict[str, Any]] = ()) -> dict[str, Path]:
    """``study_table.md`` (measured-run block, then the analytical-scenario block), ``study_table.csv``
    (all rows, one ``evidence`` column and per-figure evidence), ``figures/scaling.png`` and, from
    the run records of :func:`cropscale.report.cli.load_run`, ``figures/iou_by_epoch.png`` and
    ``figures/step_decomposition.png``; tables through :func:`cropscale.report.cli.write_table`."""

    out = Path(out)
    table_rows = [_table_row(r) for r in rows]
    columns = _columns()
    md_path, csv_path = report.write_table(table_rows, out, "study_table", columns)
    parts = []
    for evidence, title, intro in (
        (MEASURED, f"Measured runs ({MEASURED})",
         f"Each row: the median over {len(spec.seeds)} seed(s) of per-run figures over the"
         f" {spec.measured_epochs} measured epoch(s) after {spec.warmup_epochs} warm-up epoch(s); macro IoU as"
         " mean and sample standard deviation over seeds. S_N = T_1 / T_N and E_N = S_N / N with T the median"
         " training-epoch time (same samples per epoch for every N); Karp-Flatt e = (1/S_N - 1/N) / (1 - 1/N)."),
        (ANALYTICAL, f"Analytical scenarios ({ANALYTICAL}): not run, more devices than available",
         "Predicted, not measured: T_N = T_1 (e + (1 - e)/N) + U_N (t_c(N) - t_c(N_ref)) with the Karp-Flatt"
         " e of the largest measured N_ref and the ring all-reduce model t_c (assumptions in the notes)."),
    ):
        subset = [r for r in table_rows if r["evidence"] == evidence]
        if not subset:
            continue
        tmp_md, tmp_csv = report.write_table(subset, out, f".study_{evidence}", columns, title=title, intro=intro)
        parts.append(tmp_md.read_text(encoding="utf-8"))
        tmp_md.unlink()
        tmp_csv.unlink()
    header = (
        f"# Scaling study `{spec.name}`\n\nSpec: `{spec.source}`. Protocols: "
        + "; ".join(f"{p.name} (L = {p.local_batch}" + (f", G = {p.global_batch}" if p.global_batch else "")
                    + f", LR rule {p.lr_scaling})" for p in spec.protocols)
        + f". Strategy {spec.strategy}; accelerator {spec.accelerator}. Evidence labels: `{MEASURED}` = recorded"
        f" by the fit run itself (scaling callbacks, TensorBoard); `{ANALYTICAL}` = a model, not a measurement.\n"
    )
    figures_dir = out / "figures"
    paths = {"markdown": md_path, "csv": csv_path, "scaling": plot_scaling(rows, figures_dir / "scaling.png")}
    records = [r for r in runs if r]
    if records:
        paths["iou_by_epoch"] = report.plot_iou_by_epoch(records, figures_dir / "iou_by_epoch.png")
        paths["step_decomposition"] = report.plot_step_decomposition(records, figures_dir / "step_decomposition.png")
    figs = "\n".join(f"![{p.stem}](figures/{p.name})" for k, p in paths.items() if k not in ("markdown", "csv"))
    md_path.write_text(header + "\n" + "\n".join(parts) + "\n## Figures\n\n" + figs + "\n", encoding="utf-8")
    return paths


def plot_scaling(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Three panels against N: speed-up S_N (with the ideal S = N), efficiency E_N, and final macro
    IoU (mean +- sd over seeds). One line per (protocol, precision); measured-run points filled and
    solid, analytical-scenario points hollow and dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    groups = sorted({(r["protocol"], r["precision"]) for r in rows})
    ns = sorted({r["world_size"] for r in rows})
    axes[0].plot(ns, ns, ":", color="grey", label="ideal S = N")
    for i, (proto, prec) in enumerate(groups):
        color = f"C{i}"
        mine = sorted((r for r in rows if (r["protocol"], r["precision"]) == (proto, prec)),
                      key=lambda r: r["world_size"])
        measured = [r for r in mine if r["evidence"] == MEASURED]
        for ax, key in ((axes[0], "speedup"), (axes[1], "efficiency")):
            pts = [(r["world_size"], r[key]) for r in measured if r[key] is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), "o-", color=color, label=f"{proto} {prec} [{MEASURED}]")
            last = pts[-1:] if pts else []
            pred = last + [(r["world_size"], r[key]) for r in mine if r["evidence"] == ANALYTICAL and r[key] is not None]
            if len(pred) > len(last):
                ax.plot(*zip(*pred, strict=True), "o--", color=color, markerfacecolor="none",
                        label=f"{proto} {prec} [{ANALYTICAL}]")
        iou = [(r["world_size"], r["miou_final"], r["miou_final_sd"] or 0.0) for r in measured
               if r["miou_final"] is not None]
        if iou:
            x, y, e = zip(*iou, strict=True)
            axes[2].errorbar(x, y, yerr=e, fmt="o-", color=color, capsize=3, label=f"{proto} {prec} [{MEASURED}]")
    for ax, label in zip(axes, ("speed-up S_N = T_1 / T_N", "efficiency E_N = S_N / N", "final val macro IoU"),
                         strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("devices N (ranks)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    axes[0].set_title("Speed-up (hollow, dashed: analytical-scenario)", fontsize=9)
    axes[1].set_title("Efficiency", fontsize=9)
    axes[2].set_title(f"Quality (mean +- sd over seeds) [{MEASURED}]", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------ command
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cropscale study",
        description="Run a scaling study: one `fit` process per configuration and seed; configurations"
        " needing more devices than exist become analytical-scenario rows.",
    )
    parser.add_argument("--config", required=True, help="study spec YAML, e.g. configs/study/cpu.yaml")
    parser.add_argument("--out", default=None, help="study folder (default runs/study/<name>)")
    parser.add_argument("--data-root", default=None, help="data root for every run (overrides the spec's data_root)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the fit commands, run nothing")
    parser.add_argument("--resume", action="store_true", help="keep runs of an earlier call that finished")
    parser.add_argument("--node-rank", type=int, default=0,
                        help="multi-node torchrun studies: this node's rank (> 0: run only the multi-node"
                        " configurations, in step with node 0)")
    parser.add_argument("--max-devices", type=int, default=None,
                        help="ranks that may run at once (default: GPUs visible, or max_cpu_processes / cpu count)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m cropscale study --config configs/study/<name>.yaml [--out DIR] [--dry-run]``.

    Returns 0 when every launched run finished, 1 when one failed (its row says so).
    """
    args = _parser().parse_args(argv)
    spec = load_spec(args.config)
    if args.max_devices is not None and args.max_devices < 1:
        raise CropScaleError(f"--max-devices must be >= 1, got {args.max_devices}")
    out = Path(args.out) if args.out else Path("runs") / "study" / spec.name
    if args.node_rank < 0:
        raise CropScaleError(f"--node-rank must be >= 0, got {args.node_rank}")
    doc = run_study(spec, out, data_root=args.data_root, available=args.max_devices, dry_run=args.dry_run,
                    resume=args.resume, node_rank=args.node_rank)
    if args.dry_run or args.node_rank > 0:
        return 0
    print((out / "study_table.md").read_text())
    return 1 if doc.get("failed_runs") else 0


if __name__ == "__main__":
    sys.exit(main())
