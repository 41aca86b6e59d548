"""The task's ``model.*`` settings: checked at construction, the architecture a checkpoint fixes, those a resume keeps.

:class:`~cropscale.model.task.CropMappingTask` calls :func:`check_settings` in its constructor, so a bad value
fails naming the option instead of deep inside the first epoch, and :func:`architecture_mismatch` when a
checkpoint is loaded. :data:`RESUME_FIXED_SETTINGS` is what the CLI refuses to change when ``fit`` resumes.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any

from cropscale.errors import ConfigError, CropScaleError
from cropscale.model.network import CropMappingNet
from cropscale.model.optim import OPTIMIZERS, warmup_steps_of
from cropscale.model.speed import COMPILE_MODES

#: Settings whose effect a resumed ``fit`` takes from the checkpoint's optimiser and LR-schedule state.
RESUME_FIXED_SETTINGS: tuple[str, ...] = ("optimizer", "lr", "weight_decay", "momentum", "trust_coefficient",
                                          "lr_scaling", "reference_batch_size", "warmup_steps", "warmup_epochs",
                                          "schedule", "schedule_by_updates")

#: ``model.<name>``: (the check, what it requires), for the message.
_RULES = {
    "lr": (lambda v: v > 0, "> 0"),
    "weight_decay": (lambda v: v >= 0, ">= 0"),
    "warmup_steps": (lambda v: v >= 0, ">= 0"),
    "warmup_epochs": (lambda v: v >= 0, ">= 0"),
    "momentum": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "trust_coefficient": (lambda v: v > 0, "> 0"),
    "reference_batch_size": (lambda v: v >= 1, ">= 1"),
    "val_window": (lambda v: v >= 1, ">= 1"),
    "tile_batch_size": (lambda v: v >= 1, ">= 1"),
}


def check_settings(optimizer: str, compile_mode: str, **values: Any) -> None:
    """Fail at construction, naming the ``model.*`` option, instead of deep inside the first epoch.

    Args:
        optimizer: ``model.optimizer`` (one of :data:`~cropscale.model.optim.OPTIMIZERS`).
        compile_mode: ``model.compile_mode`` (one of :data:`~cropscale.model.speed.COMPILE_MODES`).
        values: every setting named in ``_RULES``, plus ``val_stride`` (None or ``1 <= val_stride <= val_window``).

    Raises:
        CropScaleError: the first setting out of its range, named with its value; both ``warmup_steps`` and
            ``warmup_epochs`` given (:func:`~cropscale.model.optim.warmup_steps_of`).
    """
    if optimizer not in OPTIMIZERS:
        raise CropScaleError(f"model.optimizer must be one of {', '.join(OPTIMIZERS)}; got {optimizer!r}")
    for name, (ok, what) in _RULES.items():
        if not ok(values[name]):
            raise CropScaleError(f"model.{name} must be {what}, got {values[name]}")
    stride, window = values["val_stride"], values["val_window"]
    if stride is not None and not 1 <= stride <= window:
        raise CropScaleError(
            f"model.val_stride={stride} must be between 1 and model.val_window={window}, or every pixel"
            " would not be covered by a tile"
        )
    warmup_steps_of(values["warmup_steps"], values["warmup_epochs"], updates_per_epoch=1)  # both units: refused
    if compile_mode not in COMPILE_MODES:
        raise CropScaleError(f"model.compile_mode must be one of {', '.join(COMPILE_MODES)}; got {compile_mode!r}")


def check_net_kwargs(net_kwargs: Mapping[str, Any]) -> None:
    """Refuse a ``model.net_kwargs`` key that is not an argument of :class:`CropMappingNet`, before it is built.

    Raises:
        ConfigError: one line naming each unknown key (with the closest valid key, if any is close) and every
            valid key, in the network's order; ``num_classes`` is not one (the task takes it from the data).
    """
    valid = [name for name in inspect.signature(CropMappingNet.__init__).parameters if name not in ("self",
                                                                                                   "num_classes")]
    unknown = [key for key in net_kwargs if key not in valid and key != "num_classes"]
    if not unknown:
        return
    named = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), valid, n=1)
        named.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ConfigError(f"model.net_kwargs: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(named)}; "
                      f"valid keys: {', '.join(valid)}")


def architecture(num_classes: int, net_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """Every :class:`CropMappingNet` argument, defaults filled in: what fixes the shapes of the weights."""
    params = inspect.signature(CropMappingNet.__init__).parameters
    arch = {name: p.default for name, p in params.items() if name != "self"}
    arch.update({k: v for k, v in (net_kwargs or {}).items() if k != "num_classes"})
    arch["num_classes"] = int(num_classes)
    return arch


def architecture_mismatch(ours: Mapping[str, Any], saved: dict[str, Any] | None) -> str | None:
    """How a checkpoint's network differs from this run's, or None when it does not (or says nothing).

    Args:
        ours: this run's ``num_classes`` and ``net_kwargs`` (the task's hyperparameters, a mapping).
        saved: the checkpoint's ``hyper_parameters`` (None or without ``num_classes``: nothing to compare).

    Returns:
        ``"<checkpoint's settings>, but this run asks for <this run's settings>"``, naming only those that differ
        (``model.num_classes=...``, ``net_kwargs.<name>=...``).
    """
    if not saved or "num_classes" not in saved:
        return None
    mine = architecture(ours["num_classes"], ours.get("net_kwargs"))
    theirs = architecture(saved["num_classes"], saved.get("net_kwargs"))
    differ = [k for k in mine if mine[k] != theirs.get(k)]
    if not differ:
        return None
    return f"{_describe(theirs, differ)}, but this run asks for {_describe(mine, differ)}"


def _describe(arch: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(f"{'model.num_classes' if k == 'num_classes' else 'net_kwargs.' + k}={arch.get(k)}" for k in keys)
