"""Which module calls are open on the Python stack: the one fact hooks cannot see when a
forward was cut short by a `KeyboardInterrupt` (always-call hooks run on `Exception` only)."""

from __future__ import annotations

import sys
from types import CodeType

from torch import nn

from wandb_modprof.capture.model.compiled import BOUNDARY_CALL
from wandb_modprof.capture.step.torch_private import CALL_IMPL_CODE

# The code objects of the frames that call a module, each with the local naming the module:
# `Module._call_impl`, and the boundary around a module compiled in place (`model.compiled`).
_CALL_CODES: dict[CodeType | None, str] = {
    CALL_IMPL_CODE: "self",
    BOUNDARY_CALL[0]: BOUNDARY_CALL[1],
}


def call_depth(module: nn.Module) -> int:
    """How many calls of `module` are on the Python stack (walked rarely: a recursive root, an
    interrupted forward, a structure pass checking it is still inside its forward)."""
    depth = 0
    frame = sys._getframe(1)
    while frame is not None:
        local = _CALL_CODES.get(frame.f_code)
        if local is not None and frame.f_locals.get(local) is module:
            depth += 1
        frame = frame.f_back  # type: ignore[assignment]
    return depth
