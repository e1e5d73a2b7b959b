"""Checks of user input at the public boundary: expected vs got, raised as ModProfError."""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import nn

from wandb_modprof._errors import ModProfError


def check_model(model: Any, where: str, what: str = "a torch.nn.Module") -> nn.Module:
    if not isinstance(model, nn.Module):
        raise ModProfError(
            f"{where} expected {what}; got {type(model).__module__}.{type(model).__qualname__}"
        )
    if isinstance(model, torch.jit.ScriptModule):
        # its forward runs in the TorchScript interpreter: no module hook reaches inside, and
        # it refuses the hooks that mark a step (a scripted submodule is measured as one call)
        raise ModProfError(
            f"{where} expected {what} in Python; got a TorchScript module "
            f"({type(model).__qualname__} of {getattr(model, 'original_name', '?')}): measure "
            "the module before torch.jit.script / trace, or a Python module that calls it (a "
            "scripted submodule is measured as one call)"
        )
    return model


def check_log_freq(log_freq: Any) -> int:
    if isinstance(log_freq, bool) or not isinstance(log_freq, int) or log_freq < 1:
        raise ModProfError(
            f"log_freq must be an int >= 1 (steps between samples); got {log_freq!r}"
        )
    return log_freq


def check_artifact_freq(freq: Any) -> int | None:
    if freq is not None and (isinstance(freq, bool) or not isinstance(freq, int) or freq < 0):
        raise ModProfError(
            "artifact_freq must be None (no profile artifact), 0 (at unwatch) or an int N > 0 "
            f"(also every N-th logged sample); got {freq!r}"
        )
    return freq


def check_table_interval(seconds: Any) -> float | None:
    ok = seconds is None or (
        isinstance(seconds, (int, float))
        and not isinstance(seconds, bool)
        and math.isfinite(seconds)
        and seconds > 0
    )
    if not ok:
        raise ModProfError(
            "table_interval must be None (tables at the 1st, 2nd, 4th, 8th, ... sample only) or "
            f"a number of seconds > 0 (the longest wait between two tables); got {seconds!r}"
        )
    return None if seconds is None else float(seconds)


def check_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ModProfError(
            f"optimizer must be a torch.optim.Optimizer or None; got {type(optimizer).__qualname__}"
        )
    return optimizer


def check_run(run: Any) -> Any:
    if run is not None and not callable(getattr(run, "log", None)):
        raise ModProfError(
            f"run must be a wandb Run (from wandb.init()) or None; got {type(run).__qualname__}"
        )
    if run is not None and getattr(run, "_is_finished", False) is True:
        # (W&B's own flag: its first log would fail with "Run ... is finished")
        raise ModProfError(
            f"run expected an active wandb Run; got run {getattr(run, 'id', '?')!r}, which is "
            "finished: pass a run from a new wandb.init(), or call watch() before run.finish()"
        )
    return run


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ModProfError(
            f"{name} expected one of {', '.join(repr(a) for a in allowed)}; got {value!r}"
        )
    return value


def check_overhead(overhead: Any) -> float:
    """`Settings.overhead`: a share of training time, 0 < overhead < 1."""
    if isinstance(overhead, bool) or not isinstance(overhead, (int, float)):
        raise ModProfError(f"watch() overhead expected a number in (0, 1); got {overhead!r}")
    if not 0 < overhead < 1:
        raise ModProfError(f"watch() overhead expected a number in (0, 1); got {overhead!r}")
    return float(overhead)


def check_offload(offload: Any) -> str:
    """`watch(offload=)`: "auto", True or False, as "auto", "process" or "off"."""
    if offload is True or offload is False:
        return "process" if offload else "off"
    if isinstance(offload, str) and offload == "auto":
        return "auto"
    raise ModProfError(f"watch() offload expected 'auto', True or False; got {offload!r}")


_PRESET_PART = re.compile(r"[A-Za-z0-9_.-]+")


def check_chart(chart: Any) -> str | None:
    """A W&B custom chart preset name, "entity/name" (what `register_chart` returns)."""
    if chart is None:
        return None
    parts = chart.split("/") if isinstance(chart, str) else []
    if len(parts) != 2 or not all(_PRESET_PART.fullmatch(p) for p in parts):
        raise ModProfError(
            "chart expected a W&B chart preset name 'entity/name' (letters, digits, '_', '.', "
            f"'-'), e.g. 'my-team/wandb-modprof-v4'; got {chart!r}"
        )
    return str(chart)


def check_preset_part(what: str, value: Any) -> str:
    """An entity or a preset name on its own (`register_chart`)."""
    if not isinstance(value, str) or not _PRESET_PART.fullmatch(value):
        raise ModProfError(
            f"{what} expected a W&B name of letters, digits, '_', '.' or '-'; got {value!r}"
        )
    return value
