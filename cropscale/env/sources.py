"""The package's source files a measurement ran, and their SHA-256: which code produced a figure.

A measuring command (the benchmark, ``lever-bench``, ``study``, ...) names its own module; the files it
runs are that module and every module of the package it imports, transitively (:func:`measured_sources`),
found by reading their syntax trees (module-level and function-level ``import`` statements, the parent
packages' ``__init__.py`` included; nothing is imported). A figure thus changes its digest when any module
on its code path changes, also after a module is split in two.

:func:`source_digests` gives one SHA-256 per file and one over them all: the SHA-256 of the listing
``sha256sum`` prints for the files in path order (one line ``<hex>  <path>`` a file, paths relative to the
folder above the package), so that ``sha256sum FILE... | sha256sum`` in a checkout reproduces it. Layer 1.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import cropscale

__all__ = ["PACKAGE_DIR", "measured_sources", "source_digests"]

PACKAGE_DIR = Path(cropscale.__file__).resolve().parent
"""The folder of the cropscale package."""


def _module_file(module: str, root: Path) -> Path | None:
    """The file of ``module`` (``cropscale.bench.step.command``) inside the package folder ``root``, or ``None``."""
    parts = module.split(".")
    if parts[0] != root.name:
        return None
    base = root.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path, root: Path) -> str:
    """``root/bench/step/command.py`` -> ``cropscale.bench.step.command`` (``__init__.py``: the package's name)."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, root: Path) -> set[str]:
    """Dotted names of the modules ``path`` imports (``from pkg import mod`` gives ``pkg`` and ``pkg.mod``)."""
    here = _module_name(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            stem = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join([*stem, *(node.module.split(".") if node.module else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _with_parents(module: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b", "a.b.c"]``: importing a module runs its parent packages' ``__init__.py``."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def measured_sources(entry: str | Path, root: str | Path = PACKAGE_DIR) -> list[Path]:
    """The package's source files that running ``entry`` executes, sorted by path.

    Args:
        entry: a module file of the package (e.g. ``cropscale/bench/step/command.py``).
        root: the package folder (default the installed cropscale; a copy elsewhere for a test).

    Returns:
        ``entry``, every package module it imports directly or through others, and their parent packages'
        ``__init__.py`` (absolute paths), sorted by their path relative to ``root``'s parent. An ``entry``
        outside ``root`` is returned alone.

    Raises:
        OSError: a file cannot be read; SyntaxError: a file is not valid Python.
    """
    root, entry = Path(root).resolve(), Path(entry).resolve()
    if not entry.is_relative_to(root):
        return [entry]
    found: set[Path] = set()
    todo = [entry, *(f for m in _with_parents(_module_name(entry, root)) if (f := _module_file(m, root)))]
    while todo:
        path = todo.pop()
        if path in found:
            continue
        found.add(path)
        for module in _imported_modules(path, root):
            todo.extend(f for m in _with_parents(module) if (f := _module_file(m, root)) and f not in found)
    return sorted(found, key=lambda p: p.relative_to(root.parent).as_posix())


def source_digests(entry: str | Path, root: str | Path = PACKAGE_DIR) -> tuple[dict[str, str], str]:
    """SHA-256 of each file of :func:`measured_sources` and one over them all.

    Returns:
        ``(files, combined)``: ``files`` maps each path (relative to ``root``'s parent, ``/``-separated, in
        path order; absolute for an ``entry`` outside ``root``) to the hex SHA-256 of its bytes;
        ``combined`` is the hex SHA-256 of the ``sha256sum`` listing of those files, one line ``<hex>  <path>``
        per file in that order.

    Raises:
        OSError: a file cannot be read.
    """
    root = Path(root).resolve()
    files: dict[str, str] = {}
    for path in measured_sources(entry, root):
        name = path.relative_to(root.parent).as_posix() if path.is_relative_to(root) else str(path)
        files[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    listing = "".join(f"{digest}  {name}\n" for name, digest in files.items())
    return files, hashlib.sha256(listing.encode("utf-8")).hexdigest()
