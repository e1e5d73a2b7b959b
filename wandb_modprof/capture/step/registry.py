"""Which models currently carry our hooks, so a model is never hooked twice.

Weak keys and weak values: forgetting to `unwatch` a model that is then deleted leaks nothing.
The owner (WatchHandle / ProfileBlock) stays alive as long as the model does, because the
model's root hooks hold its capture, which holds the owner.
"""

from __future__ import annotations

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
    _ATTACHED.add(capture)


def detach_capture(capture: Any) -> None:
    _ATTACHED.discard(capture)


def attached_captures() -> list[Any]:
    """Each has `timed_forward`: its step session while a timed forward runs, else None."""
    return list(_ATTACHED)
