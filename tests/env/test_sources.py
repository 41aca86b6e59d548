"""The measured code path's source digests (:mod:`cropscale.env.sources`), on a temporary copy of the package."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from cropscale.env.sources import PACKAGE_DIR, measured_sources, source_digests

#: the benchmark's modules and the model code its timed step runs (read off their import lines)
BENCHMARK_PATH = ("bench/step/command.py", "bench/step/config.py", "bench/step/energy.py", "bench/step/mfu.py",
                  "bench/step/rows.py", "bench/step/run.py", "model/network.py", "model/losses.py",
                  "model/synthetic.py", "model/flops.py", "batch.py", "numbers.py", "env/nvml.py", "env/peaks.py",
                  "__init__.py", "bench/__init__.py", "model/__init__.py")


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("copy") / "cropscale"
    shutil.copytree(PACKAGE_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_the_benchmark_path_holds_every_step_module_and_nothing_off_it(package):
    found = {p.relative_to(package).as_posix() for p in measured_sources(package / "bench/step/command.py", package)}
    assert set(BENCHMARK_PATH) <= found
    assert not found & {"bench/callbacks.py", "report/command.py", "study/runner.py", "cli/main.py"}


def test_digests_by_hashlib_and_by_sha256sum(package):
    files, combined = source_digests(package / "bench/step/command.py", package)
    assert list(files) == sorted(files)
    for name, digest in files.items():
        assert digest == hashlib.sha256((package.parent / name).read_bytes()).hexdigest()
    listing = "".join(f"{hashlib.sha256((package.parent / n).read_bytes()).hexdigest()}  {n}\n" for n in sorted(files))
    assert combined == hashlib.sha256(listing.encode()).hexdigest()
    if shutil.which("sha256sum"):
        out = subprocess.run(f"sha256sum {' '.join(files)} | sha256sum", shell=True, cwd=package.parent,
                             capture_output=True, text=True, check=True).stdout
        assert out.split()[0] == combined


def test_a_change_to_any_file_of_the_path_changes_the_digest(package):
    files, combined = source_digests(package / "bench/step/command.py", package)
    for name in files:
        path = package.parent / name
        original = path.read_bytes()
        path.write_bytes(original + b"\n# changed\n")
        try:
            changed, changed_combined = source_digests(package / "bench/step/command.py", package)
        finally:
            path.write_bytes(original)
        assert changed_combined != combined, name
        assert [n for n in files if changed[n] != files[n]] == [name]


def test_a_file_off_the_path_leaves_the_digest(package):
    _, combined = source_digests(package / "bench/step/command.py", package)
    path = package / "bench/callbacks.py"
    original = path.read_bytes()
    path.write_bytes(original + b"\n# changed\n")
    try:
        assert source_digests(package / "bench/step/command.py", package)[1] == combined
    finally:
        path.write_bytes(original)


def test_relative_and_function_level_imports_are_followed(tmp_path):
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("from . import b\n")
    (root / "sub" / "a.py").write_text("def f():\n    from ..c import g\n    return g\n")
    (root / "sub" / "b.py").write_text("import os\n")
    (root / "c.py").write_text("g = 1\n")
    (root / "d.py").write_text("")
    found = [p.relative_to(tmp_path).as_posix() for p in measured_sources(root / "sub" / "a.py", root)]
    assert found == ["pkg/__init__.py", "pkg/c.py", "pkg/sub/__init__.py", "pkg/sub/a.py", "pkg/sub/b.py"]


def test_an_entry_outside_the_package_is_hashed_alone(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text("import cropscale.bench.step.command\n")
    files, _ = source_digests(script)
    assert files == {str(script.resolve()): hashlib.sha256(script.read_bytes()).hexdigest()}
