"""A finished step session as plain data: what `resolve` reads, and nothing that holds the
model, a tensor, a hook or a callback, so that it pickles and resolves in another process.

`watch` hands large samples to a worker process (`api.sample_worker`); the session itself
cannot travel (it holds bound methods of the capture, the garbage-collector watch, the
saved-tensor counter). Only host-clock sessions travel: an accelerator's timing events belong
to the process that recorded them, so device-timed samples resolve in-process.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

from wandb_modprof.capture.backward.nodes import NodeTable
from wandb_modprof.capture.forward.invocation import Invocation, Recompute
from wandb_modprof.capture.session import StepSession
from wandb_modprof.capture.step.clock import CpuClock
from wandb_modprof.capture.step_phases import PhaseStamps


@dataclass
class ActivationCounts:
    """The saved-tensor counter's results: bytes saved per invocation index and the CPU
    memory curve (alternating stamps and byte deltas; None: no curve)."""

    bytes_by_invocation: dict[int, int]
    curve: list[int] | None


@dataclass
class GcCharges:
    """Garbage-collection time charged per invocation index (host nanoseconds)."""

    charged: dict[int, int]

    def ms(self, index: int) -> float:
        return self.charged.get(index, 0) / 1e6


@dataclass
class SessionRecord:
    """The fields of a finished `StepSession` that `capture.resolve` reads."""

    step: int | None
    clock: CpuClock
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
    memory: None = None  # host-clock sessions only: no device allocator readings
    cold_start: bool = False
    phase_stamps: PhaseStamps | None = None

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
            setattr(self, name, value)


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


def session_record(session: StepSession) -> SessionRecord | None:
    """`session` as plain data, or None when it cannot leave the process (device timing or
    device memory readings)."""
    if not isinstance(session.clock, CpuClock) or session.memory is not None:
        return None
    counter = session.activations
    activations = None
    if counter is not None:
        curve = None if counter.curve is None else list(counter.curve)
        activations = ActivationCounts(dict(counter.bytes_by_invocation), curve)
    return SessionRecord(
        step=session.step,
        clock=session.clock,
        invocations=session.invocations,
        nodes=session.nodes,
        recomputes=session.recomputes,
        activations=activations,
        gc=GcCharges(dict(session.gc.charged)),
        ref_stamp=session.ref_stamp,
        bwd_started=session.bwd_started,
        bwd_t_begin=session.bwd_t_begin,
        bwd_t_end=session.bwd_t_end,
        forward_thread=session.forward_thread,
        cold_start=session.cold_start,
        phase_stamps=session.phase_stamps,
    )
