"""Module hooks for one model, routed to the step session being captured.

The root module always carries one forward pre-hook and one forward hook (cheap: a counter and
a few attribute reads). Every other module gets hooks only while a sampled step is being
captured (`watch`), or for the whole `with profile(...)` block; modules without hooks take
`nn.Module._call_impl`'s fast path. Process-global module hooks are never used.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from wandb_modprof._errors import ModProfError
from wandb_modprof._warn import warn_safely
from wandb_modprof.capture import autograd_private as ap
from wandb_modprof.capture import registry as _registry
from wandb_modprof.capture.callstack import call_depth
from wandb_modprof.capture.clock import Clock, CpuClock, EventClock
from wandb_modprof.capture.device_memory import AcceleratorMemory, DeviceMemory
from wandb_modprof.capture.nvtx import NvtxRanges, check_available
from wandb_modprof.capture.options import Options, Timing
from wandb_modprof.capture.session import StepSession
from wandb_modprof.capture.static_memory import (
    ROOT_NAME,
    ModelIndex,
    build_index,
    gradient_state,
    static_memory,
)
from wandb_modprof.capture.structure_pass import StructurePass, prepare, structure_pass_active
from wandb_modprof.capture.wrappers import type_name
from wandb_modprof.records.calls import call_signature

if TYPE_CHECKING:
    from wandb_modprof.capture.static_memory import PendingGradientState, StaticMemory
    from wandb_modprof.records.calls import Structure

_MAX_PENDING = 4
MAX_STRUCTURES = 8  # distinct call sequences captured; beyond that the graph stops growing
MAX_PASSES = 2 * MAX_STRUCTURES  # structure passes started, failed ones included
# Modules with an inference fast path that `has_torch_function` (true under our dataflow mode)
# turns off: a structure pass on their eval forward would change its numerics.
_FASTPATH_TYPES = (
    nn.MultiheadAttention,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
    nn.TransformerEncoder,
)


class _Hook:
    """A module hook that copies as an inert no-op.

    `copy.deepcopy(model)` (EMA, SWA's AveragedModel) and `torch.save(model)` copy a module's
    hook dicts. Bound methods would drag the whole capture (and its lock) along and fail; a
    copy of a watched model is simply not watched.
    """

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., None] | None) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> None:
        if self.fn is not None:
            self.fn(*args)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Hook:
        return _INERT_HOOK

    def __reduce__(self) -> tuple[Callable[[], _Hook], tuple[()]]:
        return _inert_hook, ()


_INERT_HOOK = _Hook(None)


def _inert_hook() -> _Hook:
    return _INERT_HOOK


def model_device(model: nn.Module) -> torch.device:
    for param in model.parameters():
        return param.device
    for buffer in model.buffers():
        return buffer.device
    return torch.device("cpu")


def make_clock(options: Options, device: torch.device) -> Clock:
    """Host clock on CPU; device events on accelerators (events of the device that holds the
    model's first parameter: a model spread over several devices is timed on that one)."""
    if options.timing is Timing.CPU or (options.timing is Timing.AUTO and device.type == "cpu"):
        return CpuClock()
    try:
        return EventClock(device)
    except RuntimeError as error:
        raise ModProfError(
            f"timing='device' needs a model on an accelerator with timing events; the model's "
            f"parameters are on {device} ({error}). Use timing='auto' or 'cpu'."
        ) from None


class SampleSink(Protocol):
    """Where the capture hands its output: finished step sessions (resolved later, off the
    sampled step) and structure passes. `stats.accumulator.ProfileAccumulator` is one; the
    capture never imports it (the statistics stage sits above this one)."""

    def add(
        self,
        session: StepSession,
        gradients: PendingGradientState | None,
        static_fn: Callable[[set[str]], Mapping[str, StaticMemory]],
    ) -> None: ...

    def add_structure(self, structure: Structure) -> None: ...

    def has_structure(self, signature: str) -> bool: ...

    def num_structures(self) -> int: ...

    def resolve_pending(self, force: bool) -> None: ...


class Capture:
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
        self.model = model
        self.options = options
        self.optimizer = optimizer
        self._should_sample = should_sample
        self._structure_eligible = structure_eligible
        self._structure_due = options.structure
        self._structure: StructurePass | None = None
        self._stale_structures: list[StructurePass] = []  # their modes await popping
        self._warned_structures = False
        self._structure_passes = 0
        self._fastpath: tuple[ModelIndex, bool] | None = None
        if options.structure:
            prepare()
        if options.nvtx:
            check_available()
        self._lazy_children = hooks_only_when_sampling
        device = model_device(model)
        self.clock = make_clock(options, device)
        self.memory: DeviceMemory | None = None
        if options.device_memory and device.type != "cpu":
            self.memory = AcceleratorMemory(device)
        self.sink = sink
        self._root_handles: list[RemovableHandle] = []
        self._child_handles: list[RemovableHandle] = []
        self._names: dict[int, tuple[str, str]] = {}
        self._index: ModelIndex | None = None
        self._hooked_index: ModelIndex | None = None
        self.owner: object = None  # the WatchHandle / ProfileBlock: alive as long as the hooks
        self._forward: StepSession | None = None
        self._sessions: list[StepSession] = []
        self._stale_sessions: list[StepSession] = []  # their saved-tensor hooks await popping
        self._root_depth = 0  # nesting of root calls (a root may call itself)
        # `watch`'s W&B logging: called outside the autograd engine, at the next root forward
        # after a sample finished; returns False to be asked again on a later step.
        self.after_sample: Callable[[], bool] | None = None
        self._sample_done = False
        self._deliver_fn: Callable[[], None] = self._deliver
        self._warned = False
        self.attached = False

    # ---- attach / detach ---------------------------------------------------------------
    def attach(self) -> None:
        self._root_handles = [
            self.model.register_forward_pre_hook(_Hook(self._root_pre), with_kwargs=True),
            self.model.register_forward_hook(
                _Hook(self._root_post), with_kwargs=True, always_call=True
            ),
        ]
        self.attached = True
        if not self._lazy_children:
            self._attach_children()

    def detach(self) -> None:
        """Remove every hook; samples whose backward never came are dropped."""
        for handle in self._root_handles:
            handle.remove()
        self._root_handles = []
        self._detach_children()
        if self._forward is not None:  # interrupted mid-forward (KeyboardInterrupt)
            self._end_failed_forward(self._forward)
            self._forward = None
        if self._structure is not None:
            self._end_structure()
        self._stale_structures = [s for s in self._stale_structures if not s.pop_modes()]
        for session in self._sessions:
            session.abandon()
        self._sessions = []
        self.attached = False
        self.sink.resolve_pending(force=True)

    def index(self) -> ModelIndex:
        """Modules, parameters and static bytes; rebuilt only when the model changed."""
        if self._index is None or not self._index.current(self.model):
            self._index = build_index(self.model)
            self._names = {
                mid: (name, type_name(m)) for mid, (name, m) in self._index.modules.items()
            }
        return self._index

    def _attach_children(self) -> None:
        if self._child_handles:
            return
        index = self._index if self._index is not None else self.index()
        self._hooked_index = index
        for _, module in index.modules.values():
            if module is self.model:
                continue
            self._child_handles.append(
                module.register_forward_pre_hook(_Hook(self._pre), with_kwargs=True)
            )
            self._child_handles.append(
                module.register_forward_hook(_Hook(self._post), with_kwargs=True, always_call=True)
            )

    def _detach_children(self) -> None:
        for handle in self._child_handles:
            handle.remove()
        self._child_handles = []

    def _maybe_detach_children(self) -> None:
        if not self._lazy_children or self._forward is not None or self._structure is not None:
            return
        # Keep hooks while a sampled backward may still run (a checkpoint recompute needs
        # them), unless a newer forward began first: then the step is not hook-free otherwise.
        if any(not s.closed and (s.bwd_started or not s.superseded) for s in self._sessions):
            return
        self._detach_children()

    # ---- hooks -------------------------------------------------------------------------
    def _root_pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        try:
            # The unsampled path: a counter, a few attribute reads and one C call.
            if ap.in_backward():
                self._pre(module, args, kwargs)  # a checkpoint recompute of the root
                return
            if self._root_depth:
                if call_depth(module) > 1:  # the root calls itself: one step, not several
                    self._root_depth += 1
                    if self._forward is not None or self._structure is not None:
                        self._pre(module, args, kwargs)
                    return
                self._recover_interrupted()
            self._root_depth = 1
            if self._sample_done:
                self._deliver_fn()
            if self._stale_sessions:
                self._stale_sessions = [
                    s for s in self._stale_sessions if not s.pop_saved_tensors_hooks()
                ]
            if self._sessions:
                self._drop_stale_sessions()
                for pending in self._sessions:
                    pending.superseded = True
            if self._stale_structures:
                self._stale_structures = [s for s in self._stale_structures if not s.pop_modes()]
            step = self._should_sample(module)
            if self._structure_due and self._structure_can_start(module):
                # A structure pass is never timed: this step's sample (if it was one) is skipped.
                self._start_structure(module, args, kwargs)
                return
            if step is None:
                if self._child_handles:
                    self._maybe_detach_children()
                return
            if structure_pass_active():
                return  # another model's structure pass runs through this forward: not timed
            self._start(step)
        except Exception as error:
            self._internal_error(ROOT_NAME, error)

    def _root_post(self, module: nn.Module, args: Any, kwargs: Any, result: Any) -> None:
        session = self._forward
        try:
            if ap.in_backward():
                self._post(module, args, kwargs, result)  # a checkpoint recompute of the root
                return
            self._root_depth = max(0, self._root_depth - 1)
            if self._structure is not None:
                self._structure_exit(module, result)
                return
            if session is None:
                return
            session.exit(id(module), result)
            if not session.forward_done:
                return  # the root was re-entered; its outer call is still open
            self._forward = None
            if not session.closed:
                self._sessions.append(session)
                self._check_structure(session)
            self._maybe_detach_children()
        except Exception as error:
            self._forward = None
            if session is not None:
                self._end_failed_forward(session)
            self._internal_error(ROOT_NAME, error)
            self._maybe_detach_children()

    # ---- structure pass ----------------------------------------------------------------
    def _structure_can_start(self, module: nn.Module) -> bool:
        if not self._structure_eligible(module):
            return False
        if torch.compiler.is_compiling():
            # The root's hooks run inside compiled code (`model.compile()`): no modes there.
            self._structure_due = False
            self._warn_structure("the model runs inside torch.compile; it has no structure pass")
            return False
        if structure_pass_active():
            return False  # another model's pass is running: ours on a later step
        return module.training or not self._has_fastpath_modules()

    def _disturb_other_timed_forwards(self) -> None:
        """A pass about to run inside another model's timed forward spoils that sample."""
        for owner in _registry.owners():
            capture = getattr(owner, "_capture", None)
            if capture is not None and capture is not self and capture._forward is not None:
                capture._forward.disturbed = True

    def _has_fastpath_modules(self) -> bool:
        index = self.index()
        if self._fastpath is None or self._fastpath[0] is not index:
            found = any(isinstance(m, _FASTPATH_TYPES) for _, m in index.modules.values())
            self._fastpath = (index, found)
        return self._fastpath[1]

    def _start_structure(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        self._structure_due = False
        self._structure_passes += 1
        index = self.index()
        if self._child_handles and self._hooked_index is not index:
            self._detach_children()
        self._attach_children()
        self._disturb_other_timed_forwards()
        structure = StructurePass(module, training=module.training)
        self._structure = structure
        try:
            structure.push_modes()
            name, module_type = self._names.get(id(module), (ROOT_NAME, type(module).__name__))
            structure.enter(module, name, module_type, args, kwargs)
        except BaseException:
            self._end_structure()  # pops what was pushed, takes the child hooks off again
            self._rearm_structure()
            raise

    def _structure_exit(self, module: nn.Module, result: Any) -> None:
        structure = self._structure
        assert structure is not None
        raised = sys.exc_info()[1]
        if raised is not None and raised is not structure.exception_at_start:
            # The forward raised (always-call hooks run on exceptions): a partial graph is
            # not kept; a later step tries again.
            self._end_structure()
            self._rearm_structure()
            return
        structure.exit(module, result)
        if not structure.forward_done and not structure.failed:
            return  # the root was re-entered; its outer call is still open
        self._end_structure()
        if structure.failed:
            self._rearm_structure()
            error = structure.error or RuntimeError("forward hooks fired out of order")
            self._warn_once("<structure pass>", error)
            return
        self.sink.add_structure(structure.finish())

    def _end_structure(self) -> None:
        structure, self._structure = self._structure, None
        if structure is not None and not structure.pop_modes():
            self._stale_structures.append(structure)  # someone's mode is on top of ours
        self._maybe_detach_children()

    def _rearm_structure(self) -> None:
        """After a failed pass: the next timed sample finds its call sequence unknown and asks
        for another pass (`_check_structure`), so failing passes alternate with samples and
        stop after `MAX_PASSES`."""
        if self._structure_passes >= MAX_PASSES:
            self._warn_structure(f"{MAX_PASSES} structure passes failed or were cut short")

    def _check_structure(self, session: StepSession) -> None:
        """A timed step whose call sequence was never captured asks for a structure pass."""
        if not self.options.structure or self._structure_due:
            return
        signature = call_signature((inv.name, inv.call_index) for inv in session.invocations)
        if self.sink.has_structure(signature):
            return
        if self.sink.num_structures() < MAX_STRUCTURES and self._structure_passes < MAX_PASSES:
            self._structure_due = True
        else:
            self._warn_structure(
                f"the model called more than {MAX_STRUCTURES} different sequences of modules"
            )

    def _warn_structure(self, why: str) -> None:
        if self._warned_structures:
            return
        self._warned_structures = True
        warn_safely(
            f"wandb_modprof: {why}; the graph shows the structures captured so far (module "
            "statistics still cover every module, drawn without edges where no pass saw them).",
            RuntimeWarning,
            stacklevel=5,
        )

    def _end_failed_forward(self, session: StepSession) -> None:
        session.end_forward_after_error()
        if session._act_ctx is not None:  # someone else's hooks were on top: pop ours later
            self._stale_sessions.append(session)

    def _recover_interrupted(self) -> None:
        """A forward ended without our root exit hook: `Module._call_impl` runs always-call
        hooks on `Exception` only, so a KeyboardInterrupt or SystemExit skips them."""
        self._root_depth = 0
        if self._structure is not None:
            self._end_structure()
            self._rearm_structure()
        session, self._forward = self._forward, None
        if session is not None:
            self._end_failed_forward(session)
        self._maybe_detach_children()

    def _pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        try:
            if ap.in_backward():
                running = self._backward_session()
                if running is not None:
                    running.recompute_enter(id(module))
                return
            if self._structure is not None:
                name, module_type = self._names.get(id(module), ("?", type(module).__name__))
                self._structure.enter(module, name, module_type, args, kwargs)
                return
            session = self._forward
            if session is None:
                return
            name, module_type = self._names.get(id(module), ("?", type(module).__name__))
            session.enter(id(module), name, module_type)
        except Exception as error:
            self._internal_error(self._name(module), error)

    def _post(self, module: nn.Module, args: Any, kwargs: Any, result: Any) -> None:
        try:
            if ap.in_backward():
                running = self._backward_session()
                if running is not None:
                    running.recompute_exit(id(module), result)
                return
            if self._structure is not None:
                self._structure.exit(module, result)
                return
            session = self._forward
            if session is not None:
                session.exit(id(module), result)
        except Exception as error:
            self._internal_error(self._name(module), error)

    # ---- sessions ----------------------------------------------------------------------
    def _start(self, step: int) -> None:
        index = self.index()  # the one model walk per sample: later stages reuse it
        if self._child_handles and self._hooked_index is not index:
            self._detach_children()  # modules were added or replaced since they were hooked
        self._attach_children()
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
        )
        self._forward = session
        name, module_type = self._names.get(id(self.model), (ROOT_NAME, type_name(self.model)))
        session.enter(id(self.model), name, module_type)

    def set_after_sample(self, fn: Callable[[], bool]) -> None:
        self.after_sample = fn
        if "torch._dynamo" in sys.modules:
            # A root compiled in place (`model.compile()`, which imports dynamo) runs its hooks
            # inside compiled code: a disabled function runs eagerly there, after a graph
            # break. Not applied otherwise: it would import dynamo (~1 s). (disable is untyped.)
            self._deliver_fn = torch.compiler.disable(self._deliver)  # type: ignore[no-untyped-call]

    def _deliver(self) -> None:
        """Hand finished samples to `after_sample`, unless this forward is being compiled,
        runs a structure pass or runs inside another watched model's timed forward (its time
        would include ours): then on a later step."""
        if torch.compiler.is_compiling() or structure_pass_active():
            return
        for owner in _registry.owners():
            capture = getattr(owner, "_capture", None)
            if capture is not None and capture is not self and capture._forward is not None:
                return
        assert self.after_sample is not None
        # Cleared first: a sample finishing meanwhile on another thread (a device backward)
        # sets it again instead of being overwritten.
        self._sample_done = False
        if not self.after_sample():
            self._sample_done = True

    def _backward_session(self) -> StepSession | None:
        for session in self._sessions:
            if session.bwd_started and not session.closed:
                return session
        return None

    def _drop_stale_sessions(self) -> None:
        # A backward that started but never finished (it raised) will not finish now.
        for session in self._sessions:
            if session.bwd_started and not session.closed:
                session.abandon()  # its backward raised: it will never finish
        self._sessions = [s for s in self._sessions if not s.closed]
        # Forwards whose backward never came (or not yet) are kept a little while: with
        # `loss = f(a) + f(b)` the backward of a sampled `f(a)` runs after `f(b)`.
        while len(self._sessions) > _MAX_PENDING:
            self._sessions.pop(0).abandon()

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
            self.sink.add(
                session,
                gradients,
                functools.partial(static_memory, index, optimizer=self.optimizer),
            )
            self._sample_done = self.after_sample is not None
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
        self._warn_once(where, error)
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
        if self._structure is not None:
            self._structure.failed = True  # stop following tensors; ended at the root's exit
            if where == ROOT_NAME:
                self._end_structure()
        self._warn_once(where, error)

    def _warn_once(self, where: str, error: Exception) -> None:
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
