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
import hashlib
import re
from collections.abc import Sequence
from typing import Any

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
    rows: int | None = None  # its first tensor input's rows then (`invocation.rows_of`)
    linear: bool = False  # every op of its own code was linear in those rows (`flops`)
    twin: str | None = None  # its class among identical list members (`twin_class`)


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
        # a list member's class (`twin_class`) -> the newest key of that class learnt
        self.twins: dict[str, str] = {}
        # a key no pass followed -> the learnt twin whose own results it takes (`covers`)
        self.alias: dict[str, str] = {}

    def own(self, key: str) -> KnownCall | None:
        """What is known of `key`'s own code: learnt, or its twin's (`covers`)."""
        known = self.calls.get(key)
        if known is None and key in self.alias:
            known = self.calls.get(self.alias[key])
        return known

    def covers(self, key: str, shapes: Sequence[Any], twin: str | None) -> bool:
        """A timed step's call needs no pass for its own counts: a pass counted it (or, for a
        call no pass met, an identical list member, `twin`) on inputs of the same shapes, or
        of shapes that differ only in their leading (row) dimensions where every op of its
        code was linear in the rows (its counts then scale: `view.graphs.merge`).
        `shapes`: the call's tensor arguments' (`invocation.input_shapes`)."""
        if key not in self.calls and twin is not None and twin in self.twins:
            self.alias[key] = self.twins[twin]
            self.fresh.add(key)  # (a graph holding it is filled again: `kept_counts.refresh`)
        known = self.own(key)
        return known is not None and shapes_fit(known.meta, shapes, known.linear)

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
        self.alias.pop(key, None)  # (its own results now)
        if known.twin is not None:
            self.twins[known.twin] = key

    def learn_backward(self, key: str, meta: Meta, nbytes: int, ops: int) -> None:
        """The counted backward of a call a pass followed (`meta`: that pass's input meta;
        a later pass may have replaced the entry since)."""
        known = self.calls.get(key)
        if known is not None and known.meta == meta:
            self.calls[key] = dataclasses.replace(known, bwd_bytes=nbytes, bwd_ops=ops)
            self.fresh.add(key)


# A dotted name component that is a list index (`experts.5`, `layers.0`): members of one
# `ModuleList` / `Sequential` share a class when they match in type and parameter shapes.
_INDEX = re.compile(r"(?<![^.#/])\d+(?=[.#]|$)")


def twin_class(key: str, module: torch.nn.Module) -> str | None:
    """The class of identical list members `key`'s call belongs to: its key with list
    indices wildcarded, its type and its parameters' shapes (an expert `experts.5` and an
    expert `experts.3` of the same width); None for a call of no list member."""
    pattern = _INDEX.sub("*", key.partition("#")[0])
    if "*" not in pattern:
        return None
    try:
        params = tuple(tuple(p.shape) for p in module.parameters())
    except RuntimeError:  # (an uninitialised lazy parameter)
        return None
    digest = hashlib.blake2b(repr(params).encode(), digest_size=8).hexdigest()
    return f"{pattern}#{key.partition('#')[2]}|{type(module).__qualname__}|{digest}"


def shapes_fit(meta: Meta, shapes: Sequence[Any], linear: bool) -> bool:
    """The top-level tensor arguments' `shapes` (`invocation.input_shapes`) are among those
    `meta` holds (a tensor passed twice is one slot of `meta`, and `meta` also holds tensors
    nested in tuples and lists), or, for a call whose ops are `linear` in the rows, each
    matches one of them in rank and last dimension: it differs only in its rows."""
    then = {shape for _, tensors in meta for shape, _ in tensors}
    now = {tuple(s[1] if len(s) == 2 and isinstance(s[0], str) else s) for s in shapes}
    if now <= then:
        return True
    tails = {(len(a), a[-1:]) for a in then}
    return linear and all((len(b), b[-1:]) in tails for b in now)
