"""The scaling-study runner: spec validation, planning, fit commands, the not-launched rule with a
mocked launcher (analytical-scenario rows), and the CPU study end to end (slow)."""

import csv
import json
import math
import os
import sys
from pathlib import Path

import pytest

from cropscale import CropScaleError
from cropscale.study import launch, plan, runner
from cropscale.study import protocol as P
from cropscale.study import spec as study_spec

REPO_ROOT = Path(__file__).resolve().parents[2]

BASE = {
    "name": "t",
    "accelerator": "cpu",
    "devices": [1, 2, 4],
    "protocols": [
        {"name": "equal-global", "local_batch": 1, "global_batch": 4, "lr_scaling": "sqrt"},
        {"name": "equal-local", "local_batch": 2, "lr_scaling": "sqrt"},
    ],
    "seeds": [0, 1],
    "warmup_epochs": 1,
    "measured_epochs": 2,
    "train_samples_per_epoch": 16,
    "num_params": 1_947_456,
    "allreduce": {"alpha_us": 0.0, "bandwidth_gb_s": 1.0},
}


def spec_with(**changes):
    data = json.loads(json.dumps(BASE))
    data.update(changes)
    return study_spec.parse_spec(data, "test.yaml")


def test_shipped_specs_parse():
    cpu = study_spec.load_spec(REPO_ROOT / "configs/study/cpu.yaml")
    assert cpu.devices == (1, 2, 4, 8) and cpu.seeds == (0, 1) and cpu.accelerator == "cpu"
    assert [p.name for p in cpu.protocols] == ["equal-global", "equal-local"]
    gpu = study_spec.load_spec(REPO_ROOT / "configs/study/gpu_full.yaml")
    assert gpu.devices == (1, 2, 4, 8) and gpu.seeds == (0, 1, 2)
    assert (gpu.warmup_epochs, gpu.measured_epochs, gpu.max_epochs) == (5, 5, 10)
    assert gpu.precisions == ("fp32", "amp_fp16") and gpu.strategy == "ddp" and gpu.accelerator == "gpu"


@pytest.mark.parametrize(
    "changes,needle",
    [
        ({"devices": [2, 4]}, "must include 1"),
        ({"colour": "red"}, "unknown study key(s) colour"),
        ({"overrides": ["--data.batch_size=8"]}, "'data.batch_size', which the study protocol controls"),
        ({"overrides": ["data.samples_per_patch=8"]}, "must look like --key.sub=value"),
        ({"devices": [1, 8]}, "protocols[0] (equal-global) on 8 device(s): global batch 4 cannot be split"),
        ({"precisions": ["fp8"]}, "precision 'fp8' is not one of"),
        ({"strategy": "horovod"}, "strategy: expected one of ddp, fsdp, got 'horovod'"),
        ({"measured_epochs": 0}, "measured_epochs must be an integer >= 1"),
        # types, checked by jsonargparse against the StudySpec / ProtocolSpec fields
        ({"warmup_epochs": "two"}, "test.yaml: warmup_epochs: expected an integer, got 'two'"),
        ({"accelerator": "tpu"}, "test.yaml: accelerator: expected one of cpu, gpu, cuda, auto, got 'tpu'"),
        ({"run_timeout_s": "long"}, "test.yaml: run_timeout_s: expected a number, got 'long'"),
        ({"protocols": [{"name": "equal-local", "local_batch": "big"}]},
         "test.yaml: protocols[0]: local_batch: expected an integer, got 'big'"),
        ({"protocols": [{"name": "equal-local"}]}, "test.yaml: protocols[0]: missing local_batch"),
        ({"protocols": [{"name": "equal-local", "local_batch": 1, "batch": 2}]},
         "test.yaml: protocols[0]: unknown key(s) batch; known: global_batch, local_batch, lr_scaling, name,"),
    ],
)
def test_bad_specs_name_the_key(changes, needle):
    with pytest.raises(CropScaleError) as err:
        spec_with(**changes)
    assert needle in str(err.value)
    assert "test.yaml" in str(err.value)


def test_plan_marks_configurations_beyond_the_machine():
    spec = spec_with()
    configs = plan.plan_study(spec, available=2, why="test")
    assert [(c.key, c.runnable) for c in configs] == [
        ("equal-global_fp32_n1", True), ("equal-global_fp32_n2", True), ("equal-global_fp32_n4", False),
        ("equal-local_fp32_n1", True), ("equal-local_fp32_n2", True), ("equal-local_fp32_n4", False),
    ]
    by_key = {c.key: c for c in configs}
    eg2, el4 = by_key["equal-global_fp32_n2"], by_key["equal-local_fp32_n4"]
    assert (eg2.plan.accumulation, eg2.plan.global_batch, eg2.updates_per_epoch) == (2, 4, 4)
    assert (el4.plan.accumulation, el4.plan.global_batch, el4.updates_per_epoch) == (1, 8, 2)
    assert el4.plan.lr == pytest.approx(2e-3)  # sqrt(8 / 2) x 1e-3
    assert "needs 4 device(s), 2 available (test)" in el4.reason


def test_available_devices_cpu_default_and_override():
    assert plan.available_devices(spec_with(), "cpu") == (os.cpu_count(), "os.cpu_count()")
    assert plan.available_devices(spec_with(max_cpu_processes=3), "cpu")[0] == 3


def test_fit_command_carries_the_protocol(tmp_path):
    spec = spec_with()
    configs = {c.key: c for c in plan.plan_study(spec, 8)}
    cmd = launch.fit_command(spec, configs["equal-global_fp32_n2"], 1, tmp_path / "runs", "cpu", "/data/x")
    assert cmd[:4] == [sys.executable, "-m", "cropscale", "fit"]
    for arg in ("--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.num_nodes=1",
                "--trainer.max_epochs=3", "--trainer.accumulate_grad_batches=2", "--data.batch_size=1",
                "--model.lr=0.001", "--model.lr_scaling=sqrt", "--model.reference_batch_size=4",
                "--seed_everything=1", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
                "--trainer.logger.init_args.name=equal-global_fp32_n2",
                "--trainer.logger.init_args.version=seed1", "--data.root=/data/x"):
        assert arg in cmd, arg
    configs_given = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--config"]
    assert configs_given[-2].endswith("configs/precision/fp32.yaml")
    assert configs_given[-1].endswith("configs/strategy/ddp.yaml")
    one = launch.fit_command(spec, configs["equal-global_fp32_n1"], 0, tmp_path, "cpu", None)
    assert [one[i + 1] for i, a in enumerate(one) if a == "--config"][-1].endswith("configs/strategy/single.yaml")
    assert not any(a.startswith("--data.root") for a in one)


def test_launcher_template_for_several_nodes(tmp_path, monkeypatch):
    monkeypatch.setenv("HEAD_NODE", "node0")
    spec = spec_with(devices=[1, 2, 4], devices_per_node=2, max_nodes=2,
                     launcher=["torchrun", "--nnodes={nodes}", "--nproc_per_node={devices_per_node}",
                               "--node_rank={node_rank}", "--rdzv_endpoint=$HEAD_NODE:29500", "-m", "cropscale"])
    configs = {c.key: c for c in plan.plan_study(spec, 4)}
    cmd = launch.fit_command(spec, configs["equal-local_fp32_n4"], 0, tmp_path, "gpu", None, node_rank=1)
    assert cmd[:8] == ["torchrun", "--nnodes=2", "--nproc_per_node=2", "--node_rank=1",
                       "--rdzv_endpoint=node0:29500", "-m", "cropscale", "fit"]
    assert "--trainer.devices=2" in cmd and "--trainer.num_nodes=2" in cmd


def test_batch_line_check():
    plan = P.batch_plan("equal-local", 2, 2, lr_scaling="sqrt")
    line = ("cropscale: global batch 4 = local 2 x world size 2 x accumulation 1; LR rule 'sqrt' vs reference 2:"
            " lr 0.001 -> 0.00141421")
    assert launch.check_batch_line("x\n" + line + "\n", plan)[0] is True
    assert launch.check_batch_line(line.replace("-> 0.00141421", "-> 0.002"), plan)[0] is False
    assert launch.check_batch_line("nothing", plan)[0] is None


def test_dry_run_launches_nothing(tmp_path):
    calls = []
    runner.run_study(spec_with(), tmp_path / "study", launcher=lambda *a: calls.append(a), available=2, dry_run=True,
                echo=lambda s: None)
    assert calls == [] and not (tmp_path / "study").exists()


# ------------------------------------------------------------------ mocked launcher: never run, analytical
T_TRAIN = {1: 100.0, 2: 60.0}  # training-epoch seconds a fake run "measures", by world size


def _arg(cmd, key):
    return next(a.split("=", 1)[1] for a in cmd if a.startswith(f"--{key}="))


class FakeLauncher:
    """Stands in for the fit process: records the command and writes a run.json of the documented
    schema (docs/run_json.md) with the training-epoch times of ``T_TRAIN``."""

    def __init__(self):
        self.calls = []

    def __call__(self, cmd, env, log_path, timeout_s):
        n = int(_arg(cmd, "trainer.devices")) * int(_arg(cmd, "trainer.num_nodes"))
        self.calls.append(n)
        run_dir = Path(_arg(cmd, "trainer.logger.init_args.save_dir")) / _arg(
            cmd, "trainer.logger.init_args.name") / _arg(cmd, "trainer.logger.init_args.version")
        run_dir.mkdir(parents=True)
        epochs = [{"epoch": e, "samples": 16, "train_s": T_TRAIN[n] * (3 if e == 0 else 1), "val_s": 5.0,
                   "wall_s": T_TRAIN[n] + 5.0} for e in range(3)]
        step = {"median": 10.0 * n, "p95": 12.0 * n, "n": 4}
        timing = [{"epoch": e, "windows_ms": {"step": step, "data_wait": {"median": 1.0 * n},
                                              "comm_exposed": {"median": 2.0 if n > 1 else None}}}
                  for e in range(3)]
        acc = int(_arg(cmd, "trainer.accumulate_grad_batches"))
        local = int(_arg(cmd, "data.batch_size"))
        updates = math.ceil(math.ceil(math.ceil(16 / n) / local) / acc)
        doc = {"schema": "cropscale.run/1", "status": "finished", "trainer": {"max_epochs": 3},
               "global_step": 3 * updates,
               "summary": {"throughput": {"epochs": epochs}, "step_timing": {"epochs": timing},
                           "energy": {"available": False}}}
        (run_dir / "run.json").write_text(json.dumps(doc))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("fake\n")
        return launch.LaunchResult(0, 1.0, str(log_path))


def test_configuration_beyond_the_machine_is_not_launched(tmp_path):
    spec = spec_with()
    fake = FakeLauncher()
    doc = runner.run_study(spec, tmp_path / "study", launcher=fake, available=2, echo=lambda s: None)
    # 2 protocols x (N = 1, 2) x 2 seeds launched; never a 4-rank run
    assert sorted(fake.calls) == [1] * 4 + [2] * 4
    assert 4 not in fake.calls
    rows = {(r["protocol"], r["world_size"]): r for r in doc["rows"]}
    for proto in ("equal-global", "equal-local"):
        assert rows[(proto, 1)]["evidence"] == rows[(proto, 2)]["evidence"] == "measured-run"
        assert rows[(proto, 4)]["evidence"] == "analytical-scenario"
        assert rows[(proto, 4)]["seeds"] == 0
        assert "not run (needs 4 device(s), 2 available" in rows[(proto, 4)]["notes"][0]
        assert rows[(proto, 4)]["median_step_ms"] is None  # nothing measured is invented
    # measured rows first, then the analytical block
    evidence = [r["evidence"] for r in doc["rows"]]
    assert evidence == sorted(evidence, key=lambda e: e != "measured-run")
    eg2 = rows[("equal-global", 2)]
    assert eg2["train_epoch_s"] == pytest.approx(60.0)  # the warm-up epoch (3x slower) is left out
    assert eg2["speedup_vs_1_device"] == pytest.approx(100 / 60) and eg2["efficiency"] == pytest.approx(100 / 120)
    assert eg2["karp_flatt"] == pytest.approx(0.2)  # Karp-Flatt (0.6 - 0.5) / 0.5
    assert eg2["loader_wait_share"] == pytest.approx(0.1) and eg2["exposed_comm_share"] == pytest.approx(0.1)
    assert eg2["median_step_ms"] == pytest.approx(20.0) and eg2["p95_step_ms"] == pytest.approx(24.0)
    assert eg2["samples_per_s"] == pytest.approx(16 / 60)
    # T_4 = T_1 (e + (1 - e)/4) + U_4 (t_c(4) - t_c(2)); ring all-reduce with alpha 0, B_eff 1 GB/s:
    # t_c(N) = 2 (N - 1)/N x M / B_eff with M = 1,947,456 x 4 bytes; U_4 = 4 (equal-global, G = 4, S = 16)
    m = 1_947_456 * 4
    t4 = 100 * (0.2 + 0.8 / 4) + 4 * (1.5 * m / 1e9 - 1.0 * m / 1e9)
    eg4 = rows[("equal-global", 4)]
    assert eg4["updates_per_epoch"] == 4
    assert eg4["train_epoch_s"] == pytest.approx(t4, rel=1e-9)
    assert eg4["speedup_vs_1_device"] == pytest.approx(100 / t4) and eg4["efficiency"] == pytest.approx(100 / t4 / 4)
    assert eg4["samples_per_s"] == pytest.approx(0.16 * 100 / t4)
    el4 = rows[("equal-local", 4)]
    assert el4["updates_per_epoch"] == 2 and el4["global_batch"] == 8
    assert el4["train_epoch_s"] == pytest.approx(100 * 0.4 + 2 * (1.5 * m / 1e9 - 1.0 * m / 1e9), rel=1e-9)
    # the study folder: study.json, table (Markdown + CSV) with the evidence label on every row
    table = (tmp_path / "study" / "study_table.md").read_text()
    assert table.count("analytical-scenario") >= 2 and table.count("measured-run") >= 4
    with open(tmp_path / "study" / "study_table.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert [r["evidence"] for r in csv_rows].count("analytical-scenario") == 2
    assert json.loads((tmp_path / "study" / "study.json").read_text())["failed_runs"] == 0


# ------------------------------------------------------------------ the CPU study end to end
@pytest.mark.slow
def test_cpu_study_end_to_end(tmp_path, flanders_root):
    """configs/study/cpu.yaml, shortened (one seed, 1 warm-up + 1 measured epoch), through the CLI:
    measured-run rows for 1 and 2 gloo processes, analytical-scenario rows for 4 and 8."""
    import subprocess

    import yaml

    data = yaml.safe_load((REPO_ROOT / "configs/study/cpu.yaml").read_text())
    data.update(seeds=[0], warmup_epochs=1, measured_epochs=1)
    spec_path = tmp_path / "cpu_short.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    res = subprocess.run(
        [sys.executable, "-m", "cropscale", "study", "--config", str(spec_path), "--output", str(tmp_path / "study"),
         "--data-root", str(flanders_root), "--max-devices", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    doc = json.loads((tmp_path / "study" / "study.json").read_text())
    assert sorted((r["config"], r["returncode"]) for r in doc["runs"]) == [
        ("equal-global_fp32_n1", 0), ("equal-global_fp32_n2", 0), ("equal-local_fp32_n1", 0),
        ("equal-local_fp32_n2", 0)]
    assert all(r["batch_check"]["ok"] is True for r in doc["runs"]), [r["batch_check"] for r in doc["runs"]]
    rows = {(r["protocol"], r["world_size"]): r for r in doc["rows"]}
    for proto in ("equal-global", "equal-local"):
        for n in (1, 2):
            row = rows[(proto, n)]
            assert row["evidence"] == "measured-run"
            assert row["train_epoch_s"] > 0 and row["samples_per_s"] > 0 and row["median_step_ms"] > 0
            assert 0 <= row["final_miou"] <= 1
            assert row["updates_per_epoch"] == P.optimizer_updates_per_epoch(32, row["local_batch"], n,
                                                                                row["accumulation"])
            assert not any("optimizer updates/epoch, planned" in note for note in row["notes"]), row["notes"]
        # the one speed-up: samples/s ratio (= T_1 / T_2 here: the same 32 samples, one measured epoch)
        assert rows[(proto, 2)]["speedup_vs_1_device"] == pytest.approx(rows[(proto, 2)]["samples_per_s"]
                                                            / rows[(proto, 1)]["samples_per_s"])
        # Karp-Flatt at N = 2 by hand, e = (1/S - 1/N) / (1 - 1/N): on a shared 2-core machine the two-process run
        # may meet other load (S < 1, e > 1); the rule is then a refusal that says why, not an extrapolation
        s2 = rows[(proto, 2)]["samples_per_s"] / rows[(proto, 1)]["samples_per_s"]
        e = (1 / s2 - 1 / 2) / (1 - 1 / 2)
        assert rows[(proto, 2)]["karp_flatt"] == pytest.approx(e)
        for n in (4, 8):
            row = rows[(proto, n)]
            assert row["evidence"] == "analytical-scenario" and row["final_miou"] is None
            if 0 <= e <= 1:
                t1 = rows[(proto, 1)]["train_epoch_s"]  # Amdahl's T_N, plus the modelled growth of the all-reduce
                assert row["train_epoch_s"] > t1 * (e + (1 - e) / n), row["notes"]
                assert row["speedup_vs_1_device"] == pytest.approx(t1 / row["train_epoch_s"])
            else:
                assert row["train_epoch_s"] is None, row["notes"]
                e_text = f"e = {rows[(proto, 2)]['karp_flatt']:.3f} measured at N = 2 lies outside [0, 1]"
                assert any(e_text in note for note in row["notes"]), row["notes"]
    table = (tmp_path / "study" / "study_table.md").read_text()
    assert "measured-run" in table and "analytical-scenario" in table
    assert "measured-run" in res.stdout  # the table is printed
    # the prediction check from N = 1 alone, both protocols, and the device verdicts (1 seed: inconclusive)
    assert len(doc["prediction_checks"]) == 2 and all("error" in c for c in doc["prediction_checks"])
    assert "## Prediction check" in table and "## Verdicts" in table
    assert any("quality inconclusive (" in v and "no CI: 1 seed on a side" in v for v in doc["verdicts"])


def test_resume_keeps_finished_runs(tmp_path):
    spec = spec_with(devices=[1, 2])
    first, second = FakeLauncher(), FakeLauncher()
    runner.run_study(spec, tmp_path / "s", launcher=first, available=2, echo=lambda s: None)
    doc = runner.run_study(spec, tmp_path / "s", launcher=second, available=2, resume=True, echo=lambda s: None)
    assert len(first.calls) == 8 and second.calls == []
    assert all(r.get("resumed") for r in doc["runs"])
    assert [r["evidence"] for r in doc["rows"]] == ["measured-run"] * 4


def test_missing_data_root_fails_before_any_launch(tmp_path):
    calls = []
    spec = spec_with(base_configs=["configs/pastis_hd.yaml"])  # data.root: null
    with pytest.raises(CropScaleError, match="no data root.*--data-root"):
        runner.run_study(spec, tmp_path / "s", launcher=lambda *a: calls.append(a), available=2, echo=lambda s: None)
    with pytest.raises(CropScaleError, match="data root not found: /nonexistent/pastis"):
        runner.run_study(spec, tmp_path / "s", data_root="/nonexistent/pastis", launcher=lambda *a: calls.append(a),
                    available=2, echo=lambda s: None)
    assert calls == []


def test_failed_run_is_reported_not_hidden(tmp_path):
    class FailOne(FakeLauncher):
        def __call__(self, cmd, env, log_path, timeout_s):
            if _arg(cmd, "trainer.devices") == "2" and _arg(cmd, "seed_everything") == "1":
                log_path.parent.mkdir(parents=True, exist_ok=True)
                log_path.write_text("boom\n")
                return launch.LaunchResult(1, 0.5, str(log_path))
            return super().__call__(cmd, env, log_path, timeout_s)

    doc = runner.run_study(spec_with(devices=[1, 2]), tmp_path / "s", launcher=FailOne(), available=2,
                           echo=lambda s: None)
    assert doc["failed_runs"] == 2  # one per protocol
    row = next(r for r in doc["rows"] if r["protocol"] == "equal-global" and r["world_size"] == 2)
    assert row["seeds"] == 1 and "1 of 2 runs failed (see logs/): left out" in row["notes"]


def test_progress_of_the_runs_goes_to_stderr(tmp_path, capsys):
    out_lines = []
    runner.run_study(spec_with(), tmp_path / "study", launcher=FakeLauncher(), available=2, echo=out_lines.append)
    err = capsys.readouterr().err.splitlines()
    starts = [ln for ln in err if ln.startswith("study: [")]
    # 2 protocols x (N = 1, 2) x 2 seeds = 8 runs, numbered 1..8 of 8
    assert [ln.split("]")[0] for ln in starts] == [f"study: [{i}/8" for i in range(1, 9)]
    assert "left" in starts[1]  # from the second run on, the time left is estimated
    assert not any(ln.startswith("study: [") for ln in out_lines)
