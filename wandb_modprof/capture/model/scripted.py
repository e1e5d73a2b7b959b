"""TorchScript modules (`torch.jit.script(module)`) inside a watched model, measured as one call.

A `ScriptModule` refuses module hooks (`register_forward_pre_hook is not supported on
ScriptModules`), and what it calls runs inside the TorchScript interpreter, where no Python
hook reaches. Its call still goes through `nn.Module.__call__`, which runs the *global* module
hooks: while one of ours is hooked, one global pre-hook and one global always-call forward
hook (shared by every scripted module hooked, registered only while any is) call our hooks
for exactly those modules. Its submodules are not measured: their time is the scripted
module's own (self) time, its type reads "TorchScript <class>".

A global hook is on the slow path of every module call in the process, so it is there only
while the scripted modules are hooked (a sampled step, a structure pass), never on other steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module

from wandb_modprof.capture.inert_hook import InertHook

PreHook = Callable[[nn.Module, Any, Any], object]
PostHook = Callable[[nn.Module, Any, Any, Any], None]
_Entry = tuple[nn.Module, InertHook, InertHook]

# id(module) -> (module, pre, post) for each scripted module hooked now, and the global hooks'
# handles while there is any (several entries per module: one per capture hooking it)
_HOOKED: dict[int, list[_Entry]] = {}
_GLOBAL: list[Any] = []


def is_scripted(module: nn.Module) -> bool:
    """A TorchScript module (scripted or traced): no module hooks, no Python inside."""
    return isinstance(module, torch.jit.ScriptModule)


def scripted_type(module: nn.Module) -> str:
    """ "TorchScript Inner": the scripted class's own name, marked."""
    return f"TorchScript {getattr(module, 'original_name', type(module).__name__)}"


def _global_pre(module: nn.Module, args: Any) -> None:
    for target, pre, _ in _HOOKED.get(id(module), ()):
        if target is module:
            pre(module, args, {})  # (an InertHook: returns None, so the args are unchanged)


def _global_post(module: nn.Module, args: Any, result: Any) -> None:
    for target, _, post in _HOOKED.get(id(module), ()):
        if target is module:
            post(module, args, {}, result)


class ScriptedHandle:
    """Our hooks on one scripted module; `remove()` takes them off (and the global hooks
    with the last)."""

    def __init__(self, module: nn.Module, pre: PreHook, post: PostHook) -> None:
        self._entry: _Entry | None = (module, InertHook(pre), InertHook(post))
        _HOOKED.setdefault(id(module), []).append(self._entry)
        if not _GLOBAL:
            _GLOBAL.append(_module.register_module_forward_pre_hook(_global_pre))
            _GLOBAL.append(_module.register_module_forward_hook(_global_post, always_call=True))

    def remove(self) -> None:
        entry, self._entry = self._entry, None
        if entry is None:
            return
        key = id(entry[0])
        entries = [e for e in _HOOKED.get(key, ()) if e is not entry]
        if entries:
            _HOOKED[key] = entries
        else:
            _HOOKED.pop(key, None)
        if not _HOOKED:
            while _GLOBAL:
                _GLOBAL.pop().remove()
