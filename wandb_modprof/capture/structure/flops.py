"""FLOPs per module call, counted during the structure pass.

A `TorchDispatchMode` sees every ATen op once, as the user's code called it, and charges the
FLOPs that `torch.utils.flop_counter`'s formulas give to the innermost open call (through the
`FlopSink`, the running `StructurePass`), with the op's backward FLOPs and the bytes it moves
(`work.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]
from torch.utils.flop_counter import flop_registry, sdpa_flop_count

from wandb_modprof.capture.step.torch_private import (
    CPU_ATTENTION_OP,
    TorchDispatchMode,
    tree_leaves,
)
from wandb_modprof.capture.structure.work import backward_flops, is_work, moved_bytes


class FlopSink(Protocol):
    failed: bool

    def add_work(self, flops: int, bwd_flops: int, nbytes: int, linear: bool = False) -> None: ...

    def fail(self, error: Exception) -> None: ...


def _ops(*names: str) -> frozenset[Any]:
    """ATen overloads by name, skipping those this torch version does not have."""
    found = []
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(torch.ops.aten, packet, None) or getattr(torch.ops.prim, packet, None)
        if op is not None and hasattr(op, overload):
            found.append(getattr(op, overload))
    return frozenset(found)


# Metadata queries (as FlopCounterMode skips them): declining them lets tensor subclasses
# with their own size/stride policy (jagged nested tensors) answer.
_SHAPE_QUERIES = _ops(
    "is_contiguous.default",
    "is_contiguous.memory_format",
    "sym_is_contiguous.default",
    "is_strides_like_format.default",
    "is_non_overlapping_and_dense.default",
    "size.default",
    "sym_size.default",
    "stride.default",
    "sym_stride.default",
    "storage_offset.default",
    "sym_storage_offset.default",
    "numel.default",
    "sym_numel.default",
    "dim.default",
    "layout.default",
)


def _cpu_sdpa_flops(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any
) -> int:
    return int(sdpa_flop_count(query.shape, key.shape, value.shape))


# torch.utils.flop_counter has no formula for the CPU kernel of scaled_dot_product_attention
# (torch 2.13); it is the flash formula on the same shapes.
FORMULAS: dict[Any, Any] = {
    **flop_registry,
    **({} if CPU_ATTENTION_OP is None else {CPU_ATTENTION_OP: _cpu_sdpa_flops}),
}
PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
# The formulas themselves, on shapes: the registry's wrappers map every argument through a
# pytree walk first, which was two thirds of the counting's cost (`_shapes` does the same in
# one level: ATen schemas nest tensors one level at most, `Tensor[]`).
_ON_SHAPES: dict[Any, Any] = {
    formula: formula.__wrapped__
    for formula in FORMULAS.values()
    if getattr(formula, "__wrapped__", None) is not None
    and getattr(formula, "__name__", "") == getattr(formula.__wrapped__, "__name__", None)
}


def _shape(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.shape
    if isinstance(value, (list, tuple)):
        return type(value)(v.shape if isinstance(v, torch.Tensor) else v for v in value)
    return value


def _mm(a: torch.Tensor, b: torch.Tensor, *_: Any, **__: Any) -> int:
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *_: Any, **__: Any) -> int:
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


def _bmm(a: torch.Tensor, b: torch.Tensor, *_: Any, **__: Any) -> int:
    return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]


def _baddbmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *_: Any, **__: Any) -> int:
    return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]


# The matrix products, most of a model's formula ops, written out as `flop_counter` states
# them (2 x M x N x K, times the batch): its addmm / baddbmm formulas call the mm / bmm ones
# through their pytree-walking wrapper again (`test_flop_formulas` checks they agree).
_PRODUCTS: dict[Any, Any] = {
    formula: own
    for packet, own in (
        (torch.ops.aten.mm, _mm),
        (torch.ops.aten.addmm, _addmm),
        (torch.ops.aten.bmm, _bmm),
        (torch.ops.aten.baddbmm, _baddbmm),
    )
    if (formula := FORMULAS.get(packet)) is not None
}


def flops_of(formula: Any, args: Any, kwargs: Mapping[str, Any], out: Any) -> int:
    """The formula's FLOPs for one op (the registry's own call, without its pytree walk)."""
    product = _PRODUCTS.get(formula)
    if product is not None:
        return int(product(*args))
    on_shapes = _ON_SHAPES.get(formula)
    if on_shapes is None:
        return int(formula(*args, **kwargs, out_val=out))
    shaped = {k: _shape(v) for k, v in kwargs.items()}
    return int(on_shapes(*(_shape(a) for a in args), out_shape=_shape(out), **shaped))


def handles(func: Any, types: Any, plain_types: tuple[type, ...]) -> bool:
    """A counting mode runs and counts this op itself: not a metadata query, and only plain
    tensors (a tensor subclass unwraps first, and its plain ops come back to the mode)."""
    return func not in _SHAPE_QUERIES and all(t in plain_types for t in types)


# Ops whose work grows linearly with the rows of their inputs, besides the elementwise ones
# (`torch.Tag.pointwise`): matrix products. A call made only of such ops does work in
# proportion to the rows it gets (`known_calls.shapes_fit`): an expert fed 7 tokens does 7/5
# of the work it did on 5. Reductions, convolutions, attention and indexing are not in it.
_ROW_LINEAR = frozenset(
    op._overloadpacket
    for op in _ops("mm.default", "addmm.default", "_to_copy.default", "clone.default")
)


class FlopCount(TorchDispatchMode):
    """FLOPs of every ATen op with a `torch.utils.flop_counter` formula, charged to the
    innermost open call. Unlike `FlopCounterMode` it never decomposes an op to count it:
    the user's op always runs once, as called (composite ops with no formula count 0)."""

    supports_higher_order_operators = True  # torch.cond & co. run through unchanged

    def __init__(self, pass_: FlopSink, fake_type: type | None = None) -> None:
        super().__init__()
        self.pass_ = pass_
        # The pass over fake tensors (`fake_structure`) counts FakeTensor ops as plain ones,
        # and refuses any op on a real tensor: FakeTensorMode runs an op whose tensors are all
        # real for real (`self.count += 1` on a plain tensor attribute would change the model).
        self.fake_type = fake_type
        self.plain_types = PLAIN_TYPES if fake_type is None else (*PLAIN_TYPES, fake_type)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if any(issubclass(t, UninitializedTensorMixin) for t in types):
            # A lazy module materialising its parameters at its first forward (its detach and
            # copies): not the model's work, and a mode that returned NotImplemented here left
            # no handler for it ("Multiple dispatch failed"). The pass that materialised is
            # dropped at its end (`SubmoduleHooks._exit_pass`).
            return func(*args, **kwargs)
        if not handles(func, types, self.plain_types):
            return NotImplemented
        if self.fake_type is not None:
            self._refuse_real_tensors(func, args, kwargs)
        out = func(*args, **kwargs)
        if self.pass_.failed or not is_work(func):
            return out
        try:
            formula = FORMULAS.get(func._overloadpacket)
            flops = bwd = 0
            if formula is not None:
                flops = flops_of(formula, args, kwargs, out)
                bwd = backward_flops(func, args, kwargs, out)
            linear = func._overloadpacket in _ROW_LINEAR or torch.Tag.pointwise in func.tags
            self.pass_.add_work(flops, bwd, moved_bytes(args, kwargs, out), linear)
        except Exception as error:  # a formula that cannot read these arguments
            self.pass_.fail(error)
        return out

    def _refuse_real_tensors(self, func: Any, args: Any, kwargs: Any) -> None:
        fake = self.fake_type
        assert fake is not None
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and not isinstance(t, fake):
                raise RuntimeError(
                    f"{func} got a real tensor (neither a parameter, a buffer nor an input) in "
                    "a forward traced on fake tensors; it was not run"
                )
