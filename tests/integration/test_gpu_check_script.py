"""scripts/gpu_check.sh without a GPU (one line, exit 0) and, with a fake GPU machine, the steps it runs."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"

FAKE_PYTHON = r"""#!/usr/bin/env bash
# Records its arguments; writes the files a real run would (--output, --json, the fit's run folder).
echo "$*" >> "$CALLS"
prev=""
for a in "$@"; do
    if [ "$prev" = "--output" ] || [ "$prev" = "--json" ]; then echo '{}' > "$a"; fi
    case "$a" in --trainer.logger.init_args.save_dir=*) mkdir -p "${a#*=}/gpu_check/version_0";; esac
    prev="$a"
done
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
    subprocess.run([_bash(), "-n", str(SCRIPT)], check=True)


def test_without_a_gpu_one_line_and_exit_zero(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "PYTHON": "python3", "HOME": str(tmp_path)}
    assert shutil.which("nvidia-smi", path=env["PATH"]) is None or pytest.skip("this machine has nvidia-smi")
    done = subprocess.run([_bash(), str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no NVIDIA GPU usable here")
    assert "GPU figures still unmeasured" in lines[0]
    assert not (tmp_path / "out").exists()  # nothing written when nothing was measured


def test_on_a_fake_gpu_machine_every_step_runs_in_order(tmp_path, flanders_root):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "nvidia-smi", "#!/usr/bin/env bash\necho 'GPU 0: NVIDIA H200 (UUID: GPU-fake)'\n")
    _executable(bin_dir / "fakepython", FAKE_PYTHON)
    calls = tmp_path / "calls.txt"
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out), "CALLS": str(calls),
           "PYTHON": str(bin_dir / "fakepython"), "DATA_ROOT": str(flanders_root)}
    done = subprocess.run([_bash(), str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = calls.read_text().splitlines()
    ran = [ln for ln in lines if not ln.startswith("-c ")]  # the torch.cuda probe and the version line
    assert ran[0].startswith("-m pytest -q -m gpu")
    eager = ran[1]
    assert "benchmark --device cuda --precision 32-true 16-mixed bf16-mixed --batch-sizes 1 2 4 8 16 32 64" in eager
    assert "--stop-at-oom" in eager and f"--output {out}/bench_eager.json" in eager
    assert "--precision 32-true --tf32 --batch-sizes 1 2 4 8 16 32 64" in ran[2]
    compiled = [ln for ln in ran if "--compile" in ln]
    assert len(compiled) == 2 and all("--max-seconds" in ln and "--order batch" in ln for ln in compiled)
    assert "--precision 32-true 16-mixed bf16-mixed" in compiled[0] and "--tf32" in compiled[1]
    fit = next(ln for ln in ran if ln.startswith("-m cropscale fit"))
    assert "--trainer.max_epochs=2" in fit and f"--data.root={flanders_root}" in fit
    assert "--trainer.accelerator=gpu" in fit
    pipeline = next(ln for ln in ran if "pipeline-bench" in ln)
    assert f"--json {out}/pipeline.json" in pipeline and "--device cuda" in pipeline
    report = ran[-1]
    assert report.startswith("-m cropscale report") and f"--out {out}/report" in report
    for part in (f"{out}/runs/gpu_check/version_0", "bench_eager.json", "bench_tf32.json", "bench_compiled.json",
                 "bench_compiled_tf32.json"):
        assert part in report
    summary = (out / "summary.txt").read_text()
    assert "gpu_check: every step finished" in summary and "FAILED" not in summary
    assert done.stdout.rstrip().endswith("gpu_check: every step finished")
