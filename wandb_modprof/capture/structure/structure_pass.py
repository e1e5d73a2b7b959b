"""Structure capture: the dataflow graph inside every module invocation, and FLOPs per call.

Runs on its own step (never a timed one): the first eligible forward after `watch`/`profile`
starts, and again after a timed sample whose sequence of invocations was not seen before
(dynamic control flow). Two modes are pushed for that one forward:

* a `TorchFunctionMode` (`pass_frames.Dataflow`) follows tensors through the Python-level
  torch calls of each invocation's own code (a residual `+`, `cat`, `chunk`, views, in-place
  ops). Each open invocation ("frame") maps the tensors it has seen to the sources they derive
  from: its own inputs and the child calls that produced them. Working at the Python level
  (not by walking the autograd graph) makes it work under `no_grad`/eval and for integer
  tensors such as token ids, and keeps the tensor objects users see.
* a `TorchDispatchMode` (`flops.FlopCount`) counts FLOPs of every ATen op with
  `torch.utils.flop_counter`'s formulas and charges them to the innermost open call.

Neither mode holds a tensor beyond the forward: frames map tensors through weak references and
are dropped when their call returns. `pass_modes` turns the two on and off.

A pass after the first follows only what is new (`known_calls`): a call an earlier pass
followed, met again with the same input shapes, runs with both modes off and takes its own
results from that pass; the calls it makes are decided one by one. `budget` bounds the calls
one pass follows, so a large model's first graph is drawn over a few passes.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch

from wandb_modprof.capture.forward.call_keys import CallKeys
from wandb_modprof.capture.forward.callstack import call_depth
from wandb_modprof.capture.forward.invocation import input_shapes, rows_of, tensors_in
from wandb_modprof.capture.model.wrappers import inner_model
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.structure.known_calls import (
    KnownCall,
    KnownCalls,
    call_meta,
    twin_class,
)
from wandb_modprof.capture.structure.pass_frames import (
    CallBuilder,
    Frame,
    call_infos,
    own_results,
)
from wandb_modprof.capture.structure.pass_modes import PassModes
from wandb_modprof.capture.structure.slots import input_slots, output_slots
from wandb_modprof.records.calls import (
    DataEdge,
    Structure,
    call_signature,
    input_key,
    output_key,
)

_STALE_CHECK_EVERY = 128  # ops between checks that the pass's forward is still running


class StructurePass:
    """One forward seen by the structure capture; `finish()` returns the `Structure`."""

    def __init__(
        self,
        root: torch.nn.Module,
        training: bool,
        fake_type: type | None = None,
        known: KnownCalls | None = None,
        budget: int | None = None,
    ) -> None:
        self.root = root
        self.training = training
        # Calls earlier passes followed (`known_calls`): a call found there runs with the
        # modes off. `budget`: unknown calls this pass follows at most; beyond it, they
        # are left to the next pass (`partial`).
        self._known = known
        self._budget = budget
        self._backward = torch.is_grad_enabled()  # a backward may come, and be counted
        self.followed = 0
        self.new_calls = 0  # of those, calls no earlier pass followed (`budget` counts these)
        self.partial = False  # some call was neither followed nor known
        self.changed: list[str] = []  # known calls that made other calls than before
        self._calls: list[CallBuilder] = []
        self._keys = CallKeys()
        self._stack: list[Frame] = []
        self._thread = threading.get_ident()  # calls on other threads are not followed
        self._edges: set[DataEdge] = set()
        self._modes = PassModes(self, fake_type)
        # A pass over fake tensors runs to its end inside one call of ours (`fake_structure`):
        # it cannot be left behind by an interrupted forward.
        self._check_stale = fake_type is None
        self._ops = 0
        self.failed = False
        self.error: Exception | None = None  # what made the pass fail, for the warning
        self.forward_done = False
        # An exception being handled when the pass starts is not one raised by the forward.
        self.exception_at_start = sys.exc_info()[1]

    # ---- modes (`pass_modes`) ---------------------------------------------------------
    def push_modes(self) -> None:
        self._modes.push()

    def pop_modes(self) -> bool:
        """Pop our modes if they are the innermost ones; True once they are gone."""
        return self._modes.pop()

    def fail(self, error: Exception) -> None:
        """Stop following tensors (the modes turn into pass-throughs); the capture warns."""
        if not self.failed:
            self.failed = True
            self.error = error

    # ---- called by the modes -----------------------------------------------------------
    def follow(
        self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], out: Any
    ) -> None:
        """Record where the tensors an op produced or wrote into came from."""
        self._ops += 1
        if self._check_stale and self._ops % _STALE_CHECK_EVERY == 0 and not call_depth(self.root):
            # The forward ended without our root exit hook (KeyboardInterrupt): stop now
            # rather than at the next forward, and give compiled code its stance back.
            self.fail(RuntimeError("the forward was interrupted during the structure pass"))
            self._modes.restore_stance()
            return
        frame = self.frame()
        if frame is None:
            return
        frame.follow_op(func, args, kwargs, out)

    # ---- called by the capture's hooks -------------------------------------------------
    def frame(self) -> Frame | None:
        return self._stack[-1] if self._stack and not self.failed else None

    def add_work(self, flops: int, bwd_flops: int, nbytes: int, linear: bool = False) -> None:
        """One op of the innermost open call (`flops.FlopCount`); `linear`: its work is
        linear in its inputs' rows (a matrix product, an elementwise op)."""
        if self._stack and not self.failed and self._stack[-1].followed:
            call = self._calls[self._stack[-1].index]
            call.flops += flops
            call.bwd_flops += bwd_flops
            call.bytes += nbytes
            call.ops += 1
            call.linear = call.linear and linear

    def enter(
        self,
        module: torch.nn.Module,
        name: str,
        module_type: str,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> None:
        if self.failed or threading.get_ident() != self._thread:
            return
        parent = self._stack[-1] if self._stack else None
        key, call_index = self._keys.enter(name, -1 if parent is None else parent.index)
        if parent is not None and not parent.followed:
            parent.children.append(key)
        call = CallBuilder(
            id(module),
            name,
            module_type,
            key,
            call_index,
            -1 if parent is None else parent.index,
            len(self._stack),
        )
        self._calls.append(call)
        call.seq = (tp.sequence_nr(), -1)
        if (parent is None or not parent.followed) and self._beyond_budget(key):
            # left to a later pass, inside a call not followed either: nothing to record
            call.followed, self.partial = False, True
            self._stack.append(Frame(len(self._calls) - 1, key, followed=False))
            return
        # DDP's forward(*inputs) hands its arguments on unchanged: name them after the user's
        # (`is None`, not `or`: a torch.compile wrapper's truth value calls len() on the model)
        inner = inner_model(module)
        slots = input_slots(module if inner is None else inner, args, kwargs)
        call.inputs = tuple(slot for slot, _ in slots)
        call.rows = rows_of(input_shapes(args, kwargs))
        followed = self._decide(call, slots)
        if followed:
            call.twin = twin_class(call.key, module)
        frame = Frame(len(self._calls) - 1, call.key, followed)
        for slot, tensors in slots:
            if parent is not None and parent.followed:
                for src in sorted(parent.sources_of(tensors)):
                    self._edges.add(DataEdge(parent.key, src, call.key))
            if not followed:
                continue
            node = input_key(call.key, slot)
            for t in tensors:
                old = frame.sources.get(t)
                frame.sources[t] = {node} | old if old else {node}
        self._stack.append(frame)

    def _beyond_budget(self, key: str) -> bool:
        """An unknown call met once this pass followed its budget of unknown calls."""
        return (
            self._known is not None
            and self._budget is not None
            and self.new_calls >= self._budget
            and key not in self._known.calls
            and self._modes.switch(False)
        )

    def _decide(self, call: CallBuilder, slots: list[tuple[str, list[torch.Tensor]]]) -> bool:
        """Follow this call, or take its own results from an earlier pass (`known_calls`)
        and run it with the modes off; an unknown call beyond the budget is left to the
        next pass (`partial`)."""
        new = False
        if self._known is not None:
            call.meta = call_meta(slots)
            known = self._known.usable(call.key, call.meta, self._backward)
            new = call.key not in self._known.calls
            # (the budget is for calls no pass followed yet: a known call whose input
            # changed is followed whatever the count, so that a pass after a routing
            # change gives the new sequence's graph at once)
            beyond = new and self._budget is not None and self.new_calls >= self._budget
            if (known is not None or beyond) and self._modes.switch(False):
                call.followed = False
                call.known = known
                self.partial = self.partial or known is None
                return False
        if not self._modes.switch(True):  # (cannot fail: pushing is always possible)
            raise RuntimeError("the structure pass could not turn its modes back on")
        self.followed += 1
        self.new_calls += new
        return True

    def exit(self, module: torch.nn.Module, result: Any) -> None:
        if self.failed or not self._stack or threading.get_ident() != self._thread:
            return
        frame = self._stack.pop()
        call = self._calls[frame.index]
        if call.module_id != id(module):
            self.failed = True
            return
        call.seq = (call.seq[0], tp.sequence_nr())
        parent = self._stack[-1] if self._stack else None
        if not frame.followed and call.known is None and (parent is None or not parent.followed):
            # left to a later pass (`enter`), inside a call not followed: the modes stay off
            self.forward_done = parent is None
            return
        slots = output_slots(result)
        call.outputs = tuple(slot for slot, _ in slots)
        if frame.followed:
            for slot, tensors in slots:
                for src in sorted(frame.sources_of(tensors)):
                    self._edges.add(DataEdge(call.key, src, output_key(call.key, slot)))
        elif call.known is not None and tuple(frame.children) != call.known.children:
            self.changed.append(call.key)  # its own results are not these: the next pass
        if self._stack:
            parent = self._stack[-1]
            self._modes.switch(parent.followed)
            if parent.followed:
                produced = {call.key}
                for t in tensors_in(result):
                    parent.sources[t] = produced  # what leaves a call is that call's output
        else:
            self.forward_done = True

    def call_ranges(self) -> tuple[list[tuple[int, int]], list[int]]:
        """Per call, in call order (the finished structure's): the autograd sequence numbers
        of the nodes created in it, `[start, end)`, and its parent's index (-1: the root)."""
        return [c.seq for c in self._calls], [c.parent for c in self._calls]

    def followed_calls(self) -> list[bool]:
        """Per call, in call order: followed by this pass (else its results are known)."""
        return [c.followed for c in self._calls]

    def with_known_backward(self, nbytes: list[int], ops: list[int]) -> bool:
        """A counted backward's own bytes and ops per call: the followed calls' are learnt,
        the others' filled in from the pass that followed them; False if one had none."""
        complete = True
        for i, c in enumerate(self._calls):
            if c.followed:
                if self._known is not None:
                    self._known.learn_backward(c.key, c.meta, nbytes[i], ops[i])
            elif c.known is not None and c.known.bwd_bytes is not None:
                nbytes[i], ops[i] = c.known.bwd_bytes, c.known.bwd_ops or 0
            else:
                complete = False
        return complete

    def complete(self) -> bool:
        """Every call was followed or known, and every known call made the calls it made
        before: `finish` gives the structure of this forward."""
        return self.forward_done and not self.failed and not self.partial and not self.changed

    def learnt(self) -> list[tuple[str, KnownCall]]:
        """The own results of every call this pass followed, for the passes after it."""
        return own_results(self._calls, self._edges)

    def finish(self) -> Structure:
        assert self.forward_done and not self.failed and not self.partial
        for c in self._calls:
            known = c.known
            if not c.followed and known is not None:  # (`complete`: every such call is known)
                c.flops, c.bwd_flops, c.bytes, c.ops, c.linear = (
                    known.flops, known.bwd_flops, known.nbytes, known.ops, known.linear
                )  # fmt: skip
                self._edges.update(known.edges)
        calls = call_infos(self._calls)
        edges = tuple(sorted(self._edges, key=lambda e: (e.view_key, e.src_key, e.dst_key)))
        signature = call_signature(c.key for c in self._calls)
        return Structure(signature, self.training, calls, edges)
