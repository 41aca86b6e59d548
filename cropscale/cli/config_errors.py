"""One line for a configuration error of ``python -m cropscale fit|validate|...``: the YAML file and the key.

jsonargparse's messages name neither the file nor, for an empty file, anything at all (``Unexpected config:``);
a wrong type is a dump of every Union member it tried. :func:`describe_config_error` finds where the key was
set (the last ``--config`` file that holds it, the command line, or ``configs/default.yaml``) and condenses the
dump to the value and the types the key takes, e.g.::

    config file run.yaml: key trainer.max_epochs: 'abc' is not an int or null
    config file run.yaml: key trainer.callbacks: class_path 'cropscale.callbacks.EnergyCallbak': module
        'cropscale.callbacks' has no attribute 'EnergyCallbak' (did you mean cropscale.callbacks.EnergyCallback?)
    config file empty.yaml is empty: a config is a YAML mapping, e.g. 'trainer: {max_epochs: 2}'
"""

from __future__ import annotations

import difflib
import importlib
import re
from pathlib import Path
from typing import Any

_TYPE_NAMES = {"NoneType": "null", "int": "an int", "float": "a float", "str": "a string", "bool": "a bool"}


def config_files(args: list[str]) -> list[str]:
    """The ``--config`` files of ``args`` in the order given (``--config X`` and ``--config=X``)."""
    out = []
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            out.append(args[i + 1])
        elif arg.startswith("--config="):
            out.append(arg.split("=", 1)[1])
    return out


def _load(path: str) -> tuple[Any, str | None]:
    """``(data, None)`` of a YAML file, or ``(None, why)`` when it cannot be read or parsed."""
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text()), None
    except OSError as err:
        return None, f"cannot be read ({err.strerror})"
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return None, f"is not valid YAML: {getattr(err, 'problem', None) or err}{where}"


def _holds(data: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def where_set(key: str, args: list[str], default_config: str | None = None) -> str | None:
    """Where ``key`` (dotted) was set: ``command line --key``, ``config file F`` (the last that holds it), or None."""
    if any(a == f"--{key}" or a.startswith(f"--{key}=") for a in args):
        return f"command line --{key}"
    for path in reversed([*([default_config] if default_config else []), *config_files(args)]):
        data, _ = _load(path)
        if _holds(data, key):
            return f"config file {path}"
    return None


def _types(text: str) -> str | None:
    names = [_TYPE_NAMES.get(t, t) for t in re.findall(r"Expected a <class '(\w+)'>", text)]
    given = re.search(r"(?:Given|Got) value: (.*?)(?: - |$)", text)
    if not names or given is None:
        return None
    return f"{given.group(1).strip()!r} is not {' or '.join(dict.fromkeys(names))}"


def _did_you_mean(class_path: str) -> str:
    module, _, name = class_path.rpartition(".")
    try:
        candidates = [n for n in dir(importlib.import_module(module)) if not n.startswith("_")]
    except Exception:  # the module itself is misspelt or broken: nothing to suggest
        return ""
    close = difflib.get_close_matches(name, candidates, n=1)
    return f" (did you mean {module}.{close[0]}?)" if close else ""


def _detail(message: str) -> str:
    """The condensed reason of a ``Parser key "...": ...`` message (the message itself when no rule applies)."""
    cls = re.search(r"Problem with given class_path '([^']+)': ", message)
    if cls:
        rest = re.split(r" - Not a valid subclass of ", message[cls.end():], maxsplit=1)[0]
        inner = re.match(r'Parser key "([^"]+)": ', rest)
        if inner:
            why = _types(rest) or rest[inner.end():]
            return f"class_path {cls.group(1)!r}: init_args.{inner.group(1)}: {why}"
        hint = _did_you_mean(cls.group(1)) if "has no attribute" in rest or "No module named" in rest else ""
        return f"class_path {cls.group(1)!r}: {rest.strip()}{hint}"
    return _types(message) or re.sub(r'^Parser key "[^"]+": ', "", message)


def describe_config_error(message: str, args: list[str], default_config: str | None = None) -> str:
    """One line for jsonargparse's error ``message`` of a run with command line ``args``.

    Args:
        message: ``str()`` of the ``jsonargparse.ArgumentError``, whitespace runs folded to one space.
        args: the command line after ``python -m cropscale`` (subcommand first).
        default_config: the config file read before the ``--config`` files, if any.

    Returns:
        The line naming the YAML file (or the command line) and the key; ``message`` unchanged when it is
        about neither a config file nor a key.
    """
    message = " ".join(message.split())
    files = config_files(args)
    if message.startswith(("Unexpected config", "Problems parsing config")):
        for path in files:
            data, why = _load(path)
            if why:
                return f"config file {path} {why}"
            if data is None:
                return f"config file {path} is empty: a config is a YAML mapping, e.g. 'trainer: {{max_epochs: 2}}'"
            if not isinstance(data, dict):
                return (f"config file {path} holds a {type(data).__name__}, not a mapping of keys (trainer:, model:,"
                        " data:)")
        return message
    key = re.match(r'Parser key "([^"]+)": ', message)
    if key is None or key.group(1) == "config":
        return message
    where = where_set(key.group(1), args, default_config)
    return f"{where or 'configuration'}: key {key.group(1)}: {_detail(message)}"


__all__ = ["config_files", "describe_config_error", "where_set"]
