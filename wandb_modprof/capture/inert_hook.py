"""The callable every module hook of ours is wrapped in: it copies as an inert no-op.

`copy.deepcopy(model)` (EMA, SWA's AveragedModel) and `torch.save(model)` copy a module's
hook dicts. Bound methods would drag the whole capture (and its lock) along and fail; a copy
of a watched model is simply not watched. The copy holds nothing of this package, so that a
saved model loads where wandb_modprof is not installed: `COPIED_HOOK`, the standard library's
`sys.audit` with a fixed event name (a no-op returning None unless the process installed
an audit hook, which then sees the event "modprof.copied_hook").
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any


class InertHook:
    """A module hook calling `fn`; its copies (deep copy, pickle) call nothing."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any] | None) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        fn = self.fn
        if fn is None:
            return None
        # Everything up to the untraced call stays in this frame: Dynamo skips this code
        # (`skip_hook_frames`) but would trace any function called from here.
        untraced = _UNTRACED.get("call")
        if untraced is not None and _UNTRACED["callback"]() not in (None, False):
            # A `torch.compile` wrapper around the watched model runs its hooks as frames of
            # their own (`OptimizedModule` calls the inner module's `__call__` under Dynamo):
            # ours run eagerly, and say so to the capture (`under_compile`).
            _state.under_compile = True
            try:
                untraced(fn, args)
            finally:
                _state.under_compile = False
            return None
        # (the root pre-hook's `(args, kwargs)` on a sampled step: `root_hooks.ForwardFrame`)
        return fn(*args)

    def __deepcopy__(self, memo: dict[int, Any]) -> Callable[..., None]:
        return COPIED_HOOK

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return functools.partial, (sys.audit, COPIED_EVENT)


COPIED_EVENT = "modprof.copied_hook"
# What a copied or pickled hook of ours becomes: `hook(module, *args)` returns None and does
# nothing. Hooks must return None (a value would replace the module's input or output).
COPIED_HOOK: Callable[..., None] = functools.partial(sys.audit, COPIED_EVENT)
_INERT_HOOK = InertHook(None)


def inert_hook() -> InertHook:
    """What unpickling a hook saved by wandb_modprof 0.1-0.x returns (files that name this
    function or `wandb_modprof._capture._inert_hook` still load)."""
    return _INERT_HOOK


# ---- torch.compile around the watched model --------------------------------------------------
_state = threading.local()
# Set once Dynamo is imported (`skip_hook_frames`), so that nothing here imports it:
# "call": `fn(*args)` with Dynamo off for it and every frame it calls; "callback": Dynamo's
# (C) getter of its frame callback (None or False: off). No Python frame of ours runs between.
_UNTRACED: dict[str, Callable[..., Any]] = {}


def under_compile() -> bool:
    """The hook now running was called from code Dynamo is compiling (see `__call__`)."""
    return bool(getattr(_state, "under_compile", False))


def skip_hook_frames(dynamo_api: Callable[[], tuple[Any, ...]]) -> None:
    """Dynamo runs `InertHook.__call__` untraced, and the untraced call it makes under
    Dynamo is ready. Called at every attach once Dynamo is imported (cheap); `dynamo_api`:
    `torch_private.dynamo_frame_api` (this leaf of capture/ imports no sub-package)."""
    if "call" in _UNTRACED:
        return
    get_eval_frame_callback, skip_code, disable = dynamo_api()

    def call(fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        fn(*args)

    skip_code(InertHook.__call__.__code__)
    _UNTRACED["callback"] = get_eval_frame_callback
    _UNTRACED["call"] = disable(call)
