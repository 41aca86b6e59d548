"""The batch contract shared by the data pipeline, the network, the task, tiling and the callbacks.

A batch is a ``dict[str, Tensor]`` produced by :func:`cropscale.data.collate.collate` (``B`` samples,
``T2`` Sentinel-2 dates, ``T1`` dates per Sentinel-1 orbit, ``H x W`` pixels at 10 m; the high
grid is ``10H x 10W`` at 1 m):

=================  ==========================  ==============================================
key                shape, dtype                content
=================  ==========================  ==============================================
``s2``             ``[B, T2, 10, H, W]`` f32   Sentinel-2 B02 B03 B04 B05 B06 B07 B08 B8A B11 B12,
                                               reflectance x 1e4, normalised with training-fold
                                               per-band statistics
``s2_doy``         ``[B, T2]`` int64           day of year (1..366) of each sampled date,
                                               0 for a padding date
``s2_mask``        ``[B, T2, H, W]`` bool      True = clear observation (per date and pixel)
``s1a``            ``[B, T1, 2, H, W]`` f32    Sentinel-1 ascending VV, VH backscatter (dB), normalised
``s1a_doy``        ``[B, T1]`` int64           day of year, 0 for a padding or absent date
``s1a_mask``       ``[B, T1]`` bool            True = real date; all False = orbit absent for the sample
``s1d``, ...       as ``s1a``                  descending orbit
``semantic``       ``[B, H, W]`` int64         crop class id (``ignore_index`` where unlabelled/void)
``parcel``         ``[B, 3, H, W]`` f32        parcel targets: extent, boundary, distance to boundary
``parcel_present`` ``[B]`` bool                False where the sample has no instance annotation
``hr``             ``[B, 3, 10H, 10W]`` f32    high-grid RGB target in [0, 1]
``hr_present``     ``[B]`` bool                False where the sample has no high-grid image
``patch_id``       ``[B]`` int64               dataset patch id (``ID_PATCH``); ``PLACEHOLDER_PATCH_ID``
                                               (-1) marks an evaluation placeholder (below)
``crop_yx``        ``[B, 2]`` int64            top-left row, column of the 10 m crop in its patch
=================  ==========================  ==============================================

An evaluation placeholder is a copy of a real patch given to a rank that has fewer patches than
the others under DDP (:class:`cropscale.data.sharding.PaddedEvalDataset`), so that every rank runs the
same number of evaluation steps; it is run through the network like any sample and then dropped
before any metric, loss or prediction counts it.

The network is called as ``net(**{k: batch[k] for k in MODEL_INPUT_KEYS})`` and returns
``{"semantic": [B, C, H, W], "parcel": [B, 3, H, W], "hr": [B, 3, 10H, 10W]}``.
"""

MODEL_INPUT_KEYS: tuple[str, ...] = (
    "s2", "s2_doy", "s2_mask",
    "s1a", "s1a_doy", "s1a_mask",
    "s1d", "s1d_doy", "s1d_mask",
)
TARGET_KEYS: tuple[str, ...] = ("semantic", "parcel", "parcel_present", "hr", "hr_present")
ID_KEYS: tuple[str, ...] = ("patch_id", "crop_yx")
OUTPUT_KEYS: tuple[str, ...] = ("semantic", "parcel", "hr")
PLACEHOLDER_PATCH_ID: int = -1
"""``patch_id`` of an evaluation placeholder: a sample that no metric, loss or prediction counts."""
HR_SCALE: int = 10
"""Ratio of the high grid (1 m) to the Sentinel grid (10 m)."""
S2_BANDS: tuple[str, ...] = ("B02", "B03", "B04", "B05", "B06", "B07", "B08", "B8A", "B11", "B12")
S1_BANDS: tuple[str, ...] = ("VV", "VH")
PARCEL_TARGETS: tuple[str, ...] = ("extent", "boundary", "distance")


def model_inputs(batch: dict) -> dict:
    """The subset of ``batch`` that the network takes as keyword arguments."""
    return {k: batch[k] for k in MODEL_INPUT_KEYS if k in batch}
