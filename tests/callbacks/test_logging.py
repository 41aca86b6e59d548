"""The callbacks' scalar writes (``cropscale/callbacks/_logging.py``): through a Lightning ``TensorBoardLogger``
one event per step holds all of that step's scalars, and the events file reads back the same tags, steps and
values as Lightning's own ``TensorBoardLogger.log_metrics`` (one event per scalar) writes for the same
metrics; a name prefix, another logger and a rank other than 0 take the logger's own path."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from cropscale.callbacks._logging import deferred_logging, log_metrics

# not exact in float32 (0.1, 1/3), tiny, large, negative, an integer: a write in another precision or type shows
STEPS = {3: {"perf/a": 0.1, "memory/b": 1 / 3, "numerics/c": 1e-7},
         4: {"perf/a": 123456789.0, "amp/d": -2.5},
         5: {"perf/a": 7, "numerics/c": 0.2}}


def _written(log_dir: str) -> tuple[dict[str, list[tuple[int, float]]], list[int]]:
    """Scalars per tag as (step, value), read with TensorBoard's EventAccumulator; the step of every event that
    holds scalar values, in file order (TensorBoard's own event loader)."""
    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    scalars = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    events = [e for f in sorted(Path(log_dir).glob("events.out.tfevents.*")) for e in EventFileLoader(str(f)).Load()]
    steps = [e.step for e in events if e.summary.value]
    return scalars, steps


def _ours(logger, deferred: bool) -> None:
    trainer = SimpleNamespace(loggers=[logger], global_step=3)
    if deferred:  # what a CallbackGroup's on_train_batch_end does: several members, written at the end
        with deferred_logging(trainer):
            for step, metrics in STEPS.items():
                items = list(metrics.items())
                log_metrics(trainer, dict(items[:1]), step=step)
                log_metrics(trainer, dict(items[1:]), step=step)
    else:
        for step, metrics in STEPS.items():
            log_metrics(trainer, metrics, step=step)


@pytest.mark.parametrize("deferred", [False, True])
def test_tensorboard_gets_one_event_per_step_with_what_lightnings_logger_writes(tmp_path, deferred):
    ours, lightning = TensorBoardLogger(tmp_path, name="ours"), TensorBoardLogger(tmp_path, name="lightning")
    _ours(ours, deferred)
    for step, metrics in STEPS.items():
        lightning.log_metrics(metrics, step=step)
    ours.finalize("success")
    lightning.finalize("success")
    got, got_events = _written(ours.log_dir)
    want, want_events = _written(lightning.log_dir)
    assert got == want and len(got) == 4  # same tags, steps and float32 values
    assert got["memory/b"] == [(3, pytest.approx(1 / 3, rel=1e-7))]  # read back as written (float32)
    assert got_events == [3, 4, 5]  # one event per step ...
    assert want_events == [3, 3, 3, 4, 4, 5, 5]  # ... where Lightning's logger writes one per scalar


def test_a_prefix_another_logger_and_another_rank_take_the_loggers_own_path(tmp_path, monkeypatch):
    prefixed = TensorBoardLogger(tmp_path, name="prefixed", prefix="fit")
    csv = CSVLogger(tmp_path, name="csv")
    _ours(prefixed, deferred=True)
    _ours(csv, deferred=False)
    prefixed.finalize("success")
    csv.finalize("success")
    scalars, events = _written(prefixed.log_dir)
    assert sorted(scalars) == ["fit-amp/d", "fit-memory/b", "fit-numerics/c", "fit-perf/a"]  # Lightning's join
    assert events == [3, 3, 3, 4, 4, 5, 5]
    rows = (tmp_path / "csv" / "version_0" / "metrics.csv").read_text().splitlines()
    assert rows[0].split(",")[0] == "amp/d" and len(rows) == 4  # header and one row per step

    monkeypatch.setattr(rank_zero_only, "rank", 1)  # a rank other than 0: loggers write nothing there
    other = TensorBoardLogger(tmp_path, name="rank1")
    _ours(other, deferred=True)
    assert not (tmp_path / "rank1").exists()
