"""Mutable builders the step session fills while the step runs, and output flattening.

`Invocation` is one module call in the forward; `Recompute` a module forward run again during
backward by activation checkpointing; `grad_fns` finds the autograd nodes of a module output.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import fields, is_dataclass
from typing import Any

import torch


class Invocation:
    """Mutable builder for one module call while the step is being captured."""

    __slots__ = (
        "call_index",
        "depth",
        "key",
        "mem_alloc0",
        "mem_alloc1",
        "mem_peak",
        "module_id",
        "module_type",
        "name",
        "own0",
        "own1",
        "parent",
        "seq0",
        "seq1",
        "shapes",
        "t0",
        "t1",
    )

    def __init__(
        self,
        module_id: int,
        name: str,
        module_type: str,
        key: str,
        call_index: int,
        parent: int,
        depth: int,
    ) -> None:
        self.module_id = module_id
        self.name = name
        self.module_type = module_type
        self.key = key  # `capture.call_keys`: the same work on every step
        self.call_index = call_index
        self.parent = parent
        self.depth = depth
        self.seq0 = -1
        self.seq1 = -1
        self.t0: Any = None
        self.t1: Any = None
        # our own hook time (ns, `Clock.own_at`) at t0 and t1: taken out of the window
        self.own0 = 0
        self.own1 = 0
        self.mem_alloc0: int | None = None
        self.mem_alloc1: int | None = None
        self.mem_peak: int | None = None
        # the shapes of its tensor arguments (`input_shapes`): a checkpoint recompute of this
        # call gets the same ones, which tells apart two calls of one module in one region
        self.shapes: tuple[Any, ...] = ()


def input_shapes(args: tuple[Any, ...], kwargs: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """The shapes of a call's tensor arguments, positional then keyword (top level only: cheap,
    it runs for every call of a sampled step)."""
    try:
        shapes: list[Any] = [a.shape for a in args if isinstance(a, torch.Tensor)]
        if kwargs:
            shapes += [(k, v.shape) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    except RuntimeError:  # a tensor without sizes (nested): not told apart by shape
        return ()
    return tuple(shapes)


def rows_of(shapes: tuple[Any, ...]) -> int | None:
    """The rows (tokens) a call processed: its first tensor input's element count over its
    last dimension, i.e. the product of the leading dimensions (1 for a 0-d tensor). None
    for a call with no tensor argument. `shapes`: `input_shapes`'s (a keyword tensor's
    entry is `(name, shape)`)."""
    if not shapes:
        return None
    first = shapes[0]
    if isinstance(first, tuple) and len(first) == 2 and isinstance(first[0], str):
        first = first[1]  # (name, shape): a keyword argument
    rows = 1
    for size in tuple(first)[:-1]:
        rows *= int(size)
    return rows


class Recompute:
    """A module forward that ran during backward (activation checkpointing)."""

    __slots__ = ("enclosing_node", "orig", "own0", "own1", "parent", "seq0", "seq1", "t0", "t1")

    def __init__(
        self, orig: int, parent: int, enclosing_node: int, seq0: int, t0: Any, own0: int = 0
    ) -> None:
        self.orig = orig  # index of the forward invocation it repeats, -1 if unmatched
        self.parent = parent  # index into the session's recomputes, -1 for a top-level one
        self.enclosing_node = enclosing_node
        self.seq0 = seq0
        self.seq1 = -1
        self.t0 = t0
        self.t1: Any = None
        self.own0 = own0  # our own time (`Clock.own_at`) at t0 and t1
        self.own1 = own0


_MAX_DEPTH = 8  # nesting of output containers that is searched for tensors


def tensors_in(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors inside a module argument or output (tuple/list, dict and ModelOutput,
    dataclass), depth-limited."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth > _MAX_DEPTH:  # deeply nested outputs: the root's outputs still reach the graph
        return
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item, depth + 1)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from tensors_in(item, depth + 1)
    elif is_dataclass(value) and not isinstance(value, type):
        for f in fields(value):
            yield from tensors_in(getattr(value, f.name, None), depth + 1)


def grad_fns(value: Any) -> Iterator[Any]:
    """Autograd nodes of the tensors in a module output."""
    for tensor in tensors_in(value):
        if tensor.grad_fn is not None:
            yield tensor.grad_fn
