"""The step's phases around its modules in one line of text (`records.phases`)."""

from __future__ import annotations

from wandb_modprof.records.phases import PHASE_LABELS, PHASES, PhaseStats
from wandb_modprof.view.units import format_value


def phases_line(phases: PhaseStats | None) -> str | None:
    """ "step phases (median): between steps 12 ms · forward 30 ms · ..."; a phase no sample
    measured is named with its reason. None: no sample recorded phases."""
    if phases is None:
        return None
    parts = []
    for phase in PHASES:
        ms = phases.median_ms.get(phase)
        if ms is not None:
            parts.append(f"{PHASE_LABELS[phase]} {format_value('ms', ms)}")
    line = "step phases (median): " + " · ".join(parts)
    if phases.unmeasured:
        missing = "; ".join(f"{PHASE_LABELS[p]}: {why}" for p, why in phases.unmeasured.items())
        line += f" (not measured: {missing})"
    return line
