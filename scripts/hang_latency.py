"""How soon a hanging DDP rank is named: the time from the hang to rank 0's line, over a few runs.

    python scripts/hang_latency.py [--runs 3] [--rank 1] [--where own-code|collective] [--workdir DIR] \
        [-- extra fit arguments, e.g. --trainer.callbacks+=cropscale.hangs.HangWatch --trainer.callbacks.floor_s=10]

Each run is ``python -m cropscale fit`` on 2 gloo processes (the tiny CropMappingNet on the bundled sample,
2 steps an epoch) with :class:`cropscale.testing.faults.HangAt` at epoch 1, batch 0. The hang's time is the
unix time HangAt prints as it begins; the line's is the time this script reads rank 0's ``DDP rank N hangs``
line from the run's stderr (both on this machine's clock). Printed per run: the exit status, the bound and the
stillness at naming (from ``run.json``), the hang-to-line time; then the last run's line. Evidence:
measured-run, on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIT = ["fit", "--data.samples_per_patch=3", "--data.batch_size=2", "--data.t2=4", "--data.t1=2",
       "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.max_epochs=3",
       "--model.net_kwargs={s2_dim: 16, s2_heads: 2, s1_dim: 8, width: 8, fpn_dim: 16, head_dim: 8,"
       " decoder_dim: 8, hr_dim: 4}", "--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp"]
HANG = re.compile(r"HangAt: rank \d \(pid \d+\) hangs .* unix time ([\d.]+)")


def one_run(folder: Path, args: list[str], timeout_s: float) -> dict:
    """One fit in ``folder``: its exit status, the hang's and the line's unix times, the line, run.json's hang."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "cropscale", *args], cwd=folder, env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    hung_at = named_at = None
    line = ""
    deadline = time.time() + timeout_s
    for text in proc.stderr:
        if (m := HANG.search(text)) is not None:
            hung_at = float(m.group(1))
        if "hangs: no rank has reached its next step" in text:
            named_at, line = time.time(), text.strip()
        if time.time() > deadline:
            proc.kill()
            break
    status = proc.wait()
    record = json.loads((folder / "runs" / "default" / "version_0" / "run.json").read_text())
    return {"status": status, "hung_at": hung_at, "named_at": named_at, "line": line,
            "hang": (record.get("hang_watch") or {}).get("hang") or {}}


def main(argv: list[str] | None = None) -> int:
    """Run the fits and print the table (module docstring); status 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--where", choices=("own-code", "collective"), default="own-code")
    parser.add_argument("--data-root", default=str(REPO / "data" / "worldcereal-flanders"))
    parser.add_argument("--workdir", default=None, help="folder for the runs (default: a temporary one, removed)")
    parser.add_argument("--timeout", type=float, default=900.0, help="per run (s)")
    parser.add_argument("extra", nargs="*", help="after --: more fit arguments")
    opts = parser.parse_args(argv)
    hang = ["--trainer.callbacks+=cropscale.testing.faults.HangAt", "--trainer.callbacks.epoch=1",
            "--trainer.callbacks.batch=0", f"--trainer.callbacks.rank={opts.rank}",
            f"--trainer.callbacks.where={opts.where}"]
    args = [*FIT, f"--data.root={opts.data_root}", *opts.extra, *hang]
    work = Path(opts.workdir or tempfile.mkdtemp(prefix="hang-latency-"))
    print(f"command (in {work}/run<i>): python -m cropscale {' '.join(args)}")
    print("run  status  bound_s  still_s  hang->line_s  evidence")
    last = None
    for i in range(opts.runs):
        folder = work / f"run{i}"
        folder.mkdir(parents=True, exist_ok=True)
        last = one_run(folder, args, opts.timeout)
        h = last["hang"]
        latency = (last["named_at"] - last["hung_at"]) if last["named_at"] and last["hung_at"] else None
        nan = float("nan")
        print(f"{i:>3}  {last['status']:>6}  {h.get('bound_s', nan):7.2f}  {h.get('still_s', nan):7.2f}"
              f"  {latency if latency is not None else nan:12.2f}  measured-run", flush=True)
    if last is not None:
        print(f"last run's line: {last['line']}")
    if opts.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
