"""Where a sampled step's time goes around the modules: the phases of the step.

In step order: `between` (from the end of the step before, its optimizer step or, where none
ran, its backward, to this step's forward: data loading, host-to-device copies, the user's own
code), `forward`, `loss` (from the forward's end to the backward's start), `backward` and
`optimizer` (the optimizer's `step`). A phase that could not be measured is named with the
reason, never shown as 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PHASES = ("between", "forward", "loss", "backward", "optimizer")

PHASE_LABELS = {
    "between": "between steps",
    "forward": "forward",
    "loss": "loss",
    "backward": "backward",
    "optimizer": "optimizer",
}


@dataclass(frozen=True)
class StepPhases:
    """One sampled step's phases: milliseconds of each one measured, the reason for each one
    not measured (each phase of `PHASES` is in exactly one of the two)."""

    ms: Mapping[str, float]
    unmeasured: Mapping[str, str]


@dataclass(frozen=True)
class PhaseStats:
    """The phases over the samples: each measured phase's median milliseconds (over the latest
    `stats.running.MEDIAN_WINDOW` samples that measured it), its fastest sample (what the
    regression gate compares) and how many samples measured it; for a phase no sample
    measured, why (the latest sample's reason)."""

    median_ms: Mapping[str, float]
    min_ms: Mapping[str, float]
    samples: Mapping[str, int]
    unmeasured: Mapping[str, str]

    def step_ms(self) -> float:
        """The sum of the measured phases' medians: the typical step as the phases tell it."""
        return sum(self.median_ms.values())
