"""The LightningModule task: one real optimisation step per precision, LR rule, checkpointed best IoU."""

import math

import pytest
import torch
from lightning.pytorch import Callback, Trainer

from cropscale.data.datamodule import PastisHDDataModule
from cropscale.model.flops import flops_per_sample
from cropscale.model.task import CropMappingTask


class GradProbe(Callback):
    """Records, at the first optimiser step, which parameters have a finite gradient."""

    def __init__(self):
        self.missing, self.nonfinite, self.loss = [], [], None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.loss is not None:
            return
        for name, p in pl_module.named_parameters():
            if not p.requires_grad:
                continue
            if p.grad is None:
                self.missing.append(name)
            elif not torch.isfinite(p.grad).all():
                self.nonfinite.append(name)
        self.loss = float(trainer.callback_metrics.get("train/loss_step", float("nan")))


def _datamodule(root, **kw):
    kw.setdefault("samples_per_patch", 1)
    return PastisHDDataModule(str(root), batch_size=2, t2=8, t1=2, **kw)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_one_real_step_gives_every_parameter_a_finite_gradient(flanders_root, tmp_path, precision):
    torch.manual_seed(0)
    dm = _datamodule(flanders_root)
    task = CropMappingTask(num_classes=dm.num_classes, class_names=dm.class_names, t2=dm.t2, t1=dm.t1)
    probe = GradProbe()
    trainer = Trainer(
        accelerator="cpu", precision=precision, max_steps=1, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        gradient_clip_val=1.0, callbacks=[probe], default_root_dir=tmp_path,
    )
    trainer.fit(task, datamodule=dm)
    assert probe.loss is not None and math.isfinite(probe.loss)
    assert probe.missing == [], probe.missing  # no dead branch: S1A, S1D, detail decoder all trained
    assert probe.nonfinite == []
    # FLOPs per sample for the throughput callback's MFU: the task's T2 = 8, T1 = 2 (the CLI links them from the
    # data module), 32 x 32 crop.
    assert task.flops_per_sample == flops_per_sample(task.net, t2=8, t1=2)["total"]


@pytest.mark.parametrize("rule,expected", [("none", 1e-3), ("linear", 2e-3), ("sqrt", 1e-3 * math.sqrt(2))])
def test_lr_rule_applied_to_global_batch(flanders_root, tmp_path, rule, expected):
    # 2 patches x 2 crops = 2 batches of 2 per epoch: the accumulation window of 2 fills (with 1 crop per patch
    # the epoch held 1 batch, Lightning stepped after it and every update held 2 samples, not 4)
    dm = _datamodule(flanders_root, samples_per_patch=2)
    task = CropMappingTask(num_classes=dm.num_classes, lr=1e-3, lr_scaling=rule, reference_batch_size=2)
    trainer = Trainer(
        accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=2,
        default_root_dir=tmp_path,
    )
    trainer.fit(task, datamodule=dm)
    assert task.global_batch == 4  # local 2 x world size 1 x accumulation 2
    assert task.lr_effective == pytest.approx(expected)
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(expected)


class LRProbe(Callback):
    """Records, at every optimizer update, the learning rate of each parameter group and the samples averaged."""

    def __init__(self):
        self.lrs, self.samples, self.seen = [], [], 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen += batch["s2"].shape[0]

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.lrs.append([g["lr"] for g in optimizer.param_groups])
        self.samples.append(self.seen)
        self.seen = 0


def test_lamb_by_config_realises_g_with_the_rule_and_warmup_in_epochs(flanders_root, tmp_path):
    """LAMB selected by option: both parameter groups; G = local 1 x 1 x accumulation 2 = 2 samples per update;
    LR x 2 / 1 (linear rule, reference 1); warm-up of 1 epoch = 2 updates (4 samples, A = 2), factors 1/3,
    2/3, then 1."""
    import pytorch_optimizer

    # 2 training patches x 2 crops = 4 samples per epoch
    dm = PastisHDDataModule(str(flanders_root), batch_size=1, samples_per_patch=2, t2=8, t1=2, crop_size=16)
    task = CropMappingTask(num_classes=dm.num_classes, lr=1e-3, lr_scaling="linear", reference_batch_size=1,
                           optimizer="lamb", warmup_epochs=1.0, val_window=16)
    probe = LRProbe()
    trainer = Trainer(
        accelerator="cpu", max_epochs=2, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=2, callbacks=[probe],
        default_root_dir=tmp_path,
    )
    trainer.fit(task, datamodule=dm)
    optimizer = trainer.optimizers[0]
    assert isinstance(optimizer, pytorch_optimizer.Lamb)
    assert [g["name"] for g in optimizer.param_groups] == ["adapted", "excluded"]
    assert [g["adam"] for g in optimizer.param_groups] == [False, True]
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(task.parameters()))
    assert task.global_batch == 2 and task.lr_effective == pytest.approx(2e-3)
    assert probe.samples == [2, 2, 2, 2]  # 2 epochs x 2 updates, each of G = 2 samples
    expected = [2e-3 / 3, 2 * 2e-3 / 3, 2e-3, 2e-3]
    assert [lrs[0] for lrs in probe.lrs] == pytest.approx(expected)
    assert [lrs[1] for lrs in probe.lrs] == pytest.approx(expected)


def test_best_miou_survives_checkpoint_round_trip():
    task = CropMappingTask()
    task.best_miou, task.best_epoch = 0.4321, 3
    ckpt = {}
    task.on_save_checkpoint(ckpt)
    fresh = CropMappingTask()
    assert math.isnan(fresh.best_miou)
    fresh.on_load_checkpoint(ckpt)
    assert (fresh.best_miou, fresh.best_epoch) == (0.4321, 3)


def test_predict_step_returns_whole_patch_maps():
    from cropscale.model.synthetic import synthetic_batch

    task = CropMappingTask(num_classes=10, val_window=32, val_stride=16).eval()
    batch = synthetic_batch(2, t2=4, t1=2, height=64, width=32, num_classes=10)
    with torch.no_grad():
        out = task.predict_step(batch, 0)
    assert out["semantic"].shape == (2, 64, 32) and out["semantic"].dtype == torch.int64
    assert out["semantic_logits"].shape == (2, 10, 64, 32)
    assert out["parcel"].shape == (2, 3, 64, 32) and 0 <= out["parcel"].min() <= out["parcel"].max() <= 1
    assert out["hr"].shape == (2, 3, 640, 320)
    assert torch.equal(out["patch_id"], batch["patch_id"])


@pytest.mark.parametrize(
    "kwargs,needle",
    [({"lr": 0.0}, "model.lr"), ({"val_window": 32, "val_stride": 33}, "model.val_stride"),
     ({"tile_batch_size": 0}, "model.tile_batch_size"), ({"weight_decay": -1.0}, "model.weight_decay"),
     ({"optimizer": "adam"}, "model.optimizer must be one of adamw, sgd, lars, lamb"),
     ({"momentum": 1.5}, "model.momentum"), ({"warmup_epochs": -1.0}, "model.warmup_epochs"),
     ({"warmup_steps": 4, "warmup_epochs": 1.0}, "one unit: model.warmup_steps=4 and model.warmup_epochs=1")],
)
def test_bad_task_arguments_name_the_option(kwargs, needle):
    from cropscale import CropScaleError

    with pytest.raises(CropScaleError, match=needle):
        CropMappingTask(**kwargs)


def test_lr_rule_refuses_a_batch_that_does_not_form(flanders_root, tmp_path):
    """Issue 17, case 7: batch 64 with 4 training samples would print "global batch 64" and scale the LR x16
    while every batch holds 4 samples."""
    from cropscale import CropScaleError

    dm = PastisHDDataModule(str(flanders_root), batch_size=64, samples_per_patch=2, t2=8, t1=2)
    task = CropMappingTask(num_classes=dm.num_classes, lr=1e-3, lr_scaling="linear", reference_batch_size=4)
    trainer = Trainer(accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    with pytest.raises(CropScaleError) as err:
        trainer.fit(task, datamodule=dm)
    msg = str(err.value)
    for needle in ("data.batch_size=64", "4 training samples per rank", "global batch 4, not 64"):
        assert needle in msg, (needle, msg)


def test_net_kwargs_keys_are_checked_before_the_network_is_built():
    """Several unknown keys are all named, each with the closest valid key when one is close; num_classes (taken from
    the data) and every network argument pass."""
    from cropscale.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        CropMappingTask(net_kwargs={"widht": 8, "s2_dim": 16, "zzzz": 1, "fpn_dimm": 16})
    message = str(err.value)
    assert message.startswith("model.net_kwargs: unknown keys 'widht' (did you mean 'width'?), 'zzzz', "
                              "'fpn_dimm' (did you mean 'fpn_dim'?); valid keys: num_parcel_outputs, "), message
    assert "\n" not in message and "'s2_dim'" not in message
    task = CropMappingTask(num_classes=5, net_kwargs={"num_classes": 99, "s2_dim": 16, "s2_heads": 2, "width": 8})
    assert task.net.num_classes == 5
