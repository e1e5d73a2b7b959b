"""The module graph of a timed forward, derived from what the timed step records anyway.

The first sampled step of a capture that has no graph yet (the one step of a `with profile(...)`
block, the first sample of `watch(log_freq=1)`) gets its call tree and dataflow edges without a
structure pass, so one forward + backward gives the whole profile. The structure pass (Python
level, FLOPs) still runs on a later step and replaces this graph (same call-sequence signature).

Inside the view of call P, a tensor reaching a later child's arguments (or P's outputs) is
traced to its sources in two ways:

* identity at call boundaries: the same tensor object a child of P returned, or P received,
  unchanged since (same version counter). This covers tensors that carry no grad, such as
  token ids and masks, and children that return their input (`nn.Identity`).
* autograd otherwise: a tensor whose `grad_fn` was created by P's own code (a residual `+`, a
  view, an in-place op on a child's output) is followed through P's own autograd nodes to the
  child calls and the arguments of P it derives from. The session's node walk (done on every
  sampled step to hook the nodes) records each node's inputs here (`adjacency`), so this costs
  no second walk; edges are resolved once, when the root returns (outside every timed window).

Not seen here, by design (the later structure pass adds them): tensors without grad transformed
by P's own code (`mask = ids != 0`), leaves that require grad transformed by P's own code
(their AccumulateGrad node has no sequence number to match), and FLOPs: every call is marked
`flops_known=False`, never given a made-up count.

Nothing here keeps a tensor alive: identity maps hold weak references, the adjacency holds ints.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from wandb_modprof.capture.forward.invocation import Invocation, tensors_in
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.structure.slots import input_slots, output_slots
from wandb_modprof.records.calls import (
    CallInfo,
    DataEdge,
    Structure,
    call_signature,
    input_key,
    output_key,
)

# A tensor seen at a call boundary: (weak reference, version counter then, source node keys).
_Entry = tuple["weakref.ref[torch.Tensor]", int, frozenset[str]]
_MAX_VISITS = 1_000_000  # autograd nodes visited resolving edges, all views together


class StepDataflow:
    """Filled by the step session at each call's entry and exit; `finish` gives the graph."""

    def __init__(self, training: bool) -> None:
        self.training = training
        # autograd sequence number of a node -> those of the nodes it feeds its grad to
        self.adjacency: dict[int, list[int]] = {}
        self._inputs: list[tuple[str, ...]] = []  # per invocation: its argument slots
        self._outputs: dict[int, tuple[str, ...]] = {}  # per invocation: its output slots
        # per invocation: the grad_fn sequence number of each argument -> its input node keys
        self._input_seqs: list[dict[int, set[str]]] = []
        self._frames: list[dict[int, _Entry]] = []  # open calls: tensors seen in their view
        # (view invocation, view key, destination node key, grad_fn sequence number)
        self._pending: list[tuple[int, str, str, int]] = []
        self._edges: set[DataEdge] = set()

    # ---- called by the session, in the forward ---------------------------------------------
    def enter(
        self,
        idx: int,
        inv: Invocation,
        parent_key: str | None,
        module: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> None:
        assert idx == len(self._inputs), "dataflow out of step with the session's calls"
        key = inv.key
        slots = input_slots(module, args, kwargs)
        self._inputs.append(tuple(slot for slot, _ in slots))
        parent = self._frames[-1] if self._frames else None
        frame: dict[int, _Entry] = {}
        seqs: dict[int, set[str]] = {}
        for slot, tensors in slots:
            node = input_key(key, slot)
            for t in tensors:
                old = frame.get(id(t))
                sources = frozenset({node}) if old is None else old[2] | {node}
                frame[id(t)] = (weakref.ref(t), _version(t), sources)
                grad_fn = t.grad_fn
                if grad_fn is not None:
                    seqs.setdefault(tp.node_sequence_nr(grad_fn), set()).add(node)
                if parent is not None and parent_key is not None:
                    self._source(inv.parent, parent_key, parent, t, key)
        self._input_seqs.append(seqs)
        self._frames.append(frame)

    def exit(self, idx: int, inv: Invocation, result: Any) -> None:
        if not self._frames:
            return
        frame = self._frames.pop()
        slots = output_slots(result)
        self._outputs[idx] = tuple(slot for slot, _ in slots)
        for slot, tensors in slots:
            dst = output_key(inv.key, slot)
            for t in tensors:
                self._source(idx, inv.key, frame, t, dst)
        if self._frames:
            parent = self._frames[-1]
            produced = frozenset({inv.key})  # what leaves a call is that call's output
            for t in tensors_in(result):
                parent[id(t)] = (weakref.ref(t), _version(t), produced)

    def _source(
        self, view: int, view_key: str, frame: dict[int, _Entry], t: torch.Tensor, dst: str
    ) -> None:
        grad_fn = t.grad_fn
        seen: torch.Tensor = t
        entry = frame.get(id(t))
        if (entry is None or entry[0]() is not t) and grad_fn is None and t._base is not None:
            # A view without grad (`input_ids.view(-1, n)`): it comes from where its base came.
            seen = t._base
            entry = frame.get(id(seen))
        # The same object, unmodified since it crossed a boundary (an in-place op by the view's
        # own code bumps the version: then autograd knows everything it was computed from).
        if (
            entry is not None
            and entry[0]() is seen
            and (entry[1] == _version(t) or grad_fn is None)
        ):
            for src in entry[2]:
                self._edges.add(DataEdge(view_key, src, dst))
        elif grad_fn is not None:
            self._pending.append((view, view_key, dst, tp.node_sequence_nr(grad_fn)))

    # ---- when the root returned ------------------------------------------------------------
    def finish(self, invocations: Sequence[Invocation], owners: Sequence[int]) -> Structure:
        """The call tree and edges; `owners[seq - root.seq0]` is the innermost call that
        created autograd node `seq` (the session's attribution table)."""
        base = invocations[0].seq0
        budget = [_MAX_VISITS]
        for view, view_key, dst, seq in self._pending:
            for src in self._resolve(view, seq, invocations, owners, base, budget):
                self._edges.add(DataEdge(view_key, src, dst))
        calls = step_calls(
            invocations,
            [self._inputs[i] if i < len(self._inputs) else () for i in range(len(invocations))],
            [self._outputs.get(i, ()) for i in range(len(invocations))],
        )
        edges = tuple(sorted(self._edges, key=lambda e: (e.view_key, e.src_key, e.dst_key)))
        signature = call_signature(inv.key for inv in invocations)
        return Structure(signature, self.training, calls, edges)

    def _resolve(
        self,
        view: int,
        seq: int,
        invocations: Sequence[Invocation],
        owners: Sequence[int],
        base: int,
        budget: list[int],
    ) -> set[str]:
        """Source nodes (in `view`) of the tensor made by autograd node `seq`: walk the view's
        own nodes down to the child calls and the view's arguments they read."""
        inv = invocations[view]
        lo, hi = inv.seq0, inv.seq1
        found: set[str] = set()
        todo, seen = [seq], set()
        while todo and budget[0] > 0:
            s = todo.pop()
            if s in seen:
                continue
            seen.add(s)
            budget[0] -= 1
            if not lo <= s < hi:  # made before this call: one of its arguments, or nothing
                found |= self._input_seqs[view].get(s, set())
                continue
            owner = owners[s - base]
            if owner != view:
                child = _child_of(owner, view, invocations)
                if child >= 0:
                    found.add(invocations[child].key)
                continue
            todo.extend(self.adjacency.get(s, ()))  # the view's own op: look at what it read
        return found


def _version(t: torch.Tensor) -> int:
    """The version counter; inference tensors (`torch.inference_mode`) have none and are never
    written in place outside it, so one constant stands for all of them."""
    return -1 if t.is_inference() else t._version


def _child_of(idx: int, view: int, invocations: Sequence[Invocation]) -> int:
    """The direct child of `view` that call `idx` is inside (-1 if it is not inside `view`)."""
    while idx >= 0:
        parent = invocations[idx].parent
        if parent == view:
            return idx
        idx = parent
    return -1


def step_calls(
    invocations: Sequence[Invocation],
    inputs: Sequence[tuple[str, ...]] | None = None,
    outputs: Sequence[tuple[str, ...]] | None = None,
) -> tuple[CallInfo, ...]:
    """A timed step's calls as `CallInfo`s, with their argument and output slots where given
    (none: calls without slots, as `routed_graph` adds a step's new calls). No FLOPs: a timed
    step does not count them; the structure passes do (`kept_counts` fills them in)."""
    return tuple(
        CallInfo(
            key=inv.key,
            module_name=inv.name,
            module_type=inv.module_type,
            call_index=inv.call_index,
            parent_key=None if inv.parent < 0 else invocations[inv.parent].key,
            depth=inv.depth,
            order=i,
            inputs=inputs[i] if inputs is not None else (),
            outputs=outputs[i] if outputs is not None else (),
            fwd_flops=0,
            fwd_self_flops=0,
            flops_known=False,
        )
        for i, inv in enumerate(invocations)
    )
