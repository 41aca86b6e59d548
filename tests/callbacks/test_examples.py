"""Each public callback's docstring shows how to add it, as Lightning's callbacks do (``Example::``): the Python
lines run and put an instance of the class on a Trainer, the command line names a preset that configures that
class (or the class path itself), and every constructor argument is documented under ``Args:``."""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path

import pytest
import yaml
from lightning.pytorch import Callback

import cropscale.callbacks as callbacks
from cropscale.callbacks.base import iter_callbacks

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = sorted(name for name in callbacks.__all__ if isinstance(getattr(callbacks, name), type)
                and issubclass(getattr(callbacks, name), Callback) and name != "ScalingCallback")


def _example(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    assert "Example::" in doc, f"{cls.__name__}: no Example:: block"
    return textwrap.dedent(doc.split("Example::", 1)[1])


def _class_paths(node) -> set[str]:
    """Every ``class_path`` in a parsed YAML document."""
    if isinstance(node, dict):
        return {v for k, v in node.items() if k == "class_path"} | {p for v in node.values() for p in _class_paths(v)}
    if isinstance(node, list):
        return {p for v in node for p in _class_paths(v)}
    return set()


def test_every_public_callback_is_checked():
    assert len(PUBLIC) == 13 and "CallbackGroup" in PUBLIC and "DivergenceCallback" in PUBLIC


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", PUBLIC)
def test_the_example_adds_the_callback(name, monkeypatch, tmp_path):
    cls = getattr(callbacks, name)
    example = _example(cls)
    monkeypatch.chdir(tmp_path)  # a Trainer writes nothing before fit; nothing lands in the checkout either way
    scope: dict = {}
    exec(compile(example, f"<{name} example>", "exec"), scope)  # noqa: S102 - the docstring's own code
    trainer = scope["trainer"]
    assert any(type(cb) is cls for cb in [*trainer.callbacks, *iter_callbacks(trainer)]), name

    path = f"cropscale.callbacks.{name}"
    presets = re.findall(r"--config (\S+\.yaml)", example)
    flags = re.findall(r"--trainer\.callbacks\+=(\S+)", example)
    snippet = "\n".join(line.split("#", 1)[1][1:] for line in example.splitlines()
                        if line.startswith("#   ") or line.startswith("#     "))
    named = set(flags) | {p for f in presets for p in _class_paths(yaml.safe_load((ROOT / f).read_text()))}
    if "trainer:" in snippet:
        named |= _class_paths(yaml.safe_load(snippet))
    assert path in named, (name, presets, flags)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_constructor_argument_is_documented(name):
    cls = getattr(callbacks, name)
    doc = inspect.getdoc(cls) or ""
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    if not params:
        assert "No arguments" in doc or "Args:" not in doc, name
        return
    args = doc.split("Args:", 1)[1].split("\n\n", 1)[0]
    documented = {n for line in args.splitlines() if (m := re.match(r"    (\w+(?:, \w+)*):", line))
                  for n in m.group(1).split(", ")}
    assert set(params) <= documented, (name, set(params) - documented)
