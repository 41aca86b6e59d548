"""What :class:`~cropscale.cli.main.CropScaleCLI` changes in the parsed configuration before classes are built.

- :func:`integers_stay_integers`: the Trainer's ``int | float`` limits keep an integer as an integer
  (``--trainer.limit_train_batches=1`` is one batch, ``=1.0`` all of them), as in the Trainer's own API;
- :func:`merge_callbacks`: a callback configured twice (``configs/default.yaml`` and a later ``--config``) runs once;
- :func:`explicit_model_settings`: the ``model.*`` settings the user gave, which win over a checkpoint's
  hyperparameters.
"""

from __future__ import annotations

import copy
import functools
import operator
import typing
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser


def explicit_model_settings(given: dict[str, Any], defaults: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """The ``model.*`` settings the user gave: named on the command line, or different from ``configs/default.yaml``.

    Args:
        given: the parsed ``model`` section (defaults, ``--config`` files and command line).
        defaults: the same section from the defaults alone (``configs/default.yaml`` and class defaults).
        argv: the command-line arguments.

    Returns:
        ``{key: value}`` of the settings that a checkpoint's hyperparameters must not override.
    """
    named = {tok.split("=", 1)[0][len("--model."):].split(".", 1)[0] for tok in argv if tok.startswith("--model.")}
    return {k: copy.deepcopy(v) for k, v in given.items() if k in named or defaults.get(k, object()) != v}


def integers_stay_integers(parser: LightningArgumentParser, prefix: str = "trainer.") -> list[str]:
    """Make the ``int | float`` options under ``prefix`` try ``int`` first, as the Trainer's API means them.

    Lightning declares ``limit_train_batches: Optional[Union[int, float]]`` (an int: that many batches; a
    float: that fraction), but ``typing`` caches unions by equality, so the hint can come out as
    ``Union[float, int, None]`` (whichever equal union was built first) and jsonargparse, which tries the
    members in order, parses ``1`` as ``1.0`` (all batches). The options' type hints are rebuilt as
    ``int | float | ...`` (``types.UnionType``, which ``typing`` does not cache); ``1.0`` stays a float.

    Returns:
        The destinations changed (``trainer.limit_train_batches`` ...).
    """
    changed = []
    for action in parser._actions:
        hint = getattr(action, "_typehint", None)  # jsonargparse's ActionTypeHint keeps its hint here
        if not action.dest.startswith(prefix) or typing.get_origin(hint) is not typing.Union:
            continue
        args = typing.get_args(hint)
        if int in args and float in args and args.index(float) < args.index(int):
            ordered = (int, *[a for a in args if a is not int])
            action._typehint = functools.reduce(operator.or_, ordered)  # int | float | None, not cached
            changed.append(action.dest)
    return changed


GROUP_CLASS = "cropscale.callbacks.CallbackGroup"
PROVENANCE_CLASS = "cropscale.callbacks.ProvenanceCallback"


def _class_path(entry: Any) -> str | None:
    value = entry.get("class_path") if isinstance(entry, dict) else getattr(entry, "class_path", None)
    return value.replace("cropscale.callbacks.group.", "cropscale.callbacks.") if isinstance(value, str) else value


def _members(group: Any) -> list[Any]:
    args = group.get("init_args") if isinstance(group, dict) else getattr(group, "init_args", None)
    members = args.get("callbacks") if isinstance(args, dict) else getattr(args, "callbacks", None)
    return members if isinstance(members, list) else []


def _merge_member(members: list[Any], entry: Any) -> str:
    """Put ``entry`` into a group's ``members``: over the member of its class, else before provenance."""
    path = _class_path(entry)
    for i, member in enumerate(members):
        if _class_path(member) == path:
            if member == entry:
                return "kept once"
            members[i] = entry
            return "its later settings replace the group member's"
    last = len(members)
    if members and _class_path(members[-1]) == PROVENANCE_CLASS:
        last -= 1  # ProvenanceCallback stays last: run.json holds every other member's summary
    members.insert(last, entry)
    return "added to the group"


def merge_callbacks(entries: list[Any]) -> tuple[list[Any], list[str]]:
    """The ``trainer.callbacks`` entries of the parsed configuration with repeats merged.

    ``configs/default.yaml`` already holds the scaling callbacks' :class:`~cropscale.callbacks.CallbackGroup`,
    so a later ``--config callbacks/scaling.yaml`` or ``callbacks/<name>.yaml`` (they append) would run
    a callback twice. Instead: an entry equal to an earlier one is dropped; a later group's members
    and a later single entry of a class that a group already holds go into that group, replacing the
    member of the same class (later files win, as for any option); other entries stay as they are.

    Returns:
        ``(entries, notes)``: the merged list (groups changed in place) and one note per merge.
    """
    out: list[Any] = []
    notes: list[str] = []
    for entry in entries:
        path = _class_path(entry)
        group = next((e for e in out if _class_path(e) == GROUP_CLASS), None)
        if path is None:
            out.append(entry)
        elif any(entry == e for e in out):
            notes.append(f"{path} is configured twice: kept once")
        elif path == GROUP_CLASS and group is not None:
            for member in _members(entry):
                merged = _merge_member(_members(group), member)
                notes.append(f"{_class_path(member)} of a later CallbackGroup: {merged}")
        elif group is not None and any(_class_path(m) == path for m in _members(group)):
            notes.append(f"{path} is already in the CallbackGroup: {_merge_member(_members(group), entry)}")
        else:
            out.append(entry)
    return out, notes
