"""Every private torch API wandb_modprof touches, in one place.

>>> from wandb_modprof.capture.step import torch_private as tp
>>> tp.check()  # at watch / profile: raises ModProfError naming the torch version and the APIs

Any torch release may rename or remove one. Each is named in a registry below and looked up
once, so that an upgrade fails in `check()` and `tests/capture/test_torch_private.py`, not
inside a hook. Private functions, classes and modules are reached only through this module (a
C function re-exported as it is: no Python frame on the hot paths); a private attribute of a
torch object (a tensor's `_version`, a module's `_buffers`) is read inline where it is used,
each one named in the registry. Limitation: `check()` leaves the `LAZY` entries (Dynamo: a
second to import; torch.distributed) to the code using them (it raises naming the API, or
degrades) and to the test.
"""

from __future__ import annotations

import functools
import importlib
import operator
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from wandb_modprof._errors import ModProfError
from wandb_modprof._lookup import NOT_FOUND, lookup_dotted
from wandb_modprof._warn import warn_at_user

# the registry: name -> what it is for (OPTIONAL: what is lost without it)
from wandb_modprof.capture.step.torch_private_names import (
    FAKE,
    GLOBAL_HOOKS,
    INLINE,
    LAZY,
    ON_MODULE,
    OPTIONAL,
    REQUIRED,
    UNTRACED,
)

_SUPPORTED = "Supported: torch 2.13 and later (tested: 2.13, 2.14)."


# ---- looking them up -------------------------------------------------------------------------
def _a_node() -> Any:
    with torch.inference_mode(False), torch.enable_grad():
        return (torch.ones(1, requires_grad=True) * 2).grad_fn


# Owners of attributes only instances have (none draws random numbers: no parameters).
_INSTANCES: dict[str, Callable[[], Any]] = {
    "torch.nn.Module": nn.Module,
    "torch.autograd.graph.Node": _a_node,
    "torch._ops.OpOverload": lambda: torch.ops.aten.mm.default,
    "torch._dynamo.eval_frame.OptimizedModule": lambda: torch.compile(nn.Identity()),
}


def _instance_attr(owner: str, found: Any, part: str) -> Any:
    return getattr(_INSTANCES[owner](), part) if owner in _INSTANCES else NOT_FOUND


def lookup(name: str) -> Any:
    """The object `name` names, importing modules on the way (an attribute only instances
    have: its value on a throwaway one, or None where the class's code sets it)."""
    return lookup_dotted(name, _instance_attr)


def resolves(name: str) -> bool:
    try:
        lookup(name)
    except (AttributeError, ImportError, RuntimeError, OSError):
        return False
    return True


def _bind(name: str, optional: bool = False) -> Any:
    """A REQUIRED / ON_MODULE entry, looked up once; where missing, a stand-in class (so that
    subclassing and isinstance work at import) whose call raises naming the API. An OPTIONAL
    entry: None where missing."""
    assert name in (OPTIONAL if optional else {**REQUIRED, **ON_MODULE}), name
    if resolves(name):
        return lookup(name)
    if optional:
        return None

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ModProfError(f"torch {torch.__version__} has no {name}. {_SUPPORTED}")

    return type(name.rsplit(".", 1)[1], (), {"__init__": refuse})


def _optional(name: str) -> Any:
    return _bind(name, optional=True)


def load(name: str) -> Any:
    """A LAZY entry, imported now; ModProfError naming the torch version and API without it."""
    assert name in LAZY, name
    try:
        return lookup(name)
    except (AttributeError, ImportError) as error:
        raise ModProfError(
            f"wandb_modprof needs {name} ({LAZY[name]}), which torch {torch.__version__} "
            f"does not have ({error}). {_SUPPORTED}"
        ) from None


@functools.cache
def _missing(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(name for name in names if not resolves(name))


def check(on_module: bool = False) -> None:
    """Raise `ModProfError` if this torch lacks an API that watch / profile (or `on_module`)
    needs, looked up once per process; warn once for each OPTIONAL one it lacks."""
    missing = _missing((*REQUIRED, *INLINE, *(ON_MODULE if on_module else ())))
    if missing:
        raise ModProfError(
            f"wandb_modprof needs private torch APIs that torch {torch.__version__} does not "
            f"have: {', '.join(missing)}. {_SUPPORTED}"
        )
    _report_optional()


@functools.cache
def _report_optional() -> None:
    for name in _missing(tuple(OPTIONAL)):
        warn_at_user(
            f"wandb_modprof: a private torch API is missing from torch {torch.__version__}: "
            f"{name}; {OPTIONAL[name]}",
            RuntimeWarning,
        )


# ---- autograd --------------------------------------------------------------------------------
# The next autograd sequence number on this thread: every node created from now on gets one
# >= it, so the nodes created between two reads are those whose number lies in [first, second).
sequence_nr: Callable[[], int] = _bind("torch._C._autograd._get_sequence_nr")
node_sequence_nr: Callable[[Any], int] = operator.methodcaller("_sequence_nr")  # (a C call)
# The id of the backward (graph task) running on this thread; -1 outside a backward.
graph_task_id: Callable[[], int] = _bind("torch._C._current_graph_task_id")
_TOP_SAVED_TENSORS_HOOKS = _bind("torch._C._autograd._top_saved_tensors_default_hooks")
_ENGINE = _bind("torch.autograd.Variable._execution_engine")
# The node whose hooks run on this thread (None outside a backward): node hooks are not told
# their node; this lets one read its `next_functions` without the hook holding the node.
current_autograd_node: Callable[[], Any] = _bind("torch._C._current_autograd_node")
_WILL_ENGINE_EXECUTE_NODE = _bind("torch._C._will_engine_execute_node")
_PEEK_FUNCTORCH = _optional("torch._C._functorch.peek_interpreter_stack")
_PUSH_DISPATCH_MODE = _optional("torch._C._push_on_torch_dispatch_stack")


def in_backward() -> bool:
    """A backward runs on this thread: a module forward now is a checkpoint's recompute."""
    return graph_task_id() != -1


def top_saved_tensors_pack_hook() -> Any:
    """The pack hook of the innermost default saved-tensor hooks, or None."""
    top = _TOP_SAVED_TENSORS_HOOKS(False)
    return None if top is None else top[0]


def saved_tensors_hooks_active() -> bool:
    """Someone (the user, `save_on_cpu`, a checkpoint) installed default saved-tensor hooks:
    ours would shadow theirs."""
    return _TOP_SAVED_TENSORS_HOOKS(False) is not None


def queue_end_of_backward(callback: Callable[[], None]) -> None:
    """Run `callback` once the current backward has finished (called from a backward hook)."""
    _ENGINE.queue_callback(callback)


def is_accumulate_grad(node: Any) -> bool:
    """The node that adds a leaf's gradient into `.grad` (it has no sequence number range)."""
    return type(node).__name__ == "AccumulateGrad"


def will_engine_execute_node(node: Any) -> bool:
    """True if the running backward will execute `node` (False for a node outside its graph or
    one that `torch.autograd.grad(..., inputs=...)` does not need). For a leaf's AccumulateGrad
    node that `torch.autograd.grad` captures torch raises (pytorch #131753); such a node does
    not run (the gradient is returned, not accumulated), so the answer is False."""
    try:
        return bool(_WILL_ENGINE_EXECUTE_NODE(node))
    except RuntimeError:
        if is_accumulate_grad(node):
            return False
        raise


def functorch_active() -> bool:
    """Inside a `torch.func` transform: wrapper tensors with no storage to measure."""
    return _PEEK_FUNCTORCH is not None and _PEEK_FUNCTORCH() is not None


def counts_backward() -> bool:
    """This torch has what counting a backward's ops per node needs (else it is not counted)."""
    return _PUSH_DISPATCH_MODE is not None and not _missing(("torch._C._current_autograd_node",))


def push_mode_for_this_node(mode: Any) -> None:
    """Push a dispatch mode for the rest of the node running now (from its pre-hook): the
    engine restores the mode stack after every node, even one that raises (`__enter__`'s
    Python flags would stay set after such a node)."""
    _PUSH_DISPATCH_MODE(mode)


# ---- dispatch modes, pytrees, ops ------------------------------------------------------------
_PD = "torch.utils._python_dispatch."
if TYPE_CHECKING:  # their own types, re-exported (`x as x` says so to mypy)
    from torch.utils._python_dispatch import (
        TorchDispatchMode as TorchDispatchMode,  # noqa: PLC0414
    )
    from torch.utils._python_dispatch import (
        is_traceable_wrapper_subclass as is_traceable_wrapper_subclass,  # noqa: PLC0414
    )
else:
    TorchDispatchMode = _bind(_PD + "TorchDispatchMode")
    is_traceable_wrapper_subclass = _bind(_PD + "is_traceable_wrapper_subclass")
dispatch_mode_stack: Callable[[], list[Any]] = _bind(_PD + "_get_current_dispatch_mode_stack")
function_mode_stack: Callable[[], list[Any]] = _bind(
    "torch.overrides._get_current_function_mode_stack"
)
tree_leaves: Callable[[Any], list[Any]] = _bind("torch.utils._pytree.tree_leaves")
tree_map_only: Callable[..., Any] = _bind("torch.utils._pytree.tree_map_only")
HigherOrderOperator: type = _bind("torch._ops.HigherOrderOperator")
foreach_norm: Callable[..., Any] = _bind("torch._foreach_norm")
CPU_ATTENTION_OP = _optional("torch.ops.aten._scaled_dot_product_flash_attention_for_cpu")
CONVOLUTION_OPS = tuple(filter(None, [_optional("torch.ops.aten._convolution")]))
ATTENTION_OPS = tuple(filter(None, map(_optional, [n for n in OPTIONAL if "_scaled_dot" in n])))


# ---- modules: calls, hooks, torch.compile ----------------------------------------------------
CALL_IMPL_CODE = getattr(_bind("torch.nn.Module._call_impl"), "__code__", None)
_DYNAMO = "torch._dynamo"


def dynamo_loaded() -> bool:
    """Dynamo is imported (torch.compile was used): asking anything of it is free."""
    return _DYNAMO in sys.modules


def import_dynamo() -> None:
    importlib.import_module(_DYNAMO)


def dynamo_frame_api() -> tuple[Any, ...]:
    """(Dynamo's C getter of its frame callback, `skip_code`, `disable`); imports Dynamo."""
    return tuple(map(load, [n for n in LAZY if LAZY[n] is UNTRACED]))


def compiled_module_type() -> type | None:
    """`OptimizedModule`, or None where Dynamo is not imported (nothing was compiled)."""
    return load("torch._dynamo.eval_frame.OptimizedModule") if dynamo_loaded() else None


def fake_tensor_api() -> tuple[Any, ...]:
    """(`FakeTensor`, `FakeTensorMode`, `_reparametrize_module`), imported on first use."""
    return tuple(map(load, [n for n in LAZY if LAZY[n] is FAKE]))


_GLOBAL_HOOK_DICTS = [n.rsplit(".", 1)[1] for n, lost in OPTIONAL.items() if lost is GLOBAL_HOOKS]
_MODULE = importlib.import_module("torch.nn.modules.module")
_LEN_DISPATCH_STACK = _bind("torch._C._len_torch_dispatch_stack")
_FUNCTION_MODE_ENABLED = _bind("torch._C._is_torch_function_mode_enabled")


def module_calls_observed() -> bool:
    """A global module hook, a torch function or dispatch mode, or the profiler is on."""
    if any(getattr(_MODULE, n, None) for n in _GLOBAL_HOOK_DICTS):
        return True
    if _LEN_DISPATCH_STACK() or _FUNCTION_MODE_ENABLED():
        return True
    return bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", False))


# ---- optimizers and AMP ----------------------------------------------------------------------
def gradscaler_scale(scaler: Any) -> torch.Tensor | None:
    """A GradScaler's current scale, read without a sync (None before its first `scale()`)."""
    read = getattr(scaler, "_get_scale_async", None)
    return None if read is None else read()


def optimizer_step_pre_hooks() -> dict[Any, Any] | None:
    """torch's dict of global optimizer step pre-hooks, or None."""
    optimizer = importlib.import_module("torch.optim.optimizer")  # (not an attribute of optim)
    hooks = getattr(optimizer, "_global_optimizer_pre_hooks", None)
    return hooks if isinstance(hooks, dict) else None


# ---- distributed -----------------------------------------------------------------------------
def default_store() -> Any:
    """The default process group's store."""
    return load("torch.distributed.distributed_c10d._get_default_store")()
