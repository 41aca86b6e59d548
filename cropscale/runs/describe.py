"""What a run was: its precision, strategy, device count and global batch.

They come from ``run.json`` when it records them, else from the configuration (``config.yaml``), which
only says what was *requested*.

``run.json`` is authoritative: ``precision_decision`` is what was requested and what Lightning ran, and
``distributed.world_size`` / ``strategy`` what it resolved. Without it the configuration's values are
used and qualified: Lightning runs ``16-mixed`` on CPU as ``bf16-mixed``, ``devices: auto`` resolves
to a number nothing records, and a strategy ``auto`` is chosen at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cropscale.precision import PrecisionDecision, decide, requested_in
from cropscale.runs.schema import RunJson

STRATEGY_SHORT_NAMES = {"DDPStrategy": "ddp", "FSDPStrategy": "fsdp", "DeepSpeedStrategy": "deepspeed"}
"""Lightning's strategy classes that reports abbreviate (others are shown by class name)."""


def config_value(config: dict[str, Any] | None, dotted: str, default: Any = None) -> Any:
    """``config["a"]["b"]`` for ``dotted = "a.b"``, or ``default`` where a level is missing."""
    node: Any = config
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def _class_name(value: Any) -> str | None:
    """The class name of a LightningCLI ``{class_path, init_args}`` entry or of a dotted import path."""
    if isinstance(value, dict):
        path = value.get("class_path")
        return str(path).rsplit(".", 1)[-1] if path else None
    if isinstance(value, str) and "." in value and value.rsplit(".", 1)[-1][:1].isupper():
        return value.rsplit(".", 1)[-1]
    return None


def strategy_name(value: Any) -> str | None:
    """Short strategy name of a configured or recorded strategy.

    ``ddp`` / ``fsdp`` / ``deepspeed`` for those classes, else the class name (of a ``class_path``
    entry, a dotted path or ``run.json``'s class name), or the configured string.
    """
    if value is None:
        return None
    cls = _class_name(value)
    if cls is None and isinstance(value, str) and value.endswith("Strategy"):
        cls = value  # run.json distributed.strategy: a class name
    if cls is not None:
        return STRATEGY_SHORT_NAMES.get(cls, cls)
    if isinstance(value, dict):
        return "custom (no class_path)"
    return str(value)


def accelerator_name(value: Any) -> str | None:
    """``cpu`` / ``cuda`` / ``mps`` for Lightning's accelerator classes, else the configured string.

    A class is given as a ``class_path`` entry, a dotted path or ``run.json``'s class name.
    """
    cls = _class_name(value)
    if cls is None and isinstance(value, str) and value.endswith("Accelerator"):
        cls = value  # run.json distributed.accelerator: a class name
    if cls is not None:
        return {"CPUAccelerator": "cpu", "CUDAAccelerator": "cuda", "MPSAccelerator": "mps"}.get(cls, cls)
    return None if value is None else str(value).lower()


def as_int(value: Any) -> int | None:
    """An int from an int or a numeric string (``'2'``, as LightningCLI may store ``devices``), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


@dataclass
class Described:
    """A descriptive value, what is shown for it and the qualifier or reason (``note``)."""

    value: Any
    shown: Any
    note: str | None = None


def devices_from_config(config: dict[str, Any] | None) -> Described:
    """World size from ``trainer.devices`` x ``trainer.num_nodes`` of the configuration.

    Numeric strings count as ints; a list of device ids (or Lightning's ``"0,1"`` string) counts its
    ids; ``auto`` / ``-1`` are shown as such with the reason the count is unknown.
    """
    src = "config.yaml"
    d, n_raw = config_value(config, "trainer.devices"), config_value(config, "trainer.num_nodes", 1)
    nodes = as_int(n_raw) if n_raw is not None else 1
    if nodes is None or nodes < 1:
        return Described(None, None, f"{src} trainer.num_nodes={n_raw!r} is not a node count")
    per_node = f" x {nodes} nodes" if nodes > 1 else ""
    if d is None:
        return Described(None, None, f"no trainer.devices in {src} (and no run.json)")
    ids: list[Any] | None = None
    if isinstance(d, (list, tuple)):
        ids = list(d)
    elif isinstance(d, str) and "," in d:
        ids = [x.strip() for x in d.split(",") if x.strip()]
    if ids is not None:
        n = len(ids) * nodes
        return Described(n, n, f"{len(ids)} device id(s) {ids}{per_node} in {src} (no run.json)")
    count = as_int(d)
    if count is not None and count > 0:
        note = f"{count} per node{per_node} in {src} (no run.json)" if nodes > 1 else None
        return Described(count * nodes, count * nodes, note)
    shown = "all (-1)" if count == -1 else str(d)
    return Described(None, shown, f"{src} requests devices={d!r}{per_node}: the number Lightning resolved is not "
                                  "recorded (no run.json)")


def devices(run_json: RunJson | None, config: dict[str, Any] | None) -> Described:
    """World size: ``run.json`` ``distributed.world_size``, else :func:`devices_from_config`."""
    recorded = as_int(run_json.distributed.get("world_size")) if run_json is not None else None
    if recorded is not None:
        return Described(recorded, recorded)
    return devices_from_config(config)


def strategy(run_json: RunJson | None, config: dict[str, Any] | None) -> Described:
    """Strategy: ``run.json`` ``distributed.strategy``, else the configuration's ``trainer.strategy``."""
    recorded = run_json.distributed.get("strategy") if run_json is not None else None
    name = strategy_name(recorded or config_value(config, "trainer.strategy"))
    if name is None:
        return Described(None, None, "no strategy in run.json or config.yaml")
    if recorded is None and name == "auto":
        return Described(name, name, "strategy 'auto' as configured: the strategy Lightning chose is not recorded"
                                     " (no run.json)")
    return Described(name, name)


def precision(run_json: RunJson | None, config: dict[str, Any] | None) -> PrecisionDecision:
    """The run's precision decision: ``run.json["precision_decision"]``, taken whole.

    An older ``run.json`` (only the ``precision`` string) and a run folder without ``run.json`` get the same
    decision rule (:func:`cropscale.precision.decide`) over the configuration (``trainer.precision`` or a precision
    plugin in ``trainer.plugins``) and the recorded precision (None without ``run.json``: unverified).
    """
    if run_json is not None and run_json.precision_decision is not None:
        return run_json.precision_decision
    recorded = run_json.precision if run_json is not None else None
    ran_on = run_json.distributed.get("accelerator") if run_json is not None and recorded is not None else None
    device = accelerator_name(ran_on or config_value(config, "trainer.accelerator")) or "auto"
    return decide(*requested_in(config), recorded, device)
