"""Which models currently carry our hooks, so a model is never hooked twice.

Weak keys: forgetting to `unwatch` a model that is then deleted leaks nothing.
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn

from ._errors import ModProfError

_ACTIVE: weakref.WeakKeyDictionary[nn.Module, Any] = weakref.WeakKeyDictionary()


def claim(model: nn.Module, owner: Any, what: str) -> None:
    current = _ACTIVE.get(model)
    if current is not None:
        raise ModProfError(
            f"{type(model).__name__} is already being {current.kind}; expected a model that is "
            f"not hooked by wandb_modprof. Call wandb_modprof.unwatch(model) or leave the "
            f"profile() block before {what} it again."
        )
    _ACTIVE[model] = owner


def release(model: nn.Module, owner: Any) -> None:
    if _ACTIVE.get(model) is owner:
        del _ACTIVE[model]


def owner_of(model: nn.Module) -> Any:
    return _ACTIVE.get(model)


def owners() -> list[Any]:
    return list(_ACTIVE.values())
