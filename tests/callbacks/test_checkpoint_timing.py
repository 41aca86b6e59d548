"""CheckpointTimingCallback: every checkpoint write timed and booked to its epoch, inside or outside its wall time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from cropscale.callbacks import CallbackGroup, CheckpointTimingCallback, ThroughputCallback
from cropscale.errors import CropScaleError
from cropscale.testing.faults import HeavyValidation, RankSlowsDown, SlowBackward, SlowCheckpointWrite, SlowDataLoader
from cropscale.testing.toy import ToyTask

pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec"),
              pytest.mark.filterwarnings("ignore:The number of training batches")]
DELAY = 0.15


class CountingWrite(SlowCheckpointWrite):
    """Counts its writes and their wall time itself (the independent record the callback is checked against)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.writes: list[float] = []

    def _write(self, checkpoint, f) -> None:
        t0 = time.perf_counter()
        super()._write(checkpoint, f)
        self.writes.append(time.perf_counter() - t0)


def _fit(root: Path, **kw) -> tuple[CheckpointTimingCallback, CountingWrite, Trainer]:
    timing, io = CheckpointTimingCallback(), CountingWrite(DELAY)
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=TensorBoardLogger(str(root), name="run"),
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      callbacks=[CallbackGroup([ThroughputCallback(warmup_steps=0), timing]),
                                 ModelCheckpoint(dirpath=str(root / "ckpt"), save_last=True)],
                      plugins=[io], **kw)
    trainer.fit(ToyTask())
    return timing, io, trainer


def test_writes_at_the_epoch_end_are_timed_outside_the_epoch_wall(tmp_path):
    timing, io, trainer = _fit(tmp_path)
    summary = timing.summary()
    assert summary.checkpoint_io == "CountingWrite"
    assert [e.epoch for e in summary.epochs] == [0, 1]
    assert [e.saves for e in summary.epochs] == [2, 2]          # the epoch's file and last.ckpt, each epoch
    assert summary.saves == len(io.writes) == 4
    for e, writes in zip(summary.epochs, (io.writes[:2], io.writes[2:]), strict=True):
        assert e.write_s >= sum(writes) >= 2 * DELAY                 # the callback's timer brackets the writer's
        assert e.outside_wall_s == e.write_s                         # ModelCheckpoint saves after the epoch end
    assert trainer.strategy.checkpoint_io is io                      # the wrapper is gone after fit


def test_writes_after_a_mid_epoch_validation_fall_inside_the_wall(tmp_path):
    timing, io, _ = _fit(tmp_path, val_check_interval=0.5)           # ModelCheckpoint then saves after validations
    summary = timing.summary()
    assert summary.saves == len(io.writes) and summary.saves >= 4
    assert all(e.outside_wall_s == 0.0 and e.write_s >= e.saves * DELAY for e in summary.epochs)


def test_state_dict_round_trip_keeps_the_epochs(tmp_path):
    timing, _, _ = _fit(tmp_path)
    again = CheckpointTimingCallback()
    again.load_state_dict(timing.state_dict())
    assert again.summary().to_json() == {**timing.summary().to_json(), "checkpoint_io": None}


@pytest.mark.parametrize("make", [lambda: SlowDataLoader(seconds=-1), lambda: SlowBackward(seconds="x"),
                                  lambda: HeavyValidation(seconds=float("nan")),
                                  lambda: SlowCheckpointWrite(seconds=-0.5),
                                  lambda: RankSlowsDown(seconds=-2)])
def test_a_fault_with_a_negative_or_non_numeric_delay_is_refused_with_its_name(make):
    with pytest.raises(CropScaleError, match=r"^\w+\(seconds=.*\): give a delay >= 0 in seconds$"):
        make()
