"""The sampled steps of one capture: their sessions from the root's entry to the sink.

`start` begins a step session at the root's entry (the model index, the submodules' hooks, a
`session.StepSession`); every submodule's hook body (`pre` / `post`) then routes its call to
whichever is listening (a checkpoint recompute of a running backward, a structure pass, or the
timed forward); `end_forward` queues the session for its backward at the root's exit; when the
backward ends the gradients are read, before the optimizer or `zero_grad` runs (their norms
to be divided by a GradScaler's loss scale), and the session goes to the sink as plain data:
its `SessionRecord` (`session_record`), the pending gradient readings and the static readings
(`_on_finish`). An internal error drops the sample, warns once and never breaks training
(`internal_error`).

`SessionHooks` owns the sessions: the timed forward running now (`forward`), those whose
backward may still come (`pending`), those whose saved-tensor hooks await popping (`stale`),
and whether a finished sample awaits delivery (`sample_due`). The root hooks
(`root_hooks.RootHooks`) decide which steps are sampled and call it at the step's boundaries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from wandb_modprof._warn import warn_safely
from wandb_modprof.capture.backward.nvtx import NvtxRanges
from wandb_modprof.capture.forward.invocation import input_shapes
from wandb_modprof.capture.inert_hook import under_compile
from wandb_modprof.capture.memory.device_memory import DeviceMemory
from wandb_modprof.capture.memory.gradient_readings import gradient_state
from wandb_modprof.capture.memory.loss_scale import LossScaleWatch
from wandb_modprof.capture.memory.static_memory import ROOT_NAME, static_readings
from wandb_modprof.capture.model.wrappers import type_name
from wandb_modprof.capture.options import Options
from wandb_modprof.capture.session import StepSession
from wandb_modprof.capture.session_record import ActivationCounts, GcCharges, SessionRecord
from wandb_modprof.capture.sink import SampleSink
from wandb_modprof.capture.step import gc_pause
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.step.clock import Clock
from wandb_modprof.capture.step_phases import PhaseWatch
from wandb_modprof.capture.step_queue import backward_running, prune_sessions
from wandb_modprof.capture.structure.step_dataflow import StepDataflow
from wandb_modprof.capture.structure.structure_driver import StructureDriver
from wandb_modprof.capture.submodule_hooks import SubmoduleHooks

_MAX_PENDING = 4  # sampled forwards kept waiting for their backward (`step_queue`)


class InternalErrors:
    """One warning per capture for an internal error: the sample is dropped, training goes on."""

    def __init__(self) -> None:
        self.warned = False

    def warn_once(self, where: str, error: Exception) -> None:
        if self.warned:
            return
        self.warned = True
        warn_safely(
            f"wandb_modprof: internal error while measuring module '{where}' "
            f"({type(error).__name__}: {error}). This sample is dropped; training continues "
            "and later steps are still sampled. Please report this with the model class.",
            RuntimeWarning,
            stacklevel=3,
        )


class SessionHooks:
    """The step sessions of a capture: started, fed by the submodules' hooks, handed to the
    sink (the session's `on_finish`), dropped on an internal error (its `on_error`)."""

    def __init__(
        self,
        *,
        model: nn.Module,
        options: Options,
        optimizer: torch.optim.Optimizer | None,
        clock: Clock,
        memory: DeviceMemory | None,
        loss_scales: LossScaleWatch | None,
        sink: SampleSink,
        modules: SubmoduleHooks,
        structures: StructureDriver,
        errors: InternalErrors,
    ) -> None:
        self.model = model
        self.options = options
        self.optimizer = optimizer
        self.clock = clock
        self.memory = memory
        self.loss_scales = loss_scales  # the GradScaler's scale in the gradients (norms on)
        self.sink = sink
        self.modules = modules
        self.structures = structures
        self.errors = errors
        self.forward: StepSession | None = None  # the timed forward running now
        self.pending: list[StepSession] = []  # forwards whose backward may still come
        self.stale: list[StepSession] = []  # their saved-tensor hooks await popping
        # `watch`'s W&B logging: called outside the autograd engine, at the next root forward
        # after a sample finished; returns False to be asked again on a later step.
        self.after_sample: Callable[[], bool] | None = None
        self.sample_due = False  # a sample finished: hand it over at the next root forward
        # a sampled step's optimizer step and the next forward (`step_phases`)
        self.phase_watch = PhaseWatch(optimizer)

    # ---- the submodules' hook bodies -----------------------------------------------------
    def pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        self.clock.own_enter()  # first and last: the whole body is our time (clock.CpuClock)
        try:
            if tp.in_backward():
                running = backward_running(self.pending)
                if running is not None:
                    running.recompute_enter(id(module), input_shapes(args, kwargs))
                return
            structure = self.structures.current
            if structure is not None:
                name, module_type = self.modules.label(module, "?")
                structure.enter(module, name, module_type, args, kwargs)
                return
            session = self.forward
            if session is None:
                return
            name, module_type = self.modules.names.get(id(module), ("?", type(module).__name__))
            session.enter(id(module), name, module_type, module, args, kwargs)
        except Exception as error:
            self.internal_error(self._name(module), error)
        finally:
            self.clock.own_leave()

    def post(self, module: nn.Module, args: Any, kwargs: Any, result: Any) -> None:
        self.clock.own_enter()
        try:
            if tp.in_backward():
                running = backward_running(self.pending)
                if running is not None:
                    running.recompute_exit(id(module), result)
                return
            structure = self.structures.current
            if structure is not None:
                structure.exit(module, result)
                return
            session = self.forward
            if session is not None:
                session.exit(id(module), result)
        except Exception as error:
            self.internal_error(self._name(module), error)
        finally:
            self.clock.own_leave_call()  # this call's hook dispatch, both hooks, is ours too

    def busy(self) -> bool:
        """A step still needs the submodules' hooks: a timed forward or a structure pass runs,
        or a sampled backward may still run a checkpoint recompute (unless a newer forward
        began first: then the step is not hook-free otherwise)."""
        if self.forward is not None or self.structures.current is not None:
            return True
        return any(not s.closed and (s.bwd_started or not s.superseded) for s in self.pending)

    # ---- a step's boundaries (`root_hooks`) --------------------------------------------
    def before_root(self) -> None:
        """A new root forward: pop what stale sessions left pushed, abandon the sessions whose
        backward can no longer come, and mark the others superseded."""
        if self.stale:
            self.stale = [s for s in self.stale if not s.pop_saved_tensors_hooks()]
        if self.pending:
            self.pending = prune_sessions(self.pending, _MAX_PENDING)
            for waiting in self.pending:
                waiting.superseded = True

    def start(
        self, step: int, module: nn.Module, args: Any, kwargs: Any, derive: bool, cold: bool
    ) -> None:
        """A sampled step's session (`cold`: the model's first step in this process)."""
        # The collector held off from here, before the model walk and the hooks' attachment
        # (each makes many objects), until the root's own window holds it (`gc_pause`).
        gc_pause.hold(id(self))
        try:
            self._start_held(step, module, args, kwargs, derive, cold)
        finally:
            gc_pause.release(id(self))

    def _start_held(
        self, step: int, module: nn.Module, args: Any, kwargs: Any, derive: bool, cold: bool
    ) -> None:
        index = self.modules.index()  # the one model walk per sample: later stages reuse it
        if not under_compile():  # (under a compile wrapper: hooks there would be traced)
            self.modules.hook_children(index)
        excluded = None
        if self.options.activations and not tp.saved_tensors_hooks_active():
            excluded = index.excluded
        session = StepSession(
            step=step,
            clock=self.clock,
            memory=self.memory,
            excluded_storages=excluded,
            on_error=self._session_error,
            on_finish=self._on_finish,
            nvtx=NvtxRanges() if self.options.nvtx else None,
            dataflow=StepDataflow(module.training) if derive else None,
        )
        session.cold_start = cold
        self.forward = session
        name, module_type = self.modules.names.get(
            id(self.model), (ROOT_NAME, type_name(self.model))
        )
        session.enter(id(self.model), name, module_type, module, args, kwargs)

    def end_forward(self, session: StepSession, training: bool) -> None:
        """The timed forward returned: keep its derived graph, queue it for its backward."""
        self.forward = None
        if session.structure is not None:
            self.structures.add_derived(session.structure)
        elif session.structure_error is not None:
            self.structures.derive_failed = True  # the next step's pass draws the graph
            self.errors.warn_once("<module graph>", session.structure_error)
        if not session.closed:
            self.pending.append(session)
            self.structures.check(session, training)

    def end_failed_forward(self, session: StepSession) -> None:
        session.end_forward_after_error()
        if session.saved_hooks_pushed:  # someone else's hooks were on top: pop ours later
            self.stale.append(session)

    def end_interrupted_forward(self) -> None:
        """The timed forward ended without the root's exit hook (a KeyboardInterrupt)."""
        session, self.forward = self.forward, None
        if session is not None:
            self.end_failed_forward(session)

    def end_dead_backwards(self) -> None:
        # Outside a backward on this thread, a begun one that is not closed has raised: the
        # engine ran no end callback of ours after it (the sample is dropped).
        for session in self.pending:
            if session.bwd_started and not session.closed:
                session.abandon()

    def pop_stale(self) -> None:
        if self.stale:
            self.stale = [s for s in self.stale if not s.pop_saved_tensors_hooks()]

    def close(self) -> None:
        """At detach: samples whose backward never came are dropped."""
        self.phase_watch.close()
        self.end_interrupted_forward()
        for session in self.pending:
            session.abandon()
        self.pending = []

    def _on_finish(self, session: StepSession) -> None:
        """End of a sampled backward: read gradients before the optimizer or zero_grad runs."""
        try:
            if session.disturbed:
                return
            index = self.modules.built_index
            assert index is not None  # built by _start_held
            if session.bwd_started:
                names = {inv.name for inv in session.invocations}
                # The gradients carry the loss scale of a GradScaler, if one scaled the loss:
                # its scale now, to divide their norms by (`memory/loss_scale.py`).
                scales = self.loss_scales
                loss_scale = scales.at_backward_end() if scales is not None else None
                gradients = gradient_state(index, names, self.options.norms, loss_scale)
            else:
                gradients = None
            # Optimizer state is read when the sample is resolved, after optimizer.step().
            static = static_readings(index, self.optimizer)
            self.sink.add(session_record(session), gradients, static)
            self.sample_due = self.after_sample is not None
            self.phase_watch.after_backward(
                session.phase_stamps, session.clock, session.bwd_started
            )
        except Exception as error:
            self.internal_error(ROOT_NAME, error)
        finally:
            if session in self.pending:
                self.pending.remove(session)
            self.modules.release_children()

    # ---- errors ------------------------------------------------------------------------
    def _name(self, module: nn.Module) -> str:
        return self.modules.names.get(id(module), (type(module).__name__, ""))[0]

    def _session_error(self, where: str, error: Exception) -> None:
        self.errors.warn_once(where, error)
        # Failed during its backward: nothing needs the step's module hooks any more. (Never
        # detach during a forward: `_call_impl` may be iterating a hook dict.)
        self.pending = [s for s in self.pending if not s.closed]
        if self.forward is None:
            self.modules.release_children()

    def internal_error(self, where: str, error: Exception) -> None:
        """Never let measurement break training: warn once, drop the sample, carry on."""
        for session in [self.forward, *self.pending]:
            if session is not None:
                session.abandon()
        self.pending = []
        if self.structures.current is not None:
            self.structures.current.failed = True  # stop following tensors; ended at root exit
            if where == ROOT_NAME:
                self.structures.end()
        self.errors.warn_once(where, error)


def session_record(session: StepSession) -> SessionRecord:
    """A finished `session` as the plain data the sink takes: its lists and tables
    referenced, not copied (a few attribute reads on the sampled step)."""
    counter = session.activations
    activations = None
    if counter is not None:
        activations = ActivationCounts(counter.bytes_by_invocation, counter.curve)
    return SessionRecord(
        step=session.step,
        clock=session.clock,
        invocations=session.invocations,
        nodes=session.nodes,
        recomputes=session.recomputes,
        activations=activations,
        gc=GcCharges(session.gc.charged),
        ref_stamp=session.ref_stamp,
        bwd_started=session.bwd_started,
        bwd_t_begin=session.bwd_t_begin,
        bwd_t_end=session.bwd_t_end,
        forward_thread=session.forward_thread,
        device_memory=session.memory is not None,
        cold_start=session.cold_start,
        phase_stamps=session.phase_stamps,
    )
