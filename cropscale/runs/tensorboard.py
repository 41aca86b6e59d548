"""TensorBoard scalars of a run folder (read with tensorboard's ``EventAccumulator``)."""

from __future__ import annotations

from pathlib import Path

from cropscale.errors import CropScaleError

Scalars = dict[str, list[tuple[int, float, float]]]
"""``{tag: [(step, value, wall_time_s), ...]}`` sorted by wall time."""


def events_files(folder: str | Path) -> list[Path]:
    """The TensorBoard event files directly in ``folder``, sorted by name."""
    return sorted(Path(folder).glob("events.out.tfevents.*"))


def load_scalars(folder: str | Path) -> Scalars:
    """Every scalar of the TensorBoard event files directly in ``folder``, files merged.

    Raises:
        CropScaleError: an event file that tensorboard cannot read (truncated, foreign), named.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: Scalars = {}
    for path in events_files(folder):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        try:
            acc.Reload()
        except Exception as err:  # a truncated or foreign file: name it
            raise CropScaleError(f"cannot read TensorBoard events {path}: {err}") from None
        for tag in acc.Tags().get("scalars", []):
            scalars.setdefault(tag, []).extend((e.step, float(e.value), e.wall_time) for e in acc.Scalars(tag))
    for events in scalars.values():
        events.sort(key=lambda e: e[2])
    return scalars


def epoch_series(scalars: Scalars, tag: str) -> list[tuple[int, float]]:
    """``[(epoch, value)]`` of ``tag``.

    The epoch is Lightning's ``epoch`` scalar logged at the same step (nearest in wall time), else the
    event's position (validation once per epoch).
    """
    epochs = scalars.get("epoch", [])
    out = []
    for i, (step, value, wall) in enumerate(scalars.get(tag, [])):
        same = [e for e in epochs if e[0] == step]
        epoch = int(round(min(same, key=lambda e: abs(e[2] - wall))[1])) if same else i
        out.append((epoch, value))
    return out
