"""callback-bench (the callbacks' overhead microbenchmark) and the group's deferred logging."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from cropscale.bench import callbacks as callback_overhead
from cropscale.callbacks._logging import deferred_logging, log_metrics


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
    assert set(med) == set(mean) == {"off", "on"}
    assert res["overhead_us"]["on"] == pytest.approx(med["on"] - med["off"])
    assert res["overhead_ratio"]["on"] == pytest.approx((med["on"] - med["off"]) / med["off"])
    assert res["overhead_mean_us"]["on"] == pytest.approx(mean["on"] - mean["off"])
    assert all(len(v) == 2 for v in res["median_step_us_per_repeat"].values())
    if model == "network":
        assert "CropMappingNet" in res["setup"]["model"] and "clipped" in res["setup"]["optimizer"]
        assert res["within_target"] == (res["overhead_ratio"]["on"] <= 0.02) and "target_us" not in res
    else:
        assert res["within_target"] == (res["overhead_us"]["on"] <= 100.0) and "target_ratio" not in res
    printed = capsys.readouterr().out
    assert "mean step incl. log steps" in printed and "[measured-microbenchmark]" in printed


def test_callback_bench_rejects_bad_arguments():
    from cropscale import CropScaleError

    with pytest.raises(CropScaleError, match="--crop-size must be >= 1"):
        callback_overhead.main(["--model", "network", "--crop-size", "0"])
