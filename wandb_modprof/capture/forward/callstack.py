"""Which module calls are open on the Python stack: the one fact hooks cannot see when a
forward was cut short by a `KeyboardInterrupt` (always-call hooks run on `Exception` only)."""

from __future__ import annotations

import sys

from torch import nn

_CALL_IMPL_CODE = nn.Module._call_impl.__code__


def call_depth(module: nn.Module) -> int:
    """How many calls of `module` are on the Python stack (walked rarely: a recursive root, an
    interrupted forward, a structure pass checking it is still inside its forward)."""
    depth = 0
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _CALL_IMPL_CODE and frame.f_locals.get("self") is module:
            depth += 1
        frame = frame.f_back  # type: ignore[assignment]
    return depth
