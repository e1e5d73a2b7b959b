"""Handing finished samples to `watch`'s W&B logging, outside the autograd engine.

A sample finishes inside the backward (the engine's final callback); logging there would run
W&B inside autograd. So the capture only sets `sample_due`, and its next root forward calls
the delivery, which runs `after_sample` unless that forward is being compiled, runs a
structure pass, or runs inside another watched model's timed forward (whose time would include
ours): then it waits for a later step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from wandb_modprof.capture.step import registry as _registry
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.structure.pass_modes import structure_pass_active


class Deliverer(Protocol):
    sample_due: bool  # set when a sample finished; cleared when it was handed over


def delivery(
    sessions: Deliverer, after_sample: Callable[[], bool], capture: object
) -> Callable[[], None]:
    """The function `capture` calls at a root forward while its `sessions.sample_due` is set."""

    def deliver() -> None:
        if torch.compiler.is_compiling() or structure_pass_active():
            return
        for other in _registry.attached_captures():
            if other is not capture and other.timed_forward is not None:
                return
        # Cleared first: a sample finishing meanwhile on another thread (a device backward)
        # sets it again instead of being overwritten.
        sessions.sample_due = False
        if not after_sample():
            sessions.sample_due = True

    if tp.dynamo_loaded():
        # A root compiled in place (`model.compile()`, which imports dynamo) runs its hooks
        # inside compiled code: a disabled function runs eagerly there, after a graph break.
        # Not applied otherwise: it would import dynamo (~1 s). (disable is untyped.)
        return torch.compiler.disable(deliver)  # type: ignore[no-any-return,no-untyped-call]
    return deliver
