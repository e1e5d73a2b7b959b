"""What earlier structure passes learnt about each call, so that a later pass follows only
what is new.

A pass follows tensors and counts FLOPs inside a call's own code (its "view"). That work
depends on the call's code, its inputs' shapes and dtypes, and the calls it makes; the call key
(`capture.forward.call_keys`) names the same work on every step. So once a pass has followed a
call, a later pass that meets the same key with the same input meta can take the call's own
results from here (its own FLOPs, bytes and ops, forward and backward, and the edges of its
view) and run the call's code with the pass's modes off, at the speed of a plain forward.
The calls it makes are still met one by one (each is decided on its own), and when the call
returns its direct children are compared with the ones it made before: a call whose children
changed (a router picked other experts, a branch) is marked `dynamic` and followed by every
later pass; the pass that found out is incomplete and the next one follows it.

With top-k routing, a new call sequence then costs a pass over the routing blocks' own code
and the experts whose input changed, not over the whole model. A pass may also stop following
new calls after a budget of followed calls (`StructurePass(budget=...)`): the calls it did
follow are learnt here, and the next pass goes on where it stopped, so a large model's first
graph is spread over a few steps instead of one long one. Each pass that ran leaves a
`PassRecord` (the summary counts them).

A call's backward counts are those of the step that followed it: a parameter's first gradient
(`.grad` None) costs fewer ops than one added to an existing gradient, so they can differ from
what a full pass on another step would count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from wandb_modprof.records.calls import DataEdge

Meta = tuple[tuple[str, tuple[tuple[tuple[int, ...], torch.dtype], ...]], ...]


def call_meta(slots: Sequence[tuple[str, Sequence[torch.Tensor]]]) -> Meta:
    """What a call's own work depends on besides its code: each input slot's tensors'
    shapes and dtypes."""
    return tuple((name, tuple((tuple(t.shape), t.dtype) for t in ts)) for name, ts in slots)


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """One structure pass that ran to the end of its forward: the calls it followed (the
    others' results were known from earlier passes, or left to a later one), the calls of
    the forward, whether it gave the forward's whole graph, and its forward's seconds."""

    followed: int
    calls: int
    complete: bool
    seconds: float


@dataclasses.dataclass(frozen=True)
class KnownCall:
    """One call's own results from the last pass that followed it."""

    meta: Meta
    children: tuple[str, ...]  # the keys of the calls it made, in order
    flops: int  # own code only, as `CallInfo.fwd_self_flops`
    bwd_flops: int
    nbytes: int
    ops: int
    edges: tuple[DataEdge, ...]  # those of its own view
    bwd_bytes: int | None = None  # own backward nodes' (None: no counted backward yet)
    bwd_ops: int | None = None


class KnownCalls:
    """Per call key, what the passes of one capture learnt (one table per training mode: a
    module's work in `eval()` differs from its work in `train()`)."""

    def __init__(self) -> None:
        self.calls: dict[str, KnownCall] = {}
        # calls seen to make different calls on different steps: always followed
        self.dynamic: set[str] = set()
        # keys learnt (forward or backward) since `kept_counts` last filled graphs from here:
        # a graph holding none of them would be filled as before
        self.fresh: set[str] = set()

    def usable(self, key: str, meta: Meta, backward: bool) -> KnownCall | None:
        """The known results of `key` if a pass may use them instead of following the call:
        same input meta, not dynamic, and a counted backward where this step will have one."""
        known = self.calls.get(key)
        if known is None or known.meta != meta or key in self.dynamic:
            return None
        if backward and known.bwd_bytes is None:
            return None
        return known

    def mark_changed(self, keys: Sequence[str], parents: Sequence[int]) -> int:
        """A step's calls (in call order; `parents[i]`: the index of call i's caller, -1 for
        the root) seen outside a pass: every known call among them that made other calls than
        the pass saw becomes dynamic, so that the next pass follows it at once. The number
        marked."""
        children: list[list[str]] = [[] for _ in keys]
        for key, parent in zip(keys, parents, strict=True):
            if parent >= 0:
                children[parent].append(key)
        marked = 0
        for key, made in zip(keys, children, strict=True):
            known = self.calls.get(key)
            if known is not None and key not in self.dynamic and known.children != tuple(made):
                self.dynamic.add(key)
                marked += 1
        return marked

    def learn(self, key: str, known: KnownCall) -> None:
        self.calls[key] = known
        self.fresh.add(key)

    def learn_backward(self, key: str, meta: Meta, nbytes: int, ops: int) -> None:
        """The counted backward of a call a pass followed (`meta`: that pass's input meta;
        a later pass may have replaced the entry since)."""
        known = self.calls.get(key)
        if known is not None and known.meta == meta:
            self.calls[key] = dataclasses.replace(known, bwd_bytes=nbytes, bwd_ops=ops)
            self.fresh.add(key)
