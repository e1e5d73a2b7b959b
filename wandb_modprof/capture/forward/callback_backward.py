"""The backward half of `on_module`'s engine (`module_callbacks`): when each forward call of the
module returns, hook the autograd nodes it created, and fire `backward_start` and
`backward_end` as they run.

How the backward boundaries are found (the method of `session.py`, see MEASUREMENT.md):

1. The forward pre-hook and hook read the autograd sequence counter; the autograd nodes the
   call created have sequence numbers in `[seq0, seq1)`. As the call returns, the graph is walked
   from its outputs through the nodes in that range, and each gets a node pre-hook and hook
   (never module backward hooks: they break in-place ops, dict outputs and frozen inputs).
   The AccumulateGrad nodes of the module's parameters reached from them are hooked too:
   accumulating into `.grad` is the module's backward work.
2. `backward_start` fires in the pre-hook of the first of these nodes to run. Each node, as it
   starts, adds the nodes it feeds that belong to the call and that this backward will execute
   (`torch._C._will_engine_execute_node`) to the call's pending set; `backward_end` fires when
   the set is empty, right after the call's last node, not at the end of the whole backward.
   The test is made as each node runs because a node cannot be weakly referenced and holding
   it would keep its graph (and the activations it saved) alive after a forward whose
   backward never comes.
3. Safety net: a call still open when its backward finishes gets `backward_end` from the
   engine's end-of-backward callback.

Nothing here holds a tensor or a graph node: the hooks live on the nodes and die with them.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from torch import nn

from wandb_modprof.capture.forward.callback_state import CallState, Phase, remove_all, remove_calls
from wandb_modprof.capture.forward.invocation import grad_fns
from wandb_modprof.capture.step import torch_private as tp


class BackwardTracker:
    """The backward of every forward call of one module, for one `ModuleCallbacks`.

    `fire(phase, call)` runs the user's callback of a backward phase; `internal_error(where,
    error)` reports an error of ours (both never raise). The tracker holds these two, not the
    handle, so that the hooks on the autograd nodes keep no reference to it.
    """

    def __init__(
        self,
        fire: Callable[[Phase, int], None],
        internal_error: Callable[[str, Exception], None],
    ) -> None:
        self._fire = fire
        self._internal_error = internal_error
        self.removed = False
        self.live: weakref.WeakSet[CallState] = weakref.WeakSet()  # calls with a live graph
        # Parameter id -> the call whose backward accumulates it. A module called three times
        # accumulates its weight once, after its last use in backward: that is the first call
        # (backward runs in reverse), so the first call that reaches a parameter claims it.
        self._claims: dict[int, weakref.ref[CallState]] = {}
        self._shared: tuple[frozenset[int], set[int]] | None = None  # see _used_before

    def remove(self) -> None:
        """Take every hook off the nodes; no backward event fires afterwards."""
        self.removed = True
        self._claims = {}
        calls = list(self.live)
        if tp.in_backward():
            # Called from a callback inside a backward: the engine may be iterating the hooks
            # of the running node, so take them off once the backward has finished.
            tp.queue_end_of_backward(functools.partial(remove_calls, calls))
        else:
            remove_calls(calls)

    # ---- at the end of a forward call --------------------------------------------------------
    def hook(self, module: nn.Module, call: int, seq0: int, seq1: int, out: Any) -> None:
        """Hook the call's autograd nodes and its parameters' AccumulateGrad nodes."""
        if seq1 <= seq0:
            return  # created no node (no grad, or returned its input)
        params = {id(p) for p in module.parameters()}
        state = CallState(call)
        nodes: list[tuple[int, Any]] = []
        accumulators: dict[int, Any] = {}
        inputs: list[Any] = []  # nodes made before the call that its nodes feed
        todo = list(grad_fns(out))
        while todo:
            node = todo.pop()
            if tp.is_accumulate_grad(node):
                pid = id(node.variable)
                if pid in params:
                    accumulators[pid] = node
                continue
            seq = tp.node_sequence_nr(node)
            if not seq0 <= seq < seq1:
                inputs.append(node)
                continue
            if seq in state.names:
                continue
            state.names[seq] = type(node).__name__
            nodes.append((seq, node))
            todo.extend(nxt for nxt, _ in node.next_functions if nxt is not None)
        if not nodes:
            return
        for seq, node in nodes:
            state.handles.append(
                node.register_prehook(functools.partial(self._pre_node, state, seq))
            )
            state.handles.append(node.register_hook(functools.partial(self._post_node, state, seq)))
        shared = self._used_before(params, inputs) if accumulators else set()
        for pid, node in accumulators.items():
            if pid in shared or self._claimed(pid):
                continue
            ref = weakref.ref(state)
            state.acc[pid] = node.register_hook(functools.partial(self._acc_post, ref, pid))
            self._claims[pid] = ref
        self.live.add(state)
        if state.acc:
            # The graph was dropped without a backward: take the hooks off the parameters'
            # AccumulateGrad nodes, which may live on (DDP keeps them).
            finalizer = weakref.finalize(state, remove_all, state.acc)
            finalizer.atexit = False

    def _used_before(self, params: set[int], inputs: list[Any]) -> set[int]:
        """The module's parameters that the graph before the call also uses (tied weights).

        Such a parameter is accumulated once its earlier use has had its backward, long after
        this module's: waiting for it would stretch the module's backward to that point (a
        tied LM head's to nearly the whole backward). Weights are tied by structure, so the
        graph before the call is walked once, on the first call with a graph (again if the
        module's parameters change).
        """
        key = frozenset(params)
        if self._shared is not None and self._shared[0] == key:
            return self._shared[1]
        shared: set[int] = set()
        seen: dict[int, Any] = {}  # holds the nodes walked, so that their ids stay unique
        todo = list(inputs)
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen[id(node)] = node
            if tp.is_accumulate_grad(node):
                if id(node.variable) in params:
                    shared.add(id(node.variable))
                continue
            todo.extend(nxt for nxt, _ in node.next_functions if nxt is not None)
        self._shared = (key, shared)
        return shared

    def _claimed(self, pid: int) -> bool:
        ref = self._claims.get(pid)
        owner = None if ref is None else ref()
        return owner is not None and pid in owner.acc

    # ---- in the backward ---------------------------------------------------------------------
    def _pre_node(self, state: CallState, seq: int, grad_outputs: Any) -> None:
        if self.removed:
            return
        starting = not state.open
        if starting:
            try:
                task = tp.graph_task_id()
                if state.task != task:
                    tp.queue_end_of_backward(functools.partial(self._end_of_backward, state))
                    state.task = task
            except Exception as error:
                self._internal_error("backward pre-hook", error)
                return  # without the end-of-backward callback, do not start what may not end
            state.open = True
            state.pending.clear()
            state.pending_acc.clear()
            state.feeds.clear()
        try:
            state.pending.add(seq)
            node = tp.current_autograd_node()
            fed: set[int] = set()
            for nxt, _ in node.next_functions if node is not None else ():
                if nxt is None:
                    continue
                if tp.is_accumulate_grad(nxt):
                    pid = id(nxt.variable)
                    if pid in state.acc and tp.will_engine_execute_node(nxt):
                        fed.add(pid)
                else:
                    nxt_seq = tp.node_sequence_nr(nxt)
                    # The type check guards against a node of another thread's forward that
                    # happens to have a number in the call's range (the counters are per thread).
                    ours = state.names.get(nxt_seq) == type(nxt).__name__
                    if ours and tp.will_engine_execute_node(nxt):
                        state.pending.add(nxt_seq)
            state.pending_acc |= fed
            state.feeds[seq] = fed
        except Exception as error:
            state.broken = True
            self._internal_error("backward pre-hook", error)
        if starting:
            self._fire("backward_start", state.call)

    def _post_node(self, state: CallState, seq: int, grad_inputs: Any, grad_outputs: Any) -> None:
        if self.removed or not state.open or state.broken:
            return
        try:
            state.pending.discard(seq)
            fed = state.feeds.pop(seq, set())
            if state.pending:
                return
            # The call's own nodes are done. An AccumulateGrad node runs as soon as its last
            # gradient arrives (it has the engine's top priority), so one still waiting that
            # this last node did not feed waits for a use outside the call: do not wait too.
            state.pending_acc &= fed
            done = not state.pending_acc
        except Exception as error:
            self._internal_error("backward hook", error)
            return
        if done:
            self._close(state)

    def _acc_post(
        self, ref: weakref.ref[CallState], pid: int, grad_inputs: Any, grad_outputs: Any
    ) -> None:
        state = ref()
        if self.removed or state is None or not state.open or state.broken:
            return  # a later graph reached this shared node; its call is not running
        try:
            state.acc_ran.add(pid)
            state.pending_acc.discard(pid)
            done = not state.pending and not state.pending_acc
        except Exception as error:
            self._internal_error("backward hook", error)
            return
        if done:
            self._close(state)

    def _close(self, state: CallState) -> None:
        state.open = False
        self._fire("backward_end", state.call)

    def _end_of_backward(self, state: CallState) -> None:
        # Runs inside the engine once the backward has finished: must never raise.
        state.task = -1
        if self.removed:
            return
        try:
            state.broken = False
            if state.open:
                self._close(state)  # some counted node never ran (an error, an empty grad)
            # Gradients accumulated now belong to this backward; a retained graph's next
            # backward accumulates again without these hooks (and claims are freed for the
            # module's next forward).
            for pid in state.acc_ran:
                handle = state.acc.pop(pid, None)
                if handle is not None:
                    handle.remove()
            state.acc_ran.clear()
        except Exception as error:
            self._internal_error("end of backward", error)
