"""One sampled step: the forward's invocation stack, the backward's node stamps, recomputes.

The session's forward half is here: the pre/post hooks push and pop invocations, reading the
autograd sequence counter, so that the nodes a call created have sequence numbers in its
`[seq0, seq1)` (nested calls, nested ranges). The backward half is an object the session holds
(`backward`, whose module `backward/node_stamps.py` tells the whole attribution; see
MEASUREMENT.md): it hooks those nodes as calls return, charges each to the innermost call whose
range holds it when the root returns, and stamps them as they run. It reads the session's
calls, is told when the forward ends and when the sample closes, and calls back when the
backward starts, ends or fails. Here too: the step's start and end (the collector held off
inside its timed windows, `gc_pause`), and the failure paths that drop the sample without ever
breaking training.

Nothing here holds a tensor: graph nodes are held only during a walk, node hooks capture the
node stamps (ints and stamps), never a tensor.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from wandb_modprof.capture.backward.node_stamps import NodeStamps
from wandb_modprof.capture.backward.nodes import NodeTable
from wandb_modprof.capture.backward.nvtx import NvtxRanges
from wandb_modprof.capture.forward.call_keys import CallKeys
from wandb_modprof.capture.forward.invocation import Invocation, Recompute, grad_fns, input_shapes
from wandb_modprof.capture.memory.activations import ActivationCounter
from wandb_modprof.capture.memory.device_memory import DeviceMemory
from wandb_modprof.capture.memory.storage import StorageKey
from wandb_modprof.capture.step import gc_pause
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.step.clock import Clock
from wandb_modprof.capture.step.gc_watch import GcWatch
from wandb_modprof.capture.step_phases import PhaseStamps
from wandb_modprof.capture.structure.step_dataflow import StepDataflow
from wandb_modprof.records.calls import Structure


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
        # Calls on other threads (a forward that runs branches in a thread pool) interleave
        # with this stack: they are not measured, their time stays in their caller's.
        self._thread = threading.get_ident()
        self.phase_stamps = PhaseStamps()  # the step's phases around its modules
        self.nvtx = nvtx
        self.exception_at_start = sys.exc_info()[1]
        self.forward_done = False  # set by `_end_forward_state`
        self.superseded = False  # a newer root forward started before this one's backward
        # Another model's structure pass ran inside this forward: its times are not this
        # model's normal cost, so the sample is dropped when it finishes.
        self.disturbed = False
        # The model's first step in this process, as far as can be told (`Sample.cold_start`)
        self.cold_start = False
        self.closed = False  # set by `_close`
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
        self.backward = NodeStamps(
            clock,
            memory,
            nvtx,
            self.invocations,
            self._by_module,
            on_start=lambda: gc_pause.hold(id(self)),  # until `finish` (or the sample's drop)
            on_end=self.finish,
            on_error=self.fail,
        )
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
        if self.failed or threading.get_ident() != self._thread:
            return
        parent = self._stack[-1] if self._stack else -1
        key, call_index = self._keys.enter(name, parent)
        inv = Invocation(module_id, name, module_type, key, call_index, parent, len(self._stack))
        inv.shapes = input_shapes(args, kwargs)
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
        inv.seq0 = tp.sequence_nr()
        inv.t0 = self.clock.stamp()
        inv.own0 = self.clock.own_at(inv.t0)
        if parent == -1:
            self.ref_stamp = inv.t0

    def exit(self, module_id: int, result: Any) -> None:
        """Close the innermost invocation; returns when the root closes the forward."""
        if not self._stack or threading.get_ident() != self._thread:
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
        inv.seq1 = tp.sequence_nr()
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
            adjacency = self.dataflow.adjacency if self.dataflow is not None else None
            self.backward.hook_nodes(
                grad_fns(result), self.invocations[0].seq0, tp.sequence_nr(), None, adjacency
            )
            if self.dataflow is not None:
                self._dataflow_step(self.dataflow.exit, idx, inv, result)
        if not self._stack:
            self._end_forward()

    def end_forward_after_error(self) -> None:
        """The forward ended without our root exit (our own error, or a KeyboardInterrupt that
        `Module._call_impl` does not catch): drop the sample, pop our saved-tensor hooks."""
        self._stack.clear()
        self.failed = True
        self._end_forward_state()
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
        try:
            self._close_forward()
        finally:
            # Released only now: closing the forward (the saved storages, the owners of the
            # nodes, the derived graph) makes many objects too. Held again in the backward.
            gc_pause.release(id(self))

    def _close_forward(self) -> None:
        if self.nvtx is not None:
            self.nvtx.forward_abort()  # ranges a failed forward left open
        # Pop our saved-tensor hooks first, whatever happened: the hook stack must stay balanced.
        if self.activations is not None:
            self.activations.pop()
        self._end_forward_state()
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
        owners = self.backward.charge()  # every range is final now
        if self.dataflow is not None:
            self._dataflow_step(self._derive_structure, owners)
        if not self.backward.nodes.seq:
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

    # ---- end of the step -------------------------------------------------------------
    def finish(self) -> None:
        """End of the sampled backward (or of a forward that cannot have one)."""
        if self.closed:
            self.backward.release_persistent_hooks()  # (a sample dropped during the backward)
            return
        try:
            self.backward.stamp_end()
            self._close()
            self.gc.stop()
            if self.activations is not None:
                self.activations.stop_curve()
            self.backward.release_persistent_hooks()
            if self.nvtx is not None:
                self.nvtx.backward_end()
        except Exception as error:  # runs inside the engine: must never break the backward
            self._close()
            gc_pause.release(id(self))
            self.fail("end of backward", error)
            return
        try:
            if not self.failed:
                self._on_finish(self)  # the gradients' bytes and norms: many objects, held too
        finally:
            gc_pause.release(id(self))

    def _open_calls(self) -> tuple[int, ...]:
        """The invocations a garbage collection starting now pauses: the forward's open calls,
        or in the backward the owners of the nodes running on any thread and their ancestors
        (`capture.step.gc_watch`)."""
        if not self.forward_done:
            return tuple(self._stack)
        return self.backward.open_calls()

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
            self._close()
            self.backward.release_persistent_hooks()

    # The two flags the node hooks read are set only here, each with the node stamps' copy.
    def _end_forward_state(self) -> None:
        self.forward_done = True
        self.backward.end_forward()

    def _close(self) -> None:
        self.closed = True
        self.backward.close()

    # ---- what `resolve` reads of the backward (`SessionRecord`'s fields of the same names) ----
    @property
    def nodes(self) -> NodeTable:
        return self.backward.nodes

    @property
    def recomputes(self) -> list[Recompute]:
        return self.backward.recomputes

    @property
    def bwd_started(self) -> bool:
        """A node of the sampled backward ran (the capture's hooks read it too)."""
        return self.backward.started

    @property
    def bwd_t_begin(self) -> Any:
        return self.backward.t_begin

    @property
    def bwd_t_end(self) -> Any:
        return self.backward.t_end
