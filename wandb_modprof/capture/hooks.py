"""Module hooks for one model, routed to the step session being captured.

The root module always carries one forward pre-hook and one forward hook (cheap: a counter and
a few attribute reads). Every other module gets hooks only while a sampled step is being
captured (`watch`), or for the whole `with profile(...)` block; modules without hooks take
`nn.Module._call_impl`'s fast path (which submodules carry hooks, and when: the base class,
`submodule_hooks.SubmoduleHooks`). Process-global module hooks are used only for TorchScript
submodules, and only while they are hooked (`model/scripted.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

import torch
from torch import nn

from wandb_modprof._warn import warn_safely
from wandb_modprof.capture.backward import native_build
from wandb_modprof.capture.backward.nvtx import NvtxRanges, check_available
from wandb_modprof.capture.delivery import delivery
from wandb_modprof.capture.forward.callstack import call_depth
from wandb_modprof.capture.forward.invocation import input_shapes
from wandb_modprof.capture.inert_hook import under_compile
from wandb_modprof.capture.memory.device_memory import AcceleratorMemory, DeviceMemory
from wandb_modprof.capture.memory.gradient_readings import gradient_state
from wandb_modprof.capture.memory.static_memory import ROOT_NAME, StaticReader
from wandb_modprof.capture.model.compiled import Removable, hook_calls
from wandb_modprof.capture.model.transforms import refuse_meta_model
from wandb_modprof.capture.model.wrappers import type_name
from wandb_modprof.capture.options import Options
from wandb_modprof.capture.session import StepSession
from wandb_modprof.capture.sink import SampleSink
from wandb_modprof.capture.step import autograd_private as ap
from wandb_modprof.capture.step import gc_pause, hook_cost
from wandb_modprof.capture.step import registry as _registry
from wandb_modprof.capture.step.clock import CpuClock, make_clock, model_device
from wandb_modprof.capture.step.warmup import after_warmup
from wandb_modprof.capture.step_queue import backward_running, prune_sessions
from wandb_modprof.capture.structure.step_dataflow import StepDataflow
from wandb_modprof.capture.structure.structure_driver import StructureDriver
from wandb_modprof.capture.structure.structure_pass import structure_pass_active
from wandb_modprof.capture.submodule_hooks import SubmoduleHooks

_MAX_PENDING = 4


class Capture(SubmoduleHooks):
    """Installs and removes hooks; creates a `StepSession` per sampled root forward and hands
    it, once its backward ended, to `sink`."""

    def __init__(
        self,
        model: nn.Module,
        options: Options,
        optimizer: torch.optim.Optimizer | None,
        should_sample: Callable[[nn.Module], int | None],
        hooks_only_when_sampling: bool,
        structure_eligible: Callable[[nn.Module], bool] = lambda module: True,
        *,
        sink: SampleSink,
    ) -> None:
        ap.check()
        super().__init__(model, hooks_only_when_sampling)  # (`submodule_hooks`)
        self.options = options
        self.optimizer = optimizer
        self._should_sample = after_warmup(should_sample, options.warmup)
        if options.nvtx:
            check_available()
        device = model_device(model)
        refuse_meta_model(type_name(model), device)  # (an ensemble's base)
        self.clock = make_clock(options, device)
        if isinstance(self.clock, CpuClock):
            self.clock.cost = hook_cost.measured()
            native_build.start()  # the compiled node hooks: loaded, or built in the background
        self.memory: DeviceMemory | None = None
        if options.device_memory and device.type != "cpu":
            self.memory = AcceleratorMemory(device)
        self.sink = sink
        self.structures = StructureDriver(
            self, sink, options.structure, structure_eligible, (options.peak_flops, options.peak_bw)
        )
        self._root_handles: list[Removable] = []
        self.owner: object = None  # the WatchHandle / ProfileBlock: alive as long as the hooks
        self._forward: StepSession | None = None
        self._sessions: list[StepSession] = []
        self._stale_sessions: list[StepSession] = []  # their saved-tensor hooks await popping
        self._root_depth = 0  # nesting of root calls (a root may call itself)
        # `watch`'s W&B logging: called outside the autograd engine, at the next root forward
        # after a sample finished; returns False to be asked again on a later step.
        self.after_sample: Callable[[], bool] | None = None
        self.sample_due = False  # a sample finished: hand it over at the next root forward
        self._deliver_fn: Callable[[], None] = lambda: None
        self._warned = False
        self.attached = False
        # The first step's sample is the model's first step in this process when nothing says
        # the model ran before (`registry.cold_model`); `warmup=` steps run untimed instead.
        self._cold = not options.warmup and _registry.cold_model(model)
        self._cold_step = False  # the step now starting is that first step
        self._first_steps = 2  # counts down over the first two steps, then never read again
        # the root hooks' own seconds so far, read with the clock inside them: the floor of
        # `watch` that every step pays (`api.overhead`)
        self.root_hook_s = 0.0

    # ---- attach / detach ---------------------------------------------------------------
    def attach(self) -> None:
        # (around the compiled call for a root compiled in place: `compiled.hook_calls`)
        self._root_handles = hook_calls(self.model, self._root_pre, self._root_post)
        self.attached = True
        _registry.attach_capture(self)
        if not self._lazy_children:
            self._attach_children()

    def detach(self) -> None:
        """Remove every hook; samples whose backward never came are dropped."""
        for handle in self._root_handles:
            handle.remove()
        self._root_handles = []
        self._detach_children()
        self._children = None  # (its hooks hold the capture's bound methods)
        if self._forward is not None:  # interrupted mid-forward (KeyboardInterrupt)
            self._end_failed_forward(self._forward)
            self._forward = None
        if self.structures.current is not None:
            self.structures.end()
        self.structures.between_steps()
        for session in self._sessions:
            session.abandon()
        self._sessions = []
        self.attached = False
        _registry.detach_capture(self)
        self.sink.resolve_pending(force=True)

    # ---- hooks -------------------------------------------------------------------------
    def _root_pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        start = perf_counter()
        try:
            # The unsampled path: a counter, a few attribute reads and one C call.
            if ap.in_backward():
                self._pre(module, args, kwargs)  # a checkpoint recompute of the root
                return
            if self._root_depth:
                if call_depth(module) > 1:  # the root calls itself: one step, not several
                    self._root_depth += 1
                    if self._forward is not None or self.structures.current is not None:
                        self._pre(module, args, kwargs)
                    return
                self._recover_interrupted()
            self._root_depth = 1
            self._index_checked = False
            if self._first_steps:  # (later steps: one attribute read)
                self._first_steps -= 1
                self._cold_step = self._cold and self._first_steps == 1
                _registry.stepped(self.model)
            if gc_pause.holding():  # a sampled window left without its end (a failed backward)
                gc_pause.release_all()
            if self.sample_due:
                self._deliver_fn()
            if self._stale_sessions:
                self._stale_sessions = [
                    s for s in self._stale_sessions if not s.pop_saved_tensors_hooks()
                ]
            if self._sessions:
                self._sessions = prune_sessions(self._sessions, _MAX_PENDING)
                for pending in self._sessions:
                    pending.superseded = True
            if self.structures.stale or self.structures.backward is not None:
                self.structures.between_steps()
            step = self._should_sample(module)
            if (step is not None or self.structures.due) and ap.functorch_active():
                self._skip_transformed_step()  # (a step, counted, but not measured)
                return
            # A model with compiled code: its graph is traced on fake tensors, before this step.
            if self.structures.due:  # (an unsampled step with no graph due: attribute reads)
                self.structures.before_step(module, args, kwargs)
            # A sampled step while no graph was captured yet derives the graph from its own
            # forward (`step_dataflow`): one forward + backward gives the whole profile.
            derive = step is not None and self.structures.derive_from_sample()
            if not derive and self.structures.due and self.structures.can_start(module):
                # A structure pass is never timed: this step's sample (if it was one) is skipped.
                self.structures.start(module, args, kwargs)
                return
            if step is None:
                if self.children_hooked:
                    self._maybe_detach_children()
                return
            if structure_pass_active():
                return  # another model's structure pass runs through this forward: not timed
            self._start(step, module, args, kwargs, derive)
        except Exception as error:
            self._internal_error(ROOT_NAME, error)
        finally:
            self.root_hook_s += perf_counter() - start

    def _root_post(self, module: nn.Module, args: Any, kwargs: Any, result: Any) -> None:
        start = perf_counter()
        session = self._forward
        try:
            if ap.in_backward():
                self._post(module, args, kwargs, result)  # a checkpoint recompute of the root
                return
            self._root_depth = max(0, self._root_depth - 1)
            if self.structures.current is not None:
                self._exit_pass(module, result)
                return
            if session is None:
                return
            if self._materialised_now():
                session.failed = True  # dropped quietly at the root's exit, as below
            session.exit(id(module), result)
            if not session.forward_done:
                return  # the root was re-entered; its outer call is still open
            self._forward = None
            if session.structure is not None:
                self.structures.add_derived(session.structure)
            elif session.structure_error is not None:
                self.structures.derive_failed = True  # the next step's pass draws the graph
                self.warn_once("<module graph>", session.structure_error)
            if not session.closed:
                self._sessions.append(session)
                self.structures.check(session)
            self._maybe_detach_children()
        except Exception as error:
            self._forward = None
            if session is not None:
                self._end_failed_forward(session)
            self._internal_error(ROOT_NAME, error)
            self._maybe_detach_children()
        finally:
            # the model may change between forwards; within this one (the graph check above
            # included) one walk of it sufficed
            self._index_checked = False
            self.root_hook_s += perf_counter() - start

    def _end_failed_forward(self, session: StepSession) -> None:
        session.end_forward_after_error()
        if session.saved_hooks_pushed:  # someone else's hooks were on top: pop ours later
            self._stale_sessions.append(session)

    def _recover_interrupted(self) -> None:
        """A forward ended without our root exit hook: `Module._call_impl` runs always-call
        hooks on `Exception` only, so a KeyboardInterrupt or SystemExit skips them."""
        self._root_depth = 0
        if self.structures.current is not None:  # (the driver's warning counts these frames)
            self.structures.end()
            self.structures.rearm()
        session, self._forward = self._forward, None
        if session is not None:
            self._end_failed_forward(session)
        self._maybe_detach_children()

    def _pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        self.clock.own_enter()  # first and last: the whole body is our time (clock.CpuClock)
        try:
            if ap.in_backward():
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
            if ap.in_backward():
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
        if self.options.activations and not ap.saved_tensors_hooks_active():
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

    def set_after_sample(self, fn: Callable[[], bool]) -> None:
        self.after_sample = fn
        self._deliver_fn = delivery(self, fn)

    def _on_finish(self, session: StepSession) -> None:
        """End of a sampled backward: read gradients before the optimizer or zero_grad runs."""
        try:
            if session.disturbed:
                return
            index = self._index
            assert index is not None  # built by _start
            if session.bwd_started:
                names = {inv.name for inv in session.invocations}
                gradients = gradient_state(index, names, self.options.norms)
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
