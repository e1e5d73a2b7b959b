"""The engine of `on_module` (`api.callbacks`): run callbacks when a module's forward or backward
starts and ends, e.g. to start and stop `torch.profiler`, `torch.cuda.profiler`, an NVTX range
or a memory snapshot around exactly that module's backward.

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
import threading
import weakref
from typing import Any

import torch
from torch import nn

from wandb_modprof._warn import warn_safely
from wandb_modprof.capture.forward.callback_state import (
    PHASES,
    Callback,
    CallState,
    ModuleEvent,
    Phase,
    remove_all,
    remove_calls,
)
from wandb_modprof.capture.forward.invocation import grad_fns
from wandb_modprof.capture.inert_hook import InertHook
from wandb_modprof.capture.step import torch_private as tp


class ModuleCallbacks:
    """The handle `on_module` returns: `.remove()` it, or use it as a context manager.

    Examples:
        >>> with wandb_modprof.on_module(model.fc, forward_end=print) as hooks:  # doctest: +SKIP
        ...     model(x)
        >>> hooks                                                                # doctest: +SKIP
        ModuleCallbacks(Linear: forward_end; 1 call, removed)
    """

    def __init__(self, module: nn.Module, callbacks: dict[Phase, Callback | None]) -> None:
        self._module_type = type(module).__name__
        self._callbacks = callbacks
        self._calls = 0
        self._removed = False
        self._warned: set[str] = set()
        self._local = threading.local()  # per-thread stack of open forward calls
        self._live: weakref.WeakSet[CallState] = weakref.WeakSet()
        # Parameter id -> the call whose backward accumulates it. A module called three times
        # accumulates its weight once, after its last use in backward: that is the first call
        # (backward runs in reverse), so the first call that reaches a parameter claims it.
        self._claims: dict[int, weakref.ref[CallState]] = {}
        self._shared: tuple[frozenset[int], set[int]] | None = None  # see _used_before
        # The pre-hook goes first so that nodes made by other pre-hooks (weight norm, other
        # parametrizations) fall in the call's range; the hook goes last so it walks the
        # output that other hooks may have replaced.
        self._handles = [
            module.register_forward_pre_hook(InertHook(self._pre), with_kwargs=True, prepend=True),
            module.register_forward_hook(InertHook(self._post), with_kwargs=True, always_call=True),
        ]

    # ---- public ----------------------------------------------------------------------------
    @property
    def calls(self) -> int:
        """Forward calls of the module seen so far (checkpoint recomputes not counted)."""
        return self._calls

    @property
    def removed(self) -> bool:
        return self._removed

    def remove(self) -> None:
        """Remove every hook; no callback fires afterwards (a backward in flight included)."""
        if self._removed:
            return
        self._removed = True
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._claims = {}
        calls = list(self._live)
        if tp.in_backward():
            # Called from a callback inside a backward: the engine may be iterating the hooks
            # of the running node, so take them off once the backward has finished.
            tp.queue_end_of_backward(functools.partial(remove_calls, calls))
        else:
            remove_calls(calls)

    def __enter__(self) -> ModuleCallbacks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        given = ", ".join(p for p in PHASES if self._callbacks[p] is not None)
        calls = f"{self._calls} call" + ("" if self._calls == 1 else "s")
        state = ", removed" if self._removed else ""
        return f"ModuleCallbacks({self._module_type}: {given}; {calls}{state})"

    # ---- forward ---------------------------------------------------------------------------
    def _stack(self) -> list[tuple[int, int]]:
        stack: list[tuple[int, int]] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        # A forward while a backward runs on this thread is an activation-checkpointing
        # recompute: not a call of the model, and its nodes are not the ones that run.
        if self._removed or tp.in_backward():
            return
        call = self._calls
        self._calls += 1
        self._fire("forward_start", call)
        try:
            # Read after the callback, so that nodes it creates are not taken for the module's.
            self._stack().append((call, tp.sequence_nr()))
        except Exception as error:
            self._internal_error("forward pre-hook", error)

    def _post(self, module: nn.Module, args: Any, kwargs: Any, result: Any) -> None:
        if self._removed or tp.in_backward():
            return
        stack = self._stack()
        if not stack:
            return  # hooked while this call was already running
        call, seq0 = stack.pop()
        # A forward that raised passes result=None (always_call): nothing to hook.
        if torch.is_grad_enabled():
            try:
                self._hook_backward(module, call, seq0, tp.sequence_nr(), result)
            except Exception as error:
                self._internal_error("forward hook", error)
        self._fire("forward_end", call)

    def _hook_backward(self, module: nn.Module, call: int, seq0: int, seq1: int, out: Any) -> None:
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
        self._live.add(state)
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

    # ---- backward --------------------------------------------------------------------------
    def _pre_node(self, state: CallState, seq: int, grad_outputs: Any) -> None:
        if self._removed:
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
        if self._removed or not state.open or state.broken:
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
        if self._removed or state is None or not state.open or state.broken:
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
        if self._removed:
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

    # ---- callbacks and errors --------------------------------------------------------------
    def _fire(self, phase: Phase, call: int) -> None:
        fn = self._callbacks[phase]
        if fn is None:
            return
        try:
            fn(ModuleEvent(phase, call, self._module_type))
        except Exception as error:
            self._warn_once(
                phase,
                f"the {phase} callback raised {type(error).__name__}: {error}. "
                "The error is ignored and training continues",
            )

    def _internal_error(self, where: str, error: Exception) -> None:
        self._warn_once(
            where,
            f"internal error in the {where} ({type(error).__name__}: {error}); events of this "
            "call may be missing, training continues. Please report this with the model class",
        )

    def _warn_once(self, key: str, what: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        warn_safely(
            f"wandb_modprof.on_module({self._module_type}): {what} (warned once).",
            RuntimeWarning,
            stacklevel=3,
        )
