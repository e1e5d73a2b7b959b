"""Callbacks that profile a model inside the training frameworks people train with.

>>> from wandb_modprof.integrations.lightning import ModProfCallback     # doctest: +SKIP
>>> trainer = L.Trainer(logger=WandbLogger(project="p"), callbacks=[ModProfCallback(log_freq=100)])
>>> from wandb_modprof.integrations.huggingface import ModProfCallback   # doctest: +SKIP
>>> Trainer(model, TrainingArguments(report_to="wandb"), callbacks=[ModProfCallback(log_freq=100)])

Each framework is imported only by its own module (`lightning`, `huggingface`), never by this
package or by `import wandb_modprof`, so installing wandb-modprof pulls neither; importing a
module whose framework is missing raises `ModProfError` (also an `ImportError`) with the
`pip install 'wandb-modprof[<extra>]'` hint.

What both callbacks share (this module): the framework is imported once, here, with the
hint; `watch` options are checked by name when the callback is built (values by `watch` at
the start of training); the optimizer the framework hands out is unwrapped to the
`torch.optim.Optimizer` that really steps, so steps are counted as the framework counts them
(optimizer steps, with gradient accumulation); and the count starts at the framework's
global step, so a resumed run samples the same global steps as an uninterrupted one.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import Any

import torch

from wandb_modprof._errors import ModProfError
from wandb_modprof._validate import check_log_freq
from wandb_modprof.api.settings import FIELDS
from wandb_modprof.api.watch import watch
from wandb_modprof.api.watch_handle import WatchHandle, count_from, forwards_counted


class MissingFrameworkError(ModProfError, ImportError):
    """The framework an integration needs is not installed (or failed to import)."""


def import_framework(names: tuple[str, ...], framework: str, extra: str) -> list[ModuleType]:
    """The modules of `names` that import (at least one), or the install hint.

    Modules already imported come first and alone: importing a framework costs seconds, and
    the user's Trainer is from the one they imported."""
    import sys

    loaded = [sys.modules[name] for name in names if sys.modules.get(name) is not None]
    if loaded:
        return loaded
    errors = []
    for name in names:
        try:
            return [importlib.import_module(name)]
        except ImportError as error:
            errors.append(f"{name}: {error}")
    raise MissingFrameworkError(
        f"wandb_modprof.integrations.{extra} needs {framework}, which could not be imported "
        f"({'; '.join(errors)}): pip install 'wandb-modprof[{extra}]'"
    ) from None


# `watch`'s options a callback passes through; the model and the optimizer are the framework's.
_FIXED = ("model", "optimizer", "log_freq")
WATCH_OPTIONS = tuple(name for name in inspect.signature(watch).parameters if name not in _FIXED)
# the arguments `watch` took before they moved into `Settings`: passed on (it warns)
_MOVED = FIELDS


def check_watch_options(owner: str, log_freq: int, options: dict[str, Any]) -> int:
    """Check what can be checked before training starts (option names, `log_freq`); `watch`
    checks the values when the callback calls it."""
    unknown = sorted(set(options) - set(WATCH_OPTIONS) - set(_MOVED))
    if unknown:
        fixed = " (set by the callback)" if set(unknown) & set(_FIXED) else ""
        raise ModProfError(
            f"{owner} expected options of wandb_modprof.watch ({', '.join(WATCH_OPTIONS)}); "
            f"got {', '.join(repr(name) for name in unknown)}{fixed}"
        )
    return check_log_freq(log_freq)


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The `torch.optim.Optimizer` whose `step()` really runs, under the frameworks' wrappers
    (accelerate's `AcceleratedOptimizer.optimizer`, Lightning's `LightningOptimizer.
    _optimizer`). A wrapper's own `step()` is not the one torch's step hooks patch (it never
    calls `Optimizer.__init__`), so a hook on it would never fire. None if there is none."""
    for _ in range(8):  # wrappers nest a few deep at most
        inner = next(
            (
                getattr(optimizer, name)
                for name in ("optimizer", "_optimizer")
                if isinstance(getattr(optimizer, name, None), torch.optim.Optimizer)
            ),
            None,
        )
        if inner is None:
            break
        optimizer = inner
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


def start_at_step(handle: WatchHandle, global_step: int) -> None:
    """Count on from the framework's global step (a resumed run): with `log_freq=100`, a run
    resumed at step 1,000 samples 1,100, 1,200 ..., as the uninterrupted run would have.
    The first step after the start is still the structure pass (or, if it is sampled, a
    timed step that derives the graph; the pass then takes the next step)."""
    if global_step > 0:
        count_from(handle, global_step)


def training_forwards(handle: WatchHandle) -> int:
    """Training forwards of the watched module counted so far (every micro-batch)."""
    return forwards_counted(handle)


def other_rank_watches() -> bool:
    """Whether a process other than global rank zero should watch too: in a process group of
    more than one rank it measures and publishes its statistics for rank 0's table (it never
    logs and needs no W&B run); without one it has nothing to send anywhere."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
