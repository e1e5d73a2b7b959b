"""The step session's backward half: hooks on the autograd nodes each call created, stamped as
they run.

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

Steps 2 to 4 live here, in an object the step session holds (`StepSession.backward`; step 1,
the calls' ranges, is the session's forward half). It owns the node table, the stamps and the
recomputes; of the session it reads only the calls (their ranges, to charge the nodes, and per
module, for recomputes), and tells it through three callbacks only that the backward started,
ended or failed. The node hooks run ~45,000 times in a sampled step of a 22,000-node graph, so
all they read is this object's own: the session tells it once when the forward ends and when
the sample closes (`end_forward`, `close`) rather than being asked at every node. Nothing here
holds a tensor: graph nodes are held only during a walk, node hooks capture this object (ints
and stamps), never a tensor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from wandb_modprof.capture.backward.nodes import NodeTable, grad_to_create, node_name
from wandb_modprof.capture.backward.recompute import RecomputeTracker
from wandb_modprof.capture.step import interrupt_guard
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.step.interrupt_guard import BODY

if TYPE_CHECKING:
    from wandb_modprof.capture.backward.nvtx import NvtxRanges
    from wandb_modprof.capture.forward.invocation import Invocation, Recompute
    from wandb_modprof.capture.memory.device_memory import DeviceMemory
    from wandb_modprof.capture.step.clock import Clock

_PRE: Any = object()  # `_NodeHook`'s marker: called as a pre-hook


class NodeStamps:
    """The autograd nodes of one sampled step: hooked as calls return, stamped as they run."""

    def __init__(
        self,
        clock: Clock,
        memory: DeviceMemory | None,
        nvtx: NvtxRanges | None,
        invocations: Sequence[Invocation],
        calls_of_module: Mapping[int, list[int]],
        on_start: Callable[[], None],
        on_end: Callable[[], None],
        on_error: Callable[[str, Exception], None],
    ) -> None:
        """`invocations` and `calls_of_module` (module id -> its calls' indices, the
        candidates a recompute repeats) are the session's, read here, filled by its forward;
        `on_start`: the sampled backward's first node runs (before its stamp); `on_end`: the
        engine's end-of-backward callback; `on_error`: a hook failed (the sample is dropped)."""
        self.clock = clock
        self.memory = memory
        self.nvtx = nvtx
        self._invocations = invocations
        self._calls_of_module = calls_of_module
        self._on_start = on_start
        self._on_end = on_end
        self._on_error = on_error
        # The session's state as the node hooks need it, told by `end_forward` and `close`:
        # a backward run inside the forward (autograd.grad in forward) is not ours, nor is
        # one after the sample closed (another graph reaching a shared AccumulateGrad node).
        self._forward_done = False
        self._closed = False
        # the backward, indexed by node slot
        self._hooked_seqs: set[int] = set()
        self.nodes = NodeTable()
        self._exec: dict[int, list[int]] = {}
        # per thread, the newest node stamp and our own time then: where an AccumulateGrad
        # node, hooked after it runs only, began (see `hook_nodes`)
        self._last: dict[int, tuple[Any, int]] = {}
        self._persistent_handles: list[Any] = []
        # Parameters whose AccumulateGrad node is hooked; those slots cannot start a backward:
        # a later step's graph reuses a live AccumulateGrad node, hooks included.
        self._accumulate_params: set[int] = set()
        self.started = False  # a node of the sampled backward ran
        self.t_begin: Any = None
        self.t_end: Any = None
        self._recompute = RecomputeTracker()  # activation-checkpointing recomputes

    def end_forward(self) -> None:
        """The forward is over: nodes that run from now on are the sampled backward's."""
        self._forward_done = True

    def close(self) -> None:
        """The sample is finished or dropped: hooks and recomputes that still come do nothing."""
        self._closed = True

    def stamp_end(self) -> None:
        """The backward's end (the engine's end-of-backward callback runs)."""
        if self.started:
            self.t_end = self.clock.stamp()

    def charge(self) -> list[int]:
        """Once the root returned (every range final): each hooked node to the innermost call
        whose range holds it, an AccumulateGrad node to the call whose node feeds it. Returns
        that call per sequence number from the root's `seq0` on."""
        root = self._invocations[0]
        owners = [-1] * (root.seq1 - root.seq0)
        for idx, inv in enumerate(self._invocations):  # preorder: children overwrite parents
            if inv.seq1 > inv.seq0:
                owners[inv.seq0 - root.seq0 : inv.seq1 - root.seq0] = [idx] * (inv.seq1 - inv.seq0)
        nodes = self.nodes
        for slot, via in enumerate(nodes.via):
            if via >= 0:
                nodes.owner[slot] = nodes.owner[via]
            else:
                nodes.owner[slot] = owners[nodes.seq[slot] - root.seq0]
        return owners

    def hook_nodes(
        self,
        roots: Iterable[Any],
        lo: int,
        hi: int,
        owners: list[int] | None,
        adjacency: dict[int, list[int]] | None = None,
    ) -> int:
        """Hook the not-yet-hooked nodes created in `[lo, hi)` reachable from `roots`, and the
        AccumulateGrad nodes they feed; into `adjacency` (the forward's derived graph, when
        asked for), each node's sequence number -> those of the nodes it feeds its grad to.

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
            seq = tp.node_sequence_nr(node)
            in_range = lo <= seq < hi
            if in_range:
                if seq in self._hooked_seqs:
                    continue
                self._hooked_seqs.add(seq)
            elif via >= 0 and tp.is_accumulate_grad(node):
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
                seq if in_range else -1,
                node_name(node),
                -1 if in_range else via,
                owner,
                not in_range,
            )
            if not in_range:
                self.nodes.grad_new[slot] = grad_to_create(node.variable)
            hook = _NodeHook(self, slot)
            # An AccumulateGrad node gets a pre-hook too: without one it would begin where the
            # thread's previous node ended, and the engine's work between the two nodes (20-100
            # us per parameter on a ResNet) would be charged to the parameter's module.
            pre = node.register_prehook(hook)
            if not in_range:
                self._persistent_handles.append(pre)
            post = node.register_hook(hook)
            if not in_range:
                self._persistent_handles.append(post)
            hooked += 1
            if in_range:
                nexts = [nxt for nxt, _ in node.next_functions if nxt is not None]
                todo.extend((nxt, slot) for nxt in nexts)
                if adjacency is not None:
                    adjacency[seq] = [tp.node_sequence_nr(n) for n in nexts]
        return hooked

    def open_calls(self) -> tuple[int, ...]:
        """The calls a garbage collection starting in the backward pauses (`gc_watch`): the
        owners of the nodes running now on any thread, and their ancestors."""
        if self._closed or not self.started:
            return ()  # between forward and backward (the loss, the user's code): no call
        found: set[int] = set()
        for stack in list(self._exec.values()):
            for slot in stack:
                i = self.nodes.owner[slot]
                while i >= 0 and i not in found:
                    found.add(i)
                    i = self._invocations[i].parent
        return tuple(found)

    # ---- backward ----------------------------------------------------------------------
    def _exec_stack(self) -> list[int]:
        return self._exec.setdefault(threading.get_ident(), [])

    def _node_pre(self, slot: int, grad_outputs: Any) -> None:
        if self._closed or not self._forward_done:
            return
        try:
            if not self.started:
                if self.nodes.accumulate[slot]:
                    return  # another graph reached this shared node; ours has not run
                self.started = True
                self._on_start()
                self.t_begin = self.clock.stamp()
                tp.queue_end_of_backward(self._on_end)
            tid = threading.get_ident()
            stack = self._exec.setdefault(tid, [])
            self.nodes.enclosing[slot] = stack[-1] if stack else -1
            stack.append(slot)
            self.nodes.thread[slot] = threading.get_native_id()
            if self.nvtx is not None:
                self.nvtx.backward_node_of(self._invocations, self.nodes, slot, stack)
            if self.memory is not None:
                self._fold_node_peak(stack[:-1])
                self.nodes.alloc0[slot] = self.memory.allocated()
            t0 = self.nodes.t0[slot] = self.clock.stamp()
            own0 = self.nodes.own0[slot] = self.clock.own_at(t0)
            self._last[tid] = (t0, own0)
        except Exception as error:
            self._on_error("backward pre-hook", error)

    def _began_after_last(self, slot: int, tid: int, stack: list[int]) -> bool:
        """An AccumulateGrad node hooked after it runs only: it began at the thread's newest
        node stamp (False: not ours to time, e.g. another graph's backward using it)."""
        if not self.started or not self.nodes.accumulate[slot]:
            return False
        last = self._last.get(tid)
        if last is None:
            return False
        self.nodes.t0[slot], self.nodes.own0[slot] = last
        self.nodes.enclosing[slot] = stack[-1] if stack else -1
        self.nodes.thread[slot] = threading.get_native_id()
        return True

    def _node_post(self, slot: int, grad_inputs: Any, grad_outputs: Any) -> None:
        began = self.nodes.t0[slot] is not None
        if self._closed or not (began or self.nodes.accumulate[slot]):
            return
        try:
            t1 = self.clock.stamp()
            tid = threading.get_ident()
            stack = self._exec.setdefault(tid, [])
            if not began and not self._began_after_last(slot, tid, stack):
                return
            self.nodes.t1[slot] = t1
            own1 = self.nodes.own1[slot] = self.clock.own_at(t1)
            self._last[tid] = (t1, own1)
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
            self._on_error("backward hook", error)

    def _fold_node_peak(self, running: list[int]) -> None:
        assert self.memory is not None
        peak = self.memory.peak()
        self.memory.reset_peak()
        if running:
            top = running[-1]
            prev = self.nodes.peak[top]
            self.nodes.peak[top] = peak if prev is None else max(prev, peak)

    def release_persistent_hooks(self) -> None:
        handles, self._persistent_handles = self._persistent_handles, []
        for handle in handles:
            handle.remove()
        self._accumulate_params = set()

    # ---- activation-checkpointing recomputes ---------------------------------------------
    @property
    def recomputes(self) -> list[Recompute]:
        return self._recompute.records

    def recompute_enter(self, module_id: int, shapes: tuple[Any, ...] = ()) -> None:
        """A module's forward runs again in the backward; `shapes`: its arguments' shapes
        (`invocation.input_shapes`)."""
        if self._closed:
            return
        candidates = self._calls_of_module.get(module_id, [])
        self._recompute.enter(candidates, self._invocations, self._exec_stack(), self.clock, shapes)

    def recompute_exit(self, module_id: int, result: Any) -> None:
        if self._closed:
            return
        walk = self._recompute.exit(result, self.clock)
        if walk is not None:
            # With reentrant checkpointing the fresh nodes of a finished top-level recompute
            # run in a nested backward right now: hook them so the module gets their time.
            self.hook_nodes(*walk)


class _NodeHook:
    """A node's pre-hook and hook in one object (told apart by their arguments): per node one
    small object instead of two partials of two bound methods with their argument tuples, a
    sixth of the objects a sampled step left to the garbage collector (`gc_pause`)."""

    __slots__ = ("slot", "stamps")

    def __init__(self, stamps: NodeStamps, slot: int) -> None:
        self.stamps = stamps
        self.slot = slot

    def __call__(self, grads: Any, grad_outputs: Any = _PRE) -> None:
        # Our body's time, and the engine's call into it (`HookCost.node_ns`), is ours: a
        # node's window holds the rest of its pre-hook and the start of its hook, an
        # AccumulateGrad node's the rest of the node hook before it (`backward_charges`).
        # A Ctrl-C arriving inside the body waits for its end (`interrupt_guard`).
        clock = self.stamps.clock
        clock.own_enter()
        BODY.body += 1
        try:
            if grad_outputs is _PRE:  # a pre-hook gets the grad outputs only
                self.stamps._node_pre(self.slot, grads)
            else:
                self.stamps._node_post(self.slot, grads, grad_outputs)
        finally:
            clock.own_leave_node()
            BODY.body -= 1
            if BODY.pending is not None and not BODY.body:
                interrupt_guard.body_done()
