"""The package's import layers (docs/package.md, "Layout"): imports only go down, no cycles, no private module
imported from another package, and function-level imports only for optional or heavy third-party
modules. The test walks every module's syntax tree (module-level and function-level imports)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cropscale"

#: (layer, module prefixes); a module belongs to the layer of its longest matching prefix. The floors:
#: 0 vocabulary, 1 leaves (machine facts, scaling math, the run folder and its reader, command options),
#: 2 training core, 3 callbacks, 4 test and probe helpers, 5 presentation (the report: tables, plots, the
#: end-of-fit summary, the comparison statistics), 6 apps (the command line, benchmarks, the study).
LAYERS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (0, ("cropscale", "cropscale.errors", "cropscale.evidence", "cropscale.precision", "cropscale.numbers",
         "cropscale.batch", "cropscale.files", "cropscale.progress")),
    (1, ("cropscale.env", "cropscale.scaling", "cropscale.runs", "cropscale.diagnosis", "cropscale.options")),
    (2, ("cropscale.data", "cropscale.model", "cropscale.tiling", "cropscale.metrics", "cropscale.distributed",
         "cropscale.checkpointing", "cropscale.predictions", "cropscale.hangs")),
    (3, ("cropscale.callbacks",)),
    (4, ("cropscale.testing",)),
    (5, ("cropscale.report",)),
    (6, ("cropscale.cli", "cropscale.__main__", "cropscale.bench", "cropscale.study")),
)
#: app packages that must not import each other (nothing imports an app but the CLI's command table)
APPS = ("cropscale.bench", "cropscale.study")
#: third-party modules each low layer may import (layer 0: stdlib and numpy; scaling math: numpy, scipy)
THIRD_PARTY_LIMITS = {
    0: ("numpy",),
    "cropscale.scaling": ("numpy", "scipy", "pytest"),
}
#: third-party modules that may be imported inside a function (optional or heavy)
LAZY_OK = ("matplotlib", "tensorboard", "rasterio", "yaml", "pynvml", "pytest", "scipy", "torch", "lightning",
           "jsonargparse", "docstring_parser", "triton", "pytorch_optimizer")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _layer(module: str) -> int:
    best, layer = -1, None
    for number, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), number
    assert layer is not None, f"{module} is in no layer: add it to LAYERS"
    return layer


def _stdlib() -> frozenset[str]:
    import sys

    return frozenset(sys.stdlib_module_names)


class _Imports(ast.NodeVisitor):
    """Every import of a module: ``(target, line, inside_function)``, relative imports resolved."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.module, self.is_package = module, is_package
        self.found: list[tuple[str, int, bool]] = []
        self._depth = 0

    def _visit_function(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = _visit_function  # noqa: N815

    def visit_Import(self, node: ast.Import) -> None:  # noqa: N802
        for alias in node.names:
            self.found.append((alias.name, node.lineno, self._depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:  # noqa: N802
        base = node.module or ""
        if node.level:
            parts = self.module.split(".")
            keep = len(parts) - node.level + (1 if self.is_package else 0)
            base = ".".join(parts[:keep] + ([base] if base else []))
        for alias in node.names:
            # "from cropscale.env import nvml" imports the module cropscale.env.nvml
            candidate = f"{base}.{alias.name}"
            target = candidate if _is_module(candidate) else base
            self.found.append((target, node.lineno, self._depth > 0))


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _modules() -> dict[str, list[tuple[str, int, bool]]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        visitor = _Imports(name, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        out[name] = visitor.found
    return out


MODULES = _modules()


def _internal(target: str) -> bool:
    return target == "cropscale" or target.startswith("cropscale.")


def _app(module: str) -> str | None:
    return next((a for a in APPS if module == a or module.startswith(a + ".")), None)


def layering_violations(modules: dict[str, list[tuple[str, int, bool]]] = MODULES) -> list[str]:
    """Every import that breaks a rule, as ``module:line: why``."""
    stdlib = _stdlib()
    problems = []
    for module, imports in modules.items():
        layer = _layer(module)
        for target, line, lazy in imports:
            where = f"{module}:{line}"
            top = target.split(".")[0]
            if _internal(target):
                if lazy:
                    problems.append(f"{where}: function-level import of {target} (move it to the top)")
                if _layer(target) > layer:
                    problems.append(f"{where}: layer {layer} imports {target} of layer {_layer(target)}")
                app, target_app = _app(module), _app(target)
                if target_app and app and app != target_app:
                    problems.append(f"{where}: app {app} imports app {target_app}")
                private = [p for p in target.split(".") if p.startswith("_") and not p.startswith("__")]
                if private:
                    owner = target.rsplit(".", 1)[0]
                    if not (module == owner or module.startswith(owner + ".")):
                        problems.append(f"{where}: imports the private module {target} from outside {owner}")
                continue
            if top in stdlib or top == "__future__":
                continue
            limits = THIRD_PARTY_LIMITS.get(layer) or next(
                (v for k, v in THIRD_PARTY_LIMITS.items() if isinstance(k, str) and module.startswith(k)), None)
            if limits is not None and top not in limits:
                problems.append(f"{where}: {module} (layer {layer}) may import only {limits} + stdlib, not {target}")
            if lazy and not any(target == ok or target.startswith(ok + ".") for ok in LAZY_OK):
                problems.append(
                    f"{where}: function-level import of {target} (only optional or heavy modules: {LAZY_OK})"
                )
    return problems


def import_cycles(modules: dict[str, list[tuple[str, int, bool]]] = MODULES) -> list[list[str]]:
    """Cycles of the graph of internal imports (module and function level), each as a module path."""
    graph = {m: sorted({t for t, _, _ in imps if _internal(t) and t in modules and t != m})
             for m, imps in modules.items()}
    # a package's __init__ importing its own submodules is not a cycle through the package
    for m in graph:
        graph[m] = [t for t in graph[m] if not (t.startswith(m + ".") )]
    cycles, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node)
    return cycles


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_imports_only_go_down():
    problems = layering_violations()
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    cycles = import_cycles()
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_walker_sees_an_upward_import():
    """The rules can fail: a synthetic model module importing the CLI, and a cycle, are reported."""
    fake = dict(MODULES)
    fake["cropscale.model.network"] = [*MODULES["cropscale.model.network"], ("cropscale.cli.main", 1, False)]
    assert any("layer 2 imports cropscale.cli.main of layer 6" in p for p in layering_violations(fake))
    fake["cropscale.errors"] = [("cropscale.model.network", 1, True)]
    assert any("function-level import of cropscale.model.network" in p for p in layering_violations(fake))
    fake["cropscale.evidence"] = [("cropscale.errors", 1, False)]
    fake["cropscale.errors"] = [("cropscale.evidence", 1, False)]
    assert ["cropscale.errors", "cropscale.evidence", "cropscale.errors"] in import_cycles(fake) or [
        "cropscale.evidence", "cropscale.errors", "cropscale.evidence"] in import_cycles(fake)


@pytest.mark.parametrize("name", ["cropscale.errors", "cropscale.evidence"])
def test_layer_zero_imports_no_third_party(name):
    assert all(t.split(".")[0] in _stdlib() | {"__future__", "cropscale"} for t, _, _ in MODULES[name])
