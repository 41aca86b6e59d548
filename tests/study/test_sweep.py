"""The batch-sweep protocol of the study: spec, plan (G = L x N x A, updates per epoch, not-run points),
fit commands, the holds-to rule, and the sweep's table and figure from a mocked launcher."""

import csv
import json
import math
from pathlib import Path

import pytest

from cropscale import CropScaleError
from cropscale.study import aggregate, launch, plan, runner
from cropscale.study import protocol as P
from cropscale.study import spec as study_spec

REPO_ROOT = Path(__file__).resolve().parents[2]

SWEEP = {
    "name": "batch-sweep",
    "global_batches": [4, 8, 16, 32, 64],
    "max_local_batch": 4,
    "max_accumulation": 8,
    "reference_batch": 4,
    "optimizers": [{"name": "adamw", "lr": 0.001, "lr_scalings": ["sqrt", "none"]},
                   {"name": "lamb", "lr": 0.002, "lr_scalings": ["linear"]}],
    "lr_warmup_epochs": 1,
    "tolerance": 0.05,
}
BASE = {"name": "t", "accelerator": "cpu", "devices": [1, 2], "seeds": [0, 1], "warmup_epochs": 1,
        "measured_epochs": 2, "train_samples_per_epoch": 32, "protocols": [SWEEP]}


def spec_with(sweep=None, **changes):
    data = json.loads(json.dumps(BASE))
    data["protocols"][0].update(sweep or {})
    data.update(changes)
    return study_spec.parse_spec(data, "sweep.yaml")


def test_shipped_batch_specs_parse_and_plan():
    cpu = study_spec.load_spec(REPO_ROOT / "configs/study/batch_cpu.yaml")
    sweep = cpu.protocols[0]
    assert isinstance(sweep, study_spec.BatchSweepSpec) and sweep.global_batches == (4, 8, 16, 32, 64)
    configs = {c.key: c for c in plan.plan_study(cpu, available=2)}
    # hand-computed: 32 samples per epoch, local 4 on 1 process, accumulation G / 4; updates = 32 / G
    for g, acc, updates in ((4, 1, 8), (8, 2, 4), (16, 4, 2), (32, 8, 1)):
        for opt in ("adamw", "lamb"):
            c = configs[f"batch-sweep_{opt}_sqrt_fp32_g{g}"]
            assert c.runnable and (c.plan.local_batch, c.world_size, c.plan.accumulation) == (4, 1, acc)
            assert c.updates_per_epoch == updates and c.notes == ()
    assert configs["batch-sweep_lamb_sqrt_fp32_g32"].plan.lr == pytest.approx(0.002 * math.sqrt(8))
    g64 = configs["batch-sweep_adamw_sqrt_fp32_g64"]
    assert not g64.runnable and "needs accumulation 16" in g64.reason and "above the limit of 8" in g64.reason
    gpu = study_spec.load_spec(REPO_ROOT / "configs/study/batch_gpu.yaml")
    assert max(gpu.protocols[0].global_batches) == 8192 and gpu.accelerator == "gpu"
    # 8 GPUs: G = 8,192 = 32 x 8 x 32 over 1,455 x 8 = 11,640 samples: 2 updates per epoch, the second short
    big = {c.key: c for c in plan.plan_study(gpu, available=8)}
    c = next(c for k, c in big.items() if k.endswith("_g8192") and c.runs_as is None)
    assert (c.plan.local_batch, c.world_size, c.plan.accumulation, c.updates_per_epoch) == (32, 8, 32, 2)
    assert "averages 3448 of G = 8192 samples" in c.notes[0]


@pytest.mark.parametrize("sweep,changes,needle", [
    ({"global_batches": [4, 4]}, {}, "global_batches must be distinct"),
    ({"optimizers": [{"name": "adam", "lr": 1e-3}]}, {}, "name must be one of adamw, sgd, lars, lamb"),
    ({"optimizers": [{"name": "lamb", "lr": 0}]}, {}, "optimizers[0]: lr must be a positive number"),
    ({"optimizers": [{"name": "lamb", "lr": 1e-3, "lr_scalings": ["cubic"]}]}, {}, "lr_scalings must be distinct"),
    ({"max_local_batch": 0}, {}, "max_local_batch must be an integer >= 1"),
    ({"lr_schedule": "step"}, {}, "protocols[0]: lr_schedule: expected one of constant, cosine, got 'step'"),
    ({"optimizers": [{"name": "lamb", "lr": "fast"}]}, {}, "protocols[0]: optimizers[0]: lr: expected a number, got"
                                                          " 'fast'"),
    ({"optimizers": [{"name": "lamb"}]}, {}, "protocols[0]: optimizers[0]: missing lr"),
    ({"tolerance": -0.1}, {}, "protocols[0]: tolerance must be a number >= 0, got -0.1"),
    ({"baseline_optimizer": "sgd"}, {}, "baseline_optimizer 'sgd' is not one of"),
    ({"colour": "red"}, {}, "unknown key(s) colour"),
    ({}, {"train_samples_per_epoch": None}, "batch-sweep needs the spec's train_samples_per_epoch"),
    ({}, {"overrides": ["--model.optimizer=sgd"]}, "'model.optimizer', which the study protocol controls"),
])
def test_bad_sweep_specs_name_the_key(sweep, changes, needle):
    with pytest.raises(CropScaleError) as err:
        spec_with(sweep, **changes)
    assert needle in str(err.value) and "sweep.yaml" in str(err.value)


def test_plan_realises_g_on_the_devices_here_and_lists_the_rest():
    spec = spec_with()
    configs = plan.plan_study(spec, available=2, why="test")
    by_key = {c.key: c for c in configs}
    # two ranks: G = L x 2 x A with L <= 4
    assert [(g, by_key[f"batch-sweep_adamw_sqrt_fp32_g{g}"].plan.local_batch,
             by_key[f"batch-sweep_adamw_sqrt_fp32_g{g}"].world_size,
             by_key[f"batch-sweep_adamw_sqrt_fp32_g{g}"].plan.accumulation) for g in (4, 8, 16, 32, 64)] == [
        (4, 2, 2, 1), (8, 4, 2, 1), (16, 4, 2, 2), (32, 4, 2, 4), (64, 4, 2, 8)]
    # 32 samples per epoch, 16 per rank: U = ceil(ceil(16 / L) / A)
    assert [by_key[f"batch-sweep_adamw_sqrt_fp32_g{g}"].updates_per_epoch for g in (4, 8, 16, 32)] == [8, 4, 2, 1]
    g64 = by_key["batch-sweep_adamw_sqrt_fp32_g64"]
    assert not g64.runnable and "the batch does not form: an epoch of 32 training samples holds no full" in g64.reason
    # only one rank here: G = 64 would need accumulation 16
    one = {c.key: c for c in plan.plan_study(spec, available=1, why="test")}
    assert "too large for this machine" in one["batch-sweep_adamw_sqrt_fp32_g64"].reason
    assert one["batch-sweep_adamw_sqrt_fp32_g32"].plan.accumulation == 8
    # at the reference batch every rule gives the same LR: the none-rule point shares the sqrt point's runs
    assert by_key["batch-sweep_adamw_none_fp32_g4"].runs_as == "batch-sweep_adamw_sqrt_fp32_g4"
    assert by_key["batch-sweep_adamw_none_fp32_g8"].runs_as is None
    assert by_key["batch-sweep_lamb_linear_fp32_g16"].plan.lr == pytest.approx(0.002 * 4)


def test_fit_command_of_a_sweep_point(tmp_path):
    spec = spec_with()
    config = {c.key: c for c in plan.plan_study(spec, 2)}["batch-sweep_lamb_linear_fp32_g16"]
    cmd = launch.fit_command(spec, config, 1, tmp_path, "cpu", None)
    for arg in ("--trainer.devices=2", "--trainer.accumulate_grad_batches=2", "--data.batch_size=4",
                "--model.lr=0.002", "--model.lr_scaling=linear", "--model.reference_batch_size=4",
                "--model.optimizer=lamb", "--model.warmup_steps=0", "--model.warmup_epochs=1.0",
                "--model.schedule=constant", "--trainer.max_epochs=3",
                "--trainer.logger.init_args.name=batch-sweep_lamb_linear_fp32_g16"):
        assert arg in cmd, arg


def test_batch_line_check_compares_the_optimizer():
    p = P.sweep_plan(8, 4, [1], 1e-3, "sqrt", 4, optimizer="lamb")
    line = ("cropscale: global batch 8 = local 4 x world size 1 x accumulation 2; LR rule 'sqrt' vs reference 4:"
            " lr 0.001 -> 0.00141421; optimizer 'lamb'; warm-up 4 update(s), then constant")
    assert launch.check_batch_line(line, p)[0] is True
    assert launch.check_batch_line(line.replace("'lamb'", "'adamw'"), p)[0] is False


B, E, W, INC = aggregate.BASELINE, "equivalent", "worse", "inconclusive"


@pytest.mark.parametrize("points,expected", [
    ([(4, B), (8, E), (16, E), (32, W)], (16, 32)),
    ([(4, B), (8, INC), (16, E)], (4, 8)),                 # equivalent again at 16 does not count
    ([(4, B), (8, E)], (8, None)),                        # every point holds
    ([(8, W), (4, B)], (4, 8)),                           # any order
    ([(4, INC), (8, E)], (None, 4)),                        # not even the smallest G holds (another optimizer)
    ([(4, B), (8, None), (16, E)], (4, 8)),               # a point without a verdict ends the walk
    ([(4, B), (8, "better"), (16, E)], (4, 8)),           # better is not equivalent: the claim stops there
])
def test_holds_to_rule(points, expected):
    assert aggregate.holds_to(points) == expected


# ------------------------------------------------------------------ a whole sweep with a mocked launcher
BASE_IOU = (0.5, 0.515625)  # the baseline (adamw sqrt G = 4), seeds 0 and 1 (exact in float32)
D_IOU = {  # best val macro IoU minus the baseline's, seeds 0 and 1; paired 90 % CI = mean +- 4.4645 sd (df 1)
    ("adamw", "sqrt", 8): (-0.018, -0.022),    # -0.0326..-0.0074: equivalent at margin 0.05
    ("adamw", "sqrt", 16): (-0.078, -0.082),   # -0.0926..-0.0674: worse
    ("adamw", "sqrt", 32): (-0.198, -0.202),
    ("adamw", "none", 8): (-0.03125, -0.03125),  # exact: no spread observed in 2 seeds, no verdict
    ("adamw", "none", 16): (-0.09, -0.05),
    ("adamw", "none", 32): (-0.20, -0.19),
    ("lamb", "sqrt", 4): (-0.015, -0.025),     # -0.0516..+0.0116: inconclusive; 3 seeds per side would decide
    ("lamb", "sqrt", 8): (-0.04, -0.05),
    ("lamb", "sqrt", 16): (-0.10, -0.12),
    ("lamb", "sqrt", 32): (-0.21, -0.20),
}


def _best(opt, rule, g, seed):
    return BASE_IOU[seed] + (0.0 if (opt, g) == ("adamw", 4) else D_IOU[(opt, rule, g)][seed])


def _arg(cmd, key):
    return next(a.split("=", 1)[1] for a in cmd if a.startswith(f"--{key}="))


class FakeFit:
    """Stands in for `fit`: writes a run.json of the documented schema and val/mIoU TensorBoard scalars."""

    def __init__(self):
        self.calls = []

    def __call__(self, cmd, env, log_path, timeout_s):
        from torch.utils.tensorboard import SummaryWriter

        local, acc = int(_arg(cmd, "data.batch_size")), int(_arg(cmd, "trainer.accumulate_grad_batches"))
        n, seed = int(_arg(cmd, "trainer.devices")), int(_arg(cmd, "seed_everything"))
        opt = _arg(cmd, "model.optimizer")
        g = local * n * acc
        self.calls.append((opt, _arg(cmd, "model.lr_scaling"), g, seed))
        run_dir = Path(_arg(cmd, "trainer.logger.init_args.save_dir")) / _arg(
            cmd, "trainer.logger.init_args.name") / _arg(cmd, "trainer.logger.init_args.version")
        run_dir.mkdir(parents=True)
        updates = math.ceil(math.ceil(32 / n / local) / acc)
        epochs = [{"epoch": e, "samples": 32, "train_s": 10.0 * (1 + 1 / g), "val_s": 1.0, "wall_s": 12.0}
                  for e in range(3)]
        doc = {"schema": "cropscale.run/1", "status": "finished", "trainer": {"max_epochs": 3},
               "global_step": 3 * updates, "summary": {"throughput": {"epochs": epochs}}}
        (run_dir / "run.json").write_text(json.dumps(doc))
        writer = SummaryWriter(str(run_dir))
        best = _best(opt, _arg(cmd, "model.lr_scaling"), g, seed)
        for epoch, value in enumerate((best - 0.1, best, best - 0.05)):
            writer.add_scalar("val/mIoU", value, epoch)
            writer.add_scalar("epoch", epoch, epoch)
        writer.close()
        lr = float(_arg(cmd, "model.lr"))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(f"cropscale: global batch {g} = local {local} x world size {n} x accumulation {acc};"
                            f" LR rule 'x' vs reference 4: lr {lr} -> {self._lr(cmd, g)}; optimizer '{opt}'\n")
        return launch.LaunchResult(0, 1.0, str(log_path))

    @staticmethod
    def _lr(cmd, g):
        from cropscale.model.optim import scale_learning_rate

        return scale_learning_rate(float(_arg(cmd, "model.lr")), g, 4, _arg(cmd, "model.lr_scaling"))


def test_sweep_end_to_end_with_a_mocked_fit(tmp_path):
    spec = spec_with({"optimizers": [{"name": "adamw", "lr": 0.001, "lr_scalings": ["sqrt", "none"]},
                                     {"name": "lamb", "lr": 0.002, "lr_scalings": ["sqrt"]}]}, devices=[1])
    fake = FakeFit()
    doc = runner.run_study(spec, tmp_path / "s", launcher=fake, available=1, echo=lambda s: None)
    # 2 seeds x (adamw sqrt 4 G + adamw none 3 G (G = 4 shared) + lamb sqrt 4 G); G = 64 never launched
    assert len(fake.calls) == 2 * (4 + 3 + 4) and all(g != 64 for *_, g, _ in fake.calls)
    assert all(r["batch_check"]["ok"] is True for r in doc["runs"])
    rows = {(r["optimizer"], r["lr_scaling"], r["global_batch"]): r for r in doc["rows"]}
    for g, updates in ((4, 8), (8, 4), (16, 2), (32, 1)):
        row = rows[("adamw", "sqrt", g)]
        assert row["evidence"] == "measured-run" and row["updates_per_epoch"] == updates
        values = [_best("adamw", "sqrt", g, s) for s in (0, 1)]
        assert row["best_miou"] == pytest.approx(sum(values) / 2, abs=1e-6)
        assert row["best_miou_sd"] == pytest.approx(abs(values[0] - values[1]) / math.sqrt(2), abs=1e-6)
        assert not any("planned" in n for n in row["notes"]), row["notes"]  # measured global_step = plan
        assert row["speedup_vs_1_device"] is None  # no device-scaling figures on sweep rows
    assert rows[("adamw", "none", 4)]["best_miou"] == pytest.approx(sum(BASE_IOU) / 2)  # the shared runs
    sweep = doc["batch_sweep"]
    assert sweep["baseline"]["optimizer"] == "adamw" and sweep["baseline"]["global_batch"] == 4
    curves = {(c["optimizer"], c["lr_scaling"]): c for c in sweep["curves"]}
    # "holds to G" comes from the verdicts (margin = the sweep's tolerance 0.05), not from the means
    adamw, none, lamb = curves[("adamw", "sqrt")], curves[("adamw", "none")], curves[("lamb", "sqrt")]
    assert (adamw["holds_to"], adamw["stops_at"]) == (8, 16)
    assert adamw["verdict"].startswith("holds to G = 8 at this budget (a run still improving); at G = 16 worse"
                                       " (-0.0800, 90 % CI -0.0926..-0.0674 below -0.05, one-sided t alpha = 0.05")
    assert "(not run: G = 64)" in adamw["verdict"]
    assert (none["holds_to"], none["stops_at"]) == (4, 8)  # G = 4 shares the baseline's runs
    assert none["verdict"].startswith("holds to G = 4; cannot say beyond G = 4: at G = 8 inconclusive (-0.0312, no CI:"
                                      " no spread observed in 2 seeds")
    assert (lamb["holds_to"], lamb["stops_at"]) == (None, 4)
    assert lamb["verdict"].startswith("cannot say at any G: at its smallest G = 4 inconclusive (-0.0200, 90 % CI"
                                      " -0.0516..+0.0116 crosses +-0.05")
    assert "seeds that would decide: about 3 per side" in lamb["verdict"]
    assert any(v.startswith("adamw sqrt G 8 vs FP32 adamw sqrt G 4: quality equivalent") for v in doc["verdicts"])
    assert {(g, o, r) for _, g, o, r, _ in sweep["not_run"]} == {(64, "adamw", "sqrt"), (64, "adamw", "none"),
                                                                  (64, "lamb", "sqrt")}
    assert [(c["optimizer"], c["lr_scaling"]) for c in sweep["curves"]] == [("adamw", "sqrt"), ("adamw", "none"),
                                                                            ("lamb", "sqrt")]  # the spec's order
    table = (tmp_path / "s" / "study_table.md").read_text()
    assert "## Batch sweep" in table and "## Batch sweep: not run" in table and "G = 64, adamw" in table
    assert "holds to G = 8" in table and "measured-run" in table and "analytical-scenario" not in table
    assert "TOST at alpha = 0.05" in table and "| Verdict vs baseline (alpha = 0.05) |" in table
    with open(tmp_path / "s" / "batch_sweep.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == 12 and {r["evidence"] for r in csv_rows} == {"measured-run"}
    g16 = next(r for r in csv_rows if (r["optimizer"], r["lr_scaling"], r["global_batch"]) == ("adamw", "sqrt", "16"))
    assert float(g16["best_miou_delta"]) == pytest.approx(-0.08, abs=1e-6) and g16["holds"] == "worse"
    assert g16["best_miou_delta_ci"] == "-0.0926..-0.0674"
    g4 = next(r for r in csv_rows if (r["optimizer"], r["lr_scaling"], r["global_batch"]) == ("adamw", "sqrt", "4"))
    assert g4["holds"] == "baseline"
    assert g16["updates_total"] == "6"  # 2 per epoch x 3 epochs
    assert (tmp_path / "s" / "figures" / "batch_sweep.png").stat().st_size > 10_000
    assert not (tmp_path / "s" / "figures" / "scaling.png").exists()


# ------------------------------------------------------------------ the CPU sweep end to end (real fits)
@pytest.mark.slow
def test_cpu_batch_sweep_end_to_end(tmp_path, flanders_root):
    """configs/study/batch_cpu.yaml shortened to AdamW at G = 4 and 32, one seed, 2 epochs, through the CLI:
    each point a real fit whose printed batch line and global step match the plan."""
    import os
    import subprocess
    import sys

    import yaml

    data = yaml.safe_load((REPO_ROOT / "configs/study/batch_cpu.yaml").read_text())
    data["protocols"][0].update(global_batches=[4, 32, 64], optimizers=[{"name": "adamw", "lr": 0.001}])
    data.update(seeds=[0], warmup_epochs=1, measured_epochs=1)
    spec_path = tmp_path / "batch_short.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    res = subprocess.run(
        [sys.executable, "-m", "cropscale", "study", "--config", str(spec_path), "--output", str(tmp_path / "s"),
         "--data-root", str(flanders_root)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    doc = json.loads((tmp_path / "s" / "study.json").read_text())
    assert [(r["config"], r["returncode"], r["batch_check"]["ok"]) for r in doc["runs"]] == [
        ("batch-sweep_adamw_sqrt_fp32_g4", 0, True), ("batch-sweep_adamw_sqrt_fp32_g32", 0, True)]
    rows = {r["global_batch"]: r for r in doc["rows"]}
    # 32 samples per epoch at local batch 4 on 1 process: 8 updates (A = 1) and 1 update (A = 8)
    assert (rows[4]["accumulation"], rows[4]["updates_per_epoch"]) == (1, 8)
    assert (rows[32]["accumulation"], rows[32]["updates_per_epoch"]) == (8, 1)
    for row in rows.values():
        assert not any("planned" in n for n in row["notes"]), row["notes"]  # the run's global step agrees
        assert 0 <= row["best_miou"] <= 1 and row["samples_per_s"] > 0
    assert [n[1] for n in doc["batch_sweep"]["not_run"]] == [64]
    assert "## Batch sweep" in res.stdout and (tmp_path / "s" / "figures" / "batch_sweep.png").is_file()
