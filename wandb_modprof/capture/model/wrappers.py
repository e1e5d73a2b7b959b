"""What the model is under its wrappers: the inner model of DDP, the user's class of an
FSDP2 module, and the wrappers measured only in part."""

from __future__ import annotations

import warnings

from torch import nn

from wandb_modprof.capture.model.compiled import is_compiled_wrapper, unwrapped
from wandb_modprof.capture.model.scripted import is_scripted, scripted_type


def inner_model(model: nn.Module) -> nn.Module | None:
    """The user's model inside a `DistributedDataParallel` wrapper, else None."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        module = model.module
        return module if isinstance(module, nn.Module) else None
    return None


def _is_fsdp2(module: nn.Module) -> bool:
    # `fully_shard` swaps the module's class for `FSDP<Class>(FSDPModule, <Class>)`; checked by
    # name so that importing wandb_modprof never imports torch.distributed.fsdp.
    return any(_is_fsdp2_class(base) for base in type(module).__mro__)


def is_fsdp1(module: nn.Module) -> bool:
    return type(module).__name__ == "FullyShardedDataParallel" and hasattr(
        module, "_fsdp_wrapped_module"
    )


def type_name(module: nn.Module) -> str:
    """The class name users know: the inner model's for a DDP wrapper or a `torch.compile`
    wrapper (`OptimizedModule`), the original class of a module that `fully_shard` converted
    (`FSDPLinear` -> `Linear`)."""
    inner = inner_model(module)
    if inner is not None:
        return type_name(inner)
    if is_compiled_wrapper(module):
        return type_name(unwrapped(module))
    if is_scripted(module):
        return scripted_type(module)
    cls = type(module)
    if _is_fsdp2(module):
        for base in cls.__mro__[1:]:
            if issubclass(base, nn.Module) and not _is_fsdp2_class(base):
                return base.__name__
    return cls.__name__


def _is_fsdp2_class(cls: type) -> bool:
    return cls.__name__ == "FSDPModule" and cls.__module__.startswith("torch.distributed.fsdp")


def check_supported(model: nn.Module) -> None:
    """Warn (once per `watch`) about wrappers measured only in part."""
    if any(is_fsdp1(m) for m in model.modules()):
        warnings.warn(
            "wandb_modprof: FullyShardedDataParallel (FSDP1) is not supported: its modules are "
            "measured as they run, but names carry `_fsdp_wrapped_module`, parameter bytes are "
            "the rank's flat shard, and the unshard / reshard communication shows as the "
            "wrappers' own time. Use torch.distributed.fsdp.fully_shard (FSDP2) instead.",
            RuntimeWarning,
            stacklevel=3,
        )
