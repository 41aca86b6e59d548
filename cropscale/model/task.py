"""The LightningModule that trains :class:`~cropscale.model.network.CropMappingNet`.

Training: random crops (see :mod:`cropscale.data`), weighted multi-task loss
(:class:`~cropscale.model.losses.MultiTaskLoss`), AdamW (or SGD, LARS, LAMB: :mod:`cropscale.model.optim`)
with an optional linear warm-up (in optimiser updates or epochs) and cosine decay, an LR scaling rule
relative to a reference global batch, gradient clipping through the Trainer (``gradient_clip_val: 1.0``
in ``configs/default.yaml``); set up from the Trainer's facts in :mod:`cropscale.model.optim`.

Validation and test: overlap-weighted tiled inference over whole patches
(:func:`~cropscale.tiling.sliding_window_inference`), metrics whose states are summed across ranks
(:mod:`cropscale.metrics`), so that macro IoU is the same for any world size; placeholders, ``val/loss``
and per-class keys in :mod:`cropscale.model.evaluation`.

Settings are checked at construction and against a checkpoint's architecture in :mod:`cropscale.model.settings`.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import torch
import torchmetrics
from lightning.pytorch import LightningModule
from lightning.pytorch.loggers import TensorBoardLogger
from typing_extensions import override

from cropscale.batch import model_inputs
from cropscale.checkpointing import nonfinite_parameters
from cropscale.errors import CheckpointError, CropScaleError
from cropscale.metrics import HighGridMetrics, ParcelMetrics, SegmentationMetrics, confusion_matrix_figure
from cropscale.model.evaluation import class_iou_keys, loss_term_counts, weighted_term_mean, without_placeholders
from cropscale.model.flops import flops_per_sample, flops_per_sample_by_class
from cropscale.model.losses import MultiTaskLoss
from cropscale.model.network import CropMappingNet
from cropscale.model.optim import LRScaling, OptimizerName, Schedule, clip_gradients_by_norm, configure_optimization
from cropscale.model.settings import architecture_mismatch, check_net_kwargs, check_settings
from cropscale.model.speed import compile_network
from cropscale.model.synthetic import synthetic_batch
from cropscale.numbers import TARGET_FRACTION, time_to_target
from cropscale.runs.record import RunRecord, load_run
from cropscale.runs.tensorboard import HPARAMS_METRICS, custom_scalars_layout, hparams_summaries
from cropscale.tiling import sliding_window_inference

# The validation scores are computed from confusion matrices already summed across ranks
# (torchmetrics), so they are logged without sync_dist; Lightning's advice to add it does not apply.
warnings.filterwarnings("ignore", message=r".*when logging on epoch level in distributed setting.*")


class CropMappingTask(LightningModule):
    """Semantic crop mapping + parcel delineation + x10 detail decoding on Sentinel-1/2 time series.

    Args:
        num_classes: semantic classes ``C`` (linked from ``data.num_classes`` by the CLI).
        class_names: names of the ``C`` classes, for per-class IoU keys and the confusion matrix.
        ignore_index: class id excluded from loss and metrics (PASTIS: 19 "void"); None = none.
        t2, t1, crop_size: Sentinel-2 dates, dates per Sentinel-1 orbit and crop side of a training sample (linked
            from ``data.*`` by the CLI): the example input and the FLOPs per sample.
        net_kwargs: further keyword arguments of :class:`CropMappingNet` (widths, depths, heads).
        semantic_weight, parcel_weight, hr_weight: weights of the loss terms.
        lr: learning rate at ``reference_batch_size``.
        weight_decay: weight decay (LARS / LAMB: not on the excluded norm and bias parameters).
        warmup_steps: optimiser updates of linear LR warm-up (0 = none).
        schedule: ``constant`` or ``cosine`` decay to 0 over the run after warm-up.
        optimizer: ``adamw | sgd | lars | lamb`` (:func:`cropscale.model.optim.build_optimizer`; LARS and
            LAMB from ``pytorch-optimizer``, trust-ratio exclusions in :mod:`cropscale.model.optim`).
        momentum: momentum of SGD and LARS.
        trust_coefficient: LARS ``eta``.
        warmup_epochs: linear LR warm-up in epochs instead of updates (may be fractional; 0 = use
            ``warmup_steps``); the same epochs give every global batch the same warm-up samples.
        lr_scaling: ``none | linear | sqrt``: LR scaled by the ratio of the global batch
            (local batch x world size x accumulation) to ``reference_batch_size``. A run whose batches
            cannot hold the local batch (fewer training samples per rank) or whose epoch is shorter than
            the accumulation window is refused with the numbers, whatever the rule
            (:func:`~cropscale.model.optim.formed_global_batch`).
        reference_batch_size: global batch at which ``lr`` was tuned.
        val_window: tile size (10 m pixels) of tiled validation; usually the training crop size.
        val_stride: tile stride; None = ``val_window // 2``.
        tile_batch_size: tiles per network call in tiled validation.
        channels_last: convert the network to ``torch.channels_last``.
        compile: run the training forward through ``torch.compile`` of the network (compiled at the first
            step; validation's tiled inference and ``predict`` stay eager; the checkpoint keys are unchanged).
            Raises :class:`~cropscale.errors.CropScaleError` at setup where no compiler is available
            (:func:`cropscale.model.speed.compile_network`).
        compile_mode: ``torch.compile`` mode: ``default | reduce-overhead | max-autotune |
            max-autotune-no-cudagraphs``.
        fused_optimizer: fused AdamW (one kernel per update): ``None`` (auto) where the device has the
            kernel and not under ``16-mixed`` with gradient clipping; ``true`` forces it (an error where
            it cannot work); ``false`` never (:func:`cropscale.model.speed.choose_fused`). AdamW only.
        schedule_by_updates: advance the LR warm-up and decay by the optimizer updates that ran, so that steps a
            GradScaler skipped do not move the schedule (:class:`~cropscale.model.optim.UpdateAlignedSchedule`).
            Off by default: Lightning steps the scheduler after every optimizer step, skipped or not, and that is
            the schedule most users compare with (``docs/measuring.md``, "LR schedule and skipped steps").
        allow_tf32: if not None, set ``torch.backends.cuda.matmul.allow_tf32`` and
            ``torch.backends.cudnn.allow_tf32`` to this value at setup (False for a true FP32 run on
            Ampere and later GPUs).
    """

    def __init__(
        self,
        num_classes: int = 10,
        class_names: list[str] | None = None,
        ignore_index: int | None = None,
        t2: int = 16,
        t1: int = 4,
        crop_size: int = 32,
        net_kwargs: dict[str, Any] | None = None,
        semantic_weight: float = 1.0,
        parcel_weight: float = 1.0,
        hr_weight: float = 1.0,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        warmup_steps: int = 0,
        schedule: Schedule = "constant",
        lr_scaling: LRScaling = "none",
        reference_batch_size: int = 4,
        val_window: int = 32,
        val_stride: int | None = None,
        tile_batch_size: int = 16,
        channels_last: bool = False,
        allow_tf32: bool | None = None,
        optimizer: OptimizerName = "adamw",
        momentum: float = 0.9,
        trust_coefficient: float = 1e-3,
        warmup_epochs: float = 0.0,
        compile: bool = False,
        compile_mode: str = "default",
        fused_optimizer: bool | None = None,
        schedule_by_updates: bool = False,
    ) -> None:
        super().__init__()
        check_settings(optimizer, compile_mode, lr=lr, weight_decay=weight_decay, warmup_steps=warmup_steps,
                       momentum=momentum, trust_coefficient=trust_coefficient, warmup_epochs=warmup_epochs,
                       reference_batch_size=reference_batch_size, val_window=val_window, val_stride=val_stride,
                       tile_batch_size=tile_batch_size)
        self.save_hyperparameters()
        self.net = CropMappingNet(num_classes=num_classes, **self._net_kwargs())
        self.loss_fn = MultiTaskLoss(
            semantic_weight=semantic_weight,
            parcel_weight=parcel_weight,
            hr_weight=hr_weight,
            ignore_index=ignore_index,
        )
        self.val_seg = SegmentationMetrics(num_classes=num_classes, ignore_index=ignore_index)
        self.val_parcel = ParcelMetrics()
        self.val_hr = HighGridMetrics()
        # val/loss: each loss term summed over its own elements, and those counted, across batches and ranks
        self.val_loss_terms = torch.nn.ModuleDict({f"{name}_{part}": torchmetrics.SumMetric(nan_strategy="disable")
                                                   for name in ("semantic", "parcel", "hr") for part in ("sum", "n")})
        self.test_seg = SegmentationMetrics(num_classes=num_classes, ignore_index=ignore_index)
        self.best_miou: float = float("nan")
        self.best_epoch: int = -1
        self._fit_t0, self._miou_by_time = time.perf_counter(), []  # (s since training start, val/mIoU)
        self.lr_effective: float = lr
        self.global_batch: int | None = None
        self.flops_per_sample: float | None = None
        self.flops_by_class: dict[str, float] | None = None
        self._last_train_loss: float | None = None
        self._train_net: list[Any] = []  # the compiled network (model.compile), kept out of the module tree
        self.fused_optimizer_used: tuple[bool, str] | None = None

    # ------------------------------------------------------------------ set-up
    @override
    def setup(self, stage: str) -> None:
        if self.hparams.allow_tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = bool(self.hparams.allow_tf32)
            torch.backends.cudnn.allow_tf32 = bool(self.hparams.allow_tf32)
        if self.hparams.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        self._setup_compile()
        t2, t1, crop = self.hparams.get("t2", 16), self.hparams.get("t1", 4), self.hparams.get("crop_size", 32)
        if crop % self.net.stride:
            raise CropScaleError(
                f"data.crop_size={crop} must be a multiple of the network's FPN stride {self.net.stride}"
            )
        if self.hparams.val_window % self.net.stride:
            raise CropScaleError(
                f"model.val_window={self.hparams.val_window} must be a multiple of the network's FPN stride"
                f" {self.net.stride} (usually the training crop size, data.crop_size={crop})"
            )
        if self.example_input_array is None:
            sample = synthetic_batch(1, t2=t2, t1=t1, height=crop, width=crop, num_classes=self.hparams.num_classes)
            self.example_input_array = model_inputs(sample)
        if stage == "fit" and self.flops_per_sample is None:
            fresh = CropMappingNet(num_classes=self.hparams.num_classes, **self._net_kwargs())
            self.flops_per_sample = float(flops_per_sample(fresh, t2=t2, t1=t1, height=crop, width=crop)["total"])
            if self.trainer.strategy.root_device.type == "cuda":  # the split weights GPU peaks (MFU); none on CPU
                split = flops_per_sample_by_class(fresh, t2=t2, t1=t1, height=crop, width=crop)
                self.flops_by_class = {k: float(v) for k, v in split.items()}

    def _setup_compile(self) -> None:
        """``model.compile``: the compiled network used by ``training_step`` (the parameters are ``self.net``'s)."""
        if not self.hparams.get("compile", False) or self._train_net:
            return
        device = self.trainer.strategy.root_device.type if self._trainer is not None else "cpu"
        self._train_net.append(compile_network(self.net, self.hparams.get("compile_mode", "default"), device))

    def _net_kwargs(self) -> dict[str, Any]:
        """``net_kwargs`` without ``num_classes``, which always comes from the task (linked from the data).

        Raises:
            ConfigError: a key that is not an argument of the network (``settings.check_net_kwargs``).
        """
        kwargs = dict(self.hparams.net_kwargs or {})
        check_net_kwargs(kwargs)
        kwargs.pop("num_classes", None)
        return kwargs

    def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Network outputs ``{"semantic": [B,C,H,W], "parcel": [B,3,H,W], "hr": [B,3,10H,10W]}``."""
        return self.net(**inputs)

    # ---------------------------------------------------------------- training
    @override
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """Multi-task loss of one (micro-)batch; no device-to-host read except at log steps.

        ``train/loss`` and its terms stay device tensors (Lightning writes them to the logger at log
        steps). The progress bar shows ``train_loss``, the loss of the last log step copied to the host
        there: a device tensor in the progress bar would be read back (``.item()``, a synchronisation)
        at every step.
        """
        net = self._train_net[0] if self._train_net else self.net
        outputs = net(**model_inputs(batch))
        loss, terms = self.loss_fn(outputs, batch)
        bs = batch["s2"].shape[0]
        self.log("train/loss", loss, on_step=True, on_epoch=True, batch_size=bs)
        for name, value in terms.items():
            self.log(f"train/loss_{name}", value, on_step=True, on_epoch=False, batch_size=bs)
        every = self.trainer.log_every_n_steps
        if every > 0 and (self.trainer.global_step + 1) % every == 0:  # Lightning's log steps
            self.log("train_loss", loss.detach().cpu(), on_step=True, on_epoch=False, prog_bar=True, logger=False,
                     batch_size=bs)
        return loss

    @override
    def on_train_epoch_end(self) -> None:
        value = self.trainer.callback_metrics.get("train/loss_epoch")
        if value is not None:
            self._last_train_loss = float(value)

    # -------------------------------------------------------------- validation
    def _tiled_forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return sliding_window_inference(
            self.net,
            model_inputs(batch),
            window=self.hparams.val_window,
            stride=self.hparams.val_stride,
            tile_batch_size=self.hparams.tile_batch_size,
        )

    @override
    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        batch, outputs = without_placeholders(batch, self._tiled_forward(batch))
        if batch is None:  # a rank without a patch: its metrics and loss sums stay empty (zero weight)
            return
        _, terms = self.loss_fn(outputs, batch)
        counts = loss_term_counts(batch, self.loss_fn.ignore_index)
        for name, count in counts.items():  # term = its sum / its count: sum = term x count
            self.val_loss_terms[f"{name}_sum"].update(terms[name].detach().float() * count)
            self.val_loss_terms[f"{name}_n"].update(count)
        self.val_seg.update(outputs["semantic"].detach(), batch["semantic"])
        self.val_parcel.update(outputs["parcel"].detach(), batch["parcel"], batch["parcel_present"])
        self.val_hr.update(outputs["hr"].detach(), batch["hr"], batch["hr_present"])

    @override
    def on_validation_epoch_end(self) -> None:
        seg = self.val_seg.compute()
        miou = float(seg["mIoU"])
        logs = {"val/loss": self._val_loss(), "val/mIoU": seg["mIoU"], "val/OA": seg["OA"]}
        # Parcel and high-grid scores are NaN when no validation patch has that target (e.g. PASTIS
        # without SPOT): such keys are left out rather than logged as NaN.
        for extra in (self.val_parcel.compute(), self.val_hr.compute()):
            logs.update({f"val/{k}": v for k, v in extra.items() if torch.isfinite(torch.as_tensor(v)).all()})
        names = self.hparams.class_names or [str(i) for i in range(self.hparams.num_classes)]
        logs.update(class_iou_keys(names, seg["iou_per_class"].tolist(), seg["support"]))
        if not self.trainer.sanity_checking:
            finite = nonfinite_parameters(self.trainer, self)[0] == 0  # every rank: a non-finite model is no best
            if finite and not (self.best_miou >= miou):  # also true while best is NaN
                self.best_miou, self.best_epoch = miou, self.current_epoch
            self._miou_by_time.append((time.perf_counter() - self._fit_t0, miou))
            logs["val/mIoU_best"] = self.best_miou
            if isinstance(self.logger, TensorBoardLogger) and self.trainer.is_global_zero:
                fig = confusion_matrix_figure(seg["confusion_matrix"].cpu(), names)
                self.logger.experiment.add_figure("val/confusion_matrix", fig, self.global_step)
        for key, value in logs.items():
            self.log(key, torch.as_tensor(value, dtype=torch.float32), sync_dist=False)
        self.val_seg.reset()
        self.val_parcel.reset()
        self.val_hr.reset()
        for metric in self.val_loss_terms.values():
            metric.reset()

    def _val_loss(self) -> torch.Tensor:
        """``val/loss``: the multi-task loss of the whole validation set, the same for any batching and world size.

        Each term is the mean over its own elements (non-ignored pixels, samples with the target) of the
        whole set: the batch values weighted by their element counts, summed across ranks (a term without
        elements is 0, as in the loss); then the weighted sum of the terms. A mean of per-batch losses
        weighted by samples would depend on how patches are grouped into batches and ranks.
        """
        weights = {"semantic": self.loss_fn.semantic_weight, "parcel": self.loss_fn.parcel_weight,
                   "hr": self.loss_fn.hr_weight}
        return weighted_term_mean(weights, {k: m.compute() for k, m in self.val_loss_terms.items()}, self.device)

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        """Tiled prediction of whole patches.

        Evaluation placeholders (``patch_id = -1``, :mod:`cropscale.batch`) are left out, so ``B`` counts the
        real patches of the batch (0 on a rank that only had a placeholder).

        Returns:
            ``{"patch_id": [B] int64, "semantic": [B, H, W] int64 class ids (argmax of the blended
            logits), "semantic_logits": [B, C, H, W], "parcel": [B, 3, H, W] probabilities (sigmoid of
            extent, boundary, distance logits), "hr": [B, 3, 10H, 10W] RGB in [0, 1]}``.
        """
        batch, outputs = without_placeholders(batch, self._tiled_forward(batch), keep_empty=True)
        return {
            "patch_id": batch["patch_id"],
            "semantic": outputs["semantic"].argmax(dim=1),
            "semantic_logits": outputs["semantic"],
            "parcel": torch.sigmoid(outputs["parcel"]),
            "hr": outputs["hr"],
        }

    @override
    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        batch, outputs = without_placeholders(batch, self._tiled_forward(batch))
        if batch is None:
            return
        self.test_seg.update(outputs["semantic"].detach(), batch["semantic"])

    @override
    def on_test_epoch_end(self) -> None:
        seg = self.test_seg.compute()
        self.log("test/mIoU", seg["mIoU"].float())
        self.log("test/OA", seg["OA"].float())
        self.test_seg.reset()

    # --------------------------------------------------------------- optimiser
    @override
    def configure_optimizers(self):
        """The optimiser and LR schedule (:func:`~cropscale.model.optim.configure_optimization`), printed."""
        setup = configure_optimization(self.trainer, self.named_parameters(), self.hparams)
        self.global_batch, self.lr_effective, self.fused_optimizer_used = (setup.global_batch, setup.lr_effective,
                                                                          setup.fused)
        return setup.config

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip by global norm, under FSDP too (:func:`~cropscale.model.optim.clip_gradients_by_norm`)."""
        clip_gradients_by_norm(self, optimizer, gradient_clip_val, gradient_clip_algorithm)

    @override
    def on_train_start(self) -> None:
        self._fit_t0, self._miou_by_time = time.perf_counter(), []
        if self.logger is not None:
            self.logger.log_metrics(
                {"optim/global_batch": float(self.global_batch or 0), "optim/lr_scaled": self.lr_effective}, step=0
            )

    @override
    def on_fit_start(self) -> None:
        """Write the custom-scalars layout of this run (:func:`~cropscale.runs.tensorboard.custom_scalars_layout`)."""
        if isinstance(self.logger, TensorBoardLogger) and self.trainer.is_global_zero:
            scaler = getattr(self.trainer.precision_plugin, "scaler", None) is not None
            cuda = self.trainer.strategy.root_device.type == "cuda"
            self.logger.experiment.add_custom_scalars(custom_scalars_layout(scaler, cuda))

    @override
    def on_fit_end(self) -> None:
        """HPARAMS: the compared settings and the run's final figures (``run/<figure>`` scalars at the last step).

        The figures are the run folder's (:func:`~cropscale.runs.record.load_run`: ``run.json``, written by
        :class:`~cropscale.callbacks.ProvenanceCallback` before this hook, and the events), the same as the
        end-of-fit summary's; ``run/time_to_target_s`` is the time from training start until the best-so-far
        ``val/mIoU`` reached :data:`~cropscale.numbers.TARGET_FRACTION` of the run's best. A figure that is
        n/a is not written.
        """
        if not isinstance(self.logger, TensorBoardLogger) or not self.trainer.is_global_zero:
            return
        writer = self.logger.experiment
        writer.flush()  # the events load_run reads
        record = load_run(self.logger.log_dir)
        values = {f"run/{key}": fig.value for key, fig in record.figures.items()}
        values["run/time_to_target_s"] = time_to_target(self._miou_by_time, TARGET_FRACTION * self.best_miou)
        for metric in HPARAMS_METRICS:
            value = values.get(metric.tag)
            if isinstance(value, int | float) and math.isfinite(value):
                writer.add_scalar(metric.tag, float(value), self.global_step)
        for summary in hparams_summaries(self.compared_settings(record)):
            writer._get_file_writer().add_summary(summary)  # as Lightning's log_hyperparams writes them
        writer.flush()

    def compared_settings(self, record: RunRecord | None = None) -> dict[str, str | int | float]:
        """The settings a user compares across runs, for HPARAMS, the five shown first leading.

        Args:
            record: the run folder's record: its ``run.json`` gives ``amp/scaler_in_use`` and ``energy/available``.

        Returns:
            ``{name: value}``; booleans as ``"true"`` / ``"false"``; settings that are not known (None) left out.
        """
        trainer, hp = self.trainer, self.hparams
        dm = getattr(trainer, "datamodule", None)
        summary = record.run_json.summary if record is not None and record.run_json is not None else None
        settings: dict[str, Any] = {
            "precision": str(trainer.precision), "strategy": type(trainer.strategy).__name__,
            "devices": trainer.world_size, "global_batch": self.global_batch, "lr": hp.lr,
            "local_batch": getattr(dm, "batch_size", None), "accumulate_grad_batches": trainer.accumulate_grad_batches,
            "compile": hp.get("compile", False), "optimizer": hp.optimizer, "lr_scaling": hp.lr_scaling,
            "lr_scaled": self.lr_effective, "num_nodes": trainer.num_nodes,
            "amp/scaler_in_use": summary.loss_scale.scaler_in_use if summary and summary.loss_scale else None,
            "energy/available": summary.energy.available if summary and summary.energy else None,
        }
        return {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in settings.items() if v is not None}

    # ------------------------------------------------------------- checkpoint
    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["cropscale"] = {"best_miou": self.best_miou, "best_epoch": self.best_epoch}

    @override
    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """``torch.nn.Module.load_state_dict``; weights that do not fit this network are a :class:`CheckpointError`.

        Raises:
            CheckpointError: missing, unexpected or differently shaped weights (torch's ``RuntimeError``
                ``Error(s) in loading state_dict``), naming ``--ckpt_path``.
        """
        try:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        except RuntimeError as err:
            raise CheckpointError(
                f"--ckpt_path {self._ckpt_path() or ''} holds weights of another network (e.g. another class count"
                f" or net_kwargs): {' '.join(str(err).split())[:300]}"
            ) from err

    def _ckpt_path(self) -> str | None:
        return getattr(self._trainer, "ckpt_path", None) if self._trainer is not None else None

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.check_architecture(checkpoint.get("hyper_parameters"))
        state = checkpoint.get("cropscale", {})
        self.best_miou = float(state.get("best_miou", float("nan")))
        self.best_epoch = int(state.get("best_epoch", -1))

    def check_architecture(self, saved: dict[str, Any] | None, ckpt_path: str | None = None) -> None:
        """Refuse a checkpoint whose network differs (class count, ``net_kwargs``) from this task's.

        The CLI calls it before the command writes anything (:mod:`cropscale.cli.main`), Lightning's restore again.

        Args:
            saved: the checkpoint's ``hyper_parameters``.
            ckpt_path: the checkpoint, for the message (default: the trainer's ``ckpt_path``).

        Raises:
            CheckpointError: naming the settings that differ, with both values (from the command line, a
                ``--config`` file or ``data`` (class count) vs the checkpoint).
        """
        mismatch = architecture_mismatch(self.hparams, saved)
        if mismatch:
            raise CheckpointError(
                f"--ckpt_path {ckpt_path or self._ckpt_path() or ''} holds a network with {mismatch} (command line,"
                " --config or the data's classes.json): a checkpoint's architecture cannot change; drop those settings"
                " or train a new model"
            )

