"""One sampled step: forward invocation stack, backward node timing, checkpoint recomputes.

How backward time is attributed to a module invocation (see MEASUREMENT.md):

1. The forward pre/post hooks read the autograd sequence counter. The autograd nodes this
   invocation created have sequence numbers in `[seq0, seq1)`; nesting of module calls makes
   these ranges nest, so every node belongs to exactly one innermost invocation.
2. As each call returns, the graph is walked from its outputs (every call's, not only the
   root's: aux losses stay reachable) and a pre-hook and a hook are registered on each node not
   hooked yet; when the root returns, each node is charged to the innermost call whose range
   holds it. Walking as calls return means no graph is held: a forward that discards graphs
   (truncated BPTT) frees them as it would unprofiled. Node hooks, unlike
   `register_full_backward_hook`, leave tensors untouched, so in-place ops after a module,
   dict/ModelOutput outputs and inputs that need no grad all work.
3. Each node's execution is stamped; a node's *exclusive* time excludes nodes that ran nested
   inside it (reentrant checkpointing runs a whole backward inside one node). An invocation's
   backward time is the sum of the exclusive times of the nodes in its range and its children's.
4. The end of the backward is the engine's end-of-graph-task callback (what DDP uses), queued
   by the first node that runs: no need to know in advance which nodes will execute.

Nothing here holds a tensor: graph nodes are held only during a walk, node hooks capture the
session (ints and stamps), never a tensor.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from wandb_modprof.capture import autograd_private as ap
from wandb_modprof.capture import gc_pause
from wandb_modprof.capture.activations import ActivationCounter
from wandb_modprof.capture.call_keys import CallKeys
from wandb_modprof.capture.clock import Clock
from wandb_modprof.capture.device_memory import DeviceMemory
from wandb_modprof.capture.gc_watch import GcWatch
from wandb_modprof.capture.invocation import Invocation, Recompute, grad_fns
from wandb_modprof.capture.nodes import NodeTable
from wandb_modprof.capture.nvtx import NvtxRanges
from wandb_modprof.capture.recompute import RecomputeTracker
from wandb_modprof.capture.static_memory import PendingGradientState
from wandb_modprof.capture.step_dataflow import StepDataflow
from wandb_modprof.capture.storage import StorageKey
from wandb_modprof.records.calls import Structure

_PRE: Any = object()  # `_NodeHook`'s marker: called as a pre-hook


class StepSession:
    """Everything captured for one sampled step, in plain lists indexed by invocation / node."""

    def __init__(
        self,
        step: int,
        clock: Clock,
        memory: DeviceMemory | None,
        excluded_storages: set[StorageKey] | None,
        on_error: Callable[[str, Exception], None],
        on_finish: Callable[[StepSession], None],
        nvtx: NvtxRanges | None = None,
        dataflow: StepDataflow | None = None,
    ) -> None:
        self.step = step
        self.clock = clock
        self.memory = memory
        self._on_error = on_error
        self._on_finish = on_finish
        self.invocations: list[Invocation] = []
        self._stack: list[int] = []
        self._keys = CallKeys()
        self._by_module: dict[int, list[int]] = {}
        self.ref_stamp: Any = None
        self.forward_thread = threading.get_native_id()
        self.nvtx = nvtx
        self.exception_at_start = sys.exc_info()[1]
        self.forward_done = False
        self.superseded = False  # a newer root forward started before this one's backward
        # Another model's structure pass ran inside this forward: its times are not this
        # model's normal cost, so the sample is dropped when it finishes.
        self.disturbed = False
        self.closed = False
        self.failed = False
        # activations (None when someone else's saved-tensor hooks are active)
        self.activations: ActivationCounter | None = None
        if excluded_storages is not None:
            self.activations = ActivationCounter(
                excluded_storages,
                self.current,
                lambda e: self.fail("saved-tensor hook", e),
                clock,
                curve=memory is None,  # on CPU the saved bytes give the memory curve
            )
        # backward, indexed by node slot
        self._hooked_seqs: set[int] = set()
        self.nodes = NodeTable()
        self._exec: dict[int, list[int]] = {}
        self._persistent_handles: list[Any] = []
        # Parameters whose AccumulateGrad node is hooked; those slots cannot start a backward:
        # a later step's graph reuses a live AccumulateGrad node, hooks included.
        self._accumulate_params: set[int] = set()
        self.bwd_started = False
        self.bwd_t_begin: Any = None
        self.bwd_t_end: Any = None
        self._recompute = RecomputeTracker()  # activation-checkpointing recomputes
        self.gradients: PendingGradientState | None = None
        self.gc = GcWatch(self._open_calls, lambda e: self.fail("garbage-collection callback", e))
        # The module graph derived from this forward (`step_dataflow`), when asked for: set
        # when the root returns, or the error that prevented it.
        self.dataflow = dataflow
        self.structure: Structure | None = None
        self.structure_error: Exception | None = None

    # ---- forward -----------------------------------------------------------------------
    def current(self) -> int:
        return self._stack[-1] if self._stack and not self.failed else -1

    def enter(
        self,
        module_id: int,
        name: str,
        module_type: str,
        module: Any = None,
        args: tuple[Any, ...] = (),
        kwargs: Any = None,
    ) -> None:
        if self.failed:
            return
        parent = self._stack[-1] if self._stack else -1
        key, call_index = self._keys.enter(name, parent)
        inv = Invocation(module_id, name, module_type, key, call_index, parent, len(self._stack))
        idx = len(self.invocations)
        self.invocations.append(inv)
        self._by_module.setdefault(module_id, []).append(idx)
        if self.dataflow is not None and module is not None:
            # Before the stamps: the bookkeeping lands in the parent's self time, not here.
            parent_key = self.invocations[parent].key if parent >= 0 else None
            self._dataflow_step(
                self.dataflow.enter, idx, inv, parent_key, module, args, kwargs or {}
            )
        if self.memory is not None:
            self._fold_forward_peak()
            inv.mem_alloc0 = self.memory.allocated()
        if parent == -1:
            self._start_activations()
            self.gc.start()
            gc_pause.hold(id(self))  # no collection inside the timed forward (`gc_pause`)
        self._stack.append(idx)
        if self.nvtx is not None:
            self.nvtx.forward_enter(name)
        inv.seq0 = ap.sequence_nr()
        inv.t0 = self.clock.stamp()
        inv.own0 = self.clock.own_at(inv.t0)
        if parent == -1:
            self.ref_stamp = inv.t0

    def exit(self, module_id: int, result: Any) -> None:
        """Close the innermost invocation; returns when the root closes the forward."""
        if not self._stack:
            return
        if self.failed:
            # Calls entered after the failure were never pushed; only the root's exit matters
            # now, to pop the saved-tensor hooks and end the forward.
            if module_id == self.invocations[0].module_id and len(self._stack) >= 1:
                self._stack.clear()
                self._end_forward()
            return
        t1 = self.clock.stamp()
        own1 = self.clock.own_at(t1)
        if self.nvtx is not None:
            self.nvtx.forward_exit()
        if self.memory is not None:
            self._fold_forward_peak()  # into this invocation, still on top of the stack
        idx = self._stack.pop()
        inv = self.invocations[idx]
        inv.t1 = t1
        inv.own1 = own1
        inv.seq1 = ap.sequence_nr()
        if inv.module_id != module_id:
            self.fail(inv.name, RuntimeError("forward hooks fired out of order"))
        if self.memory is not None and not self.failed:
            inv.mem_alloc1 = self.memory.allocated()
            parent = self._stack[-1] if self._stack else -1
            if parent >= 0 and inv.mem_peak is not None:
                p = self.invocations[parent]
                p.mem_peak = inv.mem_peak if p.mem_peak is None else max(p.mem_peak, inv.mem_peak)
        if not self.failed:
            # Hook this call's nodes now rather than holding its outputs' graph until the root
            # returns: a forward that discards graphs (truncated BPTT) must not keep them alive.
            self._hook_nodes(grad_fns(result), self.invocations[0].seq0, ap.sequence_nr(), None)
            if self.dataflow is not None:
                self._dataflow_step(self.dataflow.exit, idx, inv, result)
        if not self._stack:
            self._end_forward()

    def end_forward_after_error(self) -> None:
        """The forward ended without our root exit (our own error, or a KeyboardInterrupt that
        `Module._call_impl` does not catch): drop the sample, pop our saved-tensor hooks."""
        self._stack.clear()
        self.failed = True
        self.forward_done = True
        if self.nvtx is not None:
            self.nvtx.forward_abort()
        self.pop_saved_tensors_hooks()
        self.abandon()

    @property
    def saved_hooks_pushed(self) -> bool:
        """Our saved-tensor hooks are still pushed (someone else's were on top at the end)."""
        return self.activations is not None and self.activations.pushed

    def pop_saved_tensors_hooks(self) -> bool:
        """Pop our saved-tensor hooks if they are innermost (`ActivationCounter`); True once
        they are gone."""
        return self.activations is None or self.activations.pop_if_innermost()

    def _fold_forward_peak(self) -> None:
        """Charge the allocator peak since the last boundary to the running invocation."""
        assert self.memory is not None
        peak = self.memory.peak()
        self.memory.reset_peak()
        if self._stack:
            inv = self.invocations[self._stack[-1]]
            inv.mem_peak = peak if inv.mem_peak is None else max(inv.mem_peak, peak)

    def _start_activations(self) -> None:
        if self.activations is not None:
            self.activations.push()

    def _end_forward(self) -> None:
        gc_pause.release(id(self))  # the forward's window closed: held again in the backward
        if self.nvtx is not None:
            self.nvtx.forward_abort()  # ranges a failed forward left open
        # Pop our saved-tensor hooks first, whatever happened: the hook stack must stay balanced.
        if self.activations is not None:
            self.activations.pop()
        self.forward_done = True
        if self.activations is not None:
            self.activations.close()
        raised = sys.exc_info()[1]
        if raised is not None and raised is not self.exception_at_start:
            # The user's forward raised: drop the sample quietly, the exception is theirs.
            # (An exception the caller was already handling, as in a retry, does not count.)
            self.failed = True
        if self.failed or not self.invocations:
            self.abandon()
            return
        # Every range is final now: charge each hooked node to the innermost call containing it.
        root = self.invocations[0]
        owners = [-1] * (root.seq1 - root.seq0)
        for idx, inv in enumerate(self.invocations):  # preorder: children overwrite parents
            if inv.seq1 > inv.seq0:
                owners[inv.seq0 - root.seq0 : inv.seq1 - root.seq0] = [idx] * (inv.seq1 - inv.seq0)
        for slot, via in enumerate(self.nodes.via):
            if via >= 0:  # AccumulateGrad: charged to the call whose node feeds it
                self.nodes.owner[slot] = self.nodes.owner[via]
            else:
                self.nodes.owner[slot] = owners[self.nodes.seq[slot] - root.seq0]
        if self.dataflow is not None:
            self._dataflow_step(self._derive_structure, owners)
        if not self.nodes.seq:
            # Nothing in the step can run a backward (all frozen, or no grad): done now.
            self.finish()

    def _derive_structure(self, owners: list[int]) -> None:
        assert self.dataflow is not None
        self.structure = self.dataflow.finish(self.invocations, owners)
        self.dataflow = None

    def _dataflow_step(self, fn: Callable[..., None], *args: Any) -> None:
        """Derive the graph without risking the sample: a failure only loses the graph (the
        capture warns once; a later structure pass draws it)."""
        try:
            fn(*args)
        except Exception as error:
            self.dataflow = None
            self.structure = None
            self.structure_error = error

    def _hook_nodes(self, roots: Iterable[Any], lo: int, hi: int, owners: list[int] | None) -> int:
        """Hook the not-yet-hooked nodes created in `[lo, hi)` reachable from `roots`, and the
        AccumulateGrad nodes they feed.

        Walks stop at hooked nodes (everything below one was hooked with it), so over a step
        every node is visited once. With `owners=None` (forward) owners are filled in when
        the root returns; recompute walks know them at once.

        Accumulating into `.grad` is real backward work of the module whose parameter it is,
        so an AccumulateGrad node is charged to the owner of the first node found using it
        (tied weights: one of the tying modules). Its hooks are removed at the end of the
        backward, since AccumulateGrad nodes can outlive the step's graph.
        """
        todo: list[tuple[Any, int]] = [(node, -1) for node in roots]
        hooked = 0
        while todo:
            node, via = todo.pop()
            seq = ap.node_sequence_nr(node)
            in_range = lo <= seq < hi
            if in_range:
                if seq in self._hooked_seqs:
                    continue
                self._hooked_seqs.add(seq)
            elif via >= 0 and ap.is_accumulate_grad(node):
                # A parameter's AccumulateGrad node is shared by every graph built while it
                # lives: a checkpoint recompute reaches the same node again. Hook it once
                # (keyed by the parameter, which outlives the step; the node is not pinned).
                param_id = id(node.variable)
                if param_id in self._accumulate_params:
                    continue
                self._accumulate_params.add(param_id)
            else:
                continue  # created before this forward (its inputs)
            if owners is None:
                owner = -1
            else:
                owner = owners[seq - lo] if in_range else self.nodes.owner[via]
            slot = self.nodes.add(
                seq if in_range else -1, node.name(), -1 if in_range else via, owner, not in_range
            )
            if not in_range:
                self.nodes.grad_new[slot] = _grad_to_create(node.variable)
            hook = _NodeHook(self, slot)
            pre = node.register_prehook(hook)
            post = node.register_hook(hook)
            if not in_range:
                self._persistent_handles += [pre, post]
            hooked += 1
            if in_range:
                nexts = [nxt for nxt, _ in node.next_functions if nxt is not None]
                todo.extend((nxt, slot) for nxt in nexts)
                if self.dataflow is not None and not self.forward_done:
                    self.dataflow.adjacency[seq] = [ap.node_sequence_nr(n) for n in nexts]
        return hooked

    # ---- backward ----------------------------------------------------------------------
    def _exec_stack(self) -> list[int]:
        return self._exec.setdefault(threading.get_ident(), [])

    def _node_pre(self, slot: int, grad_outputs: Any) -> None:
        if self.closed or not self.forward_done:
            return  # a backward run inside the forward (autograd.grad in forward) is not ours
        try:
            if not self.bwd_started:
                if self.nodes.accumulate[slot]:
                    return  # another graph reached this shared node; ours has not run
                self.bwd_started = True
                gc_pause.hold(id(self))  # until `finish` (or the sample's drop)
                self.bwd_t_begin = self.clock.stamp()
                ap.queue_end_of_backward(self.finish)
            stack = self._exec_stack()
            self.nodes.enclosing[slot] = stack[-1] if stack else -1
            stack.append(slot)
            self.nodes.thread[slot] = threading.get_native_id()
            if self.nvtx is not None:
                self.nvtx.backward_node_of(self.invocations, self.nodes, slot, stack)
            if self.memory is not None:
                self._fold_node_peak(stack[:-1])
                self.nodes.alloc0[slot] = self.memory.allocated()
            t0 = self.nodes.t0[slot] = self.clock.stamp()
            self.nodes.own0[slot] = self.clock.own_at(t0)
        except Exception as error:
            self.fail("backward pre-hook", error)

    def _node_post(self, slot: int, grad_inputs: Any, grad_outputs: Any) -> None:
        if self.closed or self.nodes.t0[slot] is None:
            return
        try:
            t1 = self.nodes.t1[slot] = self.clock.stamp()
            self.nodes.own1[slot] = self.clock.own_at(t1)
            stack = self._exec_stack()
            if stack and stack[-1] == slot:
                stack.pop()
            elif slot in stack:
                stack.remove(slot)
            if self.memory is not None:
                self.nodes.alloc1[slot] = self.memory.allocated()  # the memory curve's point
                self._fold_node_peak([slot])
                outer = self.nodes.enclosing[slot]
                peak = self.nodes.peak[slot]
                if outer >= 0 and peak is not None:
                    prev = self.nodes.peak[outer]
                    self.nodes.peak[outer] = peak if prev is None else max(prev, peak)
        except Exception as error:
            self.fail("backward hook", error)

    def _fold_node_peak(self, running: list[int]) -> None:
        assert self.memory is not None
        peak = self.memory.peak()
        self.memory.reset_peak()
        if running:
            top = running[-1]
            prev = self.nodes.peak[top]
            self.nodes.peak[top] = peak if prev is None else max(prev, peak)

    def finish(self) -> None:
        """End of the sampled backward (or of a forward that cannot have one)."""
        if self.closed:
            return
        try:
            if self.bwd_started:
                self.bwd_t_end = self.clock.stamp()
            self.closed = True
            gc_pause.release(id(self))
            self.gc.stop()
            if self.activations is not None:
                self.activations.stop_curve()
            self.release_persistent_hooks()
            if self.nvtx is not None:
                self.nvtx.backward_end()
        except Exception as error:  # runs inside the engine: must never break the backward
            self.closed = True
            self.fail("end of backward", error)
            return
        if not self.failed:
            self._on_finish(self)

    def release_persistent_hooks(self) -> None:
        handles, self._persistent_handles = self._persistent_handles, []
        for handle in handles:
            handle.remove()
        self._accumulate_params = set()

    def _open_calls(self) -> tuple[int, ...]:
        """The invocations a garbage collection starting now pauses: the forward's open calls,
        or in the backward the owners of the nodes running on any thread and their ancestors
        (`capture.gc_watch`)."""
        if not self.forward_done:
            return tuple(self._stack)
        if self.closed or not self.bwd_started:
            return ()  # between forward and backward (the loss, the user's code): no call
        open_calls: set[int] = set()
        for stack in list(self._exec.values()):
            for slot in stack:
                i = self.nodes.owner[slot]
                while i >= 0 and i not in open_calls:
                    open_calls.add(i)
                    i = self.invocations[i].parent
        return tuple(open_calls)

    # ---- activation-checkpointing recomputes ---------------------------------------------
    @property
    def recomputes(self) -> list[Recompute]:
        return self._recompute.records

    def recompute_enter(self, module_id: int) -> None:
        if self.closed:
            return
        candidates = self._by_module.get(module_id, [])
        self._recompute.enter(candidates, self.invocations, self._exec_stack(), self.clock)

    def recompute_exit(self, module_id: int, result: Any) -> None:
        if self.closed:
            return
        walk = self._recompute.exit(result, self.clock)
        if walk is not None:
            # With reentrant checkpointing the fresh nodes of a finished top-level recompute
            # run in a nested backward right now: hook them so the module gets their time.
            self._hook_nodes(*walk)

    # ---- failure -----------------------------------------------------------------------
    def fail(self, where: str, error: Exception) -> None:
        if not self.failed:
            self.failed = True
            if self.forward_done:
                self.abandon()
            self._on_error(where, error)

    def abandon(self) -> None:
        """Drop the sample. During the forward the remaining exits must still run (to pop the
        saved-tensor hooks), so only a finished forward closes the session right away."""
        self.failed = True
        gc_pause.release(id(self))
        self.gc.stop()
        if self.nvtx is not None:
            self.nvtx.backward_end()
        if self.forward_done:
            self.closed = True
            self.release_persistent_hooks()


class _NodeHook:
    """A node's pre-hook and hook in one object (told apart by their arguments): per node one
    small object instead of two partials of two bound methods with their argument tuples, a
    sixth of the objects a sampled step left to the garbage collector (`gc_pause`)."""

    __slots__ = ("session", "slot")

    def __init__(self, session: StepSession, slot: int) -> None:
        self.session = session
        self.slot = slot

    def __call__(self, grads: Any, grad_outputs: Any = _PRE) -> None:
        if grad_outputs is _PRE:  # a pre-hook gets the grad outputs only
            self.session._node_pre(self.slot, grads)
        else:
            self.session._node_post(self.slot, grads, grad_outputs)


def _grad_to_create(param: Any) -> int:
    """Bytes the gradient of `param` will take when its AccumulateGrad node runs: none if it
    has one already (accumulation adds in place), else its size (the CPU memory curve)."""
    if param.grad is not None:
        return 0
    return int(param.numel()) * int(param.element_size())
