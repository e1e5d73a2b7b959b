"""Activation-checkpointing recomputes of one sampled step, matched to the calls they repeat.

During the backward, checkpointed calls run their forward again. Each recompute is matched
to the original call (children of a recomputed call repeat in forward order; top-level
recomputes run in backward order, latest unmatched call first) so its time is that call's
`recompute_ms`, never a second forward; with reentrant checkpointing the fresh nodes it
creates are walked so their backward time goes to the same calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wandb_modprof.capture.forward.invocation import Invocation, Recompute, grad_fns
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.step.clock import Clock

# What the node stamps walk after a top-level recompute: (roots, lo, hi, owner per sequence nr)
NodeWalk = tuple[list[Any], int, int, list[int]]


class RecomputeTracker:
    def __init__(self) -> None:
        self.records: list[Recompute] = []
        self._stack: list[int] = []
        self._roots: list[Any] = []
        self._matched: set[int] = set()

    def enter(
        self,
        candidates: list[int],
        invocations: Sequence[Invocation],
        exec_stack: list[int],
        clock: Clock,
        shapes: tuple[Any, ...] = (),
    ) -> None:
        """A module's forward starts during the backward; `candidates`: its calls' indices,
        `shapes`: its arguments' shapes. A recompute repeats a call with the same shapes:
        where some candidates have them, only those are considered (one module called
        twice in one checkpointed function, on a large and a small tensor)."""
        same = [i for i in candidates if i not in self._matched and invocations[i].shapes == shapes]
        if same:
            candidates = same
        parent = self._stack[-1] if self._stack else -1
        orig = -1
        if parent >= 0 and self.records[parent].orig >= 0:
            # Inside a recomputed call children repeat in forward order.
            want = self.records[parent].orig
            orig = next(
                (i for i in candidates if i not in self._matched and invocations[i].parent == want),
                -1,
            )
        if orig < 0:
            # Top-level recomputes run in backward order: the latest unmatched call first.
            orig = next((i for i in reversed(candidates) if i not in self._matched), -1)
        if orig >= 0:
            self._matched.add(orig)
        enclosing = exec_stack[-1] if exec_stack and parent < 0 else -1
        self._stack.append(len(self.records))
        t0 = clock.stamp()
        self.records.append(
            Recompute(orig, parent, enclosing, tp.sequence_nr(), t0, clock.own_at(t0))
        )

    def exit(self, result: Any, clock: Clock) -> NodeWalk | None:
        """A recomputed forward returns; the nodes to walk once a top-level one finished."""
        if not self._stack:
            return None
        rec = self.records[self._stack.pop()]
        rec.t1 = clock.stamp()
        rec.own1 = clock.own_at(rec.t1)
        rec.seq1 = tp.sequence_nr()
        self._roots.extend(grad_fns(result))
        if self._stack:
            return None
        roots, self._roots = self._roots, []
        top = len(self.records) - 1
        while self.records[top].parent >= 0:
            top = self.records[top].parent
        lo, hi = self.records[top].seq0, rec.seq1
        if hi <= lo:
            return None
        owners = [-1] * (hi - lo)
        for r in self.records[top:]:
            owner = r.orig if r.orig >= 0 else self.records[top].orig
            if r.seq1 > r.seq0 and owner >= 0:
                owners[r.seq0 - lo : r.seq1 - lo] = [owner] * (r.seq1 - r.seq0)
        return list(roots), lo, hi, owners


def roll_up_recomputes(parents: list[int], recompute: list[float], recomputed: list[bool]) -> None:
    """Recompute times made inclusive, in place, like every other time: a call whose children
    were recomputed but not itself (transformers checkpoints a layer's `forward` function, not
    the layer's call) holds their recompute time; a call recomputed itself already holds its
    children's. `parents[i]`: the parent of call i (-1: none), parents before children."""
    measured = list(recomputed)
    for i in range(len(parents) - 1, -1, -1):
        p = parents[i]
        if p >= 0 and recomputed[i] and not measured[p]:
            recompute[p] += recompute[i]
            recomputed[p] = True
