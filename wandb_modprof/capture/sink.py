"""The interface between the capture and the statistics stage above it.

The capture hands each finished step session (with what is needed to resolve it later, off
the sampled step) and each finished structure pass to a sink; `stats.accumulator.
ProfileAccumulator` is the one the API wires in. Declared here as protocols so that the capture
never imports the stage above it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from wandb_modprof.capture.structure.structure_driver import StructureSink

if TYPE_CHECKING:
    from wandb_modprof.capture.memory.gradient_readings import PendingGradientState
    from wandb_modprof.capture.memory.static_memory import StaticMemory
    from wandb_modprof.capture.session import StepSession


class SampleSink(StructureSink, Protocol):
    """Where the capture hands its output: finished step sessions (resolved later, off the
    sampled step) and structure passes. `stats.accumulator.ProfileAccumulator` is one; the
    capture never imports it (the statistics stage sits above this one)."""

    def add(
        self,
        session: StepSession,
        gradients: PendingGradientState | None,
        static_fn: Callable[[set[str]], Mapping[str, StaticMemory]],
    ) -> None: ...

    def resolve_pending(self, force: bool) -> None: ...
