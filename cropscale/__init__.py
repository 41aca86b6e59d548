"""cropscale: multimodal Sentinel-1/Sentinel-2 crop mapping with PyTorch Lightning, and measurement of the run.

Trains a multimodal Sentinel-1/Sentinel-2 crop-mapping model with PyTorch Lightning and measures how the run
spends its time, energy and numerics (see README.md).
"""

from cropscale.errors import CropScaleError

__version__ = "0.1.0"

__all__ = ["CropScaleError", "__version__"]
