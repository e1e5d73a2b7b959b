"""The private autograd entry points the backward measurement relies on, in one place.

`torch._C` functions are not public API. Each one used by the package is looked up here, once,
so that a torch upgrade that renames or removes one fails loudly in `check()` (called by
`watch`/`profile`) and in `tests/capture/test_autograd_private.py`, instead of deep inside a hook.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from wandb_modprof._errors import ModProfError


def _lookup(owner: Any, attr: str) -> Any:
    return getattr(owner, attr, None)


_GET_SEQUENCE_NR = _lookup(torch._C._autograd, "_get_sequence_nr")
_CURRENT_GRAPH_TASK_ID = _lookup(torch._C, "_current_graph_task_id")
_TOP_SAVED_TENSORS_HOOKS = _lookup(torch._C._autograd, "_top_saved_tensors_default_hooks")
# Not required (a torch without it is taken to have no transform running): `check()` leaves
# it out, `tests/capture/test_autograd_private.py` pins it on the tested versions.
_PEEK_FUNCTORCH = _lookup(getattr(torch._C, "_functorch", None), "peek_interpreter_stack")


def check() -> None:
    """Raise `ModProfError` if this torch build lacks an entry point the profiler needs."""
    missing = [
        name
        for name, fn in (
            ("torch._C._autograd._get_sequence_nr", _GET_SEQUENCE_NR),
            ("torch._C._current_graph_task_id", _CURRENT_GRAPH_TASK_ID),
            ("torch._C._autograd._top_saved_tensors_default_hooks", _TOP_SAVED_TENSORS_HOOKS),
        )
        if fn is None
    ]
    if not hasattr(torch.autograd.Variable, "_execution_engine"):
        missing.append("torch.autograd.Variable._execution_engine.queue_callback")
    if missing:
        raise ModProfError(
            f"wandb_modprof needs autograd internals that torch {torch.__version__} does not "
            f"have: {', '.join(missing)}. Supported: torch 2.13 and later (tested: 2.13, 2.14)."
        )


def sequence_nr() -> int:
    """The next autograd sequence number on this thread.

    Every autograd node created from now on gets a number >= this one, so the nodes created
    between two reads are exactly those whose `node._sequence_nr()` lies in `[first, second)`.
    """
    value: int = _GET_SEQUENCE_NR()
    return value


def node_sequence_nr(node: Any) -> int:
    value: int = node._sequence_nr()
    return value


def in_backward() -> bool:
    """True while the autograd engine is running a backward on this thread.

    A module forward that runs now is an activation-checkpointing recompute, not a forward.
    """
    task_id: int = _CURRENT_GRAPH_TASK_ID()
    return task_id != -1


def top_saved_tensors_pack_hook() -> Any:
    """The pack hook of the innermost default saved-tensor hooks, or None."""
    top = _TOP_SAVED_TENSORS_HOOKS(False)
    return None if top is None else top[0]


def saved_tensors_hooks_active() -> bool:
    """True if someone (the user, `save_on_cpu`, a checkpoint) already installed default
    saved-tensor hooks: ours would shadow theirs and change what their code does."""
    return _TOP_SAVED_TENSORS_HOOKS(False) is not None


def queue_end_of_backward(callback: Callable[[], None]) -> None:
    """Run `callback` once the current backward (graph task) has finished.

    Must be called from inside a backward hook. The same engine API is what DDP and FSDP use
    to run their end-of-backward work.
    """
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def is_accumulate_grad(node: Any) -> bool:
    """The node that adds a leaf's gradient into `.grad` (it has no sequence number range)."""
    return type(node).__name__ == "AccumulateGrad"


# ---- used by `on_module` (`capture/forward/module_callbacks.py`) ---------------------------------
_CURRENT_AUTOGRAD_NODE = _lookup(torch._C, "_current_autograd_node")
_WILL_ENGINE_EXECUTE_NODE = _lookup(torch._C, "_will_engine_execute_node")


def check_node_callbacks() -> None:
    """Raise `ModProfError` if this torch build lacks what `on_module` needs beyond `check()`."""
    check()
    missing = [
        name
        for name, fn in (
            ("torch._C._current_autograd_node", _CURRENT_AUTOGRAD_NODE),
            ("torch._C._will_engine_execute_node", _WILL_ENGINE_EXECUTE_NODE),
        )
        if fn is None
    ]
    if missing:
        raise ModProfError(
            f"wandb_modprof.on_module needs autograd internals that torch {torch.__version__} "
            f"does not have: {', '.join(missing)}. Supported: torch 2.13 and later."
        )


def graph_task_id() -> int:
    """The id of the backward (graph task) running on this thread; -1 outside a backward."""
    task_id: int = _CURRENT_GRAPH_TASK_ID()
    return task_id


def current_autograd_node() -> Any:
    """The autograd node whose hooks are running on this thread (None outside a backward).

    Node hooks are not told which node they are on; this lets one hook look at the node's
    `next_functions` without the hook holding the node (which would keep its graph alive)."""
    return _CURRENT_AUTOGRAD_NODE()


def will_engine_execute_node(node: Any) -> bool:
    """True if the running backward will execute `node` (False for a node outside its graph or
    one that `torch.autograd.grad(..., inputs=...)` does not need).

    For a leaf's AccumulateGrad node that `torch.autograd.grad` captures, torch raises "A leaf
    node was passed to `_will_engine_execute_node`" (pytorch #131753). Such a node does not run
    (the gradient is returned, not accumulated), so the answer is False.
    """
    try:
        return bool(_WILL_ENGINE_EXECUTE_NODE(node))
    except RuntimeError:
        if is_accumulate_grad(node):
            return False
        raise


def functorch_active() -> bool:
    """True inside a `torch.func` transform (`vmap`, `grad`, `jvp`, `functionalize`): the
    forward then runs on wrapper tensors with no storage, which nothing here can measure
    (reading their storage raises), so such a forward is passed through unmeasured."""
    return _PEEK_FUNCTORCH is not None and _PEEK_FUNCTORCH() is not None


# ---- used by the structure pass's backward count (`capture/structure/backward_work.py`) --------
_PUSH_DISPATCH_MODE = _lookup(torch._C, "_push_on_torch_dispatch_stack")


def counts_backward() -> bool:
    """This torch has what counting a backward's ops per node needs (else it is not counted)."""
    return _PUSH_DISPATCH_MODE is not None and _CURRENT_AUTOGRAD_NODE is not None


def push_mode_for_this_node(mode: Any) -> None:
    """Push a `TorchDispatchMode` for the rest of the autograd node running now (from its
    pre-hook). The engine restores the thread's dispatch-mode stack after every node (a
    `ThreadLocalStateGuard` per node), so nothing pops it: it cannot outlive the node, even one
    that raises. `TorchDispatchMode.__enter__` is not used: the Python-level flags it sets would
    stay set after a node that raises, and code inside the node sees the model's own state."""
    _PUSH_DISPATCH_MODE(mode)
