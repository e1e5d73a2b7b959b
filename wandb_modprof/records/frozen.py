"""Frozen records built in bulk: resolving a sample builds one `InvocationRecord` (33 fields) per
module call and freezing the statistics one `RunningStat` per call and metric, after every
sample: ~28,000 and ~450,000 of them for a 28,000-call mixture of experts. A frozen
dataclass's `__init__` sets each field with `object.__setattr__` (12 us for an
`InvocationRecord`, 2.4 us for a `RunningStat`); `frozen` sets the attribute dict at once
(0.9 and 1.0 us). The object is the same: equal, same repr, hash and pickle, still frozen.

>>> from wandb_modprof.records.sample import RunningStat
>>> cells = {"count": 1, "mean": 2.0, "std": 0.0, "min": 2.0, "max": 2.0, "last": 2.0}
>>> frozen(RunningStat, cells | {"median": 2.0}) == RunningStat(1, 2.0, 0.0, 2.0, 2.0, 2.0, 2.0)
True
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")

_new_object, _set_attribute = object.__new__, object.__setattr__


def frozen(cls: type[T], cells: dict[str, Any]) -> T:
    """An instance of the frozen dataclass `cls` (no `__post_init__`) holding `cells`, which
    name every field (defaults included): the caller's dict becomes the instance's."""
    assert len(cells) == _field_count(cls), (cls, sorted(cells))
    instance: T = _new_object(cls)
    _set_attribute(instance, "__dict__", cells)
    return instance


_counts: dict[type, int] = {}


def _field_count(cls: type) -> int:
    count = _counts.get(cls)
    if count is None:
        count = _counts[cls] = len(fields(cls))
    return count
