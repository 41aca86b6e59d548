"""The user-facing errors of cropscale (layer 0: imports nothing of the project).

:class:`CropScaleError` is the family: a bad input file, a bad argument or a bad configuration. Its
message names the file, patch or argument at fault; the CLI prints it as one line
(``cropscale: error: ...``) and exits with status 2 instead of showing a traceback.
"""

from __future__ import annotations


class CropScaleError(ValueError):
    """A user-facing error: bad input data, a bad argument or a bad configuration.

    The message names the file, patch or argument at fault. The CLI prints it as one paragraph
    (``cropscale: error: ...``) and exits with status 2 instead of showing a traceback.
    """
