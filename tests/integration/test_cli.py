"""The main job end to end: `python -m cropscale fit` on the bundled real sample, help, config, errors."""

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


def test_help_lists_subcommands(tmp_path):
    res = run_cli(["--help"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for word in ("fit", "validate", "benchmark", "report", "study", "scaling", "summary"):
        assert word in res.stdout


def test_print_config_resolves_default(tmp_path, flanders_root):
    res = run_cli(["fit", "--print_config", f"--data.root={flanders_root}", "--trainer.devices=2"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "gradient_clip_val: 1.0" in out
    assert "devices: 2" in out or "devices: '2'" in out
    assert "worldcereal-flanders" in out
    assert "TensorBoardLogger" in out and "default_hp_metric: false" in out


def test_fit_end_to_end_on_real_sample(tmp_path, flanders_root):
    res = run_cli(["fit", f"--data.root={flanders_root}", *TINY], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    run_dirs = sorted((tmp_path / "runs" / "default").glob("version_*"))
    assert len(run_dirs) == 1
    run_dir = run_dirs[0]
    tags = scalar_tags(run_dir)
    for key in ("train/loss_step", "train/loss_epoch", "val/loss", "val/mIoU", "val/mIoU_best",
                "train/loss_semantic", "train/loss_parcel", "train/loss_hr"):
        assert key in tags, (key, sorted(tags))
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt"))
    assert "best-epoch00.ckpt" in ckpts and "last.ckpt" in ckpts, ckpts
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "hparams.yaml").is_file()


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
    assert len(res.stderr.strip().splitlines()) <= 8, res.stderr


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


def test_checkpoint_is_checked_before_lightning_opens_it(tmp_path):
    import torch

    from cropscale import CropScaleError
    from cropscale.cli import check_checkpoint

    for keyword in (None, "", "last", "best", "hpc", "registry:model", "s3://bucket/x.ckpt"):
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
