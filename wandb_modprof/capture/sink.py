"""The interface between the capture and the statistics stage above it.

The capture hands each finished step session as plain data to a sink, with what is needed to
resolve it later, off the sampled step, and each finished structure pass;
`stats.accumulator.ProfileAccumulator` is the one the API wires in. Declared here as protocols
so that the capture never imports the stage above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from wandb_modprof.capture.structure.structure_driver import StructureSink

if TYPE_CHECKING:
    from wandb_modprof.capture.memory.gradient_readings import PendingGradientState
    from wandb_modprof.capture.memory.static_memory import StaticReadings
    from wandb_modprof.capture.session_record import SessionRecord


class SampleSink(StructureSink, Protocol):
    """Where the capture hands its output: finished step sessions (resolved later, off the
    sampled step) and structure passes. `stats.accumulator.ProfileAccumulator` is one; the
    capture never imports it (the statistics stage sits above this one).

    `add` takes plain data, never a live capture object: the session's `SessionRecord` (its
    stamps, calls, nodes and byte counts; on an accelerator also its clock, whose events
    belong to this process), the static readings (the model index's per-module tables, and
    the optimizer's state bytes) and the gradient readings. Two of those await a read, to
    keep it off the sampled step: the gradient norms are device tensors not read yet (reading
    them would sync with the device inside the backward), and the optimizer's bytes are read
    after `optimizer.step()` (`PendingOptimizerBytes`). Both are read when the sample is
    resolved or handed to the worker process."""

    def add(
        self,
        record: SessionRecord,
        gradients: PendingGradientState | None,
        static: StaticReadings,
    ) -> None: ...

    def resolve_pending(self, force: bool) -> None: ...
