"""Which submodules of a watched model carry our hooks, and when; the model index they follow.

The root always carries its hooks (`hooks.Capture`). The other modules get theirs only while
something needs them: a sampled step, a structure pass, a sampled backward that may still run
a checkpoint recompute (`watch`), or the whole `with profile(...)` block. Unhooked modules
take `nn.Module._call_impl`'s fast path, and every hook added raises the recursion limit by
the frames it costs (`step.stack_room`).

Two ways the model's steps escape the index: a forward that materialises lazy modules (its
sample or structure pass is dropped; `_materialised_now`), and a step run under a `torch.func`
transform (not measured, warned once; `_skip_transformed_step`, `model/transforms.py`).

A base class of `hooks.Capture` (through `session_hooks.SessionHooks`), not an object it holds:
the hook bodies read `_names` and `_forward` in one attribute read, as before this was split
from `hooks.py`. It is also the side of the capture the structure driver sees
(`structure_driver.HookOwner`, with `warn_once`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from wandb_modprof._warn import warn_at_user
from wandb_modprof.capture.inert_hook import skip_hook_frames
from wandb_modprof.capture.memory.static_memory import ModelIndex, build_index
from wandb_modprof.capture.model.compiled import Removable, hook_calls
from wandb_modprof.capture.model.wrappers import type_name
from wandb_modprof.capture.step import stack_room
from wandb_modprof.capture.step import torch_private as tp

if TYPE_CHECKING:
    from wandb_modprof.capture.session import StepSession
    from wandb_modprof.capture.structure.structure_driver import StructureDriver


class SubmoduleHooks:
    """The hooks on a model's submodules and the index of its modules, for `hooks.Capture`.

    The attributes declared below without a value are the capture's, set by its `__init__`;
    `_pre` / `_post` are its hook bodies."""

    _root_depth: int  # nesting of root calls: the index is checked once per root forward
    _forward: StepSession | None
    _sessions: list[StepSession]
    structures: StructureDriver

    def __init__(self, model: nn.Module, hooks_only_when_sampling: bool) -> None:
        self.model = model
        self._lazy_children = hooks_only_when_sampling
        # our hooks on the submodules of `_hooked_index`; on them while `_children_on`
        self._children: ChildHooks | None = None
        self._children_on = False
        self._extra_frames = 0  # the recursion-limit raise hooks on `_hooked_index` need
        self._names: dict[int, tuple[str, str]] = {}
        self._index: ModelIndex | None = None
        self._hooked_index: ModelIndex | None = None
        self._index_checked = False  # `_index` matched the model in the forward running now
        # steps that were to be measured but ran under a torch.func transform: not measured
        self.transformed_steps = 0

    def _pre(self, module: nn.Module, args: object, kwargs: object) -> None:
        raise NotImplementedError  # Capture's forward pre-hook of every submodule

    def _post(self, module: nn.Module, args: object, kwargs: object, result: object) -> None:
        raise NotImplementedError  # Capture's forward hook of every submodule

    def index(self) -> ModelIndex:
        """Modules, parameters and static bytes; rebuilt only when the model changed."""
        # Checked once per root forward (the graph check and the sample's start both ask;
        # each check walks every module and tensor of the model).
        if self._index is None or not (self._index_checked or self._index.current(self.model)):
            self._index = build_index(self.model)
            self._names = {
                mid: (name, type_name(m)) for mid, (name, m) in self._index.modules.items()
            }
        self._index_checked = self._root_depth > 0  # valid until this forward's root returns
        return self._index

    def _materialised_now(self) -> bool:
        """The forward ending now (the root's outermost call) materialised lazy parameters or
        buffers (`nn.LazyLinear` and other `LazyModuleMixin` modules, at their first forward):
        its sample timed their initialisation and saw them without the bytes, gradients and
        norms they have from then on, and a structure pass saw their initialisation's work. So
        either is dropped, quietly; the next step measures them (its index counts them)."""
        index = self._index
        return (
            self._root_depth == 0
            and index is not None
            and index.lazy
            and not index.current(self.model)
        )

    def _exit_pass(self, module: nn.Module, result: object) -> None:
        """The root's exit during a structure pass. A pass whose forward materialised lazy
        modules is ended without keeping anything and not counted against the passes' limit:
        the next step where a pass may run runs another."""
        if not self._materialised_now():
            self.structures.exit(module, result)
            return
        self.structures.end()
        self.structures.spent -= 1
        self.structures.due = self.structures.enabled

    def _skip_transformed_step(self) -> None:
        """A sampled step (or one due for a structure pass) called under a `torch.func`
        transform (`vmap`, `grad`, ...: `transforms`): counted, neither measured nor a pass
        (one stays due); the first one warns."""
        self.transformed_steps += 1
        if self.transformed_steps == 1:
            warn_at_user(under_transform_text(type_name(self.model)), UserWarning)
        if self._children_on:
            self._maybe_detach_children()

    def _attach_children(self) -> None:
        if self._children_on:
            return
        index = self._index if self._index is not None else self.index()
        if self._children is not None and self._hooked_index is index:
            self._children.restore(self._pre, self._post)  # as they were: no registering
        else:
            self._hooked_index = index
            modules = (m for _, m in index.modules.values() if m is not self.model)
            self._children = ChildHooks(modules, self._pre, self._post)
            self._extra_frames = stack_room.extra_frames(n for n, _ in index.modules.values())
        stack_room.claim(self, self._extra_frames)
        self._children_on = True

    def hook_children(self, index: ModelIndex) -> None:
        """Hooks on every submodule of `index` (re-hooked if modules were added or replaced
        since they were hooked)."""
        if self._children_on and self._hooked_index is not index:
            self._detach_children()
        self._attach_children()

    @property
    def children_hooked(self) -> bool:
        return self._children_on

    def release_children(self) -> None:
        """Take the submodules' hooks off if nothing needs them any more (see below)."""
        self._maybe_detach_children()

    def label(self, module: nn.Module, default_name: str) -> tuple[str, str]:
        """The module's qualified name and type name (as the index knows them)."""
        return self._names.get(id(module), (default_name, type(module).__name__))

    @property
    def timed_forward(self) -> StepSession | None:
        """The step session of the timed forward now running, if any."""
        return self._forward

    def _detach_children(self) -> None:
        if self._children is not None and self._children_on:
            self._children.remove()
        self._children_on = False
        stack_room.release(self)

    def _maybe_detach_children(self) -> None:
        if (
            not self._lazy_children
            or self._forward is not None
            or self.structures.current is not None
        ):
            return
        # Keep hooks while a sampled backward may still run (a checkpoint recompute needs
        # them), unless a newer forward began first: then the step is not hook-free otherwise.
        if any(not s.closed and (s.bwd_started or not s.superseded) for s in self._sessions):
            return
        self._detach_children()


def under_transform_text(model_type: str) -> str:
    """The warning given once per watch or profile block when a step that was to be measured
    ran under a `torch.func` transform (`capture/model/transforms.py`)."""
    return (
        f"wandb_modprof: {model_type} was called under torch.func transforms (vmap, grad, "
        "jacrev, jvp, functionalize), e.g. a torch.func.stack_module_state ensemble or "
        "per-sample gradients; calls under these transforms are not profiled: they run on "
        "functorch's wrapper tensors, which have no storage to measure and no autograd graph of "
        "their own. Those steps are not sampled; calls of the model outside a transform "
        "(torch.func.functional_call on its own included) are profiled as usual."
    )


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
