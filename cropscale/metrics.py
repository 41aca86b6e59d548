"""Validation metrics whose states are sums, so they aggregate exactly over any number of ranks.

Every metric here is a :class:`torchmetrics.Metric` whose states are counts or sums with
``dist_reduce_fx="sum"``: under DDP, ``compute()`` all-reduces the states of all ranks first and
then derives the score, so a metric computed on ``N`` patches spread over any world size equals the
one computed on one process (exactly for the integer confusion matrix and boundary counts; to float64
rounding for the high-grid error sums). Never average an already-computed score across ranks.

- :class:`SegmentationMetrics`: confusion matrix of the semantic map -> macro IoU, per-class IoU,
  per-class support, overall accuracy; :func:`confusion_matrix_figure` draws it.
- :class:`ParcelMetrics`: boundary F1 with a pixel tolerance (BF score, Csurka et al. 2013).
- :class:`HighGridMetrics`: L1 and PSNR of the high-grid RGB in [0, 1].
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.functional.classification import multiclass_confusion_matrix

from cropscale.errors import CropScaleError


class SegmentationMetrics(Metric):
    """Semantic segmentation scores from a confusion matrix summed over batches and ranks.

    The state ``confmat [C, C]`` int64 counts pixels by (target row, predicted column), the
    torchmetrics convention; pixels whose target is ``ignore_index`` are not counted.

    Conventions of :meth:`compute` (the same as torchmetrics' ``MulticlassJaccardIndex(average=
    "macro")`` and as PASTIS's U-TAE code, which takes ``nanmean`` of the per-class IoU):

    - ``IoU_c = TP_c / (TP_c + FP_c + FN_c)``.
    - A class absent from both target and prediction (``TP + FP + FN = 0``) has IoU NaN and is
      **excluded** from the macro mean. A class absent from the target but predicted somewhere has
      IoU 0 and is included (its false positives count).
    - If ``ignore_index`` is a class id (PASTIS: 19, "void"), that class is excluded from the mean
      (IoU NaN) too; a labelled pixel predicted as it is an error (a false negative of the true class).
      (U-TAE instead drops such pixels by zeroing the void column.)
    - ``mIoU`` is the mean of the non-NaN per-class IoU, NaN if there is none (nothing counted).
    - ``OA = sum_c TP_c / (counted pixels)``, NaN if no pixel was counted.

    Scores are float64 (counts above 2^24 pixels are not exact in float32).

    Args:
        num_classes: ``C``.
        ignore_index: target value not counted (any int, inside ``[0, C)`` or not), or None.
        validate_args: check value ranges in :meth:`update` (one host sync per call).
        **kwargs: passed to :class:`torchmetrics.Metric`.

    Raises:
        CropScaleError: ``num_classes < 2``; bad shapes or values in :meth:`update`.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, num_classes: int, ignore_index: int | None = None, validate_args: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise CropScaleError(f"SegmentationMetrics: num_classes must be an int >= 2, got {num_classes!r}")
        if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, int)):
            raise CropScaleError(f"SegmentationMetrics: ignore_index must be an int or None, got {ignore_index!r}")
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.validate_args = validate_args
        self.add_state("confmat", default=torch.zeros(num_classes, num_classes, dtype=torch.long),
                       dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Count one batch.

        Args:
            preds: ``[B, C, H, W]`` float scores or logits (argmax over ``C``), or ``[B, H, W]`` int labels.
            target: ``[B, H, W]`` int class ids in ``[0, C)`` or ``ignore_index``.

        Raises:
            CropScaleError: shapes that do not match, or (with ``validate_args``) a label outside
                ``[0, C)`` that is not ``ignore_index``.
        """
        c = self.num_classes
        if target.dim() != 3 or target.is_floating_point():
            raise CropScaleError(f"SegmentationMetrics: target must be int [B, H, W], got {target.dtype} "
                                 f"{tuple(target.shape)}")
        if preds.is_floating_point():
            if preds.dim() != 4 or preds.shape[1] != c or preds.shape[:1] + preds.shape[2:] != target.shape:
                raise CropScaleError(f"SegmentationMetrics: float preds must be [B, {c}, H, W] matching target "
                                     f"{tuple(target.shape)}, got {tuple(preds.shape)}")
            labels = preds.argmax(dim=1)
        else:
            if preds.shape != target.shape:
                raise CropScaleError(f"SegmentationMetrics: label preds {tuple(preds.shape)} must match target "
                                     f"{tuple(target.shape)}")
            labels = preds
            if self.validate_args and labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= c):
                raise CropScaleError(f"SegmentationMetrics: predicted labels must be in [0, {c}), got "
                                     f"[{int(labels.min())}, {int(labels.max())}]")
        if self.validate_args:
            bad = (target < 0) | (target >= c)
            if self.ignore_index is not None:
                bad &= target != self.ignore_index
            if bool(bad.any()):
                raise CropScaleError(
                    f"SegmentationMetrics: target holds {int(bad.sum())} pixels outside [0, {c}) that are not "
                    f"ignore_index={self.ignore_index} (e.g. {int(target[bad][0])})")
        self.confmat += multiclass_confusion_matrix(
            labels, target, num_classes=c, ignore_index=self.ignore_index, validate_args=False)

    def compute(self) -> dict[str, Tensor]:
        """Scores from the (rank-summed) confusion matrix.

        Returns:
            ``{"mIoU": [] , "OA": [], "iou_per_class": [C], "support": [C] int64 (target pixels per
            class), "confusion_matrix": [C, C] int64}``, scores float64 in [0, 1] (NaN as stated above).
        """
        return scores_from_confusion_matrix(self.confmat, self.ignore_index)


def scores_from_confusion_matrix(confmat: Tensor, ignore_index: int | None = None) -> dict[str, Tensor]:
    """Macro IoU, per-class IoU, support and overall accuracy of a ``[C, C]`` confusion matrix.

    Rows are targets, columns predictions; conventions as in :class:`SegmentationMetrics`.
    """
    cm = confmat.to(torch.float64)
    tp = cm.diagonal()
    support = cm.sum(dim=1)
    union = support + cm.sum(dim=0) - tp
    iou = torch.where(union > 0, tp / union.clamp(min=1), torch.full_like(tp, math.nan))
    if ignore_index is not None and 0 <= ignore_index < cm.shape[0]:
        iou[ignore_index] = math.nan
    present = ~torch.isnan(iou)
    miou = iou[present].mean() if bool(present.any()) else torch.tensor(math.nan, dtype=torch.float64)
    total = cm.sum()
    oa = tp.sum() / total if total > 0 else torch.tensor(math.nan, dtype=torch.float64)
    return {"mIoU": miou, "OA": oa, "iou_per_class": iou, "support": confmat.sum(dim=1).to(torch.long),
            "confusion_matrix": confmat.clone()}


#: Width (px) at which TensorBoard shows an image card by default (Images and Time Series tabs, 1600 px window).
TENSORBOARD_CARD_PX = 360


def confusion_matrix_figure(cm: Tensor | np.ndarray, class_names: Sequence[str] | None = None,
                            title: str = "% of each target class (rows)") -> Figure:
    """Row-normalised confusion matrix as a matplotlib figure (Agg canvas, no pyplot state), readable in TensorBoard.

    The target axis names each class (``name (id)``, on at most two lines), the prediction axis gives the
    ids; each cell holds its row share in percent. The fonts are sized so that, with up to 12 classes, the
    text is at least 9 px tall when TensorBoard scales the image to its card width
    (:data:`TENSORBOARD_CARD_PX`).

    Args:
        cm: ``[C, C]`` counts, rows = target, columns = prediction.
        class_names: ``C`` tick labels; default the class ids.
        title: axes title.

    Returns:
        A :class:`matplotlib.figure.Figure` (e.g. for ``SummaryWriter.add_figure``); rows with no
        target pixel are drawn blank (NaN) and without numbers. Cell ``(i, j)`` is ``cm[i, j] / sum_j cm[i, j]``.

    Raises:
        CropScaleError: ``cm`` not square, or ``class_names`` of the wrong length.
    """
    m = np.asarray(cm.detach().cpu() if isinstance(cm, Tensor) else cm, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise CropScaleError(f"confusion_matrix_figure: cm must be [C, C], got {m.shape}")
    c = m.shape[0]
    names = [str(i) for i in range(c)] if class_names is None else [str(n) for n in class_names]
    if len(names) != c:
        raise CropScaleError(f"confusion_matrix_figure: {len(names)} class names for {c} classes")
    rows = m.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        norm = np.where(rows > 0, m / np.where(rows > 0, rows, 1.0), np.nan)
    width_in = 3.5 + 0.5 * c  # 3.5 in of class names, 0.5 in per cell
    font = 1.85 * width_in  # points: 9 px tall once the image is scaled to the card (1.8 * width_in is the limit)
    fig = Figure(figsize=(width_in, 1.2 + 0.5 * c), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.imshow(norm, vmin=0.0, vmax=1.0, cmap="Blues", interpolation="nearest")
    ax.set_xticks(range(c), labels=[str(i) for i in range(c)], fontsize=font)
    labels = [textwrap.fill(f"{n[:36]} ({i})", 18, max_lines=2, placeholder="...") for i, n in enumerate(names)]
    ax.set_yticks(range(c), labels=labels, fontsize=font)
    ax.set_xlabel("prediction (class id)", fontsize=font)
    ax.set_ylabel("target", fontsize=font)
    ax.set_title(title, fontsize=font)
    if c <= 25:
        cell_font = min(font, 20.0)  # three digits fit in a 0.5 in cell
        for i in range(c):
            for j in range(c):
                if np.isfinite(norm[i, j]):
                    ax.text(j, i, f"{100 * norm[i, j]:.0f}", ha="center", va="center", fontsize=cell_font,
                            color="white" if norm[i, j] > 0.6 else "black")
    fig.tight_layout()
    return fig


def _select_present(owner: str, present: Tensor | None, preds: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Keep the samples whose target is present (``present [B]`` bool; None = all).

    Raises:
        CropScaleError: ``present`` is not ``[B]``.
    """
    if present is None:
        return preds, target
    if present.shape != preds.shape[:1]:
        raise CropScaleError(f"{owner}: present must be [{preds.shape[0]}] bool, got {tuple(present.shape)}")
    keep = present.to(torch.bool)
    return preds[keep], target[keep]


def _disk(radius: int, device: torch.device) -> Tensor:
    r = torch.arange(-radius, radius + 1, device=device, dtype=torch.float32)
    return ((r[:, None] ** 2 + r[None, :] ** 2) <= radius**2 + 1e-6).to(torch.float32)


def _within(mask: Tensor, radius: int) -> Tensor:
    """Pixels within Euclidean distance ``radius`` of a True pixel of ``mask [N, H, W]`` bool."""
    if radius == 0:
        return mask
    kernel = _disk(radius, mask.device)[None, None]
    hits = F.conv2d(mask[:, None].to(torch.float32), kernel, padding=radius)[:, 0]
    return hits > 0.5


class ParcelMetrics(Metric):
    """Parcel-boundary F1 with a pixel tolerance (the BF score), pooled over all patches.

    The BF score is that of Csurka, Larlus & Perronnin, "What is a good evaluation measure for semantic
    segmentation?", BMVC 2013.

    A predicted boundary pixel is a true positive for precision if a target boundary pixel lies within
    Euclidean distance ``tolerance`` (10 m pixels), and a target boundary pixel counts for recall if a
    predicted one lies within it. The four counts (predicted, matched predicted, target, matched
    target boundary pixels) are sum states, so ``precision = matched_pred / pred``, ``recall =
    matched_target / target`` and ``F1 = 2PR / (P + R)`` are exact under DDP. Unlike Csurka et al.,
    who average a per-image score, the counts are pooled over the data set (a patch with few
    boundary pixels does not weigh as much as one with many).

    Conventions: precision is 0 when nothing is predicted but target boundaries exist (and recall 0
    in the converse case); F1 is 0 when ``P + R = 0``; all three are NaN when neither prediction nor
    target has a boundary pixel (or nothing was counted).

    Args:
        tolerance: matching distance in pixels (int >= 0).
        boundary_channel: channel of the parcel tensors holding the boundary (``PARCEL_TARGETS``: 1).
        logit_threshold: a predicted boundary is ``preds[:, boundary_channel] > logit_threshold``
            (0 = probability 0.5 for ``CropMappingNet``'s parcel logits).
        target_threshold: a target boundary is ``target[:, boundary_channel] > target_threshold``.

    Raises:
        CropScaleError: a bad argument, or bad shapes in :meth:`update`.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, tolerance: int = 1, boundary_channel: int = 1, logit_threshold: float = 0.0,
                 target_threshold: float = 0.5, **kwargs) -> None:
        super().__init__(**kwargs)
        if isinstance(tolerance, bool) or not isinstance(tolerance, int) or tolerance < 0:
            raise CropScaleError(f"ParcelMetrics: tolerance must be an int >= 0 (pixels), got {tolerance!r}")
        self.tolerance = tolerance
        self.boundary_channel = boundary_channel
        self.logit_threshold = logit_threshold
        self.target_threshold = target_threshold
        for name in ("pred_boundary", "pred_matched", "target_boundary", "target_matched"):
            self.add_state(name, default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor, present: Tensor | None = None) -> None:
        """Count one batch.

        Args:
            preds: ``[B, K, H, W]`` parcel logits (or a ``[B, H, W]`` bool boundary map).
            target: ``[B, K, H, W]`` parcel targets (or a ``[B, H, W]`` bool boundary map).
            present: ``[B]`` bool, False for samples without instance annotation (skipped); None = all.

        Raises:
            CropScaleError: shapes that do not match or a missing boundary channel.
        """
        pred_b = self._boundary(preds, self.logit_threshold, "preds")
        target_b = self._boundary(target, self.target_threshold, "target")
        if pred_b.shape != target_b.shape:
            raise CropScaleError(f"ParcelMetrics: preds {tuple(preds.shape)} and target {tuple(target.shape)} "
                                 f"do not match")
        pred_b, target_b = _select_present("ParcelMetrics", present, pred_b, target_b)
        if pred_b.shape[0] == 0:
            return
        self.pred_boundary += pred_b.sum()
        self.target_boundary += target_b.sum()
        self.pred_matched += (pred_b & _within(target_b, self.tolerance)).sum()
        self.target_matched += (target_b & _within(pred_b, self.tolerance)).sum()

    def _boundary(self, x: Tensor, threshold: float, name: str) -> Tensor:
        if x.dtype == torch.bool and x.dim() == 3:
            return x
        if x.dim() != 4 or x.shape[1] <= self.boundary_channel:
            raise CropScaleError(f"ParcelMetrics: {name} must be [B, K, H, W] with boundary channel "
                                 f"{self.boundary_channel} (or a [B, H, W] bool map), got {tuple(x.shape)}")
        return x[:, self.boundary_channel] > threshold

    def compute(self) -> dict[str, Tensor]:
        """``{"boundary_F1", "boundary_precision", "boundary_recall"}`` float64 scalars (NaN as stated)."""
        p_n, p_m = self.pred_boundary.double(), self.pred_matched.double()
        t_n, t_m = self.target_boundary.double(), self.target_matched.double()
        nan = torch.tensor(math.nan, dtype=torch.float64, device=p_n.device)
        if p_n == 0 and t_n == 0:
            return {"boundary_F1": nan, "boundary_precision": nan, "boundary_recall": nan}
        precision = p_m / p_n if p_n > 0 else torch.zeros_like(nan)
        recall = t_m / t_n if t_n > 0 else torch.zeros_like(nan)
        f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else torch.zeros_like(nan)
        return {"boundary_F1": f1, "boundary_precision": precision, "boundary_recall": recall}


class HighGridMetrics(Metric):
    """L1 and PSNR of the high-grid RGB (values in ``[0, data_range]``), pooled over all pixels.

    Sum states (float64): ``sum |p - t|``, ``sum (p - t)^2`` and the number of values. Then
    ``L1 = sum|p - t| / n`` and ``PSNR = 10 log10(data_range^2 / MSE)`` dB with ``MSE = sum (p - t)^2 / n``:
    the same as torchmetrics' ``MeanAbsoluteError`` and ``PeakSignalNoiseRatio(data_range=1.0)`` (whose
    default also pools the squared error over the whole data set before the log), exact under DDP.

    Args:
        data_range: value range of the RGB (1.0 for ``hr`` in [0, 1]).
        clamp: clamp predictions to ``[0, data_range]`` first.

    Returns of :meth:`compute`: ``{"hr_L1": [], "hr_PSNR": [] (dB)}`` float64; NaN when nothing was
    counted, PSNR ``inf`` for a perfect prediction.

    Raises:
        CropScaleError: bad shapes in :meth:`update`.
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, data_range: float = 1.0, clamp: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        if not data_range > 0:
            raise CropScaleError(f"HighGridMetrics: data_range must be > 0, got {data_range!r}")
        self.data_range = float(data_range)
        self.clamp = clamp
        for name in ("sum_abs_error", "sum_squared_error", "total"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor, present: Tensor | None = None) -> None:
        """Count one batch.

        Args:
            preds: ``[B, 3, sH, sW]`` predicted RGB.
            target: ``[B, 3, sH, sW]`` target RGB in ``[0, data_range]``.
            present: ``[B]`` bool, False for samples without a high-grid image (skipped); None = all.

        Raises:
            CropScaleError: shapes that do not match.
        """
        if preds.shape != target.shape or preds.dim() != 4:
            raise CropScaleError(f"HighGridMetrics: preds {tuple(preds.shape)} and target {tuple(target.shape)} "
                                 f"must both be [B, 3, sH, sW]")
        preds, target = _select_present("HighGridMetrics", present, preds, target)
        if preds.shape[0] == 0:
            return
        p = preds.detach().to(torch.float64)
        if self.clamp:
            p = p.clamp(0.0, self.data_range)
        diff = p - target.detach().to(torch.float64)
        self.sum_abs_error += diff.abs().sum()
        self.sum_squared_error += (diff * diff).sum()
        self.total += diff.numel()

    def compute(self) -> dict[str, Tensor]:
        """``{"hr_L1": mean absolute error, "hr_PSNR": PSNR in dB}`` float64 scalars."""
        if self.total == 0:
            nan = torch.tensor(math.nan, dtype=torch.float64, device=self.total.device)
            return {"hr_L1": nan, "hr_PSNR": nan.clone()}
        mse = self.sum_squared_error / self.total
        return {"hr_L1": self.sum_abs_error / self.total,
                "hr_PSNR": 10.0 * torch.log10(self.data_range**2 / mse)}
