"""A finished step session as plain data: what `resolve` reads, and nothing that holds the
model, a tensor, a hook or a callback. It is what the capture hands to the statistics stage
(`sink.SampleSink.add`) for every finished session.

The session itself stays in the capture: it holds bound methods of the capture, the
garbage-collector watch and the saved-tensor counter. The record references the session's
lists and tables (the calls, the node table, the recomputes, the saved-bytes curve), never
copies them: building it costs the sampled step a few attribute reads.

A host-clock record pickles (`watch` hands large samples to a worker process,
`api.sample_worker`). A device-clock record keeps the clock and its event stamps, whose
events belong to the process that recorded them, and the device memory readings in its calls
and nodes: it resolves in-process (`movable`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

from wandb_modprof.capture.backward.nodes import NodeTable
from wandb_modprof.capture.forward.invocation import Invocation, Recompute
from wandb_modprof.capture.step.clock import Clock, CpuClock
from wandb_modprof.capture.step_phases import PhaseStamps


@dataclass(frozen=True)
class ActivationCounts:
    """The saved-tensor counter's results: bytes saved per invocation index and the CPU
    memory curve (alternating stamps and byte deltas; None: no curve). The counter's own dict
    and list: its curve takes no entry after the step's end (`ActivationCounter.stop_curve`)."""

    bytes_by_invocation: dict[int, int]
    curve: list[int] | None


@dataclass(frozen=True)
class GcCharges:
    """Garbage-collection time charged per invocation index (host nanoseconds)."""

    charged: dict[int, int]

    def ms(self, index: int) -> float:
        return self.charged.get(index, 0) / 1e6


@dataclass(frozen=True)
class SessionRecord:
    """The fields of a finished `StepSession` that `capture.resolve` reads.

    `phase_stamps` is the session's own: the capture still stamps the optimizer step and the
    next forward into it after the hand-off (`step_phases.PhaseWatch`), and the record is read
    (resolved, or pickled for the worker) from the next root forward on."""

    step: int
    clock: Clock
    invocations: list[Invocation]
    nodes: NodeTable
    recomputes: list[Recompute]
    activations: ActivationCounts | None
    gc: GcCharges
    ref_stamp: Any
    bwd_started: bool
    bwd_t_begin: Any
    bwd_t_end: Any
    forward_thread: int
    # The calls and nodes carry the device allocator's readings (`mem_alloc0`, `alloc0`, ...):
    # the memory curve is read from them, not from the saved bytes.
    device_memory: bool = False
    cold_start: bool = False
    phase_stamps: PhaseStamps | None = None

    @property
    def movable(self) -> bool:
        """It can resolve in another process: host stamps, no device readings."""
        return isinstance(self.clock, CpuClock) and not self.device_memory

    def last_stamp(self) -> Any:
        """The step's last stamp: the backward's end, or the forward's without a backward."""
        return self.bwd_t_end if self.bwd_t_end is not None else self.invocations[0].t1

    def ready(self) -> bool:
        """Every stamp has completed, the phases' included (always on the host; a device's
        events may still run), and no phase stamp is still to come (an optimizer step under
        gradient accumulation: `step_phases.PhaseWatch`)."""
        phases = self.phase_stamps
        if phases is not None and not phases.settled:
            return False
        # (on a device the optimizer's kernels may still run at the next forward, where
        # resolution is tried: waiting a step for them times the optimizer phase)
        return self.clock.ready(self._newest())

    def wait(self) -> None:
        """Wait for the step's device events to complete, its phases' included (no wait on
        the host): the newest stamp, since a stream runs its events in order."""
        self.clock.wait(self._newest())

    def _newest(self) -> Any:
        phases = self.phase_stamps
        if phases is not None and phases.newest is not None:
            return phases.newest
        return self.last_stamp()

    # Pickled with the invocations as columns (one list per slot): the default pickling of
    # 10,000 slotted objects builds a state dict per object (83 ms to pickle and 55 ms to
    # load on nested-10000, the collector paused, against 57 / 32 ms as columns).
    def __getstate__(self) -> dict[str, Any]:
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        invocations = state.pop("invocations")
        columns = [list(c) for c in zip(*map(_SLOTS, invocations), strict=True)]
        if columns:
            columns[_SHAPES] = _shared(columns[_SHAPES])
        state["invocation_columns"] = columns
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        columns = state.pop("invocation_columns")
        invocations = []
        new = Invocation.__new__
        for values in zip(*columns, strict=True) if columns else ():
            inv = new(Invocation)
            for slot, value in zip(Invocation.__slots__, values, strict=True):
                setattr(inv, slot, value)
            invocations.append(inv)
        state["invocations"] = invocations
        for name, value in state.items():
            object.__setattr__(self, name, value)  # (frozen: set once, as `__init__` does)


_SLOTS = attrgetter(*Invocation.__slots__)
_SHAPES = Invocation.__slots__.index("shapes")


def _shared(shapes: list[Any]) -> list[Any]:
    """Equal argument shapes as one object each, so that pickle writes each distinct shape
    once (the `torch.Size`s of 10,000 calls were a third of a sample's pickling)."""
    seen: dict[Any, Any] = {}
    try:
        return [seen.setdefault(shape, shape) for shape in shapes]
    except TypeError:  # an unhashable shape: pickled as it is
        return shapes
