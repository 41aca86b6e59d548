"""Tests of cropscale.metrics on hand-computed examples."""

import math

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from torchmetrics.functional.classification import multiclass_jaccard_index
from torchmetrics.image import PeakSignalNoiseRatio
from torchmetrics.regression import MeanAbsoluteError
from torchmetrics.utilities.data import dim_zero_sum

from cropscale import CropScaleError
from cropscale.metrics import (
    HighGridMetrics,
    ParcelMetrics,
    SegmentationMetrics,
    confusion_matrix_figure,
)

torch.set_num_threads(1)


def _pairs(pairs):
    """[(target, pred, count), ...] -> target, pred as [1, 1, N] int64."""
    t = [tt for tt, _, n in pairs for _ in range(n)]
    p = [pp for _, pp, n in pairs for _ in range(n)]
    return torch.tensor(t)[None, None], torch.tensor(p)[None, None]


# 4 classes, ignore_index 255 (outside the class range). Class 2 is predicted but never a target
# (IoU 0, counted); class 3 is predicted only on ignored pixels, so absent from both (excluded).
CASE_255 = [(0, 0, 4), (0, 1, 1), (1, 1, 2), (1, 0, 1), (1, 2, 1), (255, 3, 2), (255, 0, 1)]


def test_macro_iou_on_a_hand_computed_confusion_matrix():
    target, pred = _pairs(CASE_255)
    m = SegmentationMetrics(num_classes=4, ignore_index=255)
    m.update(pred, target)
    out = m.compute()
    assert out["confusion_matrix"].tolist() == [[4, 1, 0, 0], [1, 2, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert out["support"].tolist() == [5, 4, 0, 0]
    iou = out["iou_per_class"].tolist()
    assert iou[:3] == [pytest.approx(4 / 6, abs=1e-15), pytest.approx(2 / 5, abs=1e-15), 0.0]
    assert math.isnan(iou[3])  # absent from target and prediction: excluded from the mean
    assert float(out["mIoU"]) == pytest.approx(16 / 45, abs=1e-15)  # (2/3 + 2/5 + 0) / 3
    assert float(out["OA"]) == pytest.approx(6 / 9, abs=1e-15)
    # the same convention as torchmetrics' macro Jaccard index
    ref = multiclass_jaccard_index(pred, target, num_classes=4, average="macro", ignore_index=255)
    assert float(out["mIoU"]) == pytest.approx(float(ref), abs=1e-6)


def test_ignore_index_inside_the_class_range():
    # void = 3: pixels labelled void are not counted; the void class is not averaged; a labelled
    # pixel predicted as void is an error (false negative of its class).
    target, pred = _pairs([(0, 0, 2), (1, 3, 1), (1, 1, 1), (3, 0, 1), (3, 3, 1), (2, 2, 2)])
    m = SegmentationMetrics(num_classes=4, ignore_index=3)
    m.update(pred, target)
    out = m.compute()
    assert out["confusion_matrix"].tolist() == [[2, 0, 0, 0], [0, 1, 0, 1], [0, 0, 2, 0], [0, 0, 0, 0]]
    iou = out["iou_per_class"].tolist()
    assert iou[:3] == [1.0, 0.5, 1.0] and math.isnan(iou[3])
    assert float(out["mIoU"]) == pytest.approx(5 / 6, abs=1e-15)
    assert float(out["OA"]) == pytest.approx(5 / 6, abs=1e-15)
    ref = multiclass_jaccard_index(pred, target, num_classes=4, average="macro", ignore_index=3)
    assert float(out["mIoU"]) == pytest.approx(float(ref), abs=1e-6)


def test_logits_batches_and_summed_states_give_the_same_matrix():
    target, pred = _pairs(CASE_255)
    logits = torch.nn.functional.one_hot(pred.clamp(max=3), 4).permute(0, 3, 1, 2).float() * 3.0 - 1.0
    whole = SegmentationMetrics(num_classes=4, ignore_index=255)
    whole.update(logits, target)
    # two "ranks" with uneven halves; summing their states is what dist_reduce_fx="sum" does
    a, b = SegmentationMetrics(num_classes=4, ignore_index=255), SegmentationMetrics(num_classes=4, ignore_index=255)
    a.update(pred[..., :5], target[..., :5])
    b.update(pred[..., 5:], target[..., 5:])
    assert torch.equal(a.confmat + b.confmat, whole.confmat)
    assert whole._defaults["confmat"].dtype == torch.long
    assert float(whole.compute()["mIoU"]) == pytest.approx(16 / 45, abs=1e-15)


def test_every_state_is_summed_across_ranks():
    for metric in (SegmentationMetrics(num_classes=3), ParcelMetrics(), HighGridMetrics()):
        assert metric._reductions and all(fx is dim_zero_sum for fx in metric._reductions.values()), metric


def test_empty_metric_and_bad_inputs():
    m = SegmentationMetrics(num_classes=3, ignore_index=None)
    with pytest.warns(UserWarning):
        out = m.compute()
    assert math.isnan(float(out["mIoU"])) and math.isnan(float(out["OA"]))
    with pytest.raises(CropScaleError, match="outside \\[0, 3\\)"):
        m.update(torch.zeros(1, 2, 2, dtype=torch.long), torch.tensor([[[0, 1], [2, 7]]]))
    with pytest.raises(CropScaleError, match="float preds"):
        m.update(torch.zeros(1, 4, 2, 2), torch.zeros(1, 2, 2, dtype=torch.long))
    with pytest.raises(CropScaleError, match="num_classes"):
        SegmentationMetrics(num_classes=1)


def test_confusion_matrix_figure_is_row_normalised():
    cm = torch.tensor([[4, 1, 0, 0], [1, 2, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    fig = confusion_matrix_figure(cm, ["background", "meadow", "wheat", "corn"])
    assert isinstance(fig, Figure)
    shown = np.ma.filled(fig.axes[0].images[0].get_array().astype(float), np.nan)
    np.testing.assert_allclose(shown[:2], [[0.8, 0.2, 0, 0], [0.25, 0.5, 0.25, 0]])
    assert np.isnan(shown[2:]).all()  # no target pixel: blank row
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["background (0)", "meadow (1)", "wheat (2)", "corn (3)"]
    fig.canvas.draw()  # renders with the Agg canvas, no pyplot
    with pytest.raises(CropScaleError, match="3 class names for 4 classes"):
        confusion_matrix_figure(cm, ["a", "b", "c"])


def _line_maps():
    """6x6 boundary maps: target = column 2; prediction = column 3 plus a stray pixel at (0, 5)."""
    target = torch.zeros(1, 3, 6, 6)
    target[0, 1, :, 2] = 1.0
    logits = torch.full((1, 3, 6, 6), -5.0)
    logits[0, 1, :, 3] = 5.0
    logits[0, 1, 0, 5] = 5.0
    return logits, target


@pytest.mark.parametrize("tolerance, precision, recall", [(0, 0.0, 0.0), (1, 6 / 7, 1.0), (3, 1.0, 1.0)])
def test_boundary_f1_with_pixel_tolerance(tolerance, precision, recall):
    logits, target = _line_maps()
    # a second sample without instance annotation must not count
    logits = torch.cat([logits, torch.full_like(logits, 5.0)])
    target = torch.cat([target, torch.zeros_like(target)])
    m = ParcelMetrics(tolerance=tolerance)
    m.update(logits, target, torch.tensor([True, False]))
    out = m.compute()
    assert (int(m.pred_boundary), int(m.target_boundary)) == (7, 6)
    assert float(out["boundary_precision"]) == pytest.approx(precision, abs=1e-15)
    assert float(out["boundary_recall"]) == pytest.approx(recall, abs=1e-15)
    f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    assert float(out["boundary_F1"]) == pytest.approx(f1, abs=1e-15)  # tolerance 1: 12/13


def test_boundary_f1_undefined_without_boundaries():
    m = ParcelMetrics()
    m.update(torch.full((1, 3, 4, 4), -1.0), torch.zeros(1, 3, 4, 4))
    assert all(math.isnan(float(v)) for v in m.compute().values())


def test_high_grid_metrics_match_torchmetrics():
    g = torch.Generator().manual_seed(0)
    preds, target = torch.rand(3, 3, 20, 30, generator=g), torch.rand(3, 3, 20, 30, generator=g)
    present = torch.tensor([True, False, True])
    m = HighGridMetrics()
    m.update(preds[:2], target[:2], present[:2])
    m.update(preds[2:], target[2:], present[2:])
    out = m.compute()
    keep = present
    mae, psnr = MeanAbsoluteError(), PeakSignalNoiseRatio(data_range=1.0)
    mae.update(preds[keep], target[keep])
    psnr.update(preds[keep], target[keep])
    assert float(out["hr_L1"]) == pytest.approx(float(mae.compute()), rel=1e-6)
    assert float(out["hr_PSNR"]) == pytest.approx(float(psnr.compute()), rel=1e-6)
    assert int(m.total) == 2 * 3 * 20 * 30
    # predictions are clamped to [0, 1]: 1.5 against 1.0 is no error
    c = HighGridMetrics()
    c.update(torch.full((1, 3, 2, 2), 1.5), torch.ones(1, 3, 2, 2))
    assert float(c.compute()["hr_L1"]) == 0.0 and math.isinf(float(c.compute()["hr_PSNR"]))




#: TensorBoard shows an image card about 360 px wide by default (Images tab, 1600 px window, seen in a screenshot).
CARD_PX = 360


def test_confusion_matrix_figure_reads_at_tensorboards_card_width(flanders_root):
    """The 10 real class names of the bundled sample: names on the target axis, each cell's row share as a
    percentage in the cell, and every text at least 9 px tall once TensorBoard scales the image to its card."""
    import json

    names = [v["name"] for _, v in sorted(json.loads((flanders_root / "classes.json").read_text()).items(),
                                             key=lambda kv: int(kv[0]))]
    c = len(names)
    rng = np.random.default_rng(0)
    cm = rng.integers(0, 50, size=(c, c))
    cm[3] = 0  # a class without target pixels
    fig = confusion_matrix_figure(torch.as_tensor(cm), names)
    fig.canvas.draw()
    width_px = fig.get_figwidth() * fig.dpi
    ax = fig.axes[0]
    labels = [" ".join(t.get_text().split()) for t in ax.get_yticklabels()]
    assert all(name in label for name, label in zip(names, labels, strict=True)), labels
    cells = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    for i in range(c):
        row = cm[i].sum()
        for j in range(c):
            expected = f"{100 * cm[i, j] / row:.0f}" if row else None
            assert cells.get((i, j)) == expected, (i, j, cells.get((i, j)), expected)
    texts = [*ax.get_xticklabels(), *ax.get_yticklabels(), *ax.texts, ax.xaxis.label, ax.yaxis.label]
    smallest_px = min(t.get_fontsize() for t in texts) * fig.dpi / 72
    assert smallest_px * CARD_PX / width_px >= 9.0, (smallest_px, width_px)
