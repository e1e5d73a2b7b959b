"""Warnings from inside training that can never become exceptions.

Users run with warnings as errors (`python -W error`, pytest's `filterwarnings = error`). The
profiler's "warn once and drop the sample" paths then must not raise into the training loop:
where `warnings.warn` raises, the text goes to the `wandb_modprof` logger instead.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings

_LOG = logging.getLogger("wandb_modprof")


def warn_safely(message: str, category: type[Warning], stacklevel: int = 1) -> None:
    """`warnings.warn(message, category)` as seen from `stacklevel` frames above the caller,
    or a logged warning where the warnings filter turns it into an exception."""
    try:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
    except Exception:  # "error" filters raise the warning itself (or anything a hook raises)
        # A failing log handler, or RecursionError at the stack's end: nothing is left to tell
        # the user with, and raising would break training.
        with contextlib.suppress(Exception):
            _LOG.warning("%s", message)


# Code that calls ours on the user's behalf: a warning about how the user set things up is
# reported at the first frame outside these (the user's `watch(...)`, `unwatch()`,
# `trainer.fit(...)` or `trainer.train()` line), not at our own or a framework's line.
_NOT_THE_USER = (
    "wandb_modprof",
    "torch",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "transformers",
    "accelerate",
)


def _package(frame: object) -> str:
    name = getattr(frame, "f_globals", {}).get("__name__", "")
    return name.split(".")[0] if isinstance(name, str) else ""


_CALLBACK_MODULES = (
    "wandb_modprof.integrations.lightning",
    "wandb_modprof.integrations.huggingface",
)


def entry_point() -> str:
    """Which of our entry points the current call came through: "lightning" or "huggingface"
    (the framework callbacks, `wandb_modprof.integrations.*`), else "watch"."""
    frame = sys._getframe(1)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if name in _CALLBACK_MODULES:
            return name.rsplit(".", 1)[1]
        frame = frame.f_back  # type: ignore[assignment]
    return "watch"


def warn_at_user(message: str, category: type[Warning]) -> None:
    """`warn_safely` reported at the user's line: the first frame outside wandb_modprof and the
    frameworks that call it (`_NOT_THE_USER`)."""
    level = 1  # 1: this function's own frame, as warnings.warn counts from its caller
    frame = sys._getframe(0)
    while frame.f_back is not None and _package(frame) in _NOT_THE_USER:
        frame = frame.f_back
        level += 1
    warn_safely(message, category, stacklevel=level)
