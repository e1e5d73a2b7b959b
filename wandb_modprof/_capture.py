"""Module hooks for one model, routed to the step session being captured.

The root module always carries one forward pre-hook and one forward hook (cheap: a counter and
a few attribute reads). Every other module gets hooks only while a sampled step is being
captured (`watch`), or for the whole `with profile(...)` block; modules without hooks take
`nn.Module._call_impl`'s fast path. Process-global module hooks are never used.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from . import _autograd_private as ap
from ._clock import Clock, CpuClock, EventClock
from ._device_memory import AcceleratorMemory, DeviceMemory
from ._options import Options, Timing
from ._profile import Profile
from ._session import StepSession
from ._static_memory import gradient_state, static_memory
from ._storage import storage_keys

ROOT_NAME = "<root>"


def _is_compiled_wrapper(module: nn.Module) -> bool:
    # Avoid importing torch._dynamo (slow) just for an isinstance check.
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


def hookable_modules(model: nn.Module) -> dict[int, tuple[str, nn.Module]]:
    """id -> (qualified name, module) for every module we may hook.

    A `torch.compile`d module is measured at its boundary as one leaf: hooks inside a compiled
    region never fire (hooks added after compile) or force graph breaks. Modules compiled in
    place with `Module.compile()` run their hooks inside the compiled code, so they are not
    hooked at all (their time shows in the parent's self time).
    """
    out: dict[int, tuple[str, nn.Module]] = {}
    skip_prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name == p or name.startswith(p + ".") for p in skip_prefixes):
            continue
        if module is not model and getattr(module, "_compiled_call_impl", None) is not None:
            skip_prefixes.append(name)
            continue
        out[id(module)] = (name or ROOT_NAME, module)
        if _is_compiled_wrapper(module):
            skip_prefixes.append(name + "._orig_mod" if name else "_orig_mod")
    return out


def model_device(model: nn.Module) -> torch.device:
    for param in model.parameters():
        return param.device
    for buffer in model.buffers():
        return buffer.device
    return torch.device("cpu")


def make_clock(options: Options, device: torch.device) -> Clock:
    if options.timing is Timing.CPU or (options.timing is Timing.AUTO and device.type == "cpu"):
        return CpuClock()
    return EventClock(device)


class Capture:
    """Installs and removes hooks; creates a `StepSession` per sampled root forward."""

    def __init__(
        self,
        model: nn.Module,
        options: Options,
        optimizer: torch.optim.Optimizer | None,
        should_sample: Callable[[nn.Module], int | None],
        hooks_only_when_sampling: bool,
    ) -> None:
        ap.check()
        self.model = model
        self.options = options
        self.optimizer = optimizer
        self._should_sample = should_sample
        self._lazy_children = hooks_only_when_sampling
        device = model_device(model)
        self.clock = make_clock(options, device)
        self.memory: DeviceMemory | None = None
        if options.device_memory and device.type != "cpu":
            self.memory = AcceleratorMemory(device)
        self.profile = Profile(type(model).__name__)
        self._root_handles: list[RemovableHandle] = []
        self._child_handles: list[RemovableHandle] = []
        self._names: dict[int, tuple[str, str]] = {}
        self._forward: StepSession | None = None
        self._sessions: list[StepSession] = []
        self._warned = False
        self.attached = False

    # ---- attach / detach ---------------------------------------------------------------
    def attach(self) -> None:
        self._root_handles = [
            self.model.register_forward_pre_hook(self._root_pre, with_kwargs=True),
            self.model.register_forward_hook(self._root_post, with_kwargs=True, always_call=True),
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
        self._forward = None
        for session in self._sessions:
            session.abandon()
        self._sessions = []
        self.attached = False
        self.profile._resolve_pending(force=True)

    def _attach_children(self) -> None:
        if self._child_handles:
            return
        modules = hookable_modules(self.model)
        self._names = {mid: (name, type(m).__name__) for mid, (name, m) in modules.items()}
        for mid, (_, module) in modules.items():
            if module is self.model:
                continue
            self._child_handles.append(
                module.register_forward_pre_hook(self._pre, with_kwargs=True)
            )
            self._child_handles.append(
                module.register_forward_hook(self._post, with_kwargs=True, always_call=True)
            )
            del mid

    def _detach_children(self) -> None:
        for handle in self._child_handles:
            handle.remove()
        self._child_handles = []

    def _maybe_detach_children(self) -> None:
        if not self._lazy_children or self._forward is not None:
            return
        # Keep hooks while a sampled backward may still run a checkpoint recompute.
        if any(s.bwd_started and not s.closed for s in self._sessions):
            return
        self._detach_children()

    # ---- hooks -------------------------------------------------------------------------
    def _root_pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        try:
            # The unsampled path: a counter, two attribute reads and one C call.
            if self._forward is not None or ap.in_backward():
                self._pre(module, args, kwargs)  # recompute, or the root re-entered
                return
            if self._sessions:
                self._drop_stale_sessions()
            step = self._should_sample(module)
            if step is None:
                if self._child_handles:
                    self._maybe_detach_children()
                return
            self._start(step)
        except Exception as error:
            self._internal_error(ROOT_NAME, error)

    def _root_post(self, module: nn.Module, args: Any, kwargs: Any, result: Any) -> None:
        session = self._forward
        try:
            if ap.in_backward() or session is None:
                if session is None and not ap.in_backward():
                    return
                self._post(module, args, kwargs, result)
                return
            session.exit(id(module), result)
            if not session.forward_done:
                return  # the root was re-entered; its outer call is still open
            self._forward = None
            if not session.closed:
                self._sessions.append(session)
            self._maybe_detach_children()
        except Exception as error:
            self._forward = None
            self._internal_error(ROOT_NAME, error)

    def _pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        try:
            if ap.in_backward():
                running = self._backward_session()
                if running is not None:
                    running.recompute_enter(id(module))
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
            session = self._forward
            if session is not None:
                session.exit(id(module), result)
        except Exception as error:
            self._internal_error(self._name(module), error)

    # ---- sessions ----------------------------------------------------------------------
    def _start(self, step: int) -> None:
        self._attach_children()
        excluded = None
        if self.options.activations and not ap.saved_tensors_hooks_active():
            excluded = storage_keys(self.model.parameters()) | storage_keys(self.model.buffers())
        session = StepSession(
            step=step,
            clock=self.clock,
            memory=self.memory,
            excluded_storages=excluded,
            on_error=self._session_error,
            on_finish=self._on_finish,
        )
        self._forward = session
        name, module_type = self._names.get(id(self.model), (ROOT_NAME, type(self.model).__name__))
        session.enter(id(self.model), name, module_type)

    def _backward_session(self) -> StepSession | None:
        for session in self._sessions:
            if session.bwd_started and not session.closed:
                return session
        return None

    def _drop_stale_sessions(self) -> None:
        # A backward that started but never finished (it raised) will not finish now.
        self._sessions = [s for s in self._sessions if not s.closed and not s.bwd_started]

    def _on_finish(self, session: StepSession) -> None:
        """End of a sampled backward: read gradients before the optimizer or zero_grad runs."""
        try:
            modules = self._invoked_modules(session)
            gradients = gradient_state(modules, self.options.norms) if session.bwd_started else None
            self.profile._add(session, gradients, self._static_memory)
        except Exception as error:
            self._internal_error(ROOT_NAME, error)
        finally:
            if session in self._sessions:
                self._sessions.remove(session)
            self._maybe_detach_children()

    def _invoked_modules(self, session: StepSession) -> dict[str, nn.Module]:
        by_id = {mid: m for mid, (_, m) in hookable_modules(self.model).items()}
        out: dict[str, nn.Module] = {}
        for inv in session.invocations:
            module = by_id.get(inv.module_id)
            if module is not None:
                out[inv.name] = module
        return out

    def _static_memory(self, names: set[str]) -> dict[str, Any]:
        modules = {name: m for name, m in hookable_modules(self.model).values() if name in names}
        return static_memory(modules, self.optimizer)

    # ---- errors ------------------------------------------------------------------------
    def _name(self, module: nn.Module) -> str:
        return self._names.get(id(module), (type(module).__name__, ""))[0]

    def _session_error(self, where: str, error: Exception) -> None:
        self._warn_once(where, error)

    def _internal_error(self, where: str, error: Exception) -> None:
        """Never let measurement break training: warn once, drop the sample, carry on."""
        for session in [self._forward, *self._sessions]:
            if session is not None:
                session.abandon()
        self._sessions = []
        self._warn_once(where, error)

    def _warn_once(self, where: str, error: Exception) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"wandb_modprof: internal error while measuring module '{where}' "
            f"({type(error).__name__}: {error}). This sample is dropped; training continues "
            "and later steps are still sampled. Please report this with the model class.",
            RuntimeWarning,
            stacklevel=3,
        )
