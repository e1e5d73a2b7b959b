"""Which models currently carry our hooks, so a model is never hooked twice; and which
models a capture saw step, for `cold_model` (the model's first step in the process).

Weak keys and weak values: forgetting to `unwatch` a model that is then deleted leaks nothing.
The owner (WatchHandle / ProfileBlock) stays alive as long as the model does, because the
model's root hooks hold its capture, which holds the owner.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from torch import nn

from wandb_modprof._errors import ModProfError

_ACTIVE: weakref.WeakKeyDictionary[nn.Module, weakref.ref[Any]] = weakref.WeakKeyDictionary()


def claim(model: nn.Module, owner: Any, what: str) -> None:
    current = owner_of(model)
    if current is not None:
        raise ModProfError(
            f"{type(model).__name__} is already being {current.kind}; expected a model that is "
            f"not hooked by wandb_modprof. Call wandb_modprof.unwatch(model) or leave the "
            f"profile() block before {what} it again."
        )
    _ACTIVE[model] = weakref.ref(owner)


def release(model: nn.Module, owner: Any) -> None:
    if owner_of(model) is owner:
        del _ACTIVE[model]


def owner_of(model: nn.Module) -> Any:
    ref = _ACTIVE.get(model)
    return None if ref is None else ref()


def owners() -> list[Any]:
    return [owner for ref in list(_ACTIVE.values()) if (owner := ref()) is not None]


# Captures whose hooks are attached, whatever owns them: a structure pass or a delivery must
# know whether another watched model's timed forward is running around it.
_ATTACHED: weakref.WeakSet[Any] = weakref.WeakSet()


def attach_capture(capture: Any) -> None:
    if not _FORK_HANDLER and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_quiet_in_child)
        _FORK_HANDLER.append(_quiet_in_child)
    _ATTACHED.add(capture)


def detach_capture(capture: Any) -> None:
    _ATTACHED.discard(capture)


def attached_captures() -> list[Any]:
    """Each has `timed_forward`: its step session while a timed forward runs, else None."""
    return list(_ATTACHED)


# Models a capture saw step in this process: a later capture's first sample is not their first.
_STEPPED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def stepped(model: nn.Module) -> None:
    """`model` started a step under a capture (`cold_model` is False for it from now on)."""
    _STEPPED.add(model)


def cold_model(model: nn.Module) -> bool:
    """`model`'s next step is its first in this process, as far as can be told: no capture saw
    it step, no parameter holds a gradient (a backward leaves one unless set to None), none was
    updated in place more than twice (initialisation and a load bump `_version` once each, an
    optimizer step at least once more), and no batch norm counted a batch."""
    if model in _STEPPED:
        return False
    # (torch's in-place version counter of a tensor; read defensively: not every subclass has it)
    if any(p.grad is not None or getattr(p, "_version", 0) > 2 for p in model.parameters()):
        return False
    return not any(
        int(b) > 0 for name, b in model.named_buffers() if name.endswith("num_batches_tracked")
    )


# ---- a process forked while models are watched -----------------------------------------------
# `os.fork` (data-loader workers on Linux): the child shares its parent's worker process
# (socket and folder, `api.sample_handoff`) and W&B run; a sample sent, the folder removed at
# the child's exit or a table logged from there would corrupt or lose the parent's. So in the
# child only, each attached capture samples nothing, draws no graph, delivers nothing and
# counts as detached (`unwatch()` there does nothing; the root hooks stay, inert), and its
# accumulator's remote forgets its worker without touching it (`forked()`). Only attributes
# are set (`Capture.quiet`): the child runs only the thread that forked, and a lock another
# thread held at the fork would stay held forever.
_FORK_HANDLER: list[Any] = []  # the handler, once registered (once per process)


def _quiet_in_child() -> None:
    for capture in list(_ATTACHED):
        capture.quiet()
        _ATTACHED.discard(capture)
        forked = getattr(getattr(capture.sink, "remote", None), "forked", None)
        if forked is not None:
            forked()
