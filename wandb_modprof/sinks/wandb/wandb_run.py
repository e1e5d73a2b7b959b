"""The W&B run `watch` logs to: finding it, and running our last log when it finishes.

W&B is imported here only when a run is needed, never at package import.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from wandb_modprof._errors import ModProfError
from wandb_modprof.sinks.wandb import wandb_private

T = TypeVar("T")


def current_run(run: Any) -> Any:
    """`run`, or `wandb.run` when None; W&B is imported here, never at package import. The
    first call with W&B imported checks its private APIs (`wandb_private.check`)."""
    if run is not None:
        wandb_private.check()
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
    wandb_private.check()
    return wandb.run


def call_at_finish(run: Any, owner: T, fn: Callable[[T], Any]) -> None:
    """`run.finish()` calls `fn(owner)` first (while `owner` is alive), so that samples still
    pending (in `watch`'s worker or awaiting device events) and the report are logged while
    the run is open. Uses W&B's teardown hooks (`wandb_private.add_teardown_hook`); a run
    without them (an older SDK, a stand-in) is told to the user once, who then calls
    `unwatch()` before `run.finish()`."""
    ref = weakref.ref(owner)

    def at_finish() -> None:
        alive = ref()
        if alive is not None:
            fn(alive)

    wandb_private.add_teardown_hook(run, at_finish)
