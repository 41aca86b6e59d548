"""scripts/gpu_check.sh's contract without a GPU: one line and exit 0 with no GPU; on a fake GPU machine every
step in the order of value, each with its own outcome (one failure stops none of the rest), what comes back
(at most 6 files directly under OUT, no folders or checkpoints, a summary of at most 6,000 characters printed
last); scripts/gpu_imports.py names a missing package; scripts/gpu_summary.py keeps the summary in bounds."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"

# Records its arguments and writes what a real run would; runs the real python for the check's own scripts.
FAKE_PYTHON = r"""#!/usr/bin/env bash
case "$1" in *gpu_summary.py) exec "$REAL_PY" "$@";; esac
echo "$*" >> "$CALLS"
if [ "$1" = "-c" ]; then case "$2" in *entry_points*) exit 1;; esac; exit 0; fi
prev=""
for a in "$@"; do
    if [ "$prev" = "--json" ]; then
        echo '{"evidence": "measured-microbenchmark", "results": [
          {"precision": "bf16-mixed", "batch_size": 8, "status": "ok", "samples_per_s": 100.0,
           "precision_label": "AMP BF16"},
          {"precision": "bf16-mixed", "batch_size": 16, "status": "ok", "samples_per_s": 150.0,
           "precision_label": "AMP BF16"}]}' > "$a"
    fi
    case "$a" in
        --trainer.logger.init_args.save_dir=*) save="${a#*=}";;
        --trainer.logger.init_args.name=*) name="${a#*=}";;
    esac
    prev="$a"
done
if [ -n "${save:-}" ]; then
    mkdir -p "$save/$name/version_0/checkpoints"; echo x > "$save/$name/version_0/checkpoints/last.ckpt"
    echo '{"evidence": "measured-run", "status": "finished", "summary": {}}' > "$save/$name/version_0/run.json"; fi
case "$*" in *"$FAIL_ON"*) echo "fake failure of: $*"; exit 3;; esac
echo "fake output of: ${*:1:3}"
exit 0
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _bash() -> str:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    return bash


def test_bash_syntax_is_clean():
    for name in ("gpu_check.sh", "gpu_carry.sh", "gpu_rehearsal.sh"):
        subprocess.run([_bash(), "-n", str(REPO / "scripts" / name)], check=True)


def test_without_a_gpu_one_line_and_exit_zero(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "PYTHON": "python3", "HOME": str(tmp_path)}
    assert shutil.which("nvidia-smi", path=env["PATH"]) is None or pytest.skip("this machine has nvidia-smi")
    done = subprocess.run([_bash(), str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no NVIDIA GPU usable here")
    assert "GPU figures still unmeasured" in lines[0]
    assert not (tmp_path / "out").exists()  # nothing written when nothing was measured


def _fake_machine(tmp_path: Path, flanders_root: Path, fail_on: str = "no such step") -> tuple[dict, Path, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "nvidia-smi", "#!/usr/bin/env bash\necho 'GPU 0: NVIDIA H200 (UUID: GPU-fake)'\n")
    _executable(bin_dir / "fakepython", FAKE_PYTHON)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "jsonargparse-4.53.0-py3-none-any.whl").write_bytes(b"")
    calls, out = tmp_path / "calls.txt", tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out), "CALLS": str(calls),
           "PYTHON": str(bin_dir / "fakepython"), "REAL_PY": sys.executable, "DATA_ROOT": str(flanders_root),
           "WHEELS": str(wheels), "WORK": str(tmp_path / "work"), "FAIL_ON": fail_on}
    return env, calls, out


def test_on_a_fake_gpu_machine_every_step_in_order_and_what_comes_back(tmp_path, flanders_root):
    env, calls, out = _fake_machine(tmp_path, flanders_root)
    done = subprocess.run([_bash(), str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [ln for ln in calls.read_text().splitlines() if not ln.startswith("-c ")]
    assert ran[0].startswith("-m pip install -q --no-index --no-deps") and "--target" in ran[0]
    assert ran[1].endswith("--json " + str(tmp_path / "work" / "json" / "imports.json"))
    assert "gpu_imports.py" in ran[1]
    assert "benchmark --device cuda --precision 32-true bf16-mixed 16-mixed --batch-sizes 1 2 4 8 16 32 64" in ran[2]
    assert "--stop-at-oom" in ran[2] and "--precision 32-true --tf32" in ran[3]
    # the compiled and CUDA-graph rows at the fastest eager BF16 batch (16 in the fake JSON)
    assert "--compile --compile-mode default --precision bf16-mixed --batch-sizes 16" in ran[4]
    assert "--compile --compile-mode reduce-overhead --precision bf16-mixed --batch-sizes 16" in ran[5]
    assert "fit " in ran[6] and "--trainer.precision=bf16-mixed" in ran[6] and "--trainer.max_epochs=2" in ran[6]
    assert f"--data.root={flanders_root}" in ran[6] and "--trainer.precision=16-mixed" in ran[7]
    assert "callback-bench --device cuda" in ran[8] and "pipeline-bench" in ran[9] and "--device cuda" in ran[9]
    assert ran[10].startswith("-m pytest -q -m gpu") and "-p cropscale.scaling.pytest_plugin" in ran[10]
    assert ran[11].startswith("-m cropscale report")
    entries = sorted(p.name for p in out.iterdir())
    assert entries == ["gpu_check.json", "logs_tail.txt", "summary.md"]  # no report.png from a fake report
    assert all((out / e).is_file() for e in entries)
    summary = (out / "summary.md").read_text()
    assert len(summary) <= 6000 and done.stdout.endswith(summary)
    assert summary.rstrip().endswith("gpu_check: every step finished")
    doc = json.loads((out / "gpu_check.json").read_text())
    names = [s["name"] for s in doc["steps"]]
    assert names == ["install", "data", "imports", "nvidia-smi", "bench-eager", "bench-tf32", "bench-compile-default",
                     "bench-compile-reduce-overhead", "fit-bf16", "fit-fp16", "callback-bench", "pipeline",
                     "gpu-tests", "report"]
    assert set(doc["fits"]) == {"fit-bf16", "fit-fp16"}  # their checkpoints stayed in WORK
    assert list((tmp_path / "work" / "runs").rglob("*.ckpt")) and not list(out.rglob("*.ckpt"))


def test_one_failed_step_stops_none_of_the_rest(tmp_path, flanders_root):
    env, calls, out = _fake_machine(tmp_path, flanders_root, fail_on="--precision 32-true bf16-mixed 16-mixed")
    done = subprocess.run([_bash(), str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    doc = json.loads((out / "gpu_check.json").read_text())
    status = {s["name"]: s["status"] for s in doc["steps"]}
    assert status["bench-eager"] == "failed"
    assert all(status[n] == "ok" for n in ("bench-tf32", "fit-bf16", "fit-fp16", "callback-bench", "pipeline",
                                           "gpu-tests", "report"))
    assert "1 step(s) FAILED" in done.stdout.splitlines()[-1] and "bench-eager" in done.stdout.splitlines()[-1]


def _summary_module():
    spec = importlib.util.spec_from_file_location("gpu_summary", REPO / "scripts" / "gpu_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_summary_is_cut_at_6000_characters_and_keeps_its_last_line():
    mod = _summary_module()
    rows = [{k: None for k in mod._BENCH_KEYS} | {"precision_label": "FP32", "batch_size": b, "status": "ok",
                                                  "samples_per_s": 1.0} for b in range(400)]
    doc = {"mode": "gpu", "elapsed_s": 1, "budget_s": 2, "imports": None, "nvidia_smi": None,
           "steps": [{"name": "bench-eager", "status": "failed", "seconds": 1, "limit_s": 2, "note": "x", "log": None}],
           "benchmarks": {"bench-eager": {"rows": rows}}, "fits": {}, "callback_bench": None, "pipeline": None,
           "gpu_tests": {}}
    text = mod.summary_text(doc)
    assert len(text) <= 6000 and "summary cut at 6000 characters" in text
    assert text.rstrip().endswith("gpu_check: 1 step(s) FAILED, ran out of time or were skipped: bench-eager")


def test_imports_check_names_each_missing_package(tmp_path):
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "rasterio.py").write_text("raise ImportError('hidden by the test')\n")
    env = {**os.environ, "PYTHONPATH": f"{blocker}:{REPO}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_imports.py")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1
    missing = [ln for ln in done.stdout.splitlines() if ln.startswith("MISSING ")]
    assert "MISSING rasterio: ImportError: hidden by the test" in missing
    assert done.stdout.splitlines()[-1].startswith("imports: ")


def test_the_tests_of_the_checks_own_copy_are_collected_without_error(tmp_path):
    """gpu_check.sh runs `pytest -m gpu` in a copy of what its tar line names (no README, no docs): collecting
    the tests there must not need a file the copy lacks (issue 36: test_commands.py read the README while
    collecting, and the device's gpu-tests step stopped at collection)."""
    line = next(ln for ln in SCRIPT.read_text().splitlines() if "--exclude=__pycache__ -cf -" in ln)
    names = [n for n in line.split("-cf -", 1)[1].split("|", 1)[0].split() if n != "\\"]
    assert "tests" in names and "cropscale" in names and "README.md" not in names  # the premise: what it copies
    copy = tmp_path / "project"
    copy.mkdir()
    for name in names:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, copy / name)
    env = {**os.environ, "PYTHONPATH": str(copy), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-m", "gpu",
                           "-p", "no:cacheprovider", "tests"],
                          cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and " error" not in done.stdout.splitlines()[-1], done.stdout[-3000:]
    assert "tests/integration/test_gpu.py::" in done.stdout  # the gpu tests themselves were collected
