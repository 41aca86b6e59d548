"""The input side: from PASTIS-HD files to normalised, augmented batches served by a LightningDataModule.

PASTIS-HD reader, temporal sampling, coupled augmentation, targets, statistics, collate and the
LightningDataModule, in these modules:

=====================  ==========================================================
module                 content
=====================  ==========================================================
``metadata``           ``metadata.geojson`` / ``classes.json`` parsing, day of year
``layout``             the root resolved once: metadata, modality folders read, what is absent
``index``              every patch's files resolved and checked (:func:`index_patches`)
``content``            every value of a patch checked once (the data checks)
``scans``              the checks run over a run's patches, cached by file size and mtime
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
from cropscale.data.layout import resolve_layout
from cropscale.data.scans import compute_norm_stats
from cropscale.data.stats import NormStats

__all__ = ["NormStats", "PastisHDDataModule", "PastisHDDataset", "compute_norm_stats", "index_patches",
           "resolve_layout"]
