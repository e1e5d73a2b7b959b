# mypy: disallow-untyped-calls=False
# (torch's TorchFunctionMode / TorchDispatchMode and their mode stacks are untyped, as for the
# modules built on them that pyproject.toml's override lists)
"""The structure pass's two torch modes, turned on and off, and whether a pass is on.

A pass pushes two modes for its forward (`PassModes.push`): the dataflow mode that follows
tensors (`pass_frames.Dataflow`, a `TorchFunctionMode`) and the FLOP count (`flops.FlopCount`,
a `TorchDispatchMode`). For a call the pass does not follow (`known_calls`) it takes them off
(`PassModes.switch`), so that call's code runs at the speed of a plain forward, and puts them
back for the next call it follows. Modes come off only where they are the innermost ones:
under someone else's mode that call is followed after all, and a pass that ended under one
keeps its modes until they can be popped (the driver's stale passes). While the modes are on,
compiled code runs eagerly (the `force_eager` stance).
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

import torch

from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.structure.flops import FlopCount, FlopSink
from wandb_modprof.capture.structure.pass_frames import Dataflow, Follower


class ModeOwner(Follower, FlopSink, Protocol):
    """What both modes tell (a `structure_pass.StructurePass`)."""


def prepare() -> None:
    """Import Dynamo before the first pass, outside any forward.

    The dataflow mode makes some torch functions import it lazily; imported inside the user's
    forward, that import leaves a reference cycle holding the forward's frames (and tensors)
    until the next garbage collection. With it imported, compiled code also runs eagerly during
    the pass instead of being recompiled (`PassModes.push`). About 1 s, once per process.
    """
    tp.import_dynamo()


def structure_pass_active() -> bool:
    """A structure pass (of any capture) is following tensors on this thread right now (or
    runs a call it does not follow, its modes off for that call)."""
    if _SUSPENDED:
        thread = threading.get_ident()
        if any(m.thread == thread and not m.pass_.failed for m in list(_SUSPENDED)):
            return True
    return any(isinstance(m, Dataflow) and not m.pass_.failed for m in tp.function_mode_stack())


# the modes of passes that are off for a call their pass does not follow (`PassModes.switch`)
_SUSPENDED: set[PassModes] = set()


class PassModes:
    """The two modes of one pass: pushed for its forward, off for a call it does not follow."""

    def __init__(self, pass_: ModeOwner, fake_type: type | None = None) -> None:
        self.pass_ = pass_
        self.thread = threading.get_ident()  # (`structure_pass_active` asks per thread)
        # Compiled code runs eagerly during the pass: dynamo guards on the mode stack, so
        # running it under our modes would recompile it (and again after the pass).
        self._stance: Any = None
        self._dataflow = Dataflow(pass_)
        self._flops = FlopCount(pass_, fake_type)
        self._on = False
        self._suspended = False  # the modes are off for the innermost (not followed) call

    def push(self) -> None:
        # Dynamo is imported when the capture starts (see `prepare`), so every
        # torch.compile'd function or module in the forward runs eagerly, not recompiled.
        if tp.dynamo_loaded():
            self._stance = torch.compiler.set_stance("force_eager")
        self._dataflow.__enter__()
        try:
            self._flops.__enter__()
        except BaseException:
            self._dataflow.__exit__(None, None, None)
            raise
        self._on = True

    def pop(self) -> bool:
        """Pop our modes if they are the innermost ones; True once they are gone."""
        if not self._on:
            return True
        if self._suspended:  # (popped already, for a call the pass did not follow)
            self._on = self._suspended = False
            _SUSPENDED.discard(self)
            self.restore_stance()
            return True
        fstack = tp.function_mode_stack()
        dstack = tp.dispatch_mode_stack()
        if not fstack or fstack[-1] is not self._dataflow:
            return False
        if not dstack or dstack[-1] is not self._flops:
            return False
        self._flops.__exit__(None, None, None)
        self._dataflow.__exit__(None, None, None)
        self._on = False
        self.restore_stance()
        return True

    def switch(self, follow: bool) -> bool:
        """The modes on for a followed call, off for one that is not (its code then runs at
        the speed of a plain forward); False where they cannot be turned off (someone's mode
        is on top of ours): that call is followed."""
        if not self._on or follow != self._suspended:
            return True
        if follow:
            self._dataflow.__enter__()
            self._flops.__enter__()
            self._suspended = False
            _SUSPENDED.discard(self)
            return True
        fstack = tp.function_mode_stack()
        dstack = tp.dispatch_mode_stack()
        if not (fstack and fstack[-1] is self._dataflow and dstack and dstack[-1] is self._flops):
            return False
        self._flops.__exit__(None, None, None)
        self._dataflow.__exit__(None, None, None)
        self._suspended = True
        _SUSPENDED.add(self)  # (`structure_pass_active` still sees the pass)
        return True

    def restore_stance(self) -> None:
        if self._stance is not None:
            self._stance.__exit__(None, None, None)  # back to the stance from before the pass
            self._stance = None
