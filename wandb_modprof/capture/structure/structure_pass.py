"""Structure capture: the dataflow graph inside every module invocation, and FLOPs per call.

Runs on its own step (never a timed one): the first eligible forward after `watch`/`profile`
starts, and again after a timed sample whose sequence of invocations was not seen before
(dynamic control flow). Two modes are pushed for that one forward:

* a `TorchFunctionMode` follows tensors through the Python-level torch calls of each
  invocation's own code (a residual `+`, `cat`, `chunk`, views, in-place ops). Each open
  invocation ("frame") maps the tensors it has seen to the sources they derive from: its own
  inputs and the child calls that produced them. Working at the Python level (not by walking
  the autograd graph) makes it work under `no_grad`/eval and for integer tensors such as token
  ids, and keeps the tensor objects users see.
* a `TorchDispatchMode` counts FLOPs of every ATen op with `torch.utils.flop_counter`'s
  formulas and charges them to the innermost open call.

Neither mode holds a tensor beyond the forward: frames map tensors through weak references and
are dropped when their call returns.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from wandb_modprof.capture.forward.call_keys import CallKeys
from wandb_modprof.capture.forward.callstack import call_depth
from wandb_modprof.capture.forward.invocation import tensors_in
from wandb_modprof.capture.model.wrappers import inner_model
from wandb_modprof.capture.step import autograd_private as ap
from wandb_modprof.capture.structure.flops import FlopCount
from wandb_modprof.capture.structure.slots import input_slots, output_slots
from wandb_modprof.records.calls import (
    CallInfo,
    DataEdge,
    Structure,
    call_signature,
    input_key,
    output_key,
)


def prepare() -> None:
    """Import torch._dynamo before the first pass, outside any forward.

    The dataflow mode makes some torch functions import it lazily; imported inside the user's
    forward, that import leaves a reference cycle holding the forward's frames (and tensors)
    until the next garbage collection. With it imported, compiled code also runs eagerly during
    the pass instead of being recompiled (`push_modes`). About 1 s, once per process.
    """
    import torch._dynamo  # noqa: F401


def structure_pass_active() -> bool:
    """A structure pass (of any capture) is following tensors on this thread right now."""
    from torch.overrides import _get_current_function_mode_stack

    return any(
        isinstance(m, _Dataflow) and not m.pass_.failed for m in _get_current_function_mode_stack()
    )


# ---- the pass ------------------------------------------------------------------------------
class _Frame:
    """One open invocation: where its tensors came from, and the edges found in its view."""

    __slots__ = ("index", "key", "sources")

    def __init__(self, index: int, key: str) -> None:
        self.index = index
        self.key = key
        # tensor -> the node keys (of this view) it derives from
        self.sources: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def sources_of(self, tensors: Iterable[torch.Tensor]) -> set[str]:
        """Sources of the tensors, and of the bases of views (a write through another view
        of the same base reaches them too)."""
        found: set[str] = set()
        for t in tensors:
            s = self.sources.get(t)
            if s:
                found |= s
            base = t._base
            if base is not None:
                s = self.sources.get(base)
                if s:
                    found |= s
        return found

    def add(self, t: torch.Tensor, found: set[str], replace: bool = False) -> None:
        old = None if replace else self.sources.get(t)
        self.sources[t] = found | old if old else set(found)


class _Builder:
    __slots__ = (
        "bwd_flops", "bytes", "call_index", "depth", "flops", "inputs", "key", "module_id",
        "module_name", "module_type", "ops", "outputs", "parent", "seq",
    )  # fmt: skip

    def __init__(
        self,
        module_id: int,
        name: str,
        module_type: str,
        key: str,
        call_index: int,
        parent: int,
        depth: int,
    ) -> None:
        self.module_id = module_id
        self.module_name = name
        self.module_type = module_type
        self.call_index = call_index
        self.key = key  # the timed session's key for the same call (`capture.call_keys`)
        self.parent = parent
        self.depth = depth
        self.inputs: tuple[str, ...] = ()
        self.outputs: tuple[str, ...] = ()
        self.flops = 0  # of ops in the call's own code (children's are theirs)
        self.bwd_flops = 0
        self.bytes = 0
        self.ops = 0
        # autograd sequence numbers of the nodes created in the call: [start, end)
        self.seq = (-1, -1)


# Python-level in-place operators: they return their first argument (or None for
# `__setitem__`), which now carries what was written into it.
_INPLACE_DUNDERS = frozenset(
    {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
     "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
     "__imatmul__"}
)  # fmt: skip
_STALE_CHECK_EVERY = 128  # ops between checks that the pass's forward is still running


class _Dataflow(TorchFunctionMode):
    def __init__(self, pass_: StructurePass) -> None:
        super().__init__()
        self.pass_ = pass_

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)  # the user's op runs exactly as without us
        if not self.pass_.failed:
            try:
                self.pass_.follow(func, args, kwargs, out)
            except Exception as error:  # never let the pass break the forward
                self.pass_.fail(error)
        return out


class StructurePass:
    """One forward seen by the structure capture; `finish()` returns the `Structure`."""

    def __init__(
        self, root: torch.nn.Module, training: bool, fake_type: type | None = None
    ) -> None:
        self.root = root
        self.training = training
        # Compiled code runs eagerly during the pass: dynamo guards on the mode stack, so
        # running it under our modes would recompile it (and again after the pass).
        self._stance: Any = None
        self._calls: list[_Builder] = []
        self._keys = CallKeys()
        self._stack: list[_Frame] = []
        self._thread = threading.get_ident()  # calls on other threads are not followed
        self._edges: set[DataEdge] = set()
        self._dataflow = _Dataflow(self)
        self._flops = FlopCount(self, fake_type)
        # A pass over fake tensors runs to its end inside one call of ours (`fake_structure`):
        # it cannot be left behind by an interrupted forward.
        self._check_stale = fake_type is None
        self._modes_on = False
        self._ops = 0
        self.failed = False
        self.error: Exception | None = None  # what made the pass fail, for the warning
        self.forward_done = False
        # An exception being handled when the pass starts is not one raised by the forward.
        self.exception_at_start = sys.exc_info()[1]

    # ---- modes -------------------------------------------------------------------------
    def push_modes(self) -> None:
        # torch._dynamo is imported when the capture starts (see `prepare`), so every
        # torch.compile'd function or module in the forward runs eagerly, not recompiled.
        if "torch._dynamo" in sys.modules:
            self._stance = torch.compiler.set_stance("force_eager")
        self._dataflow.__enter__()
        try:
            self._flops.__enter__()
        except BaseException:
            self._dataflow.__exit__(None, None, None)
            raise
        self._modes_on = True

    def pop_modes(self) -> bool:
        """Pop our modes if they are the innermost ones; True once they are gone."""
        if not self._modes_on:
            return True
        from torch.overrides import _get_current_function_mode_stack
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        fstack = _get_current_function_mode_stack()
        dstack = _get_current_dispatch_mode_stack()
        if not fstack or fstack[-1] is not self._dataflow:
            return False
        if not dstack or dstack[-1] is not self._flops:
            return False
        self._flops.__exit__(None, None, None)
        self._dataflow.__exit__(None, None, None)
        self._modes_on = False
        self._restore_stance()
        return True

    def _restore_stance(self) -> None:
        if self._stance is not None:
            self._stance.__exit__(None, None, None)  # back to the stance from before the pass
            self._stance = None

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
            self._restore_stance()
            return
        frame = self.frame()
        if frame is None:
            return
        written = kwargs.get("out")
        inputs: tuple[Any, ...]
        if written is not None:
            inputs = (args, {k: v for k, v in kwargs.items() if k != "out"})
        else:
            inputs = (args, kwargs)
        found = frame.sources_of(tensors_in(inputs))
        if not found:
            return
        name = getattr(func, "__name__", "")
        if written is not None:  # `out=`: the old contents are gone
            targets, replace = list(tensors_in(written)), True
        elif name in _INPLACE_DUNDERS or (name.endswith("_") and not name.startswith("_")):
            first = args[0] if args else None
            targets, replace = ([first] if isinstance(first, torch.Tensor) else []), False
        else:
            targets, replace = [], False
        for t in targets:  # written in place: so is the base of a view
            frame.add(t, found, replace)
            if t._base is not None:
                frame.add(t._base, found)
        for t in tensors_in(out):
            frame.add(t, found)

    # ---- called by the capture's hooks -------------------------------------------------
    def frame(self) -> _Frame | None:
        return self._stack[-1] if self._stack and not self.failed else None

    def add_work(self, flops: int, bwd_flops: int, nbytes: int) -> None:
        """One op of the innermost open call (`flops.FlopCount`)."""
        if self._stack and not self.failed:
            call = self._calls[self._stack[-1].index]
            call.flops += flops
            call.bwd_flops += bwd_flops
            call.bytes += nbytes
            call.ops += 1

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
        call = _Builder(
            id(module),
            name,
            module_type,
            key,
            call_index,
            -1 if parent is None else parent.index,
            len(self._stack),
        )
        self._calls.append(call)
        call.seq = (ap.sequence_nr(), -1)
        # DDP's forward(*inputs) hands its arguments on unchanged: name them after the user's
        # (`is None`, not `or`: a torch.compile wrapper's truth value calls len() on the model)
        inner = inner_model(module)
        slots = input_slots(module if inner is None else inner, args, kwargs)
        call.inputs = tuple(slot for slot, _ in slots)
        frame = _Frame(len(self._calls) - 1, call.key)
        for slot, tensors in slots:
            if parent is not None:
                for src in sorted(parent.sources_of(tensors)):
                    self._edges.add(DataEdge(parent.key, src, call.key))
            node = input_key(call.key, slot)
            for t in tensors:
                old = frame.sources.get(t)
                frame.sources[t] = {node} | old if old else {node}
        self._stack.append(frame)

    def exit(self, module: torch.nn.Module, result: Any) -> None:
        if self.failed or not self._stack or threading.get_ident() != self._thread:
            return
        frame = self._stack.pop()
        call = self._calls[frame.index]
        if call.module_id != id(module):
            self.failed = True
            return
        call.seq = (call.seq[0], ap.sequence_nr())
        slots = output_slots(result)
        call.outputs = tuple(slot for slot, _ in slots)
        for slot, tensors in slots:
            for src in sorted(frame.sources_of(tensors)):
                self._edges.add(DataEdge(call.key, src, output_key(call.key, slot)))
        if self._stack:
            parent = self._stack[-1]
            produced = {call.key}
            for t in tensors_in(result):
                parent.sources[t] = produced  # what leaves a call is that call's output
        else:
            self.forward_done = True

    def call_ranges(self) -> tuple[list[tuple[int, int]], list[int]]:
        """Per call, in call order (the finished structure's): the autograd sequence numbers
        of the nodes created in it, `[start, end)`, and its parent's index (-1: the root)."""
        return [c.seq for c in self._calls], [c.parent for c in self._calls]

    def finish(self) -> Structure:
        assert self.forward_done and not self.failed
        parents = [c.parent for c in self._calls]
        inclusive, bwd, nbytes, ops = (
            rolled_up([getattr(c, name) for c in self._calls], parents)
            for name in ("flops", "bwd_flops", "bytes", "ops")
        )
        calls = tuple(
            CallInfo(
                key=c.key,
                module_name=c.module_name,
                module_type=c.module_type,
                call_index=c.call_index,
                parent_key=None if c.parent < 0 else self._calls[c.parent].key,
                depth=c.depth,
                order=i,
                inputs=c.inputs,
                outputs=c.outputs,
                fwd_flops=inclusive[i],
                fwd_self_flops=c.flops,
                flops_known=True,  # (every op of every call of the pass was counted)
                bwd_flops=bwd[i],
                bwd_self_flops=c.bwd_flops,
                fwd_bytes=nbytes[i],
                fwd_self_bytes=c.bytes,
                fwd_ops=ops[i],
                fwd_self_ops=c.ops,
                work_known=True,
            )
            for i, c in enumerate(self._calls)
        )
        edges = tuple(sorted(self._edges, key=lambda e: (e.view_key, e.src_key, e.dst_key)))
        signature = call_signature(c.key for c in self._calls)
        return Structure(signature, self.training, calls, edges)


def rolled_up(own: Sequence[int], parents: Sequence[int]) -> list[int]:
    """Inclusive counts from each call's own (`parents[i]`: the index of call i's parent, -1
    for the root; children come after their parent, as calls are entered)."""
    inclusive = list(own)
    for i in range(len(parents) - 1, 0, -1):
        inclusive[parents[i]] += inclusive[i]
    return inclusive
