"""A dotted name (`torch.autograd.graph.Node.register_prehook`) resolved to the object it
names, importing modules on the way: how the private-API registries of torch
(`capture.step.torch_private`) and of W&B (`sinks.wandb.wandb_private`) check that every name
they use still exists.

An attribute only instances have is not on the class: `instance_attr` answers for such names
(its value, or `NOT_FOUND`), and an attribute the class's own code assigns (`self.x = ...` in
its source) resolves to None.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from inspect import getsource
from typing import Any

NOT_FOUND: Any = object()  # `instance_attr`'s answer for a name it does not know


def _no_instance_attr(owner: str, found: Any, part: str) -> Any:
    return NOT_FOUND


def lookup_dotted(
    name: str, instance_attr: Callable[[str, Any, str], Any] = _no_instance_attr
) -> Any:
    """The object `name` names. `instance_attr(owner, found, part)`: the value of `part` on
    `found` (named `owner`) where the class does not have it, or `NOT_FOUND`. Raises
    AttributeError or ImportError where a part is missing, OSError where a class's source is
    not installed."""
    parts = name.split(".")
    found: Any = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 2):
        owner = ".".join(parts[: i - 1])
        if hasattr(found, part):
            found = getattr(found, part)
            continue
        if isinstance(found, type(sys)):  # a submodule not imported yet
            found = importlib.import_module(".".join(parts[:i]))
            continue
        value = instance_attr(owner, found, part)
        if value is not NOT_FOUND:
            found = value
        elif isinstance(found, type) and re.search(rf"self\.{part}\b *[:=]", getsource(found)):
            found = None  # set by the class's own code (`__init__`)
        else:
            raise AttributeError(f"{owner} has no attribute {part}")
    return found
