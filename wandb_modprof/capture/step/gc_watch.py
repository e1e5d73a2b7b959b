"""Python garbage collections during one sampled step, charged to the calls they paused.

A full collection walks every tracked object: tens of milliseconds in a large process, landing
inside whichever call happened to allocate the object that crossed the threshold. In `make
demo` one of three samples of one attention block read 119 ms where its peers read 5.5 ms.
The statistics colour by the median, which such a sample does not move; this records where
collections ran so the hover card and `summary` can say which samples held one.

`gc.callbacks` calls us at the start and the stop of every collection, on the thread that
triggered it, holding the GIL (no other Python code runs meanwhile). At the start we ask the
session which calls are open (`running`), at the stop we charge the host time in between to
each of them: an inclusive figure, like `fwd_ms`. The callback is in `gc.callbacks` only from
the root forward's start to the end of the sampled backward (or the sample's drop).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Collection
from typing import Any


class GcWatch:
    """Collection time per invocation index of one step session (host nanoseconds)."""

    __slots__ = ("_on_error", "_open", "_running", "charged", "collections", "total_ns")

    def __init__(
        self, running: Callable[[], Collection[int]], on_error: Callable[[Exception], None]
    ) -> None:
        self._running = running  # indices of the invocations open now (forward or backward)
        self._on_error = on_error
        self._open: tuple[int, Collection[int]] | None = None
        self.charged: dict[int, int] = {}  # invocation index -> ns of collections inside it
        self.collections = 0  # every collection seen, charged to a call or not
        self.total_ns = 0

    def start(self) -> None:
        if self._on_gc not in gc.callbacks:  # bound methods compare equal on the same watch
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        while self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # An exception escaping a gc callback is printed and lost, and this runs inside the
        # user's code: report it as a measurement error (the sample is dropped), never raise.
        try:
            if phase == "start":
                self._open = (time.perf_counter_ns(), self._running())
            elif self._open is not None:
                t0, calls = self._open
                self._open = None
                ns = time.perf_counter_ns() - t0
                self.collections += 1
                self.total_ns += ns
                for i in calls:
                    self.charged[i] = self.charged.get(i, 0) + ns
        except Exception as error:
            self.stop()
            self._on_error(error)

    def ms(self, index: int) -> float:
        """Milliseconds of collections that ran inside invocation `index`."""
        return self.charged.get(index, 0) / 1e6
