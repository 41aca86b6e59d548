"""cropscale: train a multimodal Sentinel-1/Sentinel-2 crop-mapping model with PyTorch Lightning and
measure how the run spends its time, energy and numerics (see README.md)."""

__version__ = "0.1.0"


class CropScaleError(ValueError):
    """A user-facing error: bad input data, a bad argument or a bad configuration.

    The message names the file, patch or argument at fault. The CLI prints it as one paragraph
    (``cropscale: error: ...``) and exits with status 2 instead of showing a traceback.
    """
