"""The base class of the scaling callbacks and the lookup of a trainer's scaling callbacks.

:class:`ScalingCallback` adds to a Lightning ``Callback`` the three things every cropscale callback
shares: a ``run.json`` summary (:meth:`~ScalingCallback.summary`, written by
:class:`~cropscale.callbacks.ProvenanceCallback`), the per-step hook filter asked by
:class:`~cropscale.callbacks.CallbackGroup` (:meth:`~ScalingCallback.wants_hook`), and a log-step
schedule counted on the callback itself, so that no trainer property is read per step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback

from cropscale.evidence import MEASURED_RUN
from cropscale.runs.schema import SUMMARY_TYPES, Record, RunSummary, ValidityRecord
from cropscale.runs.validity import validity

__all__ = ["EpochRecordsCallback", "ScalingCallback", "fit_validity", "iter_callbacks", "resumed_epoch", "run_summary",
           "scaling_callbacks"]


class ScalingCallback(Callback):
    """Base of the cropscale scaling callbacks.

    Subclasses set :attr:`summary_key` and implement :meth:`summary`, the typed record of their
    ``run.json`` section (:mod:`cropscale.runs.schema`), which the
    :class:`~cropscale.callbacks.ProvenanceCallback` writes under ``run.json["summary"][summary_key]``
    with ``to_json()`` at the end of ``fit``. Summaries are final after ``on_train_end`` (the per-rank gathers run at
    epoch ends and in ``on_train_end``, on every rank).
    """

    summary_key: str = "scaling"
    evidence: str = MEASURED_RUN
    _log_every: int = 0
    _gstep: int = 0
    _stepped: bool = False  # an optimizer step ran since the last on_train_batch_end

    def summary(self) -> Record | dict[str, Any]:
        """This callback's ``run.json`` section: a :class:`~cropscale.runs.schema.Record` (or a JSON-ready dict)."""
        return {"evidence": self.evidence}

    def wants_hook(self, hook: str) -> bool:
        """Whether this callback needs the per-step ``hook`` for the current run.

        Asked by :class:`~cropscale.callbacks.CallbackGroup` after ``on_train_start``.

        Args:
            hook: the name of a per-step Lightning hook, e.g. ``"on_before_optimizer_step"``.
        """
        return True

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: Any, optimizer: Any) -> None:
        """Note that an optimizer step runs in this micro-batch (``_stepped``, read in ``on_train_batch_end``).

        Subclasses that need more call ``super()`` or set ``_stepped`` themselves. A
        :class:`~cropscale.callbacks.CallbackGroup` sets ``_stepped`` directly on the members that keep this
        default, without a call.
        """
        self._stepped = True

    def _start_log_schedule(self, trainer: Trainer) -> None:
        """Start counting optimizer steps from ``trainer.global_step`` (call in ``on_train_start``)."""
        self._log_every = int(trainer.log_every_n_steps or 0)
        self._gstep = int(trainer.global_step)
        self._stepped = False

    def _step_done(self) -> bool:
        """Whether an optimizer step ran in this micro-batch (``_stepped``), clearing the flag.

        Call once per ``on_train_batch_end``; False while gradients accumulate.
        """
        stepped, self._stepped = self._stepped, False
        return stepped

    def _count_step(self) -> bool:
        """Count one optimizer step; True when it is a log step (``global_step % log_every_n_steps == 0``).

        Same rule as :func:`cropscale.callbacks._logging.is_log_step` but on the callback's own
        counter, so that no trainer property is read per step. Call once per optimizer step, in
        ``on_train_batch_end``.
        """
        self._gstep += 1
        every = self._log_every
        return every > 0 and self._gstep % every == 0


class EpochRecordsCallback(ScalingCallback):
    """A scaling callback without per-step hooks that keeps one record per epoch in :attr:`epochs` across a resume.

    Subclasses set :attr:`record_type` (a :class:`~cropscale.runs.schema.Record`); ``state_dict`` holds the
    records as JSON, so a checkpoint carries them and a resumed fit continues them.
    """

    record_type: type[Record] = Record
    epochs: list[Any]

    def wants_hook(self, hook: str) -> bool:
        """No per-step hook: the records are made at epoch ends and checkpoint writes."""
        return False

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: Any, optimizer: Any) -> None:
        """Nothing per step."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """The epoch records as JSON (``{"epochs": [...]}``)."""
        return {"epochs": [e.to_json() for e in self.epochs]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The epoch records of a checkpoint (none in an empty state)."""
        self.epochs = [self.record_type.from_json(e) for e in state_dict.get("epochs", [])]


def resumed_epoch(state: dict[str, Any] | None, trainer: Trainer) -> tuple[dict[str, Any] | None, bool]:
    """A checkpoint's in-epoch state as ``on_train_start`` finds it, and whether its epoch is over.

    ``state`` is a callback's ``state_dict()["in_epoch"]``, kept by its ``load_state_dict``. Lightning 2.6, resumed
    from a checkpoint written inside an epoch, calls no ``on_train_epoch_start`` for that epoch; from one written at
    an epoch's last batch end it goes on with the next epoch and calls neither the resumed epoch's
    ``on_train_epoch_end`` nor the next one's ``on_train_epoch_start``.

    Returns:
        ``(state, over)``: ``state`` is None when there is none, it names no epoch or a later one than
        ``trainer.current_epoch``; else the steps it holds belong to its epoch's record. ``over`` is True when the
        trainer has moved past that epoch: the caller closes its record in ``on_train_start`` (a collective every
        rank joins: every rank loads the same state).
    """
    if not state or state.get("epoch") is None or int(state["epoch"]) > trainer.current_epoch:
        return None, False
    return state, int(state["epoch"]) < trainer.current_epoch


def iter_callbacks(trainer: Trainer) -> Iterator[Callback]:
    """Every callback of ``trainer``, with the members of each :class:`~cropscale.callbacks.CallbackGroup` in place.

    A group is replaced by its members, in their order.
    """
    for cb in trainer.callbacks:
        members = getattr(cb, "callbacks", None)
        if getattr(cb, "_is_callback_group", False) and isinstance(members, list):
            yield from members
        else:
            yield cb


def scaling_callbacks(trainer: Trainer) -> list[ScalingCallback]:
    """The :class:`ScalingCallback` instances of ``trainer`` (group members included), in order."""
    return [cb for cb in iter_callbacks(trainer) if isinstance(cb, ScalingCallback)]


def _section(key: str, summary: Any) -> Any:
    """A callback's summary as the record type of its ``run.json`` section.

    A plain dict (from a callback that returns one) is read into that type; a key without a type stays as it is
    (made JSON-ready with the rest of the record when ``run.json`` is written).
    """
    if isinstance(summary, Record) or key not in SUMMARY_TYPES:
        return summary
    return SUMMARY_TYPES[key].from_json(summary)


def run_summary(trainer: Trainer, exclude: Callback | None = None) -> RunSummary:
    """``run.json["summary"]``: the :meth:`~ScalingCallback.summary` of every scaling callback of ``trainer``.

    A callback whose summary fails gets ``{evidence, error}`` instead (a broken summary must not lose the record).
    Call after ``on_train_end``; it runs no collective, so any rank may call it.

    Args:
        trainer: the trainer whose callbacks (group members included) are read.
        exclude: a callback to leave out (the provenance callback itself).
    """
    summary = RunSummary()
    for cb in scaling_callbacks(trainer):
        if cb is exclude:
            continue
        try:
            section = _section(cb.summary_key, cb.summary())
        except Exception as err:  # a broken summary must not lose the record
            section = {"evidence": cb.evidence, "error": f"{type(err).__name__}: {err}"}
        if isinstance(section, Record) and cb.summary_key in SUMMARY_TYPES:
            setattr(summary, cb.summary_key, section)
        else:
            summary.other[cb.summary_key] = section
    return summary


def fit_validity(trainer: Trainer, summary: RunSummary | None = None) -> ValidityRecord:
    """The validity of the fit ``trainer`` ran to its end (:func:`cropscale.runs.validity.validity`).

    Every rank gets the same verdict: its inputs are summed or maxed over ranks by the callbacks that record them.

    Args:
        trainer: the trainer after ``fit``'s training loop ended.
        summary: its :func:`run_summary` when already built.
    """
    return validity(summary if summary is not None else run_summary(trainer), int(trainer.global_step))
