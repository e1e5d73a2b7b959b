"""Which submodules of a watched model carry our hooks, and when; the model index they follow.

The root always carries its hooks (`hooks.Capture`). The other modules get theirs only while
something needs them: a sampled step, a structure pass, a sampled backward that may still run
a checkpoint recompute (`watch`), or the whole `with profile(...)` block. Unhooked modules
take `nn.Module._call_impl`'s fast path, and every hook added raises the recursion limit by
the frames it costs (`step.stack_room`).

The base class of `hooks.Capture`, not an object it holds: the hook bodies read `_names` and
`_forward` in one attribute read, as before this was split from `hooks.py`. It is also the
side of the capture the structure driver sees (`structure_driver.HookOwner`, with `warn_once`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from wandb_modprof.capture.memory.static_memory import ModelIndex, build_index
from wandb_modprof.capture.model.compiled import Removable, hook_calls
from wandb_modprof.capture.model.wrappers import type_name
from wandb_modprof.capture.step import stack_room

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
        self._child_handles: list[Removable] = []
        self._names: dict[int, tuple[str, str]] = {}
        self._index: ModelIndex | None = None
        self._hooked_index: ModelIndex | None = None
        self._index_checked = False  # `_index` matched the model in the forward running now

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

    def _attach_children(self) -> None:
        if self._child_handles:
            return
        index = self._index if self._index is not None else self.index()
        self._hooked_index = index
        stack_room.claim(self, stack_room.extra_frames(n for n, _ in index.modules.values()))
        for _, module in index.modules.values():
            if module is self.model:
                continue
            self._child_handles.extend(hook_calls(module, self._pre, self._post))

    def hook_children(self, index: ModelIndex) -> None:
        """Hooks on every submodule of `index` (re-hooked if modules were added or replaced
        since they were hooked)."""
        if self._child_handles and self._hooked_index is not index:
            self._detach_children()
        self._attach_children()

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
        for handle in self._child_handles:
            handle.remove()
        self._child_handles = []
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
