"""The callable every module hook of ours is wrapped in: it copies as an inert no-op.

`copy.deepcopy(model)` (EMA, SWA's AveragedModel) and `torch.save(model)` copy a module's
hook dicts. Bound methods would drag the whole capture (and its lock) along and fail; a copy
of a watched model is simply not watched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class InertHook:
    """A module hook calling `fn`; its copies (deep copy, pickle) call nothing."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., None] | None) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> None:
        if self.fn is not None:
            self.fn(*args)

    def __deepcopy__(self, memo: dict[int, Any]) -> InertHook:
        return _INERT_HOOK

    def __reduce__(self) -> tuple[Callable[[], InertHook], tuple[()]]:
        return inert_hook, ()


_INERT_HOOK = InertHook(None)


def inert_hook() -> InertHook:
    """What a copied hook becomes (also what unpickling one returns)."""
    return _INERT_HOOK
