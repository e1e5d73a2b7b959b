"""The memory curve of one finished step, and on CPU the per-call peaks read from it.

Takes a finished `SessionRecord` (and, on CPU, the parameter, buffer and gradient bytes of the
root); gives a `records.sample.MemoryCurve` and, on CPU, a `SavedLevels` that answers "what
was live at time t" and "the most that was live between a and b".

* On an accelerator the points are the allocator's allocated bytes that the session already
  reads at every module boundary (for the forward delta and peak) plus one more host-side read
  at the end of every backward node: no device sync, nothing per tensor.
* On CPU there is no allocator counter. The curve is what the step itself keeps alive: the
  parameters and buffers, the gradients (an AccumulateGrad node adds the gradient it creates
  when it finishes) and the tensors saved for backward (`capture/memory/activations.py` appends
  +bytes as a storage is first saved and -bytes when its last packed object dies). Per call,
  the forward peak is the most live during its forward above what was live as it started, and
  each backward node gets the level as it started and the most live while it ran, the same
  quantities the accelerator path reads from the allocator, so the Peak mode means the same
  thing on both (of a different population of bytes: temporaries that are not saved are not
  seen on CPU).

Runs in `resolve`, after the step: nothing here costs the sampled step anything.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from wandb_modprof.capture.session_record import SessionRecord
from wandb_modprof.records.sample import MemoryCurve


@dataclass(frozen=True)
class SavedLevels:
    """A CPU step's curve as a step function over host nanoseconds since the root's start."""

    baseline: int  # live before the first event: parameters, buffers, gradients that existed
    ts: tuple[int, ...]  # event times (ns offsets), sorted
    levels: tuple[int, ...]  # live bytes from each event on

    def at(self, t: int) -> int:
        i = bisect.bisect_right(self.ts, t) - 1
        return self.levels[i] if i >= 0 else self.baseline

    def most(self, a: int, b: int) -> int:
        """The most live at any time in [a, b]."""
        top = self.at(a)
        i0, i1 = bisect.bisect_right(self.ts, a), bisect.bisect_right(self.ts, b)
        if i1 > i0:
            top = max(top, *self.levels[i0:i1])
        return top

    def curve(self) -> MemoryCurve:
        t_ms = (0.0, *(t / 1e6 for t in self.ts))
        return MemoryCurve("saved", t_ms, (self.baseline, *self.levels))


def saved_levels(
    record: SessionRecord, static_bytes: int, grad_bytes_end: int | None
) -> SavedLevels:
    """The CPU curve of `record` (CpuClock stamps: `perf_counter_ns`). `static_bytes` are the
    root's parameter and buffer bytes; `grad_bytes_end` its gradient bytes at the end of the
    step (None: not read), of which those no AccumulateGrad node created existed before."""
    assert record.activations is not None and record.activations.curve is not None
    ref = int(record.ref_stamp)
    nodes = record.nodes
    raw = list(record.activations.curve)  # copied: a late release may still append
    events = [(raw[k] - ref, raw[k + 1]) for k in range(0, len(raw) - 1, 2)]
    created = 0
    for j, extra in enumerate(nodes.grad_new):
        t1 = nodes.t1[j]
        if extra and t1 is not None and nodes.t0[j] is not None:
            events.append((int(t1) - ref, extra))
            created += extra
    end = record.bwd_t_end if record.bwd_t_end is not None else record.invocations[0].t1
    if end is not None:
        # Releases after the step (a retained graph freed later) belong to no call of it.
        events = [e for e in events if e[0] <= int(end) - ref]
    events.sort(key=lambda e: e[0])
    existing = max(0, grad_bytes_end - created) if grad_bytes_end is not None else 0
    baseline = static_bytes + existing
    levels: list[int] = []
    live = baseline
    for _, delta in events:
        live += delta
        levels.append(live)
    return SavedLevels(baseline, tuple(e[0] for e in events), tuple(levels))


def forward_peaks(record: SessionRecord, levels: SavedLevels) -> list[int | None]:
    """Per call: the most live during its forward above what was live as it started."""
    ref = int(record.ref_stamp)
    out: list[int | None] = []
    for inv in record.invocations:
        a, b = int(inv.t0) - ref, int(inv.t1) - ref
        out.append(max(0, levels.most(a, b) - levels.at(a)))
    return out


def node_levels(
    record: SessionRecord, levels: SavedLevels
) -> tuple[list[int | None], list[int | None]]:
    """Per backward node slot: live as it started and the most live while it ran (None: it did
    not run), what `resolve` folds into each call's backward peak."""
    ref = int(record.ref_stamp)
    nodes = record.nodes
    base: list[int | None] = [None] * len(nodes)
    peak: list[int | None] = [None] * len(nodes)
    for j in range(len(nodes)):
        t0, t1 = nodes.t0[j], nodes.t1[j]
        if t0 is None or t1 is None:
            continue
        a, b = int(t0) - ref, int(t1) - ref
        base[j] = levels.at(a)
        peak[j] = levels.most(a, b)
    return base, peak


def device_curve(record: SessionRecord) -> MemoryCurve:
    """The accelerator curve: allocated bytes at every module and backward node boundary."""
    stamps: list[object] = []
    values: list[int] = []
    for inv in record.invocations:
        for stamp, value in ((inv.t0, inv.mem_alloc0), (inv.t1, inv.mem_alloc1)):
            if stamp is not None and value is not None:
                stamps.append(stamp)
                values.append(value)
    nodes = record.nodes
    for j in range(len(nodes)):
        if nodes.t1[j] is None:
            continue  # did not run (or its post hook never came)
        for stamp, value in ((nodes.t0[j], nodes.alloc0[j]), (nodes.t1[j], nodes.alloc1[j])):
            if stamp is not None and value is not None:
                stamps.append(stamp)
                values.append(value)
    offsets = record.clock.offsets_ms(record.ref_stamp, stamps)
    pairs = [(t, v) for t, v in zip(offsets, values, strict=True) if not math.isnan(t)]
    points = sorted(pairs, key=lambda p: p[0])  # stable: ties keep the order they were read
    return MemoryCurve("device", tuple(p[0] for p in points), tuple(p[1] for p in points))
