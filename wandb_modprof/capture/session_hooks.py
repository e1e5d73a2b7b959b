"""The hooks that feed a sampled step's session: its start, the submodules' hook bodies, its
end and its errors.

The root's entry starts the session (`_start`: the model index, the submodules' hooks, a
`session.StepSession`); every submodule's hook body then routes its call to whichever is
listening (a checkpoint recompute of a running backward, a structure pass, or the timed
forward); when the session's backward ends the gradients are read, before the optimizer or
`zero_grad` runs (their norms to be divided by a GradScaler's loss scale), and the session
goes to the sink (`_on_finish`). An internal error drops the sample, warns once and never
breaks training (`_internal_error`).

The base class of `root_hooks.RootHooks` (whose root hooks decide which steps are sampled),
itself the base of `hooks.Capture`: the hook bodies read the capture's state in one attribute
read, as before this was split from `hooks.py`.
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
from wandb_modprof.capture.memory.static_memory import ROOT_NAME, StaticReader
from wandb_modprof.capture.model.wrappers import type_name
from wandb_modprof.capture.options import Options
from wandb_modprof.capture.session import StepSession
from wandb_modprof.capture.sink import SampleSink
from wandb_modprof.capture.step import gc_pause
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.step.clock import Clock
from wandb_modprof.capture.step_queue import backward_running
from wandb_modprof.capture.structure.step_dataflow import StepDataflow
from wandb_modprof.capture.submodule_hooks import SubmoduleHooks


class SessionHooks(SubmoduleHooks):
    """The step sessions of `hooks.Capture`: started, fed by the submodules' hooks, handed to
    the sink (the session's `on_finish`), dropped on an internal error (its `on_error`).

    The attributes declared below without a value are the capture's, set by its `__init__`."""

    options: Options
    optimizer: torch.optim.Optimizer | None
    clock: Clock
    memory: DeviceMemory | None
    loss_scales: LossScaleWatch | None  # the GradScaler's scale in the gradients (norms on)
    sink: SampleSink
    after_sample: Callable[[], bool] | None  # `watch`'s W&B logging (`set_after_sample`)
    sample_due: bool  # a sample finished: hand it over at the next root forward
    _stale_sessions: list[StepSession]  # their saved-tensor hooks await popping
    _cold_step: bool  # the step now starting is the model's first in this process
    _warned: bool  # an internal error was warned of (once per capture)

    # ---- the submodules' hook bodies -----------------------------------------------------
    def _pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        self.clock.own_enter()  # first and last: the whole body is our time (clock.CpuClock)
        try:
            if tp.in_backward():
                running = backward_running(self._sessions)
                if running is not None:
                    running.recompute_enter(id(module), input_shapes(args, kwargs))
                return
            structure = self.structures.current
            if structure is not None:
                name, module_type = self.label(module, "?")
                structure.enter(module, name, module_type, args, kwargs)
                return
            session = self._forward
            if session is None:
                return
            name, module_type = self._names.get(id(module), ("?", type(module).__name__))
            session.enter(id(module), name, module_type, module, args, kwargs)
        except Exception as error:
            self._internal_error(self._name(module), error)
        finally:
            self.clock.own_leave()

    def _post(self, module: nn.Module, args: Any, kwargs: Any, result: Any) -> None:
        self.clock.own_enter()
        try:
            if tp.in_backward():
                running = backward_running(self._sessions)
                if running is not None:
                    running.recompute_exit(id(module), result)
                return
            structure = self.structures.current
            if structure is not None:
                structure.exit(module, result)
                return
            session = self._forward
            if session is not None:
                session.exit(id(module), result)
        except Exception as error:
            self._internal_error(self._name(module), error)
        finally:
            self.clock.own_leave_call()  # this call's hook dispatch, both hooks, is ours too

    # ---- sessions ----------------------------------------------------------------------
    def _start(self, step: int, module: nn.Module, args: Any, kwargs: Any, derive: bool) -> None:
        # The collector held off from here, before the model walk and the hooks' attachment
        # (each makes many objects), until the root's own window holds it (`gc_pause`).
        gc_pause.hold(id(self))
        try:
            self._start_held(step, module, args, kwargs, derive)
        finally:
            gc_pause.release(id(self))

    def _start_held(
        self, step: int, module: nn.Module, args: Any, kwargs: Any, derive: bool
    ) -> None:
        index = self.index()  # the one model walk per sample: later stages reuse it
        if not under_compile():  # (under a compile wrapper: hooks there would be traced)
            self.hook_children(index)
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
        session.cold_start = self._cold_step
        self._forward = session
        name, module_type = self._names.get(id(self.model), (ROOT_NAME, type_name(self.model)))
        session.enter(id(self.model), name, module_type, module, args, kwargs)

    def _end_failed_forward(self, session: StepSession) -> None:
        session.end_forward_after_error()
        if session.saved_hooks_pushed:  # someone else's hooks were on top: pop ours later
            self._stale_sessions.append(session)

    def _on_finish(self, session: StepSession) -> None:
        """End of a sampled backward: read gradients before the optimizer or zero_grad runs."""
        try:
            if session.disturbed:
                return
            index = self._index
            assert index is not None  # built by _start
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
            self.sink.add(session, gradients, StaticReader(index, self.optimizer))
            self.sample_due = self.after_sample is not None
        except Exception as error:
            self._internal_error(ROOT_NAME, error)
        finally:
            if session in self._sessions:
                self._sessions.remove(session)
            self._maybe_detach_children()

    # ---- errors ------------------------------------------------------------------------
    def _name(self, module: nn.Module) -> str:
        return self._names.get(id(module), (type(module).__name__, ""))[0]

    def _session_error(self, where: str, error: Exception) -> None:
        self.warn_once(where, error)
        # Failed during its backward: nothing needs the step's module hooks any more. (Never
        # detach during a forward: `_call_impl` may be iterating a hook dict.)
        self._sessions = [s for s in self._sessions if not s.closed]
        if self._forward is None:
            self._maybe_detach_children()

    def _internal_error(self, where: str, error: Exception) -> None:
        """Never let measurement break training: warn once, drop the sample, carry on."""
        for session in [self._forward, *self._sessions]:
            if session is not None:
                session.abandon()
        self._sessions = []
        if self.structures.current is not None:
            self.structures.current.failed = True  # stop following tensors; ended at root exit
            if where == ROOT_NAME:
                self.structures.end()
        self.warn_once(where, error)

    def warn_once(self, where: str, error: Exception) -> None:
        if self._warned:
            return
        self._warned = True
        warn_safely(
            f"wandb_modprof: internal error while measuring module '{where}' "
            f"({type(error).__name__}: {error}). This sample is dropped; training continues "
            "and later steps are still sampled. Please report this with the model class.",
            RuntimeWarning,
            stacklevel=3,
        )
