"""Run several callbacks as one Lightning callback, to cut Lightning's per-callback dispatch cost.

Lightning 2.6 calls *every* hook of *every* callback on every step, each inside a profiler context
(``trainer/call.py``: ``_call_callback_hooks``), whether the callback overrides the hook or not. On a
small CPU step this costs about 2 µs per callback and hook, i.e. about 12 µs per callback and
training step (6 per-step hooks), measured with ``python -m cropscale callback-bench``. A group pays
that once and forwards each hook only to the members that override it; during training it pays nothing
for a per-step hook that no member wants (Lightning skips a hook that is not callable) and no forwarding
call for one that a single member wants.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback, Checkpoint
from typing_extensions import override

from cropscale.callbacks._logging import close_deferred, open_deferred
from cropscale.callbacks._readout import close_reads, open_reads
from cropscale.callbacks.base import ScalingCallback
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
    on TensorBoard's writer thread; the device values they read there are copied in one device-to-host
    copy for all of them (:mod:`cropscale.callbacks._readout`).

    After ``on_train_start`` the per-step hooks are forwarded only to members whose
    ``wants_hook(name)`` (if they define it) is true, e.g. a loss-scale callback without a GradScaler
    or an energy callback without a GPU; a per-step hook that no member wants is set to ``None`` on the
    group and one that a single member wants to that member's bound method; members that keep
    :meth:`ScalingCallback.on_before_optimizer_step <cropscale.callbacks.base.ScalingCallback.on_before_optimizer_step>`
    get their step flag set without a call. The full table is restored at ``on_train_end`` and
    ``on_exception``.

    Example::

        from lightning.pytorch import Trainer
        from cropscale.callbacks import CallbackGroup, GradNormCallback, ProvenanceCallback, StepTimingCallback

        group = CallbackGroup([StepTimingCallback(), GradNormCallback(), ProvenanceCallback()])
        trainer = Trainer(callbacks=[group], gradient_clip_val=1.0)

        # command line: every scaling callback in one group (configs/default.yaml has it; members of a later
        # group or a later callbacks/<name>.yaml replace the member of their class):
        #   python -m cropscale fit --config callbacks/scaling.yaml
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
        self._flag_only: list[ScalingCallback] = []  # members whose on_before_optimizer_step only sets _stepped
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
        for hook in _PER_STEP_HOOKS:  # None: a nested group that bound the hook away in its own on_train_start
            self._dispatch[hook] = [
                fn for cb in self.callbacks
                if _overrides(cb, hook) and _wants(cb, hook) and (fn := getattr(cb, hook)) is not None
            ]
        default = ScalingCallback.on_before_optimizer_step
        self._flag_only = [cb for cb in self.callbacks if isinstance(cb, ScalingCallback)
                           and type(cb).on_before_optimizer_step is default
                           and _wants(cb, "on_before_optimizer_step")]
        flagged = {id(cb) for cb in self._flag_only}
        self._dispatch["on_before_optimizer_step"] = [
            fn for fn in self._dispatch["on_before_optimizer_step"] if id(getattr(fn, "__self__", None)) not in flagged]
        self._bind_per_step_hooks()

    def _bind_per_step_hooks(self) -> None:
        """Hand Lightning the cheapest callable for each per-step hook, as instance attributes.

        Lightning calls a callback's hook only when ``getattr(callback, name)`` is callable
        (``trainer/call.py``: ``_call_callback_hooks``), inside a profiler context that costs a few µs. So a
        per-step hook that no member wants is set to ``None`` (Lightning skips it), and one that a single
        member wants is that member's bound method (no forwarding call). ``on_train_batch_end`` keeps the
        group's forwarder when two or more members want it (deferred logging). Undone by
        :meth:`_unbind_per_step_hooks`.
        """
        for hook in _PER_STEP_HOOKS:
            fns = self._dispatch[hook]
            if hook == "on_before_optimizer_step" and self._flag_only:
                self.__dict__.pop(hook, None)  # the group's own hook sets the flags, then forwards
            elif not fns:
                setattr(self, hook, None)
            elif len(fns) == 1:
                setattr(self, hook, fns[0])
            else:
                self.__dict__.pop(hook, None)

    def _unbind_per_step_hooks(self) -> None:
        for hook in _PER_STEP_HOOKS:
            self.__dict__.pop(hook, None)

    @override
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        for fn in self._dispatch["on_train_end"]:
            fn(trainer, pl_module)
        self._unbind_per_step_hooks()
        self._dispatch = self._full_table()
        self._flag_only = []

    @override
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """Set ``_stepped`` on the members that keep :meth:`ScalingCallback.on_before_optimizer_step`, then forward."""
        for cb in self._flag_only:
            cb._stepped = True
        for fn in self._dispatch["on_before_optimizer_step"]:
            fn(trainer, pl_module, optimizer)

    @override
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        for fn in self._dispatch["on_exception"]:
            fn(trainer, pl_module, exception)
        self._unbind_per_step_hooks()
        self._dispatch = self._full_table()
        self._flag_only = []

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
    if _hook not in ("on_train_start", "on_train_end", "on_train_batch_end", "on_exception",
                     "on_before_optimizer_step"):
        setattr(CallbackGroup, _hook, _make_forwarder(_hook))
del _hook


def _on_train_batch_end(self: CallbackGroup, trainer: Any, *args: Any, **kwargs: Any) -> None:
    """Forward ``on_train_batch_end`` to the members that override it, writing their scalars at the end.

    The hook runs inside :func:`~cropscale.callbacks._logging.deferred_logging`, so that the members' device
    reads all come before the first write, and inside a batch of reads
    (:func:`~cropscale.callbacks._readout.open_reads`): the device values the members ask for are copied to
    the host in one copy once all of them ran.
    """
    open_deferred()  # deferred_logging(trainer), without a context manager's calls on every step
    open_reads()  # the members' device reads of this hook: one copy, after all of them ran
    try:
        for fn in self._dispatch["on_train_batch_end"]:
            fn(trainer, *args, **kwargs)
    finally:
        try:
            close_reads()
        finally:
            close_deferred(trainer)


CallbackGroup.on_train_batch_end = _on_train_batch_end  # type: ignore[method-assign]
