"""Measure what our hooks cost outside their bodies (`clock.HookCost`), once per process.

`CpuClock` keeps the time inside our hook bodies out of every window. What it cannot see is the
interpreter's work to reach them: a module with hooks leaves `Module._call_impl`'s fast path
(hook dicts, kwargs, always-call bookkeeping, the `InertHook` frame, the call into our bound
method and back), every tensor autograd saves calls from C++ into our pack hook, and the
autograd engine calls into our node hooks (the gradients wrapped as Python objects). That work
runs inside the windows of all open calls, which the unobserved model does not have.

Measured here with the same machinery the capture installs (`InertHook` around bound methods
whose body brackets a stamp with `own_enter` / `own_leave`, registered with the same flags), as
(hooked - plain - bodies) per call, each side the fastest of several batches: interference only
adds time, so the fastest batch is the closest to the work itself. About 5 ms, once per process,
on the first capture with a host clock that starts while nothing global watches module calls:
under global module hooks (MemTracker, ModTracker), a torch function or dispatch mode, or a
running torch.profiler our calibration modules would be seen (MemTracker refuses a root called
twice; a user's trace would show them). Then nothing is run and that capture takes nothing
out (`HookCost()`, today's behaviour before this correction); a later capture measures.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
from torch import nn

from wandb_modprof.capture.inert_hook import InertHook
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.step.clock import CpuClock, HookCost
from wandb_modprof.capture.step.random_state import keeping

_CALLS = 64  # hooked calls per batch
_BATCHES = 9


class _Leaf(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class _Chain(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.leaves = nn.ModuleList(_Leaf() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for leaf in self.leaves:
            x = leaf(x)
        return x


class _Bodies:
    """Hook bodies shaped as ours: the ledger around a stamp."""

    def __init__(self, clock: CpuClock) -> None:
        self.clock = clock
        self.last = 0

    def pre(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        self.clock.own_enter()
        try:
            self.last = self.clock.stamp()
        finally:
            self.clock.own_leave()

    def post(self, module: nn.Module, args: Any, kwargs: Any, result: Any) -> None:
        self.clock.own_enter()
        try:
            self.last = self.clock.stamp()
        finally:
            self.clock.own_leave()

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.clock.own_enter()
        try:
            return tensor
        finally:
            self.clock.own_leave()


def _fastest_extra(run: Any, clock: CpuClock) -> int:
    """The fastest batch's wall time less our bodies' time in it (ns)."""
    run()  # warm: first calls pay for caches and lazy init
    best = None
    for _ in range(_BATCHES):
        own0 = clock.own_at(0)
        t0 = time.perf_counter_ns()
        run()
        t1 = time.perf_counter_ns()
        extra = (t1 - t0) - (clock.own_at(0) - own0)
        best = extra if best is None else min(best, extra)
    assert best is not None
    return best


def _call_ns() -> int:
    clock = CpuClock()
    bodies = _Bodies(clock)
    chain = _Chain(_CALLS)
    x = torch.zeros(1)
    plain = _fastest_extra(lambda: chain(x), clock)
    for leaf in chain.leaves:
        leaf.register_forward_pre_hook(InertHook(bodies.pre), with_kwargs=True)
        leaf.register_forward_hook(InertHook(bodies.post), with_kwargs=True, always_call=True)
    hooked = _fastest_extra(lambda: chain(x), clock)
    return max(0, (hooked - plain) // _CALLS)


class _NodeBody:
    """A node hook shaped as ours (`backward.node_stamps._NodeHook`): a stamp in the ledger."""

    def __init__(self, clock: CpuClock) -> None:
        self.clock = clock

    def __call__(self, grads: Any, grad_outputs: Any = None) -> None:
        self.clock.own_enter()
        try:
            self.clock.stamp()
        finally:
            self.clock.own_leave()


def _chain_loss() -> tuple[torch.Tensor, list[Any]]:
    """A graph of `_CALLS` multiplications and its nodes."""
    a = torch.ones(1, requires_grad=True)
    x = a
    for _ in range(_CALLS):
        x = x * 1.0
    nodes, node = [], x.grad_fn
    while node is not None and node.next_functions:
        nodes.append(node)
        node = node.next_functions[0][0]
    return x.sum(), nodes


def _node_ns() -> int:
    """Per node hook call: the engine's call into Python and back (the grads wrapped as
    tensors, the lock taken), outside the body."""
    clock = CpuClock()
    body = _NodeBody(clock)
    best: dict[bool, int] = {}
    with torch.enable_grad():
        for hooked in (False, True, False, True):  # (the first of each: warm)
            for _ in range(_BATCHES):
                loss, nodes = _chain_loss()
                if hooked:
                    for node in nodes:
                        node.register_prehook(body)
                        node.register_hook(body)
                own0 = clock.own_at(0)
                t0 = time.perf_counter_ns()
                torch.autograd.backward(loss)
                extra = time.perf_counter_ns() - t0 - (clock.own_at(0) - own0)
                best[hooked] = min(best.get(hooked, extra), extra)
    return max(0, (best[True] - best[False]) // (2 * _CALLS))


def _pack_ns() -> int:
    clock = CpuClock()
    bodies = _Bodies(clock)
    a = torch.ones(1, requires_grad=True)
    b = torch.ones(1, requires_grad=True)

    def muls() -> None:
        for _ in range(_CALLS):
            a * b  # saves both inputs

    with torch.enable_grad():
        plain = _fastest_extra(muls, clock)
        with torch.autograd.graph.saved_tensors_hooks(bodies.pack, lambda t: t):
            hooked = _fastest_extra(muls, clock)
    return max(0, (hooked - plain) // (2 * _CALLS))


def _observed() -> bool:
    """Something global would see (or change) our calibration's module calls and ops."""
    return tp.module_calls_observed()


@functools.cache
@keeping("the hook cost's calibration")
def _measure() -> HookCost:
    return HookCost(call_ns=_call_ns(), pack_ns=_pack_ns(), node_ns=_node_ns())


def measured() -> HookCost:
    """This process's hook cost (measured once, when nothing global is watching)."""
    if _measure.cache_info().currsize == 0 and _observed():
        return HookCost()
    return _measure()
