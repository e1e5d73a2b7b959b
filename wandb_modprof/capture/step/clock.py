"""Timestamps taken inside hooks, resolved to milliseconds later.

Hooks only *take* stamps. Turning them into numbers happens after the step, so on an
accelerator nothing inside a hook ever waits for the device: a CUDA event is recorded on the
current stream and read back once it has completed (`ready()`), or when the user explicitly
asks for the profile (`wait()`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from wandb_modprof._errors import ModProfError
from wandb_modprof.capture.options import Options, Timing


class Clock(Protocol):
    def stamp(self) -> Any: ...

    def own_enter(self) -> None:
        """One of our hook bodies starts: its time is ours, not the model's."""
        ...

    def own_leave(self) -> None: ...

    def own_leave_call(self) -> None:
        """`own_leave` at the end of a module call's last hook body: the interpreter's work
        to reach our hooks (`HookCost.call_ns`) is ours too."""
        ...

    def own_leave_pack(self) -> None:
        """`own_leave` at the end of a saved-tensor pack hook (`HookCost.pack_ns` is ours)."""
        ...

    def own_leave_node(self) -> None:
        """`own_leave` at the end of an autograd node hook (`HookCost.node_ns` is ours)."""
        ...

    def own_at(self, stamp: Any) -> int:
        """Nanoseconds of our own hook work up to `stamp` (0 where none is kept)."""
        ...

    def ready(self, stamp: Any) -> bool: ...

    def wait(self, stamp: Any) -> None: ...

    def offsets_ms(self, ref: Any, stamps: Sequence[Any]) -> list[float]:
        """Milliseconds from `ref` to each stamp (stamps may be None: gives NaN)."""
        ...


@dataclass(frozen=True)
class HookCost:
    """What our hooks cost outside their bodies, where `own_enter` / `own_leave` cannot see:
    per hooked module call, `Module._call_impl`'s slow path (hook dicts, kwargs, always-call
    bookkeeping) and the frames that reach our methods and return; per saved tensor, autograd's
    call from C++ into the pack hook; per autograd node hook, the engine's call into it.
    Measured by `capture.hook_cost` (ns)."""

    call_ns: int = 0
    pack_ns: int = 0
    node_ns: int = 0


class CpuClock:
    """Host monotonic clock that also keeps the time spent in our own hook bodies.

    Exact for CPU work; on accelerators it measures launch time. Our hooks run inside the
    windows of every open call (walking and hooking each call's new autograd nodes as it
    returns, saved-tensor bookkeeping), so a wall-clock window charges that work to every
    enclosing call (GPT-2 root forward 1.14x, containers' self time 2.6-7x, MEASUREMENT.md).
    Hook bodies are bracketed by `own_enter` / `own_leave`; `own_at(stamp)` is our time so far
    at a stamp taken now, so a window's model time is its length less `own_at(end) -
    own_at(start)`. Stamps stay wall-clock: traces keep the real timeline, which profilers'
    traces share. The interpreter's work to reach each hook, before `own_enter` and after
    `own_leave`, is not seen by the clock: it is measured once (`HookCost`, 3-5 us per hooked
    call on this machine) and added when a call's last body ends, so it leaves the enclosing
    calls' windows too (a container with 4 children read ~20 us too much self time).
    """

    __slots__ = ("_depth", "_open_ns", "_own_ns", "cost")

    def __init__(self, cost: HookCost | None = None) -> None:
        self._own_ns = 0  # time spent in our finished hook bodies
        self._open_ns = 0  # when the running outermost body began
        self._depth = 0
        self.cost = cost if cost is not None else HookCost()

    def stamp(self) -> int:
        return time.perf_counter_ns()

    def own_enter(self) -> None:
        if self._depth == 0:
            self._open_ns = time.perf_counter_ns()
        self._depth += 1

    def own_leave(self) -> None:
        if self._depth == 0:
            return  # unbalanced: nothing to close
        self._depth -= 1
        if self._depth == 0:
            self._own_ns += time.perf_counter_ns() - self._open_ns

    def own_leave_call(self) -> None:
        self.own_leave()
        if self._depth == 0:  # (inside another body of ours the dispatch is already counted)
            self._own_ns += self.cost.call_ns

    def own_leave_pack(self) -> None:
        self.own_leave()
        if self._depth == 0:
            self._own_ns += self.cost.pack_ns

    def own_leave_node(self) -> None:
        self.own_leave()
        if self._depth == 0:
            self._own_ns += self.cost.node_ns

    def own_at(self, stamp: Any) -> int:
        """Our time (ns) up to `stamp`, a stamp just taken."""
        if self._depth:
            return self._own_ns + (int(stamp) - self._open_ns)
        return self._own_ns

    def ready(self, stamp: Any) -> bool:
        return True

    def wait(self, stamp: Any) -> None:
        return None

    def offsets_ms(self, ref: Any, stamps: Sequence[Any]) -> list[float]:
        return [float("nan") if s is None else (s - ref) / 1e6 for s in stamps]


class EventClock:
    """Device timing events recorded on the current stream (CUDA, XPU, MPS ... via torch.Event).

    Spans are stream time: they include launch gaps when the step is CPU-bound and miss work
    on side streams.
    """

    def __init__(self, device: torch.device) -> None:
        self._device = device
        # Fail at construction (the API boundary), not inside the first hook.
        self.stamp()

    def stamp(self) -> torch.Event:
        event = torch.Event(device=self._device, enable_timing=True)
        event.record()
        return event

    # Device time does not include our host work unless the device starves for it; stream
    # time cannot be paused, so nothing is taken out here.
    def own_enter(self) -> None:
        return None

    def own_leave(self) -> None:
        return None

    def own_leave_call(self) -> None:
        return None

    def own_leave_pack(self) -> None:
        return None

    def own_leave_node(self) -> None:
        return None

    def own_at(self, stamp: Any) -> int:
        return 0

    def ready(self, stamp: Any) -> bool:
        return bool(stamp.query())

    def wait(self, stamp: Any) -> None:
        stamp.synchronize()

    def offsets_ms(self, ref: Any, stamps: Sequence[Any]) -> list[float]:
        return [float("nan") if s is None else float(ref.elapsed_time(s)) for s in stamps]


def model_device(model: nn.Module) -> torch.device:
    for param in model.parameters():
        return param.device
    for buffer in model.buffers():
        return buffer.device
    return torch.device("cpu")


def make_clock(options: Options, device: torch.device) -> Clock:
    """Host clock on CPU; device events on accelerators (events of the device that holds the
    model's first parameter: a model spread over several devices is timed on that one)."""
    if options.timing is Timing.CPU or (options.timing is Timing.AUTO and device.type == "cpu"):
        return CpuClock()
    try:
        return EventClock(device)
    except RuntimeError as error:
        raise ModProfError(
            f"timing='device' needs a model on an accelerator with timing events; the model's "
            f"parameters are on {device} ({error}). Use timing='auto' or 'cpu'."
        ) from None
