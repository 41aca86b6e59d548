"""Which rank hangs: the hang watch's decision, framework-free (plain numbers in, a verdict out).

Every rank of a DDP fit reports its :class:`Progress` about once a second: a *position* in the fit that the
ranks share (they run the same batches in lock step: the all-reduce of every step makes them wait for each
other), the epoch, batch and global step, a *phase* (``training``, or one of the legitimate pauses of
:data:`PAUSES`) and, once its position has stopped moving, *where* its main thread is. Rank 0 feeds what it
reads to :meth:`HangJudge.observe`, which times how long the whole run has been still (no rank moved) and
names a hang when that exceeds a bound.

The bound (:class:`HangBound`) is relative to what this run measured, with a floor:

- during ordinary steps: ``max(floor_s, factor x the longest stillness of ordinary steps so far)``;
- when the rank that is furthest behind is in a pause (the first batch of a fit or of an epoch, which starts the
  DataLoader workers; validation; the epoch end with its checkpoint writes) or has not reported yet:
  ``max(pause_floor_s, factor x the longest such pause so far)``.

A stillness ("episode") is the time between two observations where some rank's position changed; it is
measured on rank 0's monotonic clock, so its resolution is the polling period (a step shorter than the period
counts as one period). The kind of an episode is fixed when it starts.

The hung rank is the one furthest behind (lowest position): under DDP the others run ahead to the next
collective and wait there. Among ranks equally far behind, one in its own code is named before one waiting
in a collective (a victim); when every rank stopped at the same point and none is in its own code the
evidence cannot separate them and all are named (``separated`` is False).

Example::

    judge = HangJudge(world_size=2, bound=HangBound(floor_s=60))
    hang = judge.observe(time.monotonic(), {0: progress0, 1: progress1})  # None while the run moves
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from cropscale.errors import ConfigError

#: The phase of a rank in an ordinary training step.
TRAINING = "training"
#: The legitimate pauses: the first batch of the fit (compilation, DDP's bucket set-up), the first batch of an
#: epoch (DataLoader workers start), validation, the epoch end (checkpoint writes).
PAUSES = ("warm-up", "epoch start", "validation", "epoch end")
#: Bound kinds.
STEP, PAUSE = "step", "pause"


@dataclass(frozen=True)
class Progress:
    """What one rank reports: where it is in the fit.

    Attributes:
        rank: the global rank.
        position: comparable across ranks (a tuple of counters; see :func:`cropscale.hangs.watch.read_progress`).
        epoch: the epoch (0-based).
        batch: the index within the epoch of the batch last fetched.
        stage: how far that batch got: ``before its step``, ``in its step``, ``after its step`` (in
            ``on_train_batch_end``), ``done``, or ``no batch yet`` (of this epoch).
        global_step: optimizer steps done.
        phase: :data:`TRAINING` or one of :data:`PAUSES`.
        where: where its main thread was, once its position stopped moving (None while it moves).
        in_collective: True: waiting for other ranks (a collective, DDP's gradient all-reduce); False: in its own
            code; None: unknown.
        beat: the report's sequence number (its heartbeat: it moves while the reporting thread runs).
    """

    rank: int
    position: tuple[int, ...]
    epoch: int = 0
    batch: int = 0
    stage: str = "done"
    global_step: int = 0
    phase: str = TRAINING
    where: str | None = None
    in_collective: bool | None = None
    beat: int = 0

    def to_text(self) -> str:
        """The report as one JSON line (what the rank publishes)."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str | bytes) -> Progress | None:
        """Parse :meth:`to_text`'s line; None for anything else."""
        try:
            data = json.loads(text)
            return cls(**{**data, "position": tuple(int(v) for v in data["position"])})
        except (ValueError, TypeError, KeyError):
            return None

    def describe(self) -> str:
        """E.g. ``epoch 1, batch 0 after its step, global step 3, training, in its own code at x.py:12 in f``."""
        batch = "no batch yet" if self.stage == "no batch yet" else f"batch {self.batch} {self.stage}"
        text = f"epoch {self.epoch}, {batch}, global step {self.global_step}, {self.phase}"
        return f"{text}, {self.where}" if self.where else text


@dataclass(frozen=True)
class HangBound:
    """The bound's settings: floors (s) and the factor over the longest stillness measured.

    Raises:
        ConfigError: a floor or the factor is not a positive finite number.
    """

    floor_s: float = 60.0
    pause_floor_s: float = 600.0
    factor: float = 10.0

    def __post_init__(self) -> None:
        for name in ("floor_s", "pause_floor_s", "factor"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"HangWatch({name}={value!r}): must be a positive number")

    def bound(self, kind: str, longest_s: float) -> tuple[float, str]:
        """``(seconds, how)`` for an episode of ``kind`` when the longest of that kind so far is ``longest_s``."""
        floor, label = (self.floor_s, "floor") if kind == STEP else (self.pause_floor_s, "pause floor")
        what = "the longest stillness of ordinary steps so far" if kind == STEP else "the longest pause so far"
        relative = self.factor * longest_s
        rule = f"max({label} {_s(floor)}, {self.factor:g} x {_s(longest_s)}, {what})"
        return max(floor, relative), rule


@dataclass(frozen=True)
class RankState:
    """One rank as the judge last saw it.

    Attributes:
        rank: the global rank.
        progress: its last report (None: it never reported).
        still_s: how long its position has not moved (s).
        heartbeat: whether its reports still come (their sequence number moved within 3 periods).
    """

    rank: int
    progress: Progress | None
    still_s: float | None
    heartbeat: bool

    def describe(self) -> str:
        """E.g. ``rank 1 at epoch 1, batch 0, ...``, with a note when its heartbeat stopped."""
        if self.progress is None:
            return f"rank {self.rank} never reported its progress"
        text = f"rank {self.rank} at {self.progress.describe()}"
        return text if self.heartbeat else f"{text} (its heartbeat stopped too: process stopped, or holding the GIL)"


@dataclass(frozen=True)
class Hang:
    """A hang the judge named.

    Attributes:
        hung: the ranks named.
        separated: False when every rank stopped at the same point and none is in its own code (all are named).
        still_s: how long no rank has moved (s).
        bound_s: the bound it exceeded (s).
        kind: :data:`STEP` or :data:`PAUSE`.
        rule: how the bound was computed.
        ranks: every rank's state, by rank.
    """

    hung: tuple[int, ...]
    separated: bool
    still_s: float
    bound_s: float
    kind: str
    rule: str
    ranks: tuple[RankState, ...]

    def describe(self) -> str:
        """The line naming the hang (without ``cropscale: error:`` and the resume part)."""
        names = ", ".join(str(r) for r in self.hung)
        who = f"DDP rank {names} hangs" if len(self.hung) == 1 else f"DDP ranks {names} hang"
        if not self.separated:
            who += (" (every rank stopped at the same point, none in its own code: the evidence cannot tell which"
                    " rank hangs)")
        kind = "an ordinary step" if self.kind == STEP else "a pause"
        last = "; ".join(r.describe() for r in self.ranks)
        return (f"{who}: no rank has reached its next step for {_s(self.still_s)} (bound {_s(self.bound_s)} for {kind}:"
                f" {self.rule}); last progress: {last}")


class HangJudge:
    """Times the run's stillness from the ranks' reports and names the hung rank past the bound.

    Args:
        world_size: the number of ranks.
        bound: the bound's settings.
        beat_s: the reporting period (s): a rank whose heartbeat has not moved for 3 periods is said stopped.
    """

    def __init__(self, world_size: int, bound: HangBound | None = None, beat_s: float = 1.0) -> None:
        self.world_size, self.bound, self.beat_s = int(world_size), bound or HangBound(), float(beat_s)
        self.last: dict[int, Progress] = {}
        self.longest: dict[str, float] = {STEP: 0.0, PAUSE: 0.0}
        self._moved_at: dict[int, float] = {}
        self._beat_at: dict[int, float] = {}
        self._since: float | None = None
        self._kind = PAUSE

    def kind(self) -> str:
        """:data:`STEP` when every rank furthest behind is in an ordinary step, else :data:`PAUSE`."""
        if len(self.last) < self.world_size:
            return PAUSE
        low = min(p.position for p in self.last.values())
        behind = [p for p in self.last.values() if p.position == low]
        return STEP if all(p.phase == TRAINING for p in behind) else PAUSE

    def observe(self, now: float, reports: Mapping[int, Progress]) -> Hang | None:
        """Take the reports read at ``now`` (monotonic s; ranks not read keep their last report).

        Returns:
            The :class:`Hang` once no rank has moved for at least the bound, else None.
        """
        moved = False
        for rank, progress in reports.items():
            before = self.last.get(rank)
            if before is None or before.position != progress.position:
                self._moved_at[rank] = now
                moved = True
            if before is None or before.beat != progress.beat:
                self._beat_at[rank] = now
            self.last[rank] = progress
        if self._since is None or moved:
            if self._since is not None:
                self.longest[self._kind] = max(self.longest[self._kind], now - self._since)
            self._since, self._kind = now, self.kind()
            return None
        still = now - self._since
        bound_s, rule = self.bound.bound(self._kind, self.longest[self._kind])
        if still < bound_s:
            return None
        hung, separated = self._culprits()
        ranks = tuple(RankState(r, self.last.get(r), now - self._moved_at[r] if r in self._moved_at else None,
                                now - self._beat_at.get(r, -math.inf) < 3 * self.beat_s)
                      for r in range(self.world_size))
        return Hang(hung, separated, still, bound_s, self._kind, rule, ranks)

    def _culprits(self) -> tuple[tuple[int, ...], bool]:
        """The ranks to name and whether the evidence separates them from the others."""
        silent = tuple(r for r in range(self.world_size) if r not in self.last)
        if silent:
            return silent, True
        low = min(p.position for p in self.last.values())
        behind = [r for r, p in sorted(self.last.items()) if p.position == low]
        own = [r for r in behind if self.last[r].in_collective is False]
        if own and len(own) < len(behind):
            return tuple(own), True
        return tuple(behind), len(behind) < self.world_size


def _s(seconds: float) -> str:
    """``12.3 s``, ``0.52 s``, ``600 s``: three significant digits below 100 s, whole seconds above."""
    return f"{seconds:.0f} s" if seconds >= 100 else f"{seconds:.3g} s"
