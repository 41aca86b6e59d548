"""callback-bench (the callbacks' overhead microbenchmark) and the group's deferred logging."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Callback, Trainer

from cropscale import CropScaleError
from cropscale.bench import callbacks as callback_overhead
from cropscale.bench.callback_counts import LIGHTNING_ARM, LIGHTNING_NO_CPU_ARM
from cropscale.bench.interleave import Interleaver
from cropscale.callbacks._logging import deferred_logging, log_metrics
from cropscale.testing.toy import ToyTask, toy_batches


class _Logger:
    def __init__(self):
        self.calls = []

    def log_metrics(self, metrics, step):
        self.calls.append((dict(metrics), step))


def _trainer():
    return SimpleNamespace(loggers=[_Logger()], global_step=7)


def test_log_metrics_writes_at_once_outside_a_deferred_block():
    trainer = _trainer()
    log_metrics(trainer, {"perf/a": 1, "perf/none": None, "perf/nan": float("nan")})
    assert trainer.loggers[0].calls == [({"perf/a": 1.0}, 7)]


def test_deferred_block_writes_one_call_per_step_at_its_end():
    trainer = _trainer()
    with deferred_logging(trainer):
        log_metrics(trainer, {"perf/a": 1})
        log_metrics(trainer, {"memory/b": 2.5})
        log_metrics(trainer, {"perf/a": 3}, step=5)
        assert trainer.loggers[0].calls == []  # nothing written inside the block
    assert trainer.loggers[0].calls == [({"perf/a": 1.0, "memory/b": 2.5}, 7), ({"perf/a": 3.0}, 5)]


def test_deferred_scalars_are_written_when_the_block_raises():
    trainer = _trainer()
    with pytest.raises(RuntimeError, match="boom"), deferred_logging(trainer):
        log_metrics(trainer, {"numerics/x": 4})
        raise RuntimeError("boom")
    assert trainer.loggers[0].calls == [({"numerics/x": 4.0}, 7)]
    log_metrics(trainer, {"numerics/y": 1})  # the block is closed: immediate again
    assert trainer.loggers[0].calls[-1] == ({"numerics/y": 1.0}, 7)


@pytest.mark.parametrize("model,extra", [("linear", []), ("linear", ["--clock", "cpu"]),
                                         ("network", ["--crop-size", "8", "--t2", "3", "--t1", "2"])])
def test_callback_bench_figures_are_consistent(tmp_path, capsys, model, extra):
    out = tmp_path / "cb.json"
    status = callback_overhead.main(["--model", model, "--steps", "4", "--warmup", "1", "--repeats", "2",
                                     "--log-every", "2", "--json", str(out), *extra])
    assert status == 0
    res = json.loads(out.read_text())
    assert res["evidence"] == "measured-microbenchmark" and res["setup"]["repeats"] == 2
    assert res["setup"]["clock"].startswith("time.process_time" if "cpu" in extra else "time.perf_counter")
    med, mean = res["median_step_us"], res["mean_step_us"]
    arms = {"off", "on", "lightning"} if model == "linear" else {"off", "on"}  # Lightning's monitors: linear only
    assert set(med) == set(mean) == arms
    assert res["overhead_us"]["on"] == pytest.approx(med["on"] - med["off"])
    assert res["overhead_ratio"]["on"] == pytest.approx((med["on"] - med["off"]) / med["off"])
    assert res["overhead_mean_us"]["on"] == pytest.approx(mean["on"] - mean["off"])
    assert all(len(v) == 2 for v in res["median_step_us_per_repeat"].values())
    if model == "linear":  # group / Lightning's monitors: the mean overheads over all steps of the same fits
        over = res["overhead_mean_us"]
        assert over["lightning"] == pytest.approx(mean["lightning"] - mean["off"])
        assert res["ratio_to_lightning"] == pytest.approx(over["on"] / over["lightning"])
        assert len(res["ratio_to_lightning_per_fit"]) == 2
    if model == "network":
        assert "CropMappingNet" in res["setup"]["model"] and "clipped" in res["setup"]["optimizer"]
        assert res["within_target"] == (res["overhead_ratio"]["on"] <= 0.02) and "target_us" not in res
    else:
        assert res["within_target"] == (res["overhead_us"]["on"] <= 100.0) and "target_ratio" not in res
    printed = capsys.readouterr().out
    assert ("group / Lightning's monitors" in printed) == (model == "linear")
    assert "mean step incl. log steps" in printed and "[measured-microbenchmark]" in printed


def test_callback_bench_rejects_bad_arguments():
    from cropscale import CropScaleError

    with pytest.raises(CropScaleError, match="--crop-size must be >= 1"):
        callback_overhead.main(["--model", "network", "--crop-size", "0"])
    with pytest.raises(CropScaleError, match="--block must be >= 3"):
        callback_overhead.main(["--block", "2"])


@pytest.mark.filterwarnings("ignore:The number of training batches")
def test_interleaver_times_each_arm_with_a_fake_clock(tmp_path):
    """A fake clock that only the callbacks move: 1 s per step in every block, 5 s more where the arm runs."""
    from lightning.pytorch import Callback, Trainer

    from cropscale.callbacks import StepTimingCallback
    from cropscale.testing.toy import ToyTask, toy_batches

    now = [0.0]
    seen = []  # per step: (did the measured arm run, was the trainer's own profiler in place)

    class Tick(Callback):
        def on_train_batch_start(self, trainer, *a):
            now[0] += 1.0
            self.ran = False

        def on_train_batch_end(self, trainer, *a):
            seen.append((self.ran, trainer.profiler is original))

    tick = Tick()

    class Cost(Callback):
        def on_before_optimizer_step(self, *a):
            now[0] += 5.0
            tick.ran = True

    cost, timing = Cost(), StepTimingCallback()
    warmup, block, rounds = 3, 4, 3
    steps = warmup + 2 * block * rounds
    switch = Interleaver([("off", []), ("on", [timing, cost])], block=block, warmup=warmup,
                                           last_step=steps, clock=lambda: now[0])
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=steps, max_epochs=1, logger=False,
                      callbacks=[tick, timing, cost, switch], enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path))
    original = trainer.profiler
    switch.bind(trainer)
    trainer.fit(ToyTask(features=16), train_dataloaders=torch.utils.data.DataLoader(
        toy_batches(steps + 1, 1, 16), batch_size=None))
    # by hand: each block of 4 steps keeps its last 2; 3 blocks per arm
    assert switch.periods == {"off": [1.0] * 6, "on": [6.0] * 6}
    # warm-up with everything, then off, on, off, ... blocks of 4 steps
    arms = [ran for ran, _ in seen]
    assert arms == [True] * warmup + ([False] * block + [True] * block) * rounds
    # the off blocks ran on the trainer's own profiler, the on blocks on StepTimingCallback's wrapper
    assert all(orig == (not ran) for ran, orig in seen[warmup:])
    assert trainer.callbacks[-1] is switch and timing in trainer.callbacks  # all restored for the fit's end


@pytest.mark.filterwarnings("ignore:The number of training batches")
def test_interleaver_goes_round_three_arms(tmp_path):
    """Arms off, a (+2 s per step), b (+7 s per step) in blocks of 3 steps after 2 warm-up steps, fake clock."""
    now = [0.0]

    class Tick(Callback):
        def on_train_batch_start(self, trainer, *a):
            now[0] += 1.0

    class Cost(Callback):
        def __init__(self, s):
            self.s = s

        def on_before_optimizer_step(self, *a):
            now[0] += self.s

    a, b = Cost(2.0), Cost(7.0)
    warmup, block, rounds = 2, 3, 2
    steps = warmup + 3 * block * rounds
    switch = Interleaver([("off", []), ("a", [a]), ("b", [b])], block=block, warmup=warmup,
                                           last_step=steps, clock=lambda: now[0])
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=steps, max_epochs=1, logger=False,
                      callbacks=[Tick(), a, b, switch], enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path))
    switch.bind(trainer)
    trainer.fit(ToyTask(features=4), train_dataloaders=torch.utils.data.DataLoader(
        toy_batches(steps + 1, 1, 4), batch_size=None))
    # by hand: each block of 3 keeps its last step; 2 blocks per arm
    assert switch.periods == {"off": [1.0] * 2, "a": [3.0] * 2, "b": [8.0] * 2}


def test_callback_bench_count_prints_both_arms_and_precisions(tmp_path, capsys):
    out = tmp_path / "count.json"
    assert callback_overhead.main(["--count", "--steps", "30", "--log-every", "10", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["evidence"] == "count" and [f["precision"] for f in res["fits"]] == ["32-true", "16-mixed"]
    for fit in res["fits"]:
        assert set(fit["arms"]) == {"CallbackGroup", LIGHTNING_ARM, LIGHTNING_NO_CPU_ARM}
        assert fit["arms"]["CallbackGroup"]["ordinary"]["max_reads"] == 0
    printed = capsys.readouterr().out
    assert "= CallbackGroup" in printed and "= Lightning monitors" in printed and "16-mixed" in printed
    assert f"= {LIGHTNING_NO_CPU_ARM}" in printed and "log step, Python + C calls: CallbackGroup" in printed
    with pytest.raises(CropScaleError, match="--count runs the linear model only"):
        callback_overhead.main(["--count", "--model", "network"])
