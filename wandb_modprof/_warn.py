"""Warnings from inside training that can never become exceptions.

Users run with warnings as errors (`python -W error`, pytest's `filterwarnings = error`). The
profiler's "warn once and drop the sample" paths then must not raise into the training loop:
where `warnings.warn` raises, the text goes to the `wandb_modprof` logger instead.
"""

from __future__ import annotations

import contextlib
import logging
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
