"""The W&B run `watch` logs to: finding it, and running our last log when it finishes.

W&B is imported here only when a run is needed, never at package import.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from wandb_modprof._errors import ModProfError

T = TypeVar("T")


def current_run(run: Any) -> Any:
    """`run`, or `wandb.run` when None; W&B is imported here, never at package import."""
    if run is not None:
        return run
    try:
        import wandb
    except ImportError:
        raise ModProfError(
            "watch() logs to Weights & Biases, which is not installed: pip install wandb"
        ) from None
    if wandb.run is None:
        raise ModProfError(
            "watch() needs a W&B run: call wandb.init() before watch(), or pass run=...; "
            "for profiling without W&B use wandb_modprof.profile(model)"
        )
    return wandb.run


def call_at_finish(run: Any, owner: T, fn: Callable[[T], Any]) -> None:
    """`run.finish()` calls `fn(owner)` first (while `owner` is alive), so that samples still
    pending (in `watch`'s worker or awaiting device events) and the report are logged while
    the run is open. Uses W&B's teardown hooks (`Run._teardown_hooks`, stage EARLY: before the
    run is marked finished); a run without them (an older SDK, a stand-in) is left alone, and
    its user calls `unwatch()` before `run.finish()`."""
    try:
        from wandb.sdk.wandb_run import TeardownHook, TeardownStage

        hooks = run._teardown_hooks
    except Exception:
        return
    if not isinstance(hooks, list):
        return
    ref = weakref.ref(owner)

    def at_finish() -> None:
        alive = ref()
        if alive is not None:
            fn(alive)

    hooks.append(TeardownHook(at_finish, TeardownStage.EARLY))
