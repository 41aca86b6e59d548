"""The input side: PASTIS-HD reader, temporal sampling, coupled augmentation, targets, statistics,
collate and the LightningDataModule.

=====================  ==========================================================
module                 content
=====================  ==========================================================
``metadata``           ``metadata.geojson`` / ``classes.json`` parsing, day of year
``dataset``            :class:`PastisHDDataset` (memory-mapped NPY, file checks)
``temporal``           date validity and the T2 / T1 date-selection rules
``transforms``         flips and 90-degree rotations applied to every grid together
``targets``            parcel extent / boundary / distance from instance ids
``hr``                 windowed, resampling GeoTIFF reads of the high grid
``stats``              per-band statistics of the training folds (JSON)
``collate``            samples -> :mod:`cropscale.batch` batch (every key, always)
``datamodule``         :class:`PastisHDDataModule` (LightningCLI ``data:``)
``sharding``           exact evaluation sharding across ranks
``bench``              ``python -m cropscale loader-bench``: loader samples/s
=====================  ==========================================================
"""

from cropscale.data.dataset import PastisHDDataset, index_patches
from cropscale.data.stats import NormStats, compute_norm_stats

__all__ = ["NormStats", "PastisHDDataModule", "PastisHDDataset", "compute_norm_stats", "index_patches"]


def __getattr__(name: str):
    if name == "PastisHDDataModule":  # imported lazily: it pulls in Lightning
        from cropscale.data.datamodule import PastisHDDataModule

        return PastisHDDataModule
    raise AttributeError(f"module 'cropscale.data' has no attribute {name!r}")
