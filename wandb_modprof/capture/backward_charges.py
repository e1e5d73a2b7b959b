"""A finished step's backward charged to its calls: node times, checkpoint recomputes, peaks.

Takes a finished `SessionRecord`'s node stamps (and, on CPU, the per-node memory levels read
from its memory curve); gives, per invocation, its own backward work (`BackwardTimes`):
exclusive node times (nested nodes, recomputes and our hooks' own time taken out) charged to
the calls that own the nodes, each recompute's time to the call it repeats, the number of
nodes run, the first and last node's offsets, and the allocator readings around them.
`resolve` then sums these up the call tree; the node and recompute offsets kept here are
the trace's runs (`backward_runs`).

Runs in `resolve`, after the step: nothing here costs the sampled step anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wandb_modprof.capture.backward.recompute import roll_up_recomputes
from wandb_modprof.capture.session_record import SessionRecord

# Per node: the live bytes as it started and the most live while it ran.
NodeMemory = tuple[list[int | None], list[int | None]]


def stamped(offset: float) -> bool:
    """The stamp behind `offset` was taken (`Clock.offsets_ms` gives NaN for a missing one:
    a node that never ran, a recompute whose exit never came)."""
    return not math.isnan(offset)


@dataclass
class BackwardTimes:
    """Per invocation (indexed as `record.invocations`): its own backward work, then, after
    `resolve`'s roll-up, with its descendants'. Node and recompute offsets are kept for the
    trace."""

    bwd_self: list[float]
    recompute: list[float]
    recomputed: list[bool]
    nodes_run: list[int]
    first: list[float]  # start of its first node (inf: none ran)
    last: list[float]  # end of its last node (-inf: none ran)
    first_alloc: list[int | None]  # accelerators: allocated bytes as its first node started
    peak: list[int | None]  # accelerators: allocator peak over its nodes
    t0: list[float]
    t1: list[float]
    r_off: list[float]

    @classmethod
    def empty(cls, n: int) -> BackwardTimes:
        return cls(
            [0.0] * n, [0.0] * n, [False] * n, [0] * n, [math.inf] * n, [-math.inf] * n,
            [None] * n, [None] * n, [], [], [],
        )  # fmt: skip


def backward_times(record: SessionRecord, node_mem: NodeMemory | None = None) -> BackwardTimes:
    """Exclusive node times (nested nodes and recomputes taken out) charged to their owners;
    `node_mem`: per node the live bytes as it started and the most live while it ran, read
    from the CPU curve (default: the allocator's, from the record)."""
    clock, ref = record.clock, record.ref_stamp
    back = BackwardTimes.empty(len(record.invocations))
    nodes = record.nodes
    back.t0 = t0 = clock.offsets_ms(ref, nodes.t0)
    back.t1 = t1 = clock.offsets_ms(ref, nodes.t1)
    ran = [stamped(a) and stamped(b) for a, b in zip(t0, t1, strict=True)]
    # less our own time inside the node (saved-tensor unpack hooks, nested recomputes' hooks)
    own = [(b - a) / 1e6 for a, b in zip(nodes.own0, nodes.own1, strict=True)]
    dur = [t1[j] - t0[j] - own[j] if ran[j] else 0.0 for j in range(len(ran))]
    excl = list(dur)
    for j, outer in enumerate(nodes.enclosing):
        if ran[j] and outer >= 0:
            excl[outer] -= dur[j]
    _charge_recomputes(record, back, excl)
    alloc0, peaks = node_mem if node_mem is not None else (nodes.alloc0, nodes.peak)
    for j, owner in enumerate(nodes.owner):
        if not ran[j]:
            continue
        back.bwd_self[owner] += excl[j]
        back.nodes_run[owner] += 1
        if t0[j] < back.first[owner]:
            back.first[owner] = t0[j]
            back.first_alloc[owner] = alloc0[j]
        back.last[owner] = max(back.last[owner], t1[j])
        p = peaks[j]
        if p is not None:
            q = back.peak[owner]
            back.peak[owner] = p if q is None else max(q, p)
    return back


def _charge_recomputes(record: SessionRecord, back: BackwardTimes, excl: list[float]) -> None:
    """A recompute's time goes to the call it repeats (its `recompute_ms`, and its backward
    self time), and out of the node it ran inside."""
    recs = record.recomputes
    back.r_off = r_off = record.clock.offsets_ms(
        record.ref_stamp, [t for r in recs for t in (r.t0, r.t1)]
    )
    r_dur = [
        r_off[2 * k + 1] - r_off[2 * k] - (r.own1 - r.own0) / 1e6
        if stamped(r_off[2 * k + 1])
        else 0.0
        for k, r in enumerate(recs)
    ]
    r_self = list(r_dur)
    for k, r in enumerate(recs):
        if r.parent >= 0:
            r_self[r.parent] -= r_dur[k]
    for k, r in enumerate(recs):
        owner = r.orig
        up = r.parent
        while owner < 0 and up >= 0:  # an unmatched nested call: charge the nearest match
            owner, up = recs[up].orig, recs[up].parent
        if owner < 0:
            continue  # unmatched top-level recompute: its time stays in the enclosing node
        if r.parent < 0 and r.enclosing_node >= 0:
            excl[r.enclosing_node] -= r_dur[k]
        back.bwd_self[owner] += r_self[k]
        if r.orig >= 0:
            back.recompute[r.orig] += r_dur[k]
            back.recomputed[r.orig] = True
    roll_up_recomputes([inv.parent for inv in record.invocations], back.recompute, back.recomputed)
