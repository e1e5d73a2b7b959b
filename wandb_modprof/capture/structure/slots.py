"""A module call's inputs and outputs as named slots, each with the tensors it carries.

The slot names become the input / output nodes of the call's own view (`x`, `input_ids`,
`args[2]`, `logits`, `output[1]`): arguments are named after `forward`'s parameters, outputs
after dict keys, dataclass or namedtuple fields, or their position.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any

import torch

from wandb_modprof.capture.forward.invocation import tensors_in
from wandb_modprof.capture.model.scripted import is_scripted


def output_slots(result: Any) -> list[tuple[str, list[torch.Tensor]]]:
    """A module output split into named fields, each with its tensors."""
    if isinstance(result, torch.Tensor):
        return [("output", [result])]
    if isinstance(result, Mapping):  # dict, OrderedDict, transformers' ModelOutput
        items: list[tuple[str, Any]] = [(str(k), v) for k, v in result.items()]
    elif is_dataclass(result) and not isinstance(result, type):
        items = [(f.name, getattr(result, f.name, None)) for f in fields(result)]
    elif isinstance(result, (list, tuple)):
        names = getattr(result, "_fields", None)  # namedtuple
        items = [(str(names[i]) if names else f"output[{i}]", v) for i, v in enumerate(result)]
    else:
        return []
    slots = [(name, list(tensors_in(v))) for name, v in items]
    return [(name, ts) for name, ts in slots if ts]


@functools.lru_cache(maxsize=1024)
def _parameters(forward: Callable[..., Any]) -> tuple[list[str], str | None]:
    """Names of `forward`'s positional parameters (without `self`) and of its `*args`."""
    try:
        params = list(inspect.signature(forward).parameters.values())[1:]
    except (TypeError, ValueError):  # builtins / C extensions without a signature
        return [], None
    positional = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    var = next((p.name for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    return positional, var


def _scripted_parameters(module: torch.nn.Module) -> tuple[list[str], str | None]:
    """A TorchScript module's forward parameters, from its schema (its class has no Python
    `forward` to inspect)."""
    try:
        schema = module.forward.schema  # type: ignore[attr-defined]  # (a TorchScript method)
        return [a.name for a in schema.arguments][1:], None
    except (AttributeError, RuntimeError):
        return [], None


def input_slots(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[tuple[str, list[torch.Tensor]]]:
    """Arguments of a call named after `forward`'s parameters (`x`, `input_ids`, `args[2]`)."""
    positional, var = (
        _scripted_parameters(module) if is_scripted(module) else _parameters(type(module).forward)
    )
    slots: list[tuple[str, list[torch.Tensor]]] = []
    for i, value in enumerate(args):
        if i < len(positional):
            name = positional[i]
        elif var is not None:
            name = f"{var}[{i - len(positional)}]"
        else:
            name = f"args[{i}]"
        slots.append((name, list(tensors_in(value))))
    for key, value in kwargs.items():
        slots.append((str(key), list(tensors_in(value))))
    return _same_tensor_once([(name, ts) for name, ts in slots if ts])


def _same_tensor_once(
    slots: list[tuple[str, list[torch.Tensor]]],
) -> list[tuple[str, list[torch.Tensor]]]:
    """Arguments that carry the very same tensors as one slot named for all of them:
    `model(input_ids=ids, labels=ids)` (transformers' own examples do this) is one input node
    `input_ids = labels` with every edge of that tensor, instead of two nodes that each get
    both names' edges (`input_ids -> loss`, `labels -> transformer`). Only exact matches merge:
    an argument sharing some tensors with another keeps its own node."""
    merged: dict[tuple[int, ...], tuple[list[str], list[torch.Tensor]]] = {}
    for name, tensors in slots:
        same = tuple(id(t) for t in tensors)  # the tensors are alive here: ids are unique
        if same in merged:
            merged[same][0].append(name)
        else:
            merged[same] = ([name], tensors)
    return [(" = ".join(names), tensors) for names, tensors in merged.values()]
