"""What sampling costs a watched run, measured on its training thread, and `log_freq="auto"`.

Every training step starts at the watched model's root forward, where `watch` already has a
hook: the meter reads the clock there (one `perf_counter` per step) and so knows each step's
length, from its forward to the next one's (the optimizer, the data loader and the user's
logging included: the training loop's own time). A step is "plain" (not sampled, no structure
pass), "sampled" or a "structure" pass. Our work outside those steps (handing a sample over,
logging a table at a later step) is timed where it runs and taken out of the step it landed in.

The cost of sampling is then, summed over the run: each sampled and structure step's length
less the median of the recent plain steps (the step it would have been), our work at other
steps, and the floor of `watch` on every step, which the plain steps carry too and so cannot
show: the root hooks' own time, read with the clock in the hooks themselves
(`Capture.root_hook_s`, cold caches and all), as much again for the model's own code and data
that our hooks push out of the caches and the model then fetches again (`EVICTION`: on CPU,
against an unwatched twin stepped alternately, the floor a model pays was 1.7-2.3 times our
hooks' own time on a 1-layer model, a 3-layer MLP and a small transformer,
`benchmarks/meter.py`), plus the interpreter's cost to reach a hooked module's hooks
(`Module._call_impl`'s slow path), measured once per process (`capture.step.hook_cost`).
Where the worker process (`api.sample_handoff`) competes with training for the cores (torch's
intra-op threads fill every core the process may use), its CPU time counts too (`worker_s`);
with a core to spare it does not. The share is the cost over the
time since the first step. Until a plain step has been timed the sampled steps' extra is not
known and counts as 0 (said by `Overhead.steps`).

`log_freq="auto"` (`watch(..., settings=Settings(overhead=0.01))`) samples a step only when
the run's cost so far plus the last sample's cost stays within `overhead` of the time since
the first step: the interval between samples follows what a sample costs on this model and
machine. The first
sample's cost is not known before it runs: it is taken as `FIRST_SAMPLE_STEPS` plain steps.
Where the floor alone is at or above `overhead` (a tiny model whose root hooks cost more than
the budget), nothing is sampled, and `floor_over` says so (told once by `StepCounter`).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections import deque
from typing import Any

import torch

from wandb_modprof.records.snapshot import Overhead

DEFAULT_OVERHEAD = 0.01  # `Settings.overhead`: 1 % of training time
"""The share of training time `watch(log_freq="auto")` lets sampling take unless given
`overhead=`: 0.01, 1 %."""
PLAIN_WINDOW = 32  # recent plain steps whose median is the typical step
FIRST_SAMPLE_STEPS = 3  # `log_freq="auto"`: what the first sample is taken to cost, in steps
MIN_PLAIN = 8  # `log_freq="auto"`: plain steps timed before the floor is trusted
# `log_freq="auto"`: what a structure pass is taken to cost before it ran, in plain steps (a
# pass measured 4-8 on CPU, from a 3-layer MLP to the 10,000-call tree), and the roofline's
# calibration that the process's first pass also runs (0.25 s measured on a 2-core CPU)
PASS_STEPS = 8
CALIBRATION_S = 0.3
# What the root hooks' own time stands for: itself, and as much again for the model's own
# code and data that our hooks pushed out of the caches (module docstring)
EVICTION = 2.0
_MEDIAN_EVERY = 8  # steps between recomputed medians (`due` asks at every step)


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
        self._passes: list[float] = []  # of those, the structure passes' (one-time work)
        self._last_sample_s = 0.0  # the last sampled step's length (its extra: `last_cost`)
        self._own_since_sample = 0.0
        self.steps = 0
        self.samples = 0
        # the floor (docstring): the root hooks' own seconds on plain steps and over how many,
        # the reach cost per step (set by `watch` from `capture.step.hook_cost`), the hooks'
        # total as last read, and the worker's CPU seconds that competed with training
        self._hooks_plain = 0.0  # summed over every plain step
        self._hooks_recent: deque[float] = deque(maxlen=PLAIN_WINDOW)
        self._hooks_at, self._hooks_median = -1, 0.0  # (`_hooks_typical`'s cache)
        self._typical_at: int = -1
        self._typical_median: float | None = None
        self.reach_s = 0.0
        self._hooks_seen = 0.0
        self._own_before = 0.0  # `own` work timed before the last `step` (see `step`)
        # the plain steps right after a sampled or structure step: a sample leaves work behind
        # (garbage to collect, caches to refill) that lands on the step after it
        self._after: list[float] = []
        self._after_ours = False
        self.worker_s = 0.0
        self.floor_over: tuple[float, float] | None = None  # (floor, typical step) when over

    def own(self, seconds: float) -> None:
        """Our work on the training thread outside a measured window (a hand-off, a log)."""
        self._own_in_step += seconds
        self._own_since_sample += seconds

    def step(self, now: float | None = None, hooks_s: float | None = None) -> None:
        """A training step starts (the root forward): the previous one ended. `hooks_s`: the
        root hooks' own seconds so far (a running total)."""
        now = time.perf_counter() if now is None else now
        hooks = hooks_s - self._hooks_seen if hooks_s is not None else 0.0
        if hooks_s is not None:
            self._hooks_seen = hooks_s
        if self._first is None:
            self._first = now
        if self._last is not None:
            length = now - self._last - self._own_in_step
            self._own += self._own_in_step
            if self._last_kind == "plain":
                self._plain.append(length)
                if self._after_ours:  # the plain step after ours: what spilled into it
                    self._after.append(length)
                # (our work timed by `own` ran inside the root hooks: counted once, there)
                # (`own` work runs inside a root hook before that step's `step`: the hooks
                # read now include the work timed before the previous `step`)
                hooks = max(0.0, hooks - self._own_before)
                self._hooks_plain += hooks
                self._hooks_recent.append(hooks)
            else:
                self._ours.append(length)
                if self._last_kind == "structure":
                    self._passes.append(length)
                if self._last_kind == "sampled":
                    self._last_sample_s = length
                    self._own_since_sample = self._own_in_step
        self._own_before, self._own_in_step = self._own_in_step, 0.0
        self._after_ours = self._last_kind != "plain" and self._last is not None
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
        if self._typical_at != self.steps // _MEDIAN_EVERY or self._typical_median is None:
            self._typical_at = self.steps // _MEDIAN_EVERY
            self._typical_median = statistics.median(self._plain) if self._plain else None
        return self._typical_median

    def _hooks_typical(self) -> float:
        """The root hooks' own time on a typical plain step (the median of the recent ones;
        recomputed every `_MEDIAN_EVERY` steps: `due` asks at every step)."""
        if self._hooks_at != self.steps // _MEDIAN_EVERY:
            self._hooks_at = self.steps // _MEDIAN_EVERY
            self._hooks_median = (
                statistics.median(self._hooks_recent) if self._hooks_recent else 0.0
            )
        return self._hooks_median

    def floor_s(self) -> float:
        """The floor of `watch` per step: the root hooks' own time on a typical plain step,
        twice (the module docstring's eviction), plus the reach cost."""
        return EVICTION * self._hooks_typical() + self.reach_s

    def cost_s(self) -> float:
        """Ours, in seconds: the extra of sampled and structure steps, our timed work, every
        plain step's root hooks (the work a hook does after a sample included), the typical
        hooks of the other steps (inside their extra's typical step), the reach cost of every
        step, and the worker's competing CPU."""
        typical = self._typical()
        extra = 0.0
        if typical is not None:
            extra = sum(max(0.0, s - typical) for s in self._ours)
            extra += max(0.0, sum(s - typical for s in self._after))  # (noise cancels out)
        typical_hooks = self._hooks_typical()
        # the hooks' own time where it was read (plain steps) or is inside the typical step a
        # sampled or structure step is compared with, and on every step the eviction's share
        hooks = self._hooks_plain + len(self._ours) * typical_hooks
        hooks += self.steps * (EVICTION - 1) * typical_hooks
        return extra + self._own + hooks + self.steps * self.reach_s + self.worker_s

    def last_cost_s(self) -> float:
        """The newest sample's cost: its step's extra and our work since it."""
        typical = self._typical()
        extra = max(0.0, self._last_sample_s - typical) if typical is not None else 0.0
        return extra + self._own_since_sample

    def parts(self) -> tuple[float, float, float]:
        """(typical plain step, cost per sample, one-time cost: the structure passes' extra)
        in seconds, for saying what the share is made of (`Overhead`)."""
        typical = self._typical()
        if typical is None:
            return 0.0, 0.0, 0.0
        once = sum(max(0.0, s - typical) for s in self._passes)
        floor = self.steps * self.floor_s() + self.worker_s
        per_sample = max(0.0, self.cost_s() - once - floor) / self.samples if self.samples else 0.0
        return typical, per_sample, once

    def due(self, budget: float, now: float | None = None) -> bool:
        """`log_freq="auto"`: whether to sample the step starting now within `budget`."""
        typical = self._typical()
        if self._first is None or typical is None or len(self._hooks_recent) < MIN_PLAIN:
            return False  # no sample's cost, nor the floor, is known yet
        floor = self.floor_s()
        if floor >= budget * typical:
            self.floor_over = (floor, typical)
            return False
        self.floor_over = None
        now = time.perf_counter() if now is None else now
        last = self.last_cost_s() if self.samples else FIRST_SAMPLE_STEPS * typical
        return self.cost_s() + last <= budget * (now - self._first)

    def pass_due(self, budget: float, calibrating: bool, now: float | None = None) -> bool:
        """`log_freq="auto"`: whether a structure pass may run at the step starting now within
        `budget` (`calibrating`: it would also calibrate the roofline)."""
        typical = self._typical()
        if self._first is None or typical is None or len(self._hooks_recent) < MIN_PLAIN:
            return False
        if self.floor_s() >= budget * typical:
            return False  # (nothing is sampled either: `due` says so)
        now = time.perf_counter() if now is None else now
        cost = PASS_STEPS * typical + (CALIBRATION_S if calibrating else 0.0)
        return self.cost_s() + cost <= budget * (now - self._first)

    def overhead(self) -> Overhead:
        first, last = self._first, self._last
        wall = last - first if first is not None and last is not None else 0.0
        step_s, sample_s, once_s = self.parts()
        return Overhead(
            wall_s=wall,
            cost_s=self.cost_s(),
            steps=self.steps,
            samples=self.samples,
            floor_s=self.floor_s(),
            worker_s=self.worker_s,
            step_s=step_s,
            sample_s=sample_s,
            once_s=once_s,
        )


def run_overhead(meter: OverheadMeter, passes: dict[str, Any], handoff: Any) -> Overhead:
    """A watched run's `Overhead`: the meter's, with its structure passes (`passes`, the
    capture's `StructureDriver.totals`) and, with a worker (`handoff`, a `SampleHandoff`), the
    samples it lost or dropped and its CPU time where it competes for the cores."""
    facts = dict(passes)
    if handoff is not None:
        meter.worker_s = handoff.cpu_s() if worker_competes() else 0.0
        facts.update(lost=handoff.lost, dropped=handoff.dropped)
    return dataclasses.replace(meter.overhead(), **facts)


def worker_competes() -> bool:
    """Whether a worker process's CPU time is taken from training: torch's intra-op threads
    fill every core this process may run on, so no core is left idle for it."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (no affinity outside Linux)
        cores = os.cpu_count() or 1
    return torch.get_num_threads() >= cores
