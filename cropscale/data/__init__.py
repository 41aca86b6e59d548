"""The input side: from PASTIS-HD files to normalised, augmented batches served by a LightningDataModule.

PASTIS-HD reader, temporal sampling, coupled augmentation, targets, statistics, collate and the
LightningDataModule, in these modules:

=====================  ==========================================================
module                 content
=====================  ==========================================================
``metadata``           ``metadata.geojson`` / ``classes.json`` parsing, day of year
``index``              every patch's files resolved and checked (:func:`index_patches`)
``dataset``            :class:`PastisHDDataset` (memory-mapped NPY samples)
``temporal``           date validity and the T2 / T1 date-selection rules
``transforms``         flips and 90-degree rotations applied to every grid together
``targets``            parcel extent / boundary / distance from instance ids
``hr``                 windowed, resampling GeoTIFF reads of the high grid
``stats``              per-band statistics of the training folds (JSON)
``collate``            samples -> :mod:`cropscale.batch` batch (every key, always)
``datamodule``         :class:`PastisHDDataModule` (LightningCLI ``data:``)
``sharding``           exact evaluation sharding across ranks
=====================  ==========================================================
"""

from cropscale.data.datamodule import PastisHDDataModule
from cropscale.data.dataset import PastisHDDataset
from cropscale.data.index import index_patches
from cropscale.data.stats import NormStats, compute_norm_stats

__all__ = ["NormStats", "PastisHDDataModule", "PastisHDDataset", "compute_norm_stats", "index_patches"]
