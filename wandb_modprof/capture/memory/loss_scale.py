"""The loss scale inside a sampled step's gradients, so that its gradient norms are the
unscaled ones.

>>> scaler = torch.amp.GradScaler("cuda")                          # doctest: +SKIP
>>> scaler.scale(loss).backward()   # every gradient is now scale x the true one
>>> scaler.step(optimizer)          # divides them (`unscale_`), then optimizer.step()
>>> scaler.update()                 # the scale changes (x2 after growth_interval good steps)

Gradients are read at the end of the sampled backward (`gradient_readings`), before the
scaler divides them: under a `torch.amp.GradScaler` they are 65,536 times the true ones at its
default start, and another multiple as it adapts. Each sample's gradient norms are divided by
the scale active in its own step, so they are what `clip_grad_norm_` after `scaler.unscale_`
reports, in the same units in every sample.

Which scaler: nothing on a gradient or on the graph names it, and the backward's root (the
loss times the scale) is not reachable from our node hooks. What can be seen is the optimizer
step that follows: `scaler.step(optimizer)` calls `optimizer.step()`, and a step pre-hook finds
the scaler in its caller's frame (`_stepping_scaler`). The hook is torch's process-global one
(`register_optimizer_step_pre_hook`), so it serves optimizers `watch(optimizer=)` was not
given; it acts only for an optimizer holding the model's parameters. It is registered only
while something is to be learned, from `open` (the capture's attach) to the first such step,
and from each sampled backward to the step after it, and it removes itself then (or, where
torch does not allow that inside a step, at our next call outside one: `_removed_if_last`):
an unsampled step runs no code of ours. The scaler found is remembered (weakly); at the end
of each later sampled backward its scale is copied (a 0-d device tensor: no sync) before
`update()` changes it, and the step after the backward confirms which scaler that was.

Known limitations:

- Only `torch.amp.GradScaler` and its subclasses (`torch.cuda.amp.GradScaler`, FSDP's
  `ShardedGradScaler`) are recognised; a loss scaled by other code (apex, DeepSpeed, a manual
  `loss * k`) is read as the backward left it.
- A step whose gradients overflowed (inf / NaN) has no true norm to show: the scaler skips
  it, and no module has a gradient norm in its sample (`GradientReading.loss_scaled`). Its
  `optimizer.step()` is not called, so the step that settles such a sample is a later one,
  with a backed-off scale: only the overflow is read from it.
- A sample read before any step of the model's optimizer was taken (gradient accumulation
  with the very first optimizer step sampled, a result read between the backward and the
  step, or the first steps skipped as overflows) has no scaler to go by: its norms are as
  read. If a GradScaler turns up later, that is warned once
  (`LossScaleWatch._unscaled_before`).
- The scaler's overflow check covers all of the optimizer's parameters: one outside the
  model that overflowed skips the step while the model's gradients are finite, and such a
  sample, settled by a later step, is divided by that step's (backed-off) scale.
- Norms are accumulated in float32 from the scaled gradients (no extra pass, no copy): a
  scaled norm beyond float32 (over about 1.8e19, which only a scale grown very large reaches)
  reads as an overflow although the scaler took the step.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from wandb_modprof._warn import warn_safely
from wandb_modprof.capture.step import torch_private as tp

_GradScaler = torch.amp.GradScaler
# Frames above our step pre-hook where the scaler's own method calls `optimizer.step()`:
# `GradScaler.step` (a fused optimizer) or `_maybe_opt_step` (any other). Between them and
# the hook sit torch's step wrapper and any wrapper of `optimizer.step` (an LR scheduler's).
_SCALER_METHODS = frozenset({"step", "_maybe_opt_step"})
_MAX_FRAMES = 8


class LossScale:
    """One sample's loss scale: set at the end of its backward from the scaler seen stepping
    the model's optimizer before, settled at the step after it; read when the sample's
    gradient readings are (`gradient_readings.PendingGradientState.reading`)."""

    __slots__ = ("__weakref__", "_owner", "known", "scale", "source")

    def __init__(self, owner: LossScaleWatch) -> None:
        self._owner = owner
        self.known = False  # False: no step of the model's optimizer seen yet
        self.scale: torch.Tensor | None = None  # a copy; None: no loss scale
        self.source: weakref.ref[Any] | None = None  # the scaler it was copied from

    def set_from(self, scaler: Any) -> None:
        self.known = True
        self.scale = _scale_of(scaler)
        self.source = None if self.scale is None else weakref.ref(scaler)

    def read(self) -> torch.Tensor | None:
        """The scale to divide this sample's gradients by; None: none (or not known)."""
        self._owner.read(self)
        return self.scale


def _scale_of(scaler: Any) -> torch.Tensor | None:
    """A copy of `scaler`'s current scale (no sync; `update()` changes it in place), or None
    where it scales nothing (disabled, or `scale()` never called)."""
    if scaler is None or not scaler.is_enabled():
        return None
    scale = tp.gradscaler_scale(scaler)
    return None if scale is None else scale.detach().clone()


def _stepping_scaler(frame: FrameType | None) -> Any:
    """The GradScaler whose `step` called the optimizer step now starting, or None."""
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        if frame.f_code.co_name in _SCALER_METHODS:
            owner = frame.f_locals.get("self")
            if isinstance(owner, _GradScaler):
                return owner
        frame = frame.f_back
    return None


class LossScaleWatch:
    """Per capture: which GradScaler (if any) steps the model's optimizer, and the loss scale
    of each sampled backward (`at_backward_end`)."""

    def __init__(self, model: nn.Module, on_error: Callable[[str, Exception], None]) -> None:
        self._model = model
        # the capture's warn-once, weakly: the capture holds this watch, and a cycle would
        # keep a detached capture until the collector runs
        self._on_error = weakref.WeakMethod(on_error)
        self._learned = False  # a step of the model's optimizer was seen
        self._scaler: weakref.ref[Any] | None = None  # the scaler of that step; None: none
        self._waiting: weakref.WeakSet[LossScale] = weakref.WeakSet()  # for their step
        self._armed = False  # the next step of the model's optimizer is to be read
        self._handle: Any = None  # the global step pre-hook, while registered
        self._unscaled_reads = 0  # samples read before any step was seen
        self._told = False
        # optimizers found holding the model's parameters, with their parameters' count and
        # first one's id then: asking again walks the model (20,000 parameters: ~20 ms)
        self._holders: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()

    # ---- the capture's side ----------------------------------------------------------------
    def open(self) -> None:
        """Learn the scaler at the first step of the model's optimizer (the capture attached)."""
        if not self._learned:
            self._arm()

    def close(self) -> None:
        """Register nothing any more (the capture detached); samples waiting keep their scale."""
        self._waiting = weakref.WeakSet()
        self._armed = False
        self.tidy()

    def at_backward_end(self) -> LossScale:
        """The loss scale of the sampled backward that just ended: the remembered scaler's
        scale now (the one its loss was multiplied by), confirmed at the step after it."""
        slot = LossScale(self)
        if self._learned:
            scaler = self._scaler() if self._scaler is not None else None
            if scaler is not None or self._scaler is None:  # (a scaler since freed: unknown)
                slot.set_from(scaler)
        self._waiting.add(slot)
        self._arm()
        return slot

    def read(self, slot: LossScale) -> None:
        """`slot` is read (outside any optimizer step): counted if it was not known yet."""
        if not slot.known:
            self._unscaled_reads += 1
        self.tidy()

    def tidy(self) -> None:
        """Remove the step pre-hook if nothing waits for a step. Called outside optimizer
        steps only (inside one: `_removed_if_last`)."""
        if not self._armed and self._handle is not None:
            handle, self._handle = self._handle, None
            handle.remove()

    # ---- the step pre-hook -----------------------------------------------------------------
    def _arm(self) -> None:
        self._armed = True
        if self._handle is None:
            _sweep_dead_hooks()  # (outside any step: the dict is not being iterated)
            hook = _StepHook(self)
            self._handle = hook.handle = register_optimizer_step_pre_hook(hook)

    def on_step(self, optimizer: Any) -> None:
        """An optimizer step is starting: if it holds the model's parameters, its caller's
        scaler (or none) is the one of every backward since the last such step."""
        try:
            if not self._armed:
                self._remove_inside_step()
                return
            if not self._holds_model(optimizer):
                return
            scaler = _stepping_scaler(sys._getframe(2))  # (above `_StepHook.__call__`)
            self._learned = True
            self._scaler = None if scaler is None else weakref.ref(scaler)
            for slot in list(self._waiting):
                source = slot.source() if slot.source is not None else None
                if not slot.known or source is not scaler:
                    slot.set_from(scaler)
            self._waiting = weakref.WeakSet()
            self._armed = False
            self._remove_inside_step()
            if scaler is not None and scaler.is_enabled() and self._unscaled_reads:
                self._unscaled_before()
        except Exception as error:  # never break the user's step; the samples keep their scale
            self._waiting = weakref.WeakSet()
            self._armed = False
            warn = self._on_error()
            if warn is not None:
                warn("<loss scale>", error)

    def _remove_inside_step(self) -> None:
        if _removed_if_last(self._handle):
            self._handle = None

    def _holds_model(self, optimizer: Any) -> bool:
        groups = getattr(optimizer, "param_groups", ())
        params = [group.get("params", ()) for group in groups]
        count = sum(len(p) for p in params)
        key = (count, id(params[0][0]) if params and len(params[0]) else 0)
        with contextlib.suppress(TypeError):  # (not weakly referenceable: asked each time)
            if self._holders.get(optimizer) == key:
                return True  # (the same parameters as when it was found to hold the model's)
        ids = {id(p) for p in self._model.parameters()}
        holds = any(id(p) in ids for group in groups for p in group.get("params", ()))
        if holds:
            with contextlib.suppress(TypeError):  # (not weakly referenceable)
                self._holders[optimizer] = key
        return holds

    def _unscaled_before(self) -> None:
        if self._told:
            return
        self._told = True
        warn_safely(
            f"wandb_modprof: {self._unscaled_reads} sample(s) of {type(self._model).__name__} "
            "were read before the first optimizer step of its parameters, so the loss scale "
            "of the GradScaler that steps it was not known then: their gradient norms "
            "(grad_norm) are multiplied by that scale, and they are in the statistics. "
            "Later samples are divided by the scale of their own step.",
            RuntimeWarning,
        )


class _StepHook:
    """The global step pre-hook: by weak reference, so a registration left behind (a capture
    dropped without detaching) keeps nothing alive; it then does nothing."""

    __slots__ = ("handle", "watch")

    def __init__(self, watch: LossScaleWatch) -> None:
        self.watch = weakref.ref(watch)
        self.handle: Any = None

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        watch = self.watch()
        if watch is not None:
            watch.on_step(optimizer)
        else:
            _removed_if_last(self.handle)


def _sweep_dead_hooks() -> None:
    """Remove the step pre-hooks of ours whose watch is gone (left inert inside a step, where
    they could not be removed, by a capture that then went away without another call)."""
    hooks = tp.optimizer_step_pre_hooks()
    if hooks is None:
        return
    for hook in list(hooks.values()):
        if isinstance(hook, _StepHook) and hook.watch() is None and hook.handle is not None:
            hook.handle.remove()


def _removed_if_last(handle: Any) -> bool:
    """Remove a step pre-hook from inside a step where that is safe: torch runs the step
    pre-hooks over the live dict of them, so removing an entry that another follows raises
    there ("OrderedDict mutated during iteration"), while the last entry may go (the
    iteration is over). Otherwise it stays, inert, until `LossScaleWatch.tidy` (the next
    sample's backward or reading, outside any step)."""
    hooks = handle.hooks_dict_ref() if handle is not None else None
    if hooks is None or next(reversed(hooks), None) != handle.id:
        return False
    handle.remove()
    return True
