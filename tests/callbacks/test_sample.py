"""The real bundled sample through the CLI with ``callbacks/scaling.yaml``, on 1 process and on 2 CPU DDP
processes (gloo): run.json complete, TensorBoard scalars under every prefix. Slow (the real model on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PREFIXES = ("perf/", "numerics/", "memory/")
#: an FP32 run on CPU logs no AMP or energy scalar (no GradScaler, no NVML): their constant flags are in run.json
ABSENT = ("amp/", "energy/")

pytestmark = pytest.mark.slow


def _fit(tmp_path: Path, flanders_root: Path, *extra: str) -> dict:
    cmd = [
        sys.executable, "-m", "cropscale", "fit",
        "--config", str(REPO / "configs" / "default.yaml"), "--config", str(REPO / "callbacks" / "scaling.yaml"),
        f"--data.root={flanders_root}", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
        "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false", *extra,
    ]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_json,) = (tmp_path / "runs").rglob("run.json")
    return {"record": json.loads(run_json.read_text()), "dir": run_json.parent}


def _tags(log_dir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(log_dir))
    ea.Reload()
    return set(ea.Tags()["scalars"])


def _check(run: dict, world: int, flanders_root: Path) -> None:
    rec = run["record"]
    assert rec["status"] == "finished" and rec["distributed"]["world_size"] == world
    assert len(rec["devices"]) == world
    assert rec["dataset"]["available"] and rec["dataset"]["root"] == str(flanders_root.resolve())
    assert rec["config_source"] == "SaveConfigCallback" and rec["config"]["data"]["batch_size"] == 4
    s = rec["summary"]
    assert set(s) == {"step_timing", "throughput", "loss_scale", "nonfinite", "grad_norm", "energy", "memory",
                      "trained", "quality", "checkpoint", "divergence"}
    assert s["throughput"]["epochs"][0]["samples"] == 2 * 4 * world
    assert s["throughput"]["epochs"][0]["flops_per_sample"] > 0  # from CropMappingTask.flops_per_sample
    assert s["grad_norm"]["steps"] == 2 and s["grad_norm"]["clip_threshold"] == 1.0
    tags = _tags(run["dir"])
    for prefix in PREFIXES:
        assert any(t.startswith(prefix) for t in tags), prefix
    assert not any(t.startswith(ABSENT) for t in tags), sorted(tags)
    for r in range(world):
        assert (run["dir"] / f"step_trace.rank{r}.jsonl").is_file()


def test_sample_one_process(tmp_path, flanders_root):
    _check(_fit(tmp_path, flanders_root), 1, flanders_root)


def test_sample_two_process_ddp(tmp_path, flanders_root):
    run = _fit(tmp_path, flanders_root, "--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp")
    _check(run, 2, flanders_root)
    assert run["record"]["summary"]["step_timing"]["comm_timing"]["available"] is True
