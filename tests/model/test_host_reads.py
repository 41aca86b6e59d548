"""No device-to-host read in steady-state training steps (issue 12, item 6).

A CPU fit of :class:`~cropscale.model.task.CropMappingTask` (a small network on synthetic batches, progress
bar on) with every scaling callback (``NonFiniteCallback(policy="log")``) counts the calls that read a
tensor back to the host: ``Tensor.item``, ``tolist``, ``__bool__``, ``cpu``, ``__float__``, ``__int__``,
``numpy``. On a GPU each of these on a device tensor is a synchronisation. Counted per optimizer step, from
one ``on_train_batch_start`` to the next (hooks, logging and the progress bar included). Expected: none on
non-log steps; some on log steps (where the callbacks read their figures and the task refreshes the
progress bar), which shows the counter sees them.

Two kinds of reads are not device reads and are left out: reads of a tensor that an explicit ``.cpu()``
copy produced (a host tensor; the copy itself is counted), and torch's optimizers reading their step
counters (CPU tensors by design, ``capturable=False``; ``torch/optim``).
"""

from __future__ import annotations

import collections
import traceback

import pytest
import torch
from lightning.pytorch import Callback, Trainer

from cropscale.callbacks import CallbackGroup, NonFiniteCallback, all_scaling_callbacks
from cropscale.model.synthetic import synthetic_batch
from cropscale.model.task import CropMappingTask

READS = ("item", "tolist", "__bool__", "cpu", "__float__", "__int__", "numpy")
STEPS, EVERY = 7, 3  # log steps: global steps 3 and 6 (1-based); the 7th ends the epoch
SMALL_NET = {"s2_dim": 16, "s2_heads": 2, "s1_dim": 8, "width": 8, "fpn_dim": 16, "head_dim": 8,
             "decoder_dim": 8, "hr_dim": 4, "hr_scale": 2}


class ReadCounter:
    """Wraps the reading methods of ``torch.Tensor`` while active; counts per step, with the caller."""

    def __init__(self) -> None:
        self.step = -1
        self.active = False
        self.counts: collections.Counter = collections.Counter()
        self.where: dict[int, list[str]] = collections.defaultdict(list)
        self.host: dict[int, torch.Tensor] = {}  # id -> tensor made by an explicit .cpu() (kept alive)
        self._saved = {}

    def _is_host(self, t: torch.Tensor) -> bool:
        return id(t) in self.host and self.host[id(t)] is t

    def install(self) -> None:
        def wrap(name, orig):
            def read(t, *args, **kwargs):
                out = orig(t, *args, **kwargs)
                if self.active:
                    caller = traceback.extract_stack(limit=2)[0]
                    if not self._is_host(t) and "torch/optim/" not in caller.filename:
                        self.counts[self.step] += 1
                        self.where[self.step].append(f"{name} {caller.filename}:{caller.lineno}")
                    if name == "cpu":
                        self.host[id(out)] = out
                return out
            return read

        def propagate(name, orig):  # a copy or view of a host tensor is a host tensor
            def op(t, *args, **kwargs):
                out = orig(t, *args, **kwargs)
                if self.active and self._is_host(t):
                    self.host[id(out)] = out
                return out
            return op

        for name in READS:
            self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, wrap(name, self._saved[name]))
        for name in ("clone", "detach", "squeeze", "to", "float", "reshape", "view"):
            self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, propagate(name, self._saved[name]))

    def uninstall(self) -> None:
        for name, orig in self._saved.items():
            setattr(torch.Tensor, name, orig)


class StepProbe(Callback):
    def __init__(self, counter):
        self.counter = counter

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.counter.step += 1
        self.counter.active = True

    def on_train_end(self, trainer, pl_module):
        self.counter.active = False


@pytest.fixture
def counter():
    c = ReadCounter()
    c.install()
    yield c
    c.uninstall()


@pytest.mark.filterwarnings("ignore:.*LeafSpec", "ignore:The number of training batches", "ignore:.*num_workers",
                            "ignore:You defined a `validation_step` but have no `val_dataloader`")
def test_no_host_read_on_non_log_steps(counter, tmp_path):
    torch.manual_seed(0)
    batches = []
    for i in range(STEPS):
        b = synthetic_batch(2, t2=3, t1=2, height=8, width=8, num_classes=10, hr_scale=2, seed=i)
        b["patch_id"], b["crop_yx"] = torch.tensor([2 * i, 2 * i + 1]), torch.zeros(2, 2, dtype=torch.long)
        batches.append(b)
    callbacks = all_scaling_callbacks()
    assert isinstance(callbacks[3], NonFiniteCallback) and callbacks[3].policy == "log"
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=STEPS, log_every_n_steps=EVERY,
                      callbacks=[StepProbe(counter), CallbackGroup(callbacks)], enable_checkpointing=False,
                      enable_model_summary=False, limit_val_batches=0, default_root_dir=str(tmp_path),
                      gradient_clip_val=1.0, enable_progress_bar=True)
    task = CropMappingTask(net_kwargs=SMALL_NET, val_window=8)
    task.flops_per_sample = 1.0  # skip the FLOP count at setup: not what this test is about
    trainer.fit(task, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    assert trainer.global_step == STEPS
    log_steps = [k for k in range(STEPS) if (k + 1) % EVERY == 0]
    plain = [k for k in range(STEPS - 1) if k not in log_steps]
    assert plain == [0, 1, 3, 4]
    for k in plain:
        assert counter.counts[k] == 0, (k, counter.where[k])
    for k in log_steps:
        assert counter.counts[k] > 0, k  # the counter sees the reads of the log steps
    assert "train_loss" in trainer.progress_bar_metrics  # the bar still shows the loss, from the last log step
