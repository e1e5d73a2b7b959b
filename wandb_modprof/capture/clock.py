"""Timestamps taken inside hooks, resolved to milliseconds later.

Hooks only *take* stamps. Turning them into numbers happens after the step, so on an
accelerator nothing inside a hook ever waits for the device: a CUDA event is recorded on the
current stream and read back once it has completed (`ready()`), or when the user explicitly
asks for the profile (`wait()`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn

from wandb_modprof._errors import ModProfError
from wandb_modprof.capture.options import Options, Timing


class Clock(Protocol):
    def stamp(self) -> Any: ...

    def ready(self, stamp: Any) -> bool: ...

    def wait(self, stamp: Any) -> None: ...

    def offsets_ms(self, ref: Any, stamps: Sequence[Any]) -> list[float]:
        """Milliseconds from `ref` to each stamp (stamps may be None: gives NaN)."""
        ...


class CpuClock:
    """Host monotonic clock. Exact for CPU work; on accelerators it measures launch time."""

    def stamp(self) -> int:
        return time.perf_counter_ns()

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
