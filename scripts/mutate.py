"""Mutation testing of cropscale modules with mutmut, one module at a time, on the tests that reach it.

    make mutate MODULES="cropscale/numbers.py cropscale/callbacks/_dist.py"
    .venv/bin/python scripts/mutate.py [--out DIR] [--tests "tests/a.py tests/b.py"] [--sample N [--seed S]]
                                       MODULE [MODULE ...]

For each module: a fresh work folder ``build/mutate/<module>/`` (git-ignored) holds copies of ``cropscale/``,
``tests/``, ``configs/`` and the other files tests read, ``pyproject.toml`` with a ``[tool.mutmut]`` section
naming that module and its tests (:data:`MODULE_TESTS`, the one table of which tests reach which module), and
``shared/data`` linking the bundled sample (``../shared/data``, else ``data/``) where ``tests/conftest.py``
looks. mutmut runs there with one worker (``--max-children 1``, sized for 2 shared cores), never in the
committed tree, and for each mutant runs only the tests of that selection which call the mutated function
(its own per-function map, recorded in a first run of the selection). That map is widened here: a function
called while a module-scoped fixture was set up (one fit shared by a file's tests) is judged by every test that
shares the fixture, not only by the first one that asked for it (:func:`widen`).

Two things the copy changes so that mutmut mutates them, without shifting a line: ``@override`` (a marker
that changes no behaviour) becomes a comment, since mutmut skips every decorated function but
``staticmethod``/``classmethod``; a ``@property`` becomes a plain method ``_mutmut_property_<name>``
and ``Class.<name> = property(...)`` is appended at the end of the file.

Written per module into ``--out`` (default ``build/mutate/results``):
``<module>.tsv`` (status, line, mutant, function, mutation; every mutant) and ``<module>.json`` (counts,
score, seconds, tests). The score is killed / (mutants - skipped); ``no tests`` (no test of the selection
calls the function) and ``timeout`` are listed apart (a timeout counts as killed, as mutmut does).
The last line printed per module: ``mutate: <module>: <killed>/<n> killed (<score> %), <survived> survived,
<no tests> without tests, in <s> s``.

``--sample N`` runs N mutants drawn at random (``random.Random(seed).sample`` of the sorted mutant names, so a
re-run with the same code and seed draws the same ones) instead of all of them, for a module whose full run
does not fit the time at hand; the others are ``not checked`` in the TSV and left out of the score, and the
JSON adds the population and the score's 95 % Clopper-Pearson interval (scipy's ``binomtest``), the
uncertainty of estimating the whole module's score from the sample.

Exit status 0 when every run finished (survivors are results, not failures), 1 when mutmut failed
(the clean tests failed, nothing collected), 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Which tests reach which module: unit tests of the module (whole fits only where no unit test exists).
# mutmut narrows each mutant further to the tests of this list that call the mutated function.
_CALLBACKS = ["tests/callbacks"]  # every unit and one-process fit test of the callbacks: about 20 s
_SCALING = ["tests/scaling/test_pmnf.py", "tests/scaling/test_adjusted_r2.py", "tests/scaling/test_landau.py",
            "tests/scaling/test_multi.py", "tests/scaling/test_verdict.py", "tests/scaling/test_verdict_support.py",
            "tests/scaling/test_robust_verdict.py", "tests/scaling/test_lead_order_verdict.py",
            "tests/scaling/test_multi_verdict.py", "tests/scaling/test_assertions.py",
            "tests/scaling/test_study_assertions.py", "tests/scaling/test_verdict_parts.py",
            "tests/scaling/test_pmnf_mutants.py", "tests/scaling/test_verdict_mutants.py"]
MODULE_TESTS: dict[str, list[str]] = {
    "cropscale/numbers.py": ["tests/test_numbers.py", "tests/study/test_definitions.py"],
    "cropscale/report/equivalence.py": ["tests/report/test_equivalence.py", "tests/report/test_equivalence_mutants.py",
                                        "tests/report/test_verdicts.py", "tests/report/test_comparison.py",
                                        "tests/report/test_convergence.py"],
    "cropscale/report/verdicts.py": ["tests/report/test_verdicts.py", "tests/report/test_verdicts_mutants.py",
                                     "tests/report/test_equivalence.py",
                                     "tests/report/test_comparison.py", "tests/report/test_report.py",
                                     "tests/report/test_failed_runs.py", "tests/report/test_plots.py",
                                     "tests/study/test_runner.py", "tests/study/test_protocol.py"],
    "cropscale/report/convergence.py": ["tests/report/test_convergence.py", "tests/report/test_verdicts.py"],
    "cropscale/runs/rules.py": ["tests/runs", "tests/report/test_verdicts.py", "tests/report/test_report.py",
                                "tests/report/test_numerics_and_ranks.py", "tests/report/test_summary.py",
                                "tests/diagnosis/test_rules.py"],
    "cropscale/runs/validity.py": ["tests/runs/test_validity.py", "tests/runs/test_trained.py"],
    "cropscale/scaling/verdict.py": _SCALING,
    "cropscale/scaling/pmnf.py": _SCALING,
    "cropscale/callbacks/_dist.py": _CALLBACKS,
    "cropscale/callbacks/throughput.py": _CALLBACKS,
    # test_costs counts the Python calls of a log step: mutmut's trampoline around every loss_scale function adds
    # calls, so under mutmut's stats run the 16-mixed count fails on the unmutated code
    "cropscale/callbacks/loss_scale.py": _CALLBACKS + ["--ignore=tests/callbacks/test_costs.py"],
    "cropscale/callbacks/grad_norm.py": _CALLBACKS,
    "cropscale/callbacks/divergence.py": _CALLBACKS,
    "cropscale/callbacks/quality.py": _CALLBACKS,
    "cropscale/callbacks/trained.py": _CALLBACKS + ["tests/runs/test_trained.py"],
    "cropscale/callbacks/energy.py": _CALLBACKS,
    "cropscale/checkpointing.py": ["tests/test_checkpointing.py", "tests/test_checkpointing_resolution.py",
                                   "tests/test_checkpointing_mutants.py"],
    "cropscale/distributed.py": ["tests/test_distributed.py", "tests/test_distributed_edges.py",
                                 "tests/test_distributed_mutants.py"],
    "cropscale/data/content.py": ["tests/data/test_content_checks.py", "tests/data/test_content_rules.py",
                                  "tests/data/test_every_value.py", "tests/data/test_silent_data.py",
                                  "tests/data/test_content_mutants.py"],
    "cropscale/tiling.py": ["tests/test_tiling.py"],
    "cropscale/diagnosis/steps.py": ["tests/diagnosis"],
    "cropscale/diagnosis/ranks.py": ["tests/diagnosis"],
}

ALSO_COPY = ["configs", "callbacks", "scripts", "docs", "README.md", "Makefile"]
MUTMUT_SECTION = """
[tool.mutmut]
source_paths = ["cropscale/"]
only_mutate = [{module}]
pytest_add_cli_args_test_selection = [{tests}]
pytest_add_cli_args = ["-p", "no:cacheprovider"]
use_git_change_detection = false
also_copy = [{also}]
"""

STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout",
          -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", None: "not checked"}
SPINNER = "\u280b\u2819\u2839\u2838\u283c\u2834\u2826\u2827\u2807\u280f"  # mutmut's progress frames
SEP = "\u01c1"  # mutmut's class separator in mutant names: x<SEP>Class<SEP>method


def slug(module: str) -> str:
    """``cropscale/callbacks/_dist.py`` -> ``callbacks._dist`` (a file name for the module's results)."""
    return module.removeprefix("cropscale/").removesuffix(".py").replace("/", ".")


def make_mutable(source: str) -> tuple[str, list[str]]:
    """The module's source with ``@override`` commented out and ``@property`` made a plain method.

    Lines keep their numbers. Returns the new source and the names of the properties rewritten
    (``Class.name``), whose ``property(...)`` assignments are appended at the end.
    """
    lines = source.splitlines(keepends=True)
    appended: list[str] = []
    classes: list[tuple[int, str]] = []  # (indent, name) of the enclosing classes
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if stripped and not stripped.startswith("#"):
            while classes and indent <= classes[-1][0]:
                classes.pop()
        m = re.match(r"class (\w+)", stripped)
        if m:
            classes.append((indent, m.group(1)))
        if stripped.rstrip() == "@override":
            lines[i] = " " * indent + "# @override (commented out for mutmut)\n"
        elif stripped.rstrip() == "@property" and classes and len(classes) == 1:
            nxt = lines[i + 1]
            d = re.match(r"(\s*)def (\w+)\(", nxt)
            if d is None:
                continue
            name = d.group(2)
            lines[i] = " " * indent + "# @property (made a plain method for mutmut)\n"
            lines[i + 1] = nxt.replace(f"def {name}(", f"def _mutmut_property_{name}(", 1)
            cls = classes[-1][1]
            appended.append(f"{cls}.{name} = property({cls}._mutmut_property_{name})\n")
    text = "".join(lines)
    if appended:
        text += "\n\n# properties as plain methods for mutmut (scripts/mutate.py)\n" + "".join(appended)
    return text, [a.split(" = ")[0] for a in appended]


def prepare(module: str, tests: list[str], work: Path) -> None:
    """A fresh work folder for ``module``: copies of the package, the tests and the settings, mutmut's section."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    shutil.copytree(ROOT / "cropscale", work / "cropscale", ignore=ignore)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=ignore)
    for extra in ALSO_COPY:  # what tests read beside the package (configs, presets, the README, docs, scripts)
        src = ROOT / extra
        if src.is_dir():
            shutil.copytree(src, work / extra, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, work / extra)
    # tests/conftest.py reads <repo>/../shared/data, the repo being work/mutants: work/shared/data links the sample
    data = next((d for d in (ROOT.parent / "shared" / "data", ROOT / "data") if d.is_dir()), None)
    if data is not None:
        (work / "shared").mkdir()
        (work / "shared" / "data").symlink_to(data.resolve())
    quote = lambda xs: ", ".join(json.dumps(x) for x in xs)  # noqa: E731
    (work / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text()
                                         + MUTMUT_SECTION.format(module=quote([module]), tests=quote(tests),
                                                                               also=quote(ALSO_COPY)))
    target = work / module
    text, _ = make_mutable(target.read_text())
    target.write_text(text)


def function_lines(source: str) -> dict[str, int]:
    """``{"x_name": def line, "x<SEP>Class<SEP>name": def line}`` of the top-level functions and methods."""
    found: dict[str, int] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[f"x_{node.name}"] = node.lineno
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    found[f"x{SEP}{node.name}{SEP}{item.name}"] = item.lineno
    return found


def function_name(key: str) -> str:
    """``Class.method`` or ``function`` of a mutant name (``...x<SEP>Class<SEP>method__mutmut_3``)."""
    fn = key.rpartition(".")[2].partition("__mutmut_")[0]
    fn = fn[2:] if fn.startswith("x_") else fn[1:].strip(SEP).replace(SEP, ".")
    return fn.replace("_mutmut_property_", "")


def describe(work: Path, module: str, key: str, def_lines: dict[str, int]) -> tuple[int | None, str]:
    """(line in the module, ``old -> new``) of mutant ``key``, read from mutmut's mutated file."""
    from mutmut.mutation.diff_apply import read_functions_from_index  # the venv's mutmut (make mutate)

    cwd = os.getcwd()
    os.chdir(work)
    try:
        pair = read_functions_from_index(key, module)
    finally:
        os.chdir(cwd)
    if pair is None:
        return None, "?"
    import libcst as cst

    orig, mutant = (cst.Module([]).code_for_node(f).splitlines() for f in pair)
    start_o = next(i for i, s in enumerate(orig) if s.lstrip().startswith(("def ", "async def ")))
    start_m = next(i for i, s in enumerate(mutant) if s.lstrip().startswith(("def ", "async def ")))
    orig, mutant = orig[start_o:], mutant[start_m:]
    fn = key.rpartition(".")[2].partition("__mutmut_")[0]
    base = def_lines.get(fn)
    sm = difflib.SequenceMatcher(a=orig, b=mutant, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        old = " / ".join(s.strip() for s in orig[i1:i2]) or "(nothing)"
        new = " / ".join(s.strip() for s in mutant[j1:j2]) or "(removed)"
        return (None if base is None else base + i1), f"{old}  ->  {new}"
    return base, "(no textual change)"


def shared_fixture_groups(selection: list[str]) -> list[set[str]]:
    """Node ids of the tests that share one module-, class- or package-scoped fixture, one set per fixture.

    Collected with pytest in the current folder (mutmut's ``mutants/``), as mutmut names the tests.
    """
    import pytest

    groups: dict[int, set[str]] = {}

    class Collector:
        def pytest_collection_modifyitems(self, items: list) -> None:
            for item in items:
                info = getattr(item, "_fixtureinfo", None)
                for defs in (info.name2fixturedefs.values() if info is not None else ()):
                    if defs and defs[-1].scope in ("module", "class", "package"):
                        groups.setdefault(id(defs[-1]), set()).add(item.nodeid)

    pytest.main(["--rootdir=.", "--collect-only", "-qq", "-p", "no:cacheprovider", *selection],
                plugins=[Collector()])
    return [g for g in groups.values() if len(g) > 1]


def widen(tests_by_function: dict[str, set[str]], groups: list[set[str]]) -> int:
    """Add to each function's tests every test that shares a higher-scoped fixture with one of them.

    mutmut maps a function to the tests during which it ran; a module-scoped fixture (one fit shared by a file's
    tests) runs during the first test that asks for it, so the other tests of that fit would never judge a
    mutant of the code the fit ran. Returns the number of (function, test) pairs added.
    """
    member: dict[str, list[set[str]]] = {}
    for g in groups:
        for node in g:
            member.setdefault(node, []).append(g)
    added = 0
    for tests in tests_by_function.values():
        extra = {u for t in list(tests) for g in member.get(t, ()) for u in g} - tests
        tests |= extra
        added += len(extra)
    return added


SAMPLE_ENV = "CROPSCALE_MUTATE_SAMPLE"  # "N:seed" from run_module to the child that drives mutmut


def draw(names: list[str], n: int, seed: int) -> set[str]:
    """``n`` of ``names`` drawn at random with ``seed`` (all of them when ``n`` >= their number); order-free."""
    ordered = sorted(names)
    return set(random.Random(seed).sample(ordered, min(n, len(ordered))))


def drive() -> None:
    """``mutmut run --max-children 1`` in the current folder, with the test map widened (:func:`widen`).

    With ``CROPSCALE_MUTATE_SAMPLE=N:seed`` in the environment only a sample of N mutants (:func:`draw`) runs.
    """
    import mutmut.__main__ as mm
    from mutmut.utils.file_utils import change_cwd

    collect = mm.collect_or_load_stats
    gather = mm.collect_source_file_mutation_data
    sample = os.environ.get(SAMPLE_ENV)

    def gather_sample(*, mutant_names):  # noqa: ANN001, ANN202
        mutants, by_path = gather(mutant_names=mutant_names)
        if sample and not mutant_names:
            n, seed = (int(x) for x in sample.split(":"))
            chosen = draw([key for _, key, _ in mutants], n, seed)
            mutants = [m for m in mutants if m[1] in chosen]
            print(f"mutate: a sample of {len(mutants)} mutants (seed {seed})", flush=True)
        return mutants, by_path

    def collect_and_widen(runner, **kwargs):  # noqa: ANN001, ANN003, ANN202
        collect(runner, **kwargs)
        with change_cwd("mutants"):
            groups = shared_fixture_groups(mm.config().pytest_add_cli_args_test_selection)
        added = widen(mm.state().tests_by_mangled_function_name, groups)
        print(f"mutate: {added} (function, test) pairs added for tests sharing a module-scoped fixture", flush=True)
        mm.save_stats()

    mm.collect_or_load_stats = collect_and_widen
    mm.collect_source_file_mutation_data = gather_sample
    mm._run((), 1)


def run_module(module: str, tests: list[str], out: Path, sample: int | None = None, seed: int = 0) -> bool:
    """Mutate ``module`` against ``tests``; write its results into ``out``; True when mutmut finished.

    ``sample``: run that many mutants drawn at random with ``seed`` (None: every mutant).
    """
    name = slug(module)
    work = ROOT / "build" / "mutate" / name
    prepare(module, tests, work)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop(SAMPLE_ENV, None)
    if sample is not None:
        env[SAMPLE_ENV] = f"{sample}:{seed}"
    log = work / "mutmut.log"
    print(f"mutate: {module}: tests {' '.join(tests)}; log {log.relative_to(ROOT)}", flush=True)
    t0 = time.monotonic()
    with log.open("w") as fh:
        rc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--drive"], cwd=work, env=env,
                            stdout=fh, stderr=subprocess.STDOUT).returncode
    seconds = time.monotonic() - t0
    log.write_text(_without_spinner(log.read_text(errors="replace")))
    meta = work / "mutants" / (module + ".meta")
    if rc != 0 or not meta.exists():
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print(f"mutate: {module}: mutmut exited {rc} after {seconds:.0f} s; last lines of {log}:", file=sys.stderr)
        print("\n".join("  " + t for t in tail), file=sys.stderr)
        return False
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    def_lines = function_lines((work / module).read_text())
    rows = []
    for key, code in codes.items():
        status = STATUS.get(code, "suspicious")
        line, change = describe(work, module, key, def_lines)
        rows.append((status, line or 0, key.rpartition(".")[2], function_name(key), change))
    rows.sort(key=lambda r: (r[0] != "survived", r[1], r[2]))
    counts = {s: sum(r[0] == s for r in rows) for s in sorted({r[0] for r in rows})}
    n = len(rows) - counts.get("skipped", 0) - counts.get("not checked", 0)
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    summary = {"module": module, "tool": "mutmut " + _version(), "mutants": len(rows), "killed": killed,
               "counts": counts, "score": round(100.0 * killed / n, 1) if n else None,
               "seconds": round(seconds), "tests": tests}
    if sample is not None:
        summary.update(sample=n, seed=seed, score_95=score_interval(killed, n))
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{name}.tsv").open("w") as fh:
        fh.write("status\tline\tmutant\tfunction\tmutation\n")
        for r in rows:
            fh.write("\t".join(str(x) for x in r) + "\n")
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    drawn = (f" of a sample of {n} in {len(rows)} (95 % interval {summary['score_95']})"
             if sample is not None else "")
    print(f"mutate: {module}: {killed}/{n} killed ({summary['score']} %{drawn}), {counts.get('survived', 0)} survived, "
          f"{counts.get('no tests', 0)} without tests, {counts.get('timeout', 0)} timeouts, in {seconds:.0f} s; "
          f"{out / (name + '.tsv')}", flush=True)
    return True


def score_interval(killed: int, n: int) -> list[float] | None:
    """The 95 % Clopper-Pearson interval of a score (percent) estimated from ``killed`` of ``n`` sampled mutants."""
    if n == 0:
        return None
    from scipy.stats import binomtest

    ci = binomtest(killed, n).proportion_ci(confidence_level=0.95, method="exact")
    return [round(100.0 * ci.low, 1), round(100.0 * ci.high, 1)]


def _without_spinner(text: str) -> str:
    """The log of mutmut with each progress line cut to its last frame (it redraws a spinner in place)."""
    return "\n".join(re.split(f"[{SPINNER}]", line)[-1].strip() if re.search(f"[{SPINNER}]", line) else line
                     for line in text.splitlines()) + "\n"


def _version() -> str:
    from importlib.metadata import version

    return version("mutmut")


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run every module in turn; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="+", help="module files, e.g. cropscale/numbers.py")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "mutate" / "results",
                   help="folder of the per-module results (default build/mutate/results)")
    p.add_argument("--tests", default=None, help="test files to use instead of the table (one module only)")
    p.add_argument("--sample", type=int, default=None, help="run N mutants drawn at random instead of all")
    p.add_argument("--seed", type=int, default=0, help="seed of the --sample draw (default 0)")
    if argv is None and sys.argv[1:] == ["--drive"]:  # the child run in a module's work folder
        drive()
        return 0
    args = p.parse_args(argv)
    if importlib.util.find_spec("mutmut") is None:
        print(f"mutate: {sys.executable} has no mutmut (pip install -e '.[dev]')", file=sys.stderr)
        return 2
    if args.sample is not None and args.sample < 1:
        print("mutate: --sample takes a positive number of mutants", file=sys.stderr)
        return 2
    if args.tests and len(args.modules) > 1:
        print("mutate: --tests takes one module", file=sys.stderr)
        return 2
    ok = True
    for module in args.modules:
        module = module.removeprefix("./")
        if not (ROOT / module).is_file() or not module.startswith("cropscale/"):
            print(f"mutate: {module}: no such module under cropscale/", file=sys.stderr)
            return 2
        tests = args.tests.split() if args.tests else MODULE_TESTS.get(module)
        if not tests:
            print(f"mutate: {module}: no tests listed in scripts/mutate.py MODULE_TESTS (or pass --tests)",
                  file=sys.stderr)
            return 2
        ok = run_module(module, tests, args.out, args.sample, args.seed) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
