"""`python -m cropscale validate` of the real task gives identical metrics on 1 and 2 CPU processes.

Three real PASTIS-R patches (fold 1 of pastis-r-mini) validated on 2 ranks: a world size that does not
divide the number of patches, where Lightning's padding DistributedSampler would count one patch twice.
"""

import pytest

from tests.integration.test_cli import run_cli, scalar_tags

VALIDATE = [
    "validate", "--seed_everything=0", "--data.train_folds=[2]", "--data.val_folds=[1]",
    "--data.ignore_index=19", "--data.t2=3", "--data.t1=3", "--trainer.accelerator=cpu",
]


def _metrics(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values = {}
    for event_file in run_dir.glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(event_file), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            if tag.startswith(("val/", "val_class/")):
                values[tag] = acc.Scalars(tag)[-1].value
    return values


def test_validation_metrics_identical_on_one_and_two_processes(tmp_path, pastis_mini_root):
    results = {}
    for devices in (1, 2):
        cwd = tmp_path / f"n{devices}"
        cwd.mkdir()
        args = [*VALIDATE, f"--data.root={pastis_mini_root}", f"--trainer.devices={devices}"]
        if devices > 1:
            args.append("--trainer.strategy=ddp")
        res = run_cli(args, cwd=cwd, env_extra={"OMP_NUM_THREADS": "1"})
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
        run_dir = next((cwd / "runs" / "default").glob("version_*"))
        assert "val/mIoU" in scalar_tags(run_dir)
        results[devices] = _metrics(run_dir)
    one, two = results[1], results[2]
    assert set(one) == set(two)
    assert any(k.startswith("val_class/") for k in one)
    for key in one:
        if key == "val/loss":  # a mean of per-batch means: equal up to float32 summation order
            assert two[key] == pytest.approx(one[key], rel=1e-5)
        else:  # confusion-matrix based: exactly equal
            assert two[key] == one[key], (key, one[key], two[key])
