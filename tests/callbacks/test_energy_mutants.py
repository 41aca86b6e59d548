"""EnergyCallback in the cases the other energy tests leave out, worked out by hand (issue 36, mutation testing).

The fakes of test_energy_epochs.py (a scripted NVML energy counter, a fake host clock, gathers that hand back a
second rank's row). Here: a fit clock that does not start at 0, the sampled-power path with a scripted sampler
(readings inside and outside the fit window, a rank that sends no readings), counter reads that fail at a log step
or an epoch end, a log step at the very time of the last one, a batch without a size, a resume that runs no
``on_train_epoch_start`` (Lightning 2.6 on a checkpoint written inside an epoch or at its last batch's end), the
state round trip with epochs, the CUDA synchronisation (a fake ``torch.cuda``), and the power sampler's own thread.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from cropscale.callbacks import EnergyCallback
from cropscale.callbacks import energy as energy_module
from tests.callbacks.test_energy_epochs import READINGS, ScriptedNvml, _setup, _step, _two_epochs


class FailAt(ScriptedNvml):
    """The scripted counter, raising at the given read numbers (1-based)."""

    def __init__(self, readings, fail):
        super().__init__(readings)
        self.fail = set(fail)

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if self.reads + 1 in self.fail:
            self.reads += 1
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return super().nvmlDeviceGetTotalEnergyConsumption(h)


def _power(trainer):
    return [(step, m["energy/power_w"]) for step, m in trainer.loggers[0].rows if "energy/power_w" in m]


def test_state_round_trip_keeps_the_epochs(monkeypatch):
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS, world_size=1)
    _two_epochs(cb, trainer, module, clock)
    back = EnergyCallback()
    back.load_state_dict(cb.state_dict())
    assert [(e.epoch, e.energy_j, e.samples) for e in back.epochs] == [(0, 150.0, 8), (1, 35.0, 6)]
    assert (back.total_j, back.total_samples) == (185.0, 14)


def test_a_fit_clock_that_does_not_start_at_zero(monkeypatch):
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS, world_size=1)
    clock.t = 100.0
    cb.on_train_start(trainer, module)  # reads: probe 0 J, fit start 10 J
    clock.t = 101.0
    cb.on_train_epoch_start(trainer, module)  # 20 J
    clock.t = 105.0
    cb.on_train_epoch_end(trainer, module)  # 60 J
    clock.t = 107.0
    cb.on_train_end(trainer, module)  # 140 J
    assert sent == [[40.0, 4.0, 0.0], [130.0, 7.0, None, None]]
    assert cb.summary().training.seconds_per_rank == [7.0]


class ScriptedSampler:
    """The power sampler's readings, scripted: 100 W at t = 4 (before the fit), 5, 6, 7, 10, 21 (after it)."""

    def __init__(self, device, interval) -> None:
        self.samples = [(t, 100.0) for t in (4.0, 5.0, 6.0, 7.0, 10.0, 21.0)]
        self.stopped = False

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True

    def problem(self):
        return None


class NoCounter(ScriptedNvml):
    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.reads += 1
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")


def _sampled_fit(monkeypatch, world_size):
    """Sampled power, the fit from t = 5 to 20, one epoch from 5 to 19 with log steps at 9 and 13."""
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, [0.0], world_size=world_size)
    monkeypatch.setattr(energy_module, "_PowerSampler", ScriptedSampler)
    nv.__class__ = NoCounter
    clock.t = 5.0
    cb.on_train_start(trainer, module)
    cb.on_train_epoch_start(trainer, module)
    for _ in range(4):  # steps end at 7, 9, 11, 13
        _step(cb, trainer, module, clock, 2.0, 2)
    clock.t = 19.0
    cb.on_train_epoch_end(trainer, module)
    clock.t = 20.0
    cb.on_train_end(trainer, module)
    return cb, trainer, nv, sent


def test_sampled_power_counts_the_readings_inside_the_fit_and_their_mean_period(monkeypatch):
    cb, trainer, nv, sent = _sampled_fit(monkeypatch, world_size=1)
    # readings at 5, 6, 7, 10 lie in [5, 20]: 4 of them, (10 - 5) / 3 s apart on average
    assert sent[-1] == [pytest.approx(1500.0), 15.0, 4.0, pytest.approx(5 / 3)]
    s = cb.summary()
    assert (s.available, s.method, s.reason) == (True, "sampled-power", None)
    assert (s.power_samples, s.power_sample_period_s) == (4, pytest.approx(5 / 3))
    assert s.training.seconds_per_rank == [15.0] and cb.epochs[0].energy_j == pytest.approx(1400.0)
    assert _power(trainer) == [(2, pytest.approx(100.0)), (4, pytest.approx(100.0))]
    assert nv.reads == 1  # the probe only: no counter read at the log steps of a sampled-power run


def test_sampled_power_with_a_rank_that_sends_no_readings_has_no_count(monkeypatch):
    """Rank 1's fit row carries no reading count (test_energy_epochs.RANK1): no minimum over ranks, the period max."""
    cb, trainer, nv, sent = _sampled_fit(monkeypatch, world_size=2)
    s = cb.summary()
    assert (s.power_samples, s.power_sample_period_s) == (None, pytest.approx(5 / 3))
    assert s.training.energy_j_per_rank == [pytest.approx(1500.0), 400.0]


def test_a_counter_read_failing_at_a_log_step_logs_no_power(monkeypatch):
    # reads: probe 1, fit start 2, epoch 0 start 3, log step 2 (t 3: read 4 fails), log step 4 (t 7: 140 J),
    # epoch 0 end 6, epoch 1 start 7, log step 6 (t 11: 200 J), ...
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS, world_size=1)
    nv.__class__ = FailAt
    nv.fail = {4}
    _two_epochs(cb, trainer, module, clock)
    # log step 2 has no reading, so no power for it nor for log step 4 (its interval starts at the missing reading)
    assert _power(trainer) == [(6, pytest.approx((200.0 - 140.0) / 4.0))]
    s = cb.summary()
    assert s.available is True and s.total_energy_j == 185.0
    assert s.reason == "energy counter read failed at a log step: RuntimeError: NVML_ERROR_GPU_IS_LOST"


def test_a_log_step_at_the_time_of_the_last_one_logs_no_power(monkeypatch):
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS, world_size=1)
    cb.on_train_start(trainer, module)  # t = 0, 10 J
    cb.on_train_epoch_start(trainer, module)  # 20 J
    _step(cb, trainer, module, clock, 0.0, 2)
    _step(cb, trainer, module, clock, 0.0, 2)  # log step 2 at t = 0 again: 60 J in no time, no power
    _step(cb, trainer, module, clock, 1.0, 2)
    _step(cb, trainer, module, clock, 1.0, 2)  # log step 4 at t = 2: 140 - 60 J over 2 s
    assert _power(trainer) == [(4, pytest.approx(40.0))]


def test_a_counter_read_failing_at_an_epoch_end_is_named_with_the_rank_gap(monkeypatch):
    # reads: probe 1, fit start 2, epoch 0 start 3, log steps 4 and 5, epoch 0 end 6 fails
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS, world_size=1)
    nv.__class__ = FailAt
    nv.fail = {6}
    _two_epochs(cb, trainer, module, clock)
    assert [(e.epoch, e.energy_j) for e in cb.epochs] == [(0, None), (1, 35.0)]
    s = cb.summary()
    assert s.available is False
    assert s.reason == ("energy not measured over the whole run: energy counter read failed at the end of epoch 0: "
                        "RuntimeError: NVML_ERROR_GPU_IS_LOST; epoch 0: no energy from rank(s) [0]")
    assert [(d["rank"], d["method"]) for d in s.devices] == [(0, "counter")]
    assert s.training.energy_j == 220.0 and s.method == "counter"


def test_an_epoch_resumed_without_its_start_counts_from_the_restart(monkeypatch):
    """Lightning runs no on_train_epoch_start for it: its window and its samples start at the restart."""
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS, world_size=1)
    cb.on_train_start(trainer, module)  # t 0: probe 0 J, fit start 10 J
    for samples in (2, 3, 2):  # steps end at 1, 2, 3; log step 2 reads 20 J
        _step(cb, trainer, module, clock, 1.0, samples)
    cb.on_train_epoch_end(trainer, module)  # t 3: 60 J
    assert sent == [[50.0, 3.0, 7.0]]  # before (issue 36): [None, None, 7.0], so the summary said available: false
    assert (cb.epochs[0].samples, cb.epochs[0].energy_j) == (7, 50.0)
    assert cb.summary().available is True


def test_a_batch_without_a_size_adds_no_sample(monkeypatch):
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS, world_size=1)
    cb.on_train_start(trainer, module)
    cb.on_train_epoch_start(trainer, module)
    _step(cb, trainer, module, clock, 1.0, 2)
    cb.on_before_optimizer_step(trainer, module, None)
    cb.on_train_batch_end(trainer, module, None, {"names": ["a", "b"]}, 1)  # no tensor: batch_size is None
    cb.on_train_epoch_end(trainer, module)
    assert sent[0][2] == 2.0 and cb.epochs[0].samples == 2


@pytest.mark.parametrize("device", [torch.device("cuda", 1), torch.device("cpu")])
def test_window_edges_synchronise_the_modules_gpu(monkeypatch, device):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: synced.append(d))
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS, world_size=1)
    module = SimpleNamespace(device=device)
    cb.on_train_start(trainer, module)
    cb.on_train_epoch_start(trainer, module)
    cb.on_train_epoch_end(trainer, module)
    cb.on_train_end(trainer, module)
    # the fit start, the epoch start and end, the fit end: the module's GPU before each reading; none on a CPU
    assert synced == ([device] * 4 if device.type == "cuda" else [])


class _Device:
    def __init__(self, power_w) -> None:
        self.power_w = power_w


def test_the_sampler_counts_every_failed_reading():
    calls = []

    def power_w():
        calls.append(None)
        if len(calls) == 3:
            sampler._stop.set()  # the third reading is the last
            return 250.0
        raise RuntimeError(f"NVML_ERROR_UNKNOWN #{len(calls)}")

    sampler = energy_module._PowerSampler(_Device(power_w), 0.001)
    sampler._run()  # in this thread: three readings, the first two fail
    assert (sampler.failures, len(sampler.samples)) == (2, 1)
    assert sampler.problem() == ("power sampler: 2 of 3 nvmlDeviceGetPowerUsage readings failed "
                                 "(first: RuntimeError: NVML_ERROR_UNKNOWN #1)")


def test_stop_waits_for_the_reading_in_flight():
    """A reading that fails while stop() runs is counted before stop() returns (the summary reads it right after)."""
    entered = threading.Event()

    def power_w():
        entered.set()
        sampler._stop.wait(5.0)  # the reading hangs until stop() ...
        time.sleep(0.05)  # ... and fails a little after it
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    sampler = energy_module._PowerSampler(_Device(power_w), 0.1)
    sampler.start()
    thread = sampler._thread
    try:
        assert thread in threading.enumerate() and thread.name == "cropscale-power-sampler"  # named in thread dumps
        assert thread.daemon  # never holds the interpreter open after a fit that did not stop it
        assert entered.wait(5.0)
    finally:
        sampler.stop()
    assert not thread.is_alive() and sampler.failures == 1
    assert sampler.problem() == ("power sampler: 1 of 1 nvmlDeviceGetPowerUsage readings failed "
                                 "(first: RuntimeError: NVML_ERROR_GPU_IS_LOST)")


def test_stop_gives_a_hung_reading_five_intervals_and_a_second_at_most():
    """stop() never blocks the end of a fit on an NVML call that hangs: it waits 5 x interval + 1 s, then returns."""
    waited = []

    class HungThread:  # a reading that never returns: the thread stays alive whatever the wait
        def is_alive(self):
            return True

        def join(self, timeout=None):
            waited.append(timeout)

    for interval, bound in ((0.1, 1.5), (0.5, 3.5)):  # 5 x 0.1 + 1 and 5 x 0.5 + 1 (not 5 / 0.1 + 1 = 51 s)
        sampler = energy_module._PowerSampler(_Device(lambda: 250.0), interval)
        sampler._thread = HungThread()
        sampler.stop()
        assert sampler._stop.is_set() and waited[-1] == pytest.approx(bound)
