"""Run several callbacks as one Lightning callback, to cut Lightning's per-callback dispatch cost.

Lightning 2.6 calls *every* hook of *every* callback on every step, each inside a profiler context
(``trainer/call.py``: ``_call_callback_hooks``), whether the callback overrides the hook or not. On a
small CPU step this costs about 2 µs per callback and hook, i.e. about 12 µs per callback and
training step (6 per-step hooks), measured with ``python -m cropscale callback-bench``. A group pays
that once and forwards each hook only to the members that override it.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback, Checkpoint
from typing_extensions import override

from cropscale.callbacks._logging import deferred_logging
from cropscale.errors import CropScaleError

_HOOKS: tuple[str, ...] = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
    "on_train_batch_start", "on_train_batch_end", "on_train_epoch_start", "on_train_epoch_end",
    "on_validation_epoch_start", "on_validation_epoch_end", "on_test_epoch_start", "on_test_epoch_end",
    "on_predict_epoch_start", "on_predict_epoch_end", "on_validation_batch_start", "on_validation_batch_end",
    "on_test_batch_start", "on_test_batch_end", "on_predict_batch_start", "on_predict_batch_end",
    "on_train_start", "on_train_end", "on_validation_start", "on_validation_end", "on_test_start",
    "on_test_end", "on_predict_start", "on_predict_end", "on_exception", "on_save_checkpoint",
    "on_load_checkpoint", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
    "on_before_zero_grad",
)


_PER_STEP_HOOKS: tuple[str, ...] = (
    "on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_zero_grad",
    "on_before_optimizer_step", "on_train_batch_end",
)


def _overrides(cb: Callback, hook: str) -> bool:
    return getattr(type(cb), hook, None) is not getattr(Callback, hook)


def _wants(cb: Callback, hook: str) -> bool:
    wants = getattr(cb, "wants_hook", None)
    return True if wants is None else bool(wants(hook))


class CallbackGroup(Callback):
    """Several callbacks run as one: each Lightning hook is forwarded, in order, to the members that override it.

    Args:
        callbacks: the member callbacks (any ``lightning.pytorch.callbacks.Callback`` except
            checkpoint callbacks, which the trainer must see itself).

    Raises:
        CropScaleError: if ``callbacks`` is empty, holds a non-callback or a ``Checkpoint``, or two
            members share a ``state_key``.

    ``state_dict`` holds each member's state under its ``state_key``, so that a resumed run restores
    every member. Rank behaviour is the members' own.

    Scalars the members log in ``on_train_batch_end`` are written once all of them ran
    (:func:`~cropscale.callbacks._logging.deferred_logging`), so that their device reads do not wait
    on TensorBoard's writer thread.

    After ``on_train_start`` the per-step hooks are forwarded only to members whose
    ``wants_hook(name)`` (if they define it) is true, e.g. a loss-scale callback without a GradScaler
    or an energy callback without a GPU; the full table is restored at ``on_train_end``.
    """

    _is_callback_group = True

    def __init__(self, callbacks: list[Callback]) -> None:
        if not callbacks:
            raise CropScaleError("CallbackGroup(callbacks=...): give at least one callback")
        keys: set[str] = set()
        for cb in callbacks:
            if not isinstance(cb, Callback):
                raise CropScaleError(f"CallbackGroup(callbacks=...): {cb!r} is not a Lightning Callback")
            if isinstance(cb, Checkpoint):
                raise CropScaleError(
                    f"CallbackGroup(callbacks=...): {type(cb).__name__} is a checkpoint callback; "
                    "pass it to the Trainer directly so that trainer.checkpoint_callback finds it"
                )
            if cb.state_key in keys:
                raise CropScaleError(f"CallbackGroup(callbacks=...): two members share state_key {cb.state_key!r}")
            keys.add(cb.state_key)
        self.callbacks = list(callbacks)
        self._dispatch: dict[str, list[Any]] = self._full_table()
        self._state_key = self._generate_state_key(members=[cb.state_key for cb in self.callbacks])

    @property
    @override
    def state_key(self) -> str:
        return self._state_key

    def _full_table(self) -> dict[str, list[Any]]:
        return {hook: [getattr(cb, hook) for cb in self.callbacks if _overrides(cb, hook)] for hook in _HOOKS}

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        for fn in self._dispatch["on_train_start"]:
            fn(trainer, pl_module)
        for hook in _PER_STEP_HOOKS:
            self._dispatch[hook] = [
                getattr(cb, hook) for cb in self.callbacks if _overrides(cb, hook) and _wants(cb, hook)
            ]

    @override
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        for fn in self._dispatch["on_train_end"]:
            fn(trainer, pl_module)
        self._dispatch = self._full_table()

    @override
    def state_dict(self) -> dict[str, Any]:
        return {cb.state_key: cb.state_dict() for cb in self.callbacks}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for cb in self.callbacks:
            if cb.state_key in state_dict:
                cb.load_state_dict(state_dict[cb.state_key])

    def __repr__(self) -> str:
        return f"CallbackGroup([{', '.join(type(cb).__name__ for cb in self.callbacks)}])"


def _make_forwarder(hook: str) -> Any:
    def forward(self: CallbackGroup, *args: Any, **kwargs: Any) -> None:
        for fn in self._dispatch[hook]:
            fn(*args, **kwargs)

    forward.__name__ = hook
    forward.__qualname__ = f"CallbackGroup.{hook}"
    forward.__doc__ = f"Forward ``{hook}`` to the members that override it."
    return forward


for _hook in _HOOKS:
    if _hook not in ("on_train_start", "on_train_end", "on_train_batch_end"):
        setattr(CallbackGroup, _hook, _make_forwarder(_hook))
del _hook


def _on_train_batch_end(self: CallbackGroup, trainer: Any, *args: Any, **kwargs: Any) -> None:
    """Forward ``on_train_batch_end`` to the members that override it, writing their scalars at the end.

    The hook runs inside :func:`~cropscale.callbacks._logging.deferred_logging`, so that the members' device
    reads all come before the first write.
    """
    with deferred_logging(trainer):
        for fn in self._dispatch["on_train_batch_end"]:
            fn(trainer, *args, **kwargs)


CallbackGroup.on_train_batch_end = _on_train_batch_end  # type: ignore[method-assign]
