"""What sampling costs a watched run, measured on its training thread, and `log_freq="auto"`.

Every training step starts at the watched model's root forward, where `watch` already has a
hook: the meter reads the clock there (one `perf_counter` per step) and so knows each step's
length, from its forward to the next one's (the optimizer, the data loader and the user's
logging included: the training loop's own time). A step is "plain" (not sampled, no structure
pass), "sampled" or a "structure" pass. Our work outside those steps (handing a sample over,
logging a table at a later step) is timed where it runs and taken out of the step it landed in.

The cost of sampling is then, summed over the run: each sampled and structure step's length
less the median of the recent plain steps (the step it would have been), and our work at other
steps. The share is that over the time since the first step. Until a plain step has been
timed the sampled steps' extra is not known and counts as 0 (said by `Overhead.steps`).

`log_freq="auto"` (`watch(..., overhead=0.01)`) samples a step only when the run's cost so far
plus the last sample's cost stays within `overhead` of the time since the first step: the
interval between samples follows what a sample costs on this model and machine. The first
sample is the first step after the structure pass (its cost is not known before).
"""

from __future__ import annotations

import statistics
import time
from collections import deque

from wandb_modprof.records.snapshot import Overhead

DEFAULT_OVERHEAD = 0.01  # `watch(overhead=)`: 1 % of training time
"""The share of training time `watch(log_freq="auto")` lets sampling take unless given
`overhead=`: 0.01, 1 %."""
PLAIN_WINDOW = 32  # recent plain steps whose median is the typical step


class OverheadMeter:
    """Step lengths and our own time of one watched run (see the module docstring)."""

    def __init__(self) -> None:
        self._first: float | None = None
        self._last: float | None = None
        self._last_kind = "plain"
        self._own_in_step = 0.0  # our work inside the step now running (taken out of it)
        self._own = 0.0  # all our work outside sampled and structure steps
        self._plain: deque[float] = deque(maxlen=PLAIN_WINDOW)
        self._ours: list[float] = []  # lengths of sampled / structure steps
        self._last_sample_s = 0.0  # the last sampled step's length (its extra: `last_cost`)
        self._own_since_sample = 0.0
        self.steps = 0
        self.samples = 0

    def own(self, seconds: float) -> None:
        """Our work on the training thread outside a measured window (a hand-off, a log)."""
        self._own_in_step += seconds
        self._own_since_sample += seconds

    def step(self, now: float | None = None) -> None:
        """A training step starts (the root forward): the previous one ended."""
        now = time.perf_counter() if now is None else now
        if self._first is None:
            self._first = now
        if self._last is not None:
            length = now - self._last - self._own_in_step
            self._own += self._own_in_step
            if self._last_kind == "plain":
                self._plain.append(length)
            else:
                self._ours.append(length)
                if self._last_kind == "sampled":
                    self._last_sample_s = length
                    self._own_since_sample = self._own_in_step
        self._own_in_step = 0.0
        self._last, self._last_kind = now, "plain"
        self.steps += 1

    def mark(self, kind: str) -> None:
        """The step now running (or, for "structure", the one that just ended: a pass is known
        once it ran) is "sampled" or a "structure" pass."""
        if self._last_kind == "sampled":
            self.samples -= 1  # a sampled step given to a structure pass is not a sample
        self._last_kind = kind
        if kind == "sampled":
            self.samples += 1

    def _typical(self) -> float | None:
        return statistics.median(self._plain) if self._plain else None

    def cost_s(self) -> float:
        typical = self._typical()
        extra = sum(max(0.0, s - typical) for s in self._ours) if typical is not None else 0.0
        return extra + self._own

    def last_cost_s(self) -> float:
        """The newest sample's cost: its step's extra and our work since it."""
        typical = self._typical()
        extra = max(0.0, self._last_sample_s - typical) if typical is not None else 0.0
        return extra + self._own_since_sample

    def due(self, budget: float, now: float | None = None) -> bool:
        """`log_freq="auto"`: whether to sample the step starting now within `budget`."""
        if self.samples == 0:
            return True
        if self._first is None or self._typical() is None:
            return False  # a plain step first: without it the last sample's cost is unknown
        now = time.perf_counter() if now is None else now
        return self.cost_s() + self.last_cost_s() <= budget * (now - self._first)

    def overhead(self) -> Overhead:
        first, last = self._first, self._last
        wall = last - first if first is not None and last is not None else 0.0
        return Overhead(wall_s=wall, cost_s=self.cost_s(), steps=self.steps, samples=self.samples)
