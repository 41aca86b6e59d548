"""``python -m cropscale tensorboard``: serve the run folders with TensorBoard, ending with the address to open.

The address (:func:`~cropscale.runs.tensorboard.first_screen_url`) opens the Time Series tab with the loss, the
best val/mIoU so far, the step time and the memory pinned at the top; it is printed once TensorBoard answers, as
the last line (TensorBoard's own start-up line, the bare address, is not printed). ``make tensorboard`` runs it.

Example::

    python -m cropscale tensorboard --logdir runs --port 6006
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from cropscale.options import Options, parse_options
from cropscale.runs.tensorboard import serve


@dataclasses.dataclass(kw_only=True)
class TensorBoardOptions(Options):
    """Serve run folders with TensorBoard; the last line printed is the address to open."""

    logdir: str = "runs"
    """the folder of the runs (a logger's save_dir)"""
    host: str = "localhost"
    """the address TensorBoard listens on"""
    port: int = 6006
    """the port (0: a free one)"""

    AT_LEAST: ClassVar[dict[str, float]] = {"port": 0}


def main(argv: list[str] | None = None) -> int:
    """Serve ``--logdir`` until interrupted (:func:`~cropscale.runs.tensorboard.serve`).

    Raises:
        CropScaleError: no such folder, or TensorBoard cannot serve (e.g. the port is taken), named.
        OptionError: a bad option (named).
    """
    args = parse_options(TensorBoardOptions, argv, "python -m cropscale tensorboard")
    serve(args.logdir, args.host, args.port)
    return 0
