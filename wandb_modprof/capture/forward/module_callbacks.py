"""The engine of `on_module` (`api.callbacks`): run callbacks when a module's forward or backward
starts and ends, e.g. to start and stop `torch.profiler`, `torch.cuda.profiler`, an NVTX range
or a memory snapshot around exactly that module's backward.

Here the handle and the forward: a forward pre-hook and hook on the module fire the forward
events and read the autograd sequence counter around each call; as the call returns, its
autograd nodes are handed to a `callback_backward.BackwardTracker`, which finds where the
call's backward starts and ends (the method is described there). Every callback runs so that
it never breaks training: an error in it, or in our hooks, warns once and is dropped.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn

from wandb_modprof._warn import warn_safely
from wandb_modprof.capture.forward.callback_backward import BackwardTracker
from wandb_modprof.capture.forward.callback_state import PHASES, Callback, ModuleEvent, Phase
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
        self._events = _Events(type(module).__name__, callbacks)
        self._calls = 0
        self._removed = False
        self._local = threading.local()  # per-thread stack of open forward calls
        self._backward = BackwardTracker(self._events.fire, self._events.internal_error)
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
        self._backward.remove()

    def __enter__(self) -> ModuleCallbacks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        given = ", ".join(p for p in PHASES if self._events.callbacks[p] is not None)
        calls = f"{self._calls} call" + ("" if self._calls == 1 else "s")
        state = ", removed" if self._removed else ""
        return f"ModuleCallbacks({self._events.module_type}: {given}; {calls}{state})"

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
        self._events.fire("forward_start", call)
        try:
            # Read after the callback, so that nodes it creates are not taken for the module's.
            self._stack().append((call, tp.sequence_nr()))
        except Exception as error:
            self._events.internal_error("forward pre-hook", error)

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
                self._backward.hook(module, call, seq0, tp.sequence_nr(), result)
            except Exception as error:
                self._events.internal_error("forward hook", error)
        self._events.fire("forward_end", call)


class _Events:
    """The callbacks of one `ModuleCallbacks`, run so that they never break training: an error
    in a callback, or in our hooks (`internal_error`), warns once per place and is dropped.
    Also held by its `BackwardTracker`, which fires the backward events."""

    def __init__(self, module_type: str, callbacks: dict[Phase, Callback | None]) -> None:
        self.module_type = module_type
        self.callbacks = callbacks
        self._warned: set[str] = set()

    def fire(self, phase: Phase, call: int) -> None:
        fn = self.callbacks[phase]
        if fn is None:
            return
        try:
            fn(ModuleEvent(phase, call, self.module_type))
        except Exception as error:
            self._warn_once(
                phase,
                f"the {phase} callback raised {type(error).__name__}: {error}. "
                "The error is ignored and training continues",
            )

    def internal_error(self, where: str, error: Exception) -> None:
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
            f"wandb_modprof.on_module({self.module_type}): {what} (warned once).",
            RuntimeWarning,
            stacklevel=3,
        )
