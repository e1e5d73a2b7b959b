"""torch.compile'd code in a watched model: where the compiled regions are, the user's names
under the `torch.compile(module)` wrapper, and hooks that stay outside compiled code.

Three styles, all measured at the boundary of each compiled region (hooks inside one would be
traced by Dynamo: graph breaks and recompiles):

- `torch.compile(module)` gives an `OptimizedModule` wrapper whose own hooks run eagerly
  (Dynamo picks up the frame of the inner module's forward); the inner model is `_orig_mod`,
  whose name and class are the user's.
- `module.compile()` compiles the module's `_call_impl` in place, module hooks included: a
  module hook there runs inside compiled code. Its boundary is taken instead by wrapping the
  instance's `_compiled_call_impl` (what `nn.Module.__call__` calls), which runs eagerly
  around the compiled function.
- per-block compile is either of these on each block.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from torch import nn

from wandb_modprof.capture.inert_hook import InertHook, skip_hook_frames
from wandb_modprof.capture.model.scripted import ScriptedHandle, is_scripted
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.records.calls import CallInfo

ORIG = "_orig_mod"  # OptimizedModule's attribute holding the user's module

PreHook = Callable[[nn.Module, Any, Any], object]  # (the root's: `root_hooks.ForwardFrame`)
PostHook = Callable[[nn.Module, Any, Any, Any], None]


def is_compiled_wrapper(module: nn.Module) -> bool:
    # By name: an isinstance check would import Dynamo (about 1 s).
    return type(module).__name__ == "OptimizedModule" and hasattr(module, ORIG)


def compiled_in_place(module: nn.Module) -> bool:
    """`module.compile()` ran: its calls (hooks included) run compiled."""
    return module.__dict__.get("_compiled_call_impl") is not None


def unwrapped(module: nn.Module) -> nn.Module:
    """The user's module under any number of `torch.compile(...)` wrappers."""
    while is_compiled_wrapper(module):
        module = getattr(module, ORIG)
    return module


def user_name(name: str) -> str:
    """A qualified name with the wrappers' `_orig_mod` parts taken out."""
    return ".".join(part for part in name.split(".") if part != ORIG)


def eager_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(user's name, module) for every module that runs in the model's forward, compiled
    regions included, each once: a wrapper stands for its `_orig_mod` (one call, one name)."""
    root = unwrapped(model)
    scripted: list[str] = []  # a TorchScript module's submodules run inside it, unseen
    for name, module in root.named_modules():
        parts = name.split(".") if name else []
        if parts and parts[-1] == ORIG:
            continue  # called through its wrapper, which has this name already
        if any(name.startswith(p + ".") for p in scripted):
            continue
        if name and is_scripted(module):
            scripted.append(name)
        yield user_name(name), module


def region_roots(eager: nn.Module) -> set[str]:
    """The user's names of the modules below `eager` whose call is one compiled region: a
    `torch.compile` wrapper (per-block style, `model.layers[i] = torch.compile(b)`) or a
    module compiled in place (`b.compile()`). The root's own compiled state is the caller's
    to know (the watched model may be a wrapper, or run under one it cannot see)."""
    return {
        name
        for name, module in eager_modules(eager)
        if module is not eager and (is_compiled_wrapper(module) or compiled_in_place(module))
    }


def mark_regions(calls: Iterable[CallInfo], roots: set[str]) -> tuple[CallInfo, ...]:
    """`calls` with `compiled_region` set: a call of a module named in `roots` is a region's
    root (its own key) unless it lies in a region already, and every call below a root gets
    the root's key. Only the outermost region counts: its boundary is where the hooks are
    (`static_memory.hookable_modules` hooks nothing inside it), a region compiled within it
    is traced into the outer one's graph."""
    calls = tuple(calls)
    by_key = {c.key: c for c in calls}
    region: dict[str, str | None] = {}

    def of(call: CallInfo) -> str | None:
        if call.key not in region:
            # parents before children: walk up first (iteratively: deep models nest far)
            chain = [call]
            seen = {call.key}  # (a cycle of parents cannot come from one forward; no hang)
            while (up := chain[-1].parent_key) in by_key and up not in region and up not in seen:
                chain.append(by_key[up])
                seen.add(up)
            for c in reversed(chain):
                above = region.get(c.parent_key) if c.parent_key is not None else None
                if above is None and c.module_name in roots:
                    above = c.key
                region[c.key] = above
        return region[call.key]

    # Built from the fields (`dataclasses.replace` costs 8 us a call, this 5); calls outside
    # every region are kept as they are. About 10 us a call in all (25,000 calls: 0.25 s, on a
    # shared 2-core machine), once per graph, outside every timed window.
    out = []
    for c in calls:
        key = of(c)
        out.append(c if key is None else CallInfo(**{**vars(c), "compiled_region": key}))
    return tuple(out)


# ---- hooks at the boundary of a module compiled in place -----------------------------------
class _Boundary:
    """Stands in for a module's `_compiled_call_impl`: our hooks run eagerly around the
    compiled call. Copies (deepcopy of the model: EMA, SWA) get the compiled call alone."""

    __slots__ = ("compiled", "module_ref", "post", "pre")

    def __init__(
        self, module: nn.Module, compiled: Callable[..., Any], pre: PreHook, post: PostHook
    ) -> None:
        self.compiled = compiled
        self.module_ref = weakref.ref(module)  # no cycle through the module's own __dict__
        self.pre = pre
        self.post = post

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module_ref()
        if module is None:  # (cannot happen while the module is being called)
            return self.compiled(*args, **kwargs)
        window = self.pre(module, args, kwargs)  # noqa: F841  (kept for the call: `ForwardFrame`)
        try:
            result = self.compiled(*args, **kwargs)
        except BaseException:
            # As nn.Module's always-call hooks, and here also for a KeyboardInterrupt: the
            # windows of ours this forward opened end before it unwinds.
            self.post(module, args, kwargs, None)
            raise
        self.post(module, args, kwargs, result)
        return result

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return copy.deepcopy(self.compiled, memo)

    def __reduce__(self) -> Any:
        return self.compiled.__reduce__()


# The frames that call a module compiled in place, and their local naming it (`call_depth`).
BOUNDARY_CALL = (_Boundary.__call__.__code__, "module")


class BoundaryHandle:
    """Like a `RemovableHandle`: `remove()` puts the compiled call back (once; only if it is
    still ours, so a later `module.compile()` by the user is kept)."""

    def __init__(self, module: nn.Module, boundary: _Boundary) -> None:
        self.module: nn.Module | None = module
        self.boundary = boundary

    def remove(self) -> None:
        module, self.module = self.module, None
        if module is not None and module.__dict__.get("_compiled_call_impl") is self.boundary:
            module.__dict__["_compiled_call_impl"] = self.boundary.compiled


def hook_compiled_boundary(module: nn.Module, pre: PreHook, post: PostHook) -> BoundaryHandle:
    """Our pre / post hooks around a module compiled in place, outside its compiled code."""
    compiled = module.__dict__["_compiled_call_impl"]
    boundary = _Boundary(module, compiled, pre, post)
    # Straight into __dict__: nn.Module.__setattr__ would do the same for a plain callable,
    # with more checks on a hot path.
    module.__dict__["_compiled_call_impl"] = boundary
    return BoundaryHandle(module, boundary)


class Removable(Protocol):
    def remove(self) -> None: ...


def hook_calls(module: nn.Module, pre: PreHook, post: PostHook) -> list[Removable]:
    """Our forward pre-hook and always-call forward hook on `module`: as module hooks, or
    around the compiled call of a module compiled in place (where module hooks would run
    inside compiled code)."""
    if tp.dynamo_loaded():  # a compiled wrapper around the model runs our hooks untraced
        skip_hook_frames(tp.dynamo_frame_api)
    if compiled_in_place(module):
        return [hook_compiled_boundary(module, pre, post)]
    if is_scripted(module):
        return [ScriptedHandle(module, pre, post)]  # refuses module hooks: `scripted.py`
    return [
        module.register_forward_pre_hook(InertHook(pre), with_kwargs=True),
        module.register_forward_hook(InertHook(post), with_kwargs=True, always_call=True),
    ]
