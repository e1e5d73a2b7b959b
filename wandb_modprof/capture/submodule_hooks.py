"""Which submodules of a watched model carry the capture's hooks, and when; the model index
they follow.

The root always carries its hooks (`root_hooks.RootHooks`). The other modules get theirs only
while something needs them: a sampled step, a structure pass, a sampled backward that may still
run a checkpoint recompute (`watch`), or the whole `with profile(...)` block. Unhooked modules
take `nn.Module._call_impl`'s fast path, and every hook added raises the recursion limit by the
frames it costs (`step.stack_room`).

A forward that materialises lazy modules escapes the index: `materialised_now` tells the root
hooks, which drop that step's sample or structure pass.

`SubmoduleHooks` owns the index, the submodules' names and their hooks. The hook bodies are the
step sessions' (`session_hooks.SessionHooks.pre` / `post`), connected once by `hooks.Capture`
(`connect`), with the sessions' answer to "does anything still need the hooks?" (`busy`). The
structure driver sees it as its `HookOwner`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from wandb_modprof.capture.inert_hook import skip_hook_frames
from wandb_modprof.capture.memory.static_memory import ModelIndex, build_index
from wandb_modprof.capture.model.compiled import Removable, hook_calls
from wandb_modprof.capture.model.wrappers import type_name
from wandb_modprof.capture.step import stack_room
from wandb_modprof.capture.step import torch_private as tp

PreBody = Callable[[nn.Module, Any, Any], None]
PostBody = Callable[[nn.Module, Any, Any, Any], None]


def _never_busy() -> bool:
    return False


class SubmoduleHooks:
    """The hooks on a model's submodules and the index of its modules."""

    def __init__(self, model: nn.Module, hooks_only_when_sampling: bool) -> None:
        self.model = model
        self._lazy_children = hooks_only_when_sampling
        self._pre_body: PreBody | None = None  # the sessions' hook bodies (`connect`)
        self._post_body: PostBody | None = None
        self._busy: Callable[[], bool] = _never_busy
        # our hooks on the submodules of `_hooked_index`; on them while `_children_on`
        self._children: ChildHooks | None = None
        self._children_on = False
        self._extra_frames = 0  # the recursion-limit raise hooks on `_hooked_index` need
        # module id -> (qualified name, type name): read by every hook body of a sampled step
        self.names: dict[int, tuple[str, str]] = {}
        self._index: ModelIndex | None = None
        self._hooked_index: ModelIndex | None = None
        self._in_forward = False  # a root forward of the model is running
        self._index_checked = False  # `_index` matched the model in the forward running now

    def connect(self, pre: PreBody, post: PostBody, busy: Callable[[], bool]) -> None:
        """The hook bodies every hooked submodule calls, and whether a step still needs them
        (a forward, a pass, a backward that may recompute)."""
        self._pre_body, self._post_body, self._busy = pre, post, busy

    def forward_began(self) -> None:
        """A root forward starts: the next `index()` walks the model once for it."""
        self._in_forward = True
        self._index_checked = False

    def forward_left(self, still_inside: bool) -> None:
        """A root call returned (`still_inside`: an outer call of a root calling itself is
        still running); the model may change before the next forward."""
        self._in_forward = still_inside
        self._index_checked = False

    def index(self) -> ModelIndex:
        """Modules, parameters and static bytes; rebuilt only when the model changed."""
        # Checked once per root forward (the graph check and the sample's start both ask;
        # each check walks every module and tensor of the model).
        if self._index is None or not (self._index_checked or self._index.current(self.model)):
            self._index = build_index(self.model)
            self.names = {
                mid: (name, type_name(m)) for mid, (name, m) in self._index.modules.items()
            }
        self._index_checked = self._in_forward  # valid until this forward's root returns
        return self._index

    @property
    def built_index(self) -> ModelIndex | None:
        """The index as last built (a sampled step's: `index()` ran at its start)."""
        return self._index

    def materialised_now(self) -> bool:
        """The forward ending now materialised lazy parameters or buffers (`nn.LazyLinear` and
        other `LazyModuleMixin` modules, at their first forward): its sample timed their
        initialisation and saw them without the bytes, gradients and norms they have from then
        on, and a structure pass saw their initialisation's work. So either is dropped,
        quietly; the next step measures them (its index counts them)."""
        index = self._index
        return index is not None and index.lazy and not index.current(self.model)

    def attach_unless_lazy(self) -> None:
        """At attach: hooks on every submodule for good (`profile`), unless they come and go
        with samples (`watch`)."""
        if not self._lazy_children:
            self.attach_children()

    def attach_children(self) -> None:
        if self._children_on:
            return
        assert self._pre_body is not None and self._post_body is not None  # (`connect`)
        index = self._index if self._index is not None else self.index()
        if self._children is not None and self._hooked_index is index:
            self._children.restore(self._pre_body, self._post_body)  # as they were
        else:
            self._hooked_index = index
            modules = (m for _, m in index.modules.values() if m is not self.model)
            self._children = ChildHooks(modules, self._pre_body, self._post_body)
            self._extra_frames = stack_room.extra_frames(n for n, _ in index.modules.values())
        stack_room.claim(self, self._extra_frames)
        self._children_on = True

    def hook_children(self, index: ModelIndex) -> None:
        """Hooks on every submodule of `index` (re-hooked if modules were added or replaced
        since they were hooked)."""
        if self._children_on and self._hooked_index is not index:
            self.detach_children()
        self.attach_children()

    @property
    def children_hooked(self) -> bool:
        return self._children_on

    def release_children(self) -> None:
        """Take the submodules' hooks off, if they come and go with samples (`watch`) and no
        step needs them any more (`busy`)."""
        if self._lazy_children and self._children_on and not self._busy():
            self.detach_children()

    def label(self, module: nn.Module, default_name: str) -> tuple[str, str]:
        """The module's qualified name and type name (as the index knows them)."""
        return self.names.get(id(module), (default_name, type(module).__name__))

    def detach_children(self) -> None:
        if self._children is not None and self._children_on:
            self._children.remove()
        self._children_on = False
        stack_room.release(self)

    def drop(self) -> None:
        """Every hook off, and nothing kept that holds the hook bodies (at detach)."""
        self.detach_children()
        self._children = None


# A module's hook dicts, by the attribute `nn.Module.__init__` keeps each in.
_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


class ChildHooks:
    """Our hooks on a set of submodules, registered once and then put into and taken out of
    the modules' hook dicts by key, as they were: on a 10,000-module model, registering and
    removing 20,000 hooks with their handles at every sample cost 80-120 ms of the training
    thread; putting the entries back costs a tenth of that.

    Only torch's own module hooks move this way (each handle's key and dicts, found by identity
    among the module's hook dicts, so that a module whose dicts were swapped is hooked anew);
    any other handle (around a compiled call, a scripted module) is removed and registered
    again each time."""

    __slots__ = ("_entries", "_others")

    def __init__(self, modules: Iterable[nn.Module], pre: Any, post: Any) -> None:
        # (a module's __dict__, the hook dict's attribute, key, value) per entry of ours
        self._entries: list[tuple[dict[str, Any], str, int, Any]] = []
        self._others: list[tuple[nn.Module, list[Removable]]] = []
        for module in modules:
            handles = hook_calls(module, pre, post)
            if not self._take(module, handles):
                self._others.append((module, handles))

    def _take(self, module: nn.Module, handles: list[Removable]) -> bool:
        """Record where `handles` put their entries (False: not torch's module hooks)."""
        owner = vars(module)
        attrs = {id(owner.get(a)): a for a in _HOOK_DICTS}
        found: list[tuple[dict[str, Any], str, int, Any]] = []
        for handle in handles:
            if type(handle) is not RemovableHandle:
                return False
            for ref in (handle.hooks_dict_ref, *handle.extra_dict_ref):
                hooks = ref()
                attr = attrs.get(id(hooks))
                if hooks is None or attr is None or handle.id not in hooks:
                    return False
                found.append((owner, attr, handle.id, hooks[handle.id]))
        self._entries += found
        return True

    def remove(self) -> None:
        for owner, attr, key, _ in self._entries:
            owner[attr].pop(key, None)
        for _, handles in self._others:
            for handle in handles:
                handle.remove()

    def restore(self, pre: Any, post: Any) -> None:
        if tp.dynamo_loaded():
            skip_hook_frames(tp.dynamo_frame_api)  # (as `hook_calls` does: Dynamo imported since)
        for owner, attr, key, value in self._entries:
            owner[attr][key] = value
        self._others = [(m, hook_calls(m, pre, post)) for m, _ in self._others]
