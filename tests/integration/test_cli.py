"""The main job end to end: `python -m cropscale fit` on the bundled real sample, help, config, errors."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# One small epoch on the real sample: 2 training patches x 2 crops, both validation patches tiled.
TINY = [
    "--trainer.max_epochs=1",
    "--data.samples_per_patch=2",
    "--data.batch_size=2",
    "--trainer.log_every_n_steps=1",
]


def run_cli(args, cwd, timeout=600, env_extra=None):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "cropscale", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )


def scalar_tags(run_dir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for event_file in run_dir.glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(event_file), size_guidance={"scalars": 0})
        acc.Reload()
        tags.update(acc.Tags()["scalars"])
    return tags


#: Every subcommand, written out here (not read from the CLI's table): Lightning's four and the analysis ones.
ALL_SUBCOMMANDS = ("fit", "validate", "test", "predict", "summary", "benchmark", "report", "study", "scaling",
                   "loader-bench", "tiling-bench", "callback-bench", "lever-bench", "pipeline-bench", "tensorboard")


@pytest.mark.parametrize("args", [[], ["--help"], ["-h"]])
def test_bare_command_and_help_list_every_subcommand(tmp_path, args):
    """Issue 28: ``python -m cropscale`` alone lists every subcommand, one a line, and exits 0 with no error."""
    res = run_cli(args, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "error" not in res.stderr.lower(), res.stderr[-3000:]
    listed = [line.split()[0] for line in res.stdout.splitlines() if line.startswith("  ") and line.split()]
    assert sorted(listed) == sorted(ALL_SUBCOMMANDS), res.stdout


def test_print_config_resolves_default(tmp_path, flanders_root):
    res = run_cli(["fit", "--print_config", f"--data.root={flanders_root}", "--trainer.devices=2"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "gradient_clip_val: 1.0" in out
    assert "devices: 2" in out or "devices: '2'" in out
    assert "worldcereal-flanders" in out
    assert "TensorBoardLogger" in out and "default_hp_metric: false" in out


# The default configuration (scaling callbacks on) at its smallest with a measured step: one epoch of 6
# steps (2 training patches x 3 crops / batch 1); the callbacks leave out their 5 warm-up steps (and each
# epoch's first step), so they measure step 6. A single-epoch run has no warm-up epoch.
SUMMARY_RUN = [
    "--trainer.max_epochs=1",
    "--data.samples_per_patch=3",
    "--data.batch_size=1",
    "--trainer.log_every_n_steps=1",
]


def summary_lines(stdout: str) -> dict[str, str]:
    """The end-of-fit summary's lines by their label (``quality``, ``speed``, ..., ``run folder``)."""
    text = stdout[stdout.index("cropscale fit summary"):]
    out = {}
    for line in text.splitlines()[2:]:
        label, _, rest = line.partition("  ")
        if rest:
            out[label.strip()] = rest.strip()
    return out


def test_fit_end_to_end_on_real_sample(tmp_path, flanders_root):
    """The main job: the default configuration writes run.json and the callbacks' scalars, and prints a
    summary whose figures are the ones computed here by hand from run.json and the TensorBoard events."""
    res = run_cli(["fit", f"--data.root={flanders_root}", *SUMMARY_RUN], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    run_dirs = sorted((tmp_path / "runs" / "default").glob("version_*"))
    assert len(run_dirs) == 1
    run_dir = run_dirs[0]
    tags = scalar_tags(run_dir)
    for key in ("train/loss_step", "train/loss_epoch", "val/loss", "val/mIoU", "val/mIoU_best",
                "train/loss_semantic", "train/loss_parcel", "train/loss_hr"):
        assert key in tags, (key, sorted(tags))
    for prefix in ("perf/", "numerics/", "memory/"):  # amp/ and energy/ log nothing on a CPU FP32 run
        assert any(t.startswith(prefix) for t in tags), (prefix, sorted(tags))
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt"))
    assert any(c.startswith("best-epoch") for c in ckpts) and "last.ckpt" in ckpts, ckpts
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "hparams.yaml").is_file()

    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["status"] == "finished" and rec["global_step"] == 6
    s = rec["summary"]
    lines = summary_lines(res.stdout)
    assert "DIVERGED" not in lines
    assert lines["ran"] == "FP32 on 1 device(s) (SingleDeviceStrategy), global batch 1, 6 optimizer steps"
    # quality: val/mIoU once per epoch in TensorBoard
    (miou,) = [e.value for e in _events(run_dir, "val/mIoU")]
    assert lines["quality"] == f"best val/mIoU {miou:.4f} at epoch 0 (final {miou:.4f})"
    # speed over the epoch: training samples / training seconds; the step window's median (one step)
    (tp,) = s["throughput"]["epochs"]
    assert tp["samples"] == 6
    (st,) = s["step_timing"]["epochs"]
    assert st["windows_ms"]["step"]["n"] == 1
    step = st["windows_ms"]["step"]["median"]
    assert lines["speed"] == (f"{tp['samples'] / tp['train_s']:,.2f} training-loop samples/s,"
                              f" {tp['samples'] / tp['wall_s']:,.2f} epoch-clock samples/s (end-to-end epoch);"
                              f" median step {step:,.1f} ms")
    assert lines["epoch"] == (f"training-only {tp['train_s']:,.2f} s, validation-only {tp['val_s']:,.2f} s,"
                              f" end-to-end {tp['wall_s']:,.2f} s")
    shares = {w: 100 * st["windows_ms"][w]["median"] / step for w in
              ("data_wait", "transfer", "forward", "backward", "optimizer", "remainder")}
    names = ("data wait", "transfer", "forward", "backward", "optimizer", "remainder")
    expected = ", ".join(f"{name} {share:.0f} %" for name, share in zip(names, shares.values(), strict=True))
    assert lines["step"].startswith(expected + " of the median step")
    assert lines["step"].endswith(f"(window medians; sum {sum(shares.values()):.0f} %)")
    assert lines["memory"].startswith(f"peak {s['memory']['host_peak_rss_gib']:.2f} GiB (host RSS")
    assert s["energy"]["available"] is False and s["energy"]["reason"] in lines["energy"]
    assert lines["numerics"] == ("0 non-finite batch(es), 0 skipped step(s); the last logged training loss is finite")
    assert sum(r["nonfinite_batches"] for r in s["nonfinite"]["per_rank"]) == 0
    assert (tmp_path / lines["run folder"]).resolve() == run_dir.resolve()
    assert lines["report"] == "python -m cropscale report runs --output reports"


def _events(run_dir: Path, tag: str) -> list:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = []
    for event_file in sorted(run_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(event_file), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            events += acc.Scalars(tag)
    return sorted(events, key=lambda e: e.wall_time)


def test_a_diverging_fit_stops_says_so_and_exits_non_zero(tmp_path, flanders_root):
    """``--model.lr=1e6`` used to end with exit status 0 and a normal-looking val/mIoU (0.0198). Now the
    default configuration stops it once 3 logged losses in a row are non-finite, the summary says so,
    and the exit status is 1. 2 epochs of 4 steps (2 patches x 2 crops / batch 1) were asked for; no
    validation (not what this is about)."""
    res = run_cli(["fit", f"--data.root={flanders_root}", "--model.lr=1e6", "--trainer.max_epochs=2",
                   "--data.samples_per_patch=2", "--data.batch_size=1", "--trainer.log_every_n_steps=1",
                   "--trainer.limit_val_batches=0", "--trainer.enable_model_summary=false"], cwd=tmp_path)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-5000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("cropscale: error:")]
    assert len(errors) == 1 and errors[0].startswith("cropscale: error: training diverged: "), errors
    (run_json,) = (tmp_path / "runs").rglob("run.json")
    rec = json.loads(run_json.read_text())
    assert rec["status"] == "diverged" and rec["global_step"] < 8  # stopped before the 8 steps asked for
    assert rec["validity"]["status"] == "diverged" and rec["validity"]["reason"] in errors[0]
    assert f"DivergenceCallback stopped the run at step {rec['global_step']}" in errors[0]
    first = res.stdout[res.stdout.index("DIVERGED"):].splitlines()
    assert first[0].startswith("DIVERGED  ") and first[1].startswith("cropscale fit summary")
    losses = [e.value for e in _events(run_json.parent, "train/loss_step")]
    assert len(losses) == rec["global_step"] and all(math.isnan(v) or math.isinf(v) for v in losses[-3:])
    assert summary_lines(res.stdout)["numerics"].endswith("logged training losses are non-finite (from step"
                                                          f" {rec['summary']['divergence']['since_step']})")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["fit", "--trainer.no_such_key=1"], "no_such_key"),
        (["fit", "--data.root=/nonexistent/pastis"], "/nonexistent/pastis"),
        (["fit", "--trainer.devices=0"], "--trainer.devices"),
        (["fit", "--trainer.devices=-5"], "--trainer.devices"),  # Lightning raises TypeError here
        (["frobnicate"], "unknown subcommand 'frobnicate': choose from fit, validate, test, predict, summary"),
        (["fit", "--model.lr=-1"], "model.lr"),
        (["fit", "--model.val_stride=64"], "model.val_stride"),
        (["fit", "--trainer.strategy=bogus"], "bogus"),
        (["validate", "--ckpt_path=/nonexistent/best.ckpt"], "/nonexistent/best.ckpt"),
        (["test"], "data.test_folds"),
    ],
)
def test_bad_arguments_are_one_paragraph(tmp_path, flanders_root, args, needle):
    if "--data.root" not in " ".join(args):
        args = [*args, f"--data.root={flanders_root}"]
    res = run_cli(args, cwd=tmp_path, timeout=120)
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    assert needle in res.stderr
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    warned = [line for line in lines if "Warning" in line and "cropscale: warning: " not in line]
    assert not warned, res.stderr  # a data warning is one line of its own, not a source listing
    assert len([line for line in lines if not line.startswith("cropscale: warning: ")]) <= 8, res.stderr


THREADS_LINE = "cropscale: torch threads per process: "


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_fit_on_cpu_sets_and_prints_the_threads_per_process(tmp_path, flanders_root):
    """Issue 28: without OMP_NUM_THREADS, one process on CPU gets the usable cores; ``--threads`` overrides."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    cores = len(os.sched_getaffinity(0))
    quick = ["fit", f"--data.root={flanders_root}", "--trainer.accelerator=cpu", "--trainer.devices=1", *TINY,
             "--trainer.max_steps=1", "--trainer.limit_val_batches=0"]
    for extra, count, why in (([], cores, f"{cores} cores / 1 processes"), (["--threads=1"], 1, "--threads 1")):
        res = subprocess.run([sys.executable, "-m", "cropscale", *quick, *extra], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
        lines = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith(THREADS_LINE)]
        assert lines == [f"{THREADS_LINE}{count} ({why}); override with --threads N or OMP_NUM_THREADS"], (
            res.stderr[-3000:])


def test_fit_ddp_two_cpu_processes(tmp_path, flanders_root):
    res = run_cli(
        ["fit", f"--data.root={flanders_root}", "--trainer.accelerator=cpu", "--trainer.devices=2",
         "--trainer.strategy=ddp", *TINY],
        cwd=tmp_path, env_extra={"OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    run_dir = next((tmp_path / "runs" / "default").glob("version_*"))
    assert "val/mIoU" in scalar_tags(run_dir)
    assert "global batch 4 = local 2 x world size 2" in res.stdout + res.stderr
    assert res.stdout.count("cropscale fit summary") == 1  # rank 0 only (rank 1 shares the pipe)
    assert (res.stdout + res.stderr).count(f"{THREADS_LINE}1 (OMP_NUM_THREADS=1)") == 1  # rank 0 only
    assert "FP32 on 2 device(s) (ddp)" in summary_lines(res.stdout)["ran"]


def test_checkpoint_is_checked_before_lightning_opens_it(tmp_path):
    import torch

    from cropscale import CropScaleError
    from cropscale.cli.main import check_checkpoint

    for keyword in (None, "", "last", "hpc", "registry:model", "s3://bucket/x.ckpt"):
        check_checkpoint(keyword)  # left to Lightning
    good = tmp_path / "good.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "pytorch-lightning_version": "2.6.0"}, good)
    check_checkpoint(str(good))
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    plain = tmp_path / "weights.pt"
    torch.save(torch.nn.Linear(2, 2).state_dict(), plain)
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[:200])
    cases = [
        (tmp_path / "missing.ckpt", "checkpoint file not found: .*missing.ckpt"),
        (text, "notes.txt is not a readable Lightning checkpoint \\(not a torch checkpoint file\\)"),
        (plain, "weights.pt is a torch file but not a Lightning checkpoint "
                "\\(no 'state_dict' / 'pytorch-lightning_version'"),
        (truncated, "truncated.ckpt is not a readable Lightning checkpoint \\(PytorchStreamReader failed"),
    ]
    for path, message in cases:
        with pytest.raises(CropScaleError, match=message):
            check_checkpoint(str(path))
