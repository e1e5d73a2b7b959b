"""When a sample's calls ran, on the step's time axis (ms from the root forward's start): the end
of a call's forward window, and the call running at a given time. The spans (`view/spans.py`)
draw a forward window up to `fwd_end`; the memory curve's meta (`view/memory_curve.py`) names
the call running at the curve's peak.
"""

from __future__ import annotations

from wandb_modprof.records.sample import InvocationRecord, Sample


def fwd_end(rec: InvocationRecord) -> float:
    """When the call's forward ended: its start plus its wall time where that was measured,
    else plus its forward time."""
    wall = rec.fwd_wall_ms if rec.fwd_wall_ms is not None else rec.fwd_ms
    return rec.fwd_start_ms + wall


def running_at(sample: Sample, t_ms: float) -> tuple[str, str]:
    """The innermost call running at `t_ms` and in which phase: in the forward the deepest
    call whose window holds it, in the backward the owner of the run holding it (the latest
    started, so a nested recompute wins); ("", "") between them."""
    best: InvocationRecord | None = None
    for rec in sample.invocations:
        if rec.fwd_start_ms <= t_ms <= fwd_end(rec) and (best is None or rec.depth > best.depth):
            best = rec
    if best is not None:
        return best.key, "forward"
    owner = ""
    for run in sample.runs:
        if run.start_ms <= t_ms <= run.end_ms:
            owner = run.owner_key
    return (owner, "backward") if owner else ("", "")
