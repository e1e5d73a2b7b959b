"""Accelerator allocator counters read at hook boundaries (host-side calls, no device sync).

Peaks nest: each boundary reads the peak since the previous boundary, folds it into the work
that was running, and resets the peak counter. This resets `torch.cuda.max_memory_allocated()`
(and the other accelerators' equivalent) during sampled steps: a user who reads that peak for
their own logging sees the peak since our last boundary instead. Documented in the README.
"""

from __future__ import annotations

from typing import Protocol

import torch


class DeviceMemory(Protocol):
    def allocated(self) -> int: ...

    def peak(self) -> int: ...

    def reset_peak(self) -> None: ...


class AcceleratorMemory:
    """`torch.accelerator` memory counters of one device."""

    def __init__(self, device: torch.device) -> None:
        self._index = (
            device.index if device.index is not None else torch.accelerator.current_device_index()
        )

    def allocated(self) -> int:
        return int(torch.accelerator.memory_allocated(self._index))

    def peak(self) -> int:
        return int(torch.accelerator.max_memory_allocated(self._index))

    def reset_peak(self) -> None:
        torch.accelerator.reset_peak_memory_stats(self._index)
