"""What a TensorBoard user sees, read back from the event files of real runs (``python -m cropscale`` on the bundled
sample; the AMP and energy charts from ToyTask fits with a real GradScaler and a fake NVML): the custom-scalars
layout's tags each match a logged tag, the first screen, HPARAMS against ``run.json``, evaluation runs apart."""

from __future__ import annotations

import json
import re
import statistics
import urllib.parse
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins import MixedPrecision

from cropscale.callbacks import CallbackGroup, ThroughputCallback, all_scaling_callbacks
from cropscale.env import nvml
from cropscale.runs.record import find_runs, load_run
from cropscale.runs.tensorboard import LAYOUT, custom_scalars_layout, first_screen_url
from cropscale.testing.toy import ToyTask
from tests.callbacks.test_fit import CountingNvml
from tests.integration.test_cli import run_cli

# one epoch of 6 steps on the real sample (the CLI test's smallest measured run)
FIT = ["--trainer.max_epochs=1", "--data.samples_per_patch=3", "--data.batch_size=1", "--trainer.log_every_n_steps=1"]


def _accumulator(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert list(folder.glob("events.out.tfevents.*")), f"no event file in {folder}"
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _scalars(folder: Path) -> dict[str, list[float]]:
    acc = _accumulator(folder)
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory, flanders_root):
    """``fit``, then ``validate`` from its last checkpoint, then ``validate`` without a checkpoint."""
    tmp = tmp_path_factory.mktemp("tb")
    fit = run_cli(["fit", f"--data.root={flanders_root}", *FIT], cwd=tmp)
    assert fit.returncode == 0, fit.stdout[-2000:] + fit.stderr[-4000:]
    run_dir = tmp / "runs" / "default" / "version_0"
    config_before = (run_dir / "config.yaml").read_bytes()
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    val = run_cli(["validate", f"--data.root={flanders_root}", f"--ckpt_path={ckpt}"], cwd=tmp)
    assert val.returncode == 0, val.stderr[-4000:]
    bare = run_cli(["validate", f"--data.root={flanders_root}"], cwd=tmp)
    assert bare.returncode == 0, bare.stderr[-4000:]
    return {"root": tmp / "runs", "run_dir": run_dir, "config_before": config_before,
            "record": json.loads((run_dir / "run.json").read_text()), "validate_output": val.stdout + val.stderr}


def _written_layout(folder: Path) -> dict[str, dict[str, list[str]]]:
    """``{category: {title: patterns}}`` as written: a multiline chart's tag regexes, a margin chart's three tags as
    exact patterns (``^tag$``: TensorBoard's margin charts take tags, not regexes)."""
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    acc = _accumulator(folder)
    (event,) = acc.Tensors(metadata.CONFIG_SUMMARY_TAG)
    layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])

    def patterns(chart) -> list[str]:
        if chart.HasField("margin"):
            return [f"^{re.escape(t)}$" for s in chart.margin.series for t in (s.value, s.lower, s.upper)]
        return list(chart.multiline.tag)

    return {cat.title: {chart.title: patterns(chart) for chart in cat.chart} for cat in layout.category}


def _unmatched(layout: dict[str, dict[str, list[str]]], tags: set[str]) -> list[str]:
    """The layout's regexes that match no tag (TensorBoard's custom-scalars plugin uses ``re.search``)."""
    return [rx for charts in layout.values() for rxs in charts.values() for rx in rxs
            if not any(re.search(rx, tag) for tag in tags)]


def _steps(folder: Path) -> dict[str, list[int]]:
    acc = _accumulator(folder)
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_the_written_layout_matches_logged_tags(cli_runs):
    layout = _written_layout(cli_runs["run_dir"])
    tags = set(_scalars(cli_runs["run_dir"]))
    # a CPU FP32 run: no GradScaler and no GPU, so no AMP, energy, GPU-memory or MFU chart
    assert list(layout) == ["1 quality", "2 step time per epoch", "3 step time per log interval", "4 throughput",
                            "6 memory"]
    assert _unmatched(layout, tags) == []
    each = {t for rxs in layout["3 step time per log interval"].values() for t in tags if re.search(rxs[0], t)}
    assert each == {f"perf/step/{w}_ms" for w in ("step", "data_wait", "transfer", "forward", "backward",
                                                  "optimizer", "remainder")}
    # one line per chart, or a margin chart (line, band bottom, band top) whose three tags share their steps
    # (TensorBoard's margin chart warns of a step mismatch otherwise)
    steps = _steps(cli_runs["run_dir"])
    bands = [rxs for charts in layout.values() for rxs in charts.values() if len(rxs) == 3]
    assert len(bands) == 8 and all(len(rxs) in (1, 3) for charts in layout.values() for rxs in charts.values())
    for rxs in bands:
        line, _, top = (rx.strip("^$").replace("\\", "") for rx in rxs)
        assert steps[line] == steps[top] and steps[line], (line, top)


def _toy_trainer(root: Path, **kw) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=TensorBoardLogger(str(root), name="run"),
                   log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False, num_sanity_val_steps=0, **kw)


@pytest.mark.filterwarnings("ignore:.*LeafSpec", "ignore:The number of training batches")
def test_amp_energy_and_mfu_charts_match_tags_logged_by_the_callbacks(tmp_path, monkeypatch, cli_runs):
    """Every chart of :data:`LAYOUT` but the GPU-memory one (CUDA only) matches tags that real fits log: the CLI
    run, a 16-mixed fit with a real GradScaler, a fit with a fake NVML and a peak for MFU."""
    torch.manual_seed(0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    amp = _toy_trainer(tmp_path / "amp", callbacks=[CallbackGroup(all_scaling_callbacks())],
                       plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    amp.fit(ToyTask(n_train=16, overflow_steps={1}))
    device = nvml.NvmlDevice(CountingNvml(), ("dev", 0), "uuid")  # energy counter +5 J a read, 312.5 W
    monkeypatch.setattr(nvml, "open_device_for", lambda _: (device, None))
    cbs = all_scaling_callbacks()
    cbs[1] = ThroughputCallback(peak_tflops=1e-6, warmup_steps=0)
    gpu_like = _toy_trainer(tmp_path / "energy", callbacks=[CallbackGroup(cbs)])
    gpu_like.fit(ToyTask())
    tags = set(_scalars(cli_runs["run_dir"])) | set(_scalars(Path(amp.log_dir))) | set(_scalars(Path(gpu_like.log_dir)))
    charts = [c for c in LAYOUT if not (c.needs == "cuda" and c.tags[0].startswith("memory/"))]
    layout = {cat: {title: spec[1] for title, spec in charts_.items()}
              for cat, charts_ in custom_scalars_layout(scaler=True, cuda=True, charts=tuple(charts)).items()}
    assert {"5 AMP", "7 energy"} <= set(layout)
    assert _unmatched(layout, tags) == []


def test_first_screen_opens_on_changing_curves(cli_runs):
    """TensorBoard's Time Series tab sorts the tags, groups them by the part before the first ``/`` and expands
    the first two groups: none of their charts is a single dot, and no constant flag is logged as a scalar."""
    scalars = _scalars(cli_runs["run_dir"])
    assert "amp/scaler_in_use" not in scalars and "energy/available" not in scalars
    groups: dict[str, list[str]] = {}
    for tag in sorted(scalars):
        groups.setdefault(tag.split("/", 1)[0], []).append(tag)
    first_two = list(groups)[:2]
    for group in first_two:
        assert all(len(scalars[t]) > 1 for t in groups[group]), (group, {t: scalars[t] for t in groups[group]})
    # the address make tensorboard prints pins loss, best mIoU so far, step time and memory: tags this run logged
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(first_screen_url()).query)
    pinned = [card["tag"] for card in json.loads(query["pinnedCards"][0])]
    assert pinned == ["train/loss_step", "val/mIoU_best", "perf/epoch/step_ms_median", "memory/host_rss_gib"]
    assert all(t in scalars for t in pinned), sorted(scalars)


def _hparams(folder: Path):
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    acc = _accumulator(folder)
    content = {tag: plugin_data_pb2.HParamsPluginData.FromString(acc.SummaryMetadata(tag).plugin_data.content)
               for tag in acc.Tags()["tensors"] if tag.startswith("_hparams_/")}
    return content[metadata.EXPERIMENT_TAG].experiment, content[metadata.SESSION_START_INFO_TAG].session_start_info


def test_hparams_hold_the_compared_settings_and_the_final_figures_of_run_json(cli_runs):
    experiment, start = _hparams(cli_runs["run_dir"])
    rec, run_dir = cli_runs["record"], cli_runs["run_dir"]
    config = rec["config"]
    kinds = {name: value.WhichOneof("kind") for name, value in start.hparams.items()}
    assert "bool_value" not in kinds.values() and not any(name.startswith("_") for name in kinds), kinds
    got = {name: getattr(value, value.WhichOneof("kind")) for name, value in start.hparams.items()}
    world = rec["distributed"]["world_size"]
    accumulation = rec["trainer"]["accumulate_grad_batches"]
    expected = {
        "precision": rec["precision"], "strategy": rec["distributed"]["strategy"], "devices": str(world),
        "global_batch": str(config["data"]["batch_size"] * world * accumulation), "lr": config["model"]["lr"],
        "local_batch": str(config["data"]["batch_size"]), "accumulate_grad_batches": str(accumulation),
        "compile": "true" if config["model"].get("compile") else "false", "optimizer": config["model"]["optimizer"],
        "lr_scaling": config["model"]["lr_scaling"],
        "amp/scaler_in_use": "true" if rec["summary"]["loss_scale"]["scaler_in_use"] else "false",
        "energy/available": "true" if rec["summary"]["energy"]["available"] else "false",
    }
    assert {k: got.get(k) for k in expected} == pytest.approx(expected)
    # TensorBoard shows five settings, first by (not differs, name) (hparams backend_context), and the first five
    # metrics: the ones compared first
    shown = sorted(experiment.hparam_infos, key=lambda h: (not h.differs, h.name))[:5]
    assert sorted(h.name for h in shown) == ["devices", "global_batch", "lr", "precision", "strategy"]
    assert [m.name.tag for m in experiment.metric_infos][:5] == [
        "run/best_miou", "run/samples_per_s", "run/median_step_ms", "run/peak_memory_gib", "run/energy_j_per_sample"]
    # the figures, from run.json and the validation events (one epoch: no warm-up epoch left out)
    scalars = _scalars(run_dir)
    (tp,) = rec["summary"]["throughput"]["epochs"]
    (st,) = rec["summary"]["step_timing"]["epochs"]
    figures = {
        "run/best_miou": max(scalars["val/mIoU"]),
        "run/samples_per_s": tp["samples"] / tp["train_s"],
        "run/samples_per_s_epoch_clock": tp["samples"] / tp["wall_s"],  # the second throughput, named apart
        "run/median_step_ms": st["windows_ms"]["step"]["median"],
        "run/peak_memory_gib": rec["summary"]["memory"]["host_peak_rss_gib"],
        "run/final_miou": scalars["val/mIoU"][-1],
        "run/best_epoch": 0.0,
        "run/final_train_loss": statistics.fmean(scalars["train/loss_step"]),
    }
    assert {k: scalars[k][-1] for k in figures} == pytest.approx(figures, rel=1e-5)
    assert "run/energy_j_per_sample" not in scalars  # n/a on CPU: not written (run.json says why)
    assert rec["summary"]["energy"]["reason"]


def test_evaluation_runs_are_logged_apart_from_training_runs(cli_runs):
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    root, run_dir = cli_runs["root"], cli_runs["run_dir"]
    mux = EventMultiplexer().AddRunsFromDirectory(str(root))
    assert sorted(mux.Runs()) == ["default/validate/version_0", "default/version_0", "default/version_0/validate_0"]
    assert sorted(p.name for p in (root / "default").iterdir()) == ["validate", "version_0"]  # no new version_N
    assert (run_dir / "config.yaml").read_bytes() == cli_runs["config_before"]  # the training config kept
    assert f"validate logs into {Path('runs/default/version_0/validate_0')}" in cli_runs["validate_output"]
    evaluation = run_dir / "validate_0"
    assert "val/mIoU" in _scalars(evaluation) and not (evaluation / "run.json").exists()
    assert not any(t.startswith("train/") for t in _scalars(evaluation))
    # the report reads the evaluation folders as no training run
    for folder in find_runs(root):
        record = load_run(folder)
        assert record.training_run is (folder == run_dir), (folder, record.skip_reason)


REPO = Path(__file__).resolve().parents[2]


def _make_recipe(target: str, **variables: str) -> str:
    """The Makefile's recipe of ``target`` as a shell script, its ``$(NAME)`` variables replaced by ``variables``."""
    lines = (REPO / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line[1:].lstrip("@"))
    script = "\n".join(recipe)
    for name, value in variables.items():
        script = script.replace(f"$({name})", value)
    return script


def test_make_tensorboard_ends_with_the_address_to_open(cli_runs):
    """``make tensorboard``'s recipe, run as make runs it (on the CLI run's folder, a free port): once TensorBoard
    serves, the last line printed (stdout and stderr together) is the address with the pinned first screen, and that
    address answers. Before, the pinned address came first and TensorBoard's bare address last."""
    import os
    import signal
    import socket
    import subprocess
    import threading
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = _make_recipe("tensorboard", PY=str(REPO / ".venv" / "bin" / "python"), VENV=str(REPO / ".venv"),
                          TB_PORT=port)
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(["bash", "-c", script], cwd=cli_runs["root"].parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any("pinnedCards" in line for line in lines) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        time.sleep(8)  # what TensorBoard prints once it serves comes within this
        printed = [line.rstrip("\n") for line in lines if line.strip()]
        assert printed and "pinnedCards" in printed[-1], printed[-5:]
        address = printed[-1].split()[-1]
        assert urllib.parse.urlsplit(address).port == int(port) and first_screen_url(port=int(port)) == address
        with urllib.request.urlopen(address, timeout=30) as response:
            assert response.status == 200
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
