"""The step's phases over the samples (`records.phases`): a median per phase over the latest
samples that measured it, as the modules' statistics keep theirs."""

from __future__ import annotations

import math
import statistics
from collections import deque

from wandb_modprof.records.phases import PHASES, PhaseStats, StepPhases
from wandb_modprof.stats.running import MEDIAN_WINDOW


class PhaseFold:
    """Each phase's latest values (`MEDIAN_WINDOW`), how many samples measured it, and why the
    latest sample did not."""

    def __init__(self) -> None:
        self._window: dict[str, deque[float]] = {p: deque(maxlen=MEDIAN_WINDOW) for p in PHASES}
        self._counts = dict.fromkeys(PHASES, 0)
        self._min = dict.fromkeys(PHASES, math.inf)
        self._why: dict[str, str] = {}
        self.folded = 0  # samples that carried phases

    def fold(self, phases: StepPhases | None) -> None:
        if phases is None:
            return
        self.folded += 1
        for phase, ms in phases.ms.items():
            self._window[phase].append(ms)
            self._counts[phase] += 1
            self._min[phase] = min(self._min[phase], ms)
        self._why.update(phases.unmeasured)

    def snapshot(self) -> PhaseStats | None:
        """None: no sample carried phases (a profile read from an older file)."""
        if not self.folded:
            return None
        measured = [p for p in PHASES if self._counts[p]]
        return PhaseStats(
            median_ms={p: statistics.median(self._window[p]) for p in measured},
            min_ms={p: self._min[p] for p in measured},
            samples={p: self._counts[p] for p in measured},
            unmeasured={p: self._why.get(p, "not measured") for p in PHASES if p not in measured},
        )
