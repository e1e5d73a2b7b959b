"""What one ATen op of the structure pass costs besides its forward FLOPs: the FLOPs of its
backward and the bytes it moves. `FlopCount` charges both to the innermost open call, with the
op itself (the call's op count), for the efficiency analysis (`records/roofline.py`).

Backward FLOPs are counted, not assumed: each op with a forward formula in
`torch.utils.flop_counter` is charged the formulas of the kernels its backward runs, for the
inputs that require a gradient at that moment (a first layer whose input needs none runs one
matmul backward, not two; under `torch.no_grad` there is no backward). Ops without a formula
(elementwise, reductions, copies) count 0 FLOPs forward and backward, as the FLOPs mode does.

Bytes are logical: every distinct tensor an op reads (its tensor arguments) and writes (its
outputs), at numel x element size; an in-place op reads and writes its tensor. View ops
(`t`, `view`, `expand`, ...) move nothing and are not counted as ops.

>>> import torch
>>> a, b = torch.ones(8, 4, requires_grad=True), torch.ones(4, 2)
>>> backward_flops(torch.ops.aten.mm.default, (a, b), {}, a @ b)  # grad of a only
128
>>> moved_bytes((a, b), {}, a @ b)  # 32 + 8 floats read, 16 written
224
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.utils.flop_counter as fc

from wandb_modprof.capture.step.torch_private import (
    ATTENTION_OPS,
    CONVOLUTION_OPS,
    HigherOrderOperator,
)

aten = torch.ops.aten


def _needs(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad


def _mm(a: torch.Tensor, b: torch.Tensor) -> int:
    """Backward of a @ b (M x K @ K x N, batched alike): g @ b^T for a, a^T @ g for b, each
    2 x batch x M x N x K FLOPs (`flop_counter`'s mm / bmm formulas, written out: its wrappers
    walk their arguments as pytrees, a third of the structure pass's time on small layers)."""
    each = 2 * a.shape[-2] * a.shape[-1] * b.shape[-1]
    for size in a.shape[:-2]:
        each *= size
    return each * (int(_needs(a)) + int(_needs(b)))


def _conv(
    out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: Any, *rest: Any, **_: Any
) -> int:
    stride, padding, dilation, transposed, output_padding, groups = rest[:6]
    mask = [_needs(x), _needs(w), _needs(bias)]
    if not any(mask):
        return 0
    shapes = (out.shape, x.shape, w.shape, None)
    args = (stride, padding, dilation, transposed, output_padding, groups, mask)
    # `out_shape`: the shapes of grad input and weight. The formula itself, not the registered
    # wrapper that walks its arguments as a pytree first (where this torch exposes it).
    formula: Any = fc.conv_backward_flop
    raw = getattr(formula, "__wrapped__", None)
    if raw is not None:
        return int(raw(*shapes, *args, out_shape=(x.shape, w.shape)))
    return int(formula(*shapes, *args, out_val=(x.shape, w.shape)))


def _attention(
    out: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: Any, **__: Any
) -> int:
    if not (_needs(q) or _needs(k) or _needs(v)):
        return 0
    first = out[0] if isinstance(out, (tuple, list)) else out
    count = fc.sdpa_backward_flop_count(first.shape, q.shape, k.shape, v.shape)  # type: ignore[no-untyped-call]
    return int(count)


def _rules() -> dict[Any, Callable[..., int]]:
    def mm(out: Any, a: Any, b: Any, *_: Any, **__: Any) -> int:
        return _mm(a, b)

    def addmm(out: Any, bias: Any, a: Any, b: Any, *_: Any, **__: Any) -> int:
        return _mm(a, b)

    rules: dict[Any, Callable[..., int]] = {aten.mm: mm, aten.bmm: mm}
    rules.update({aten.addmm: addmm, aten.baddbmm: addmm})
    for name in ("convolution", "convolution_overrideable"):
        if hasattr(aten, name):
            rules[getattr(aten, name)] = _conv
    rules.update(dict.fromkeys(CONVOLUTION_OPS, _conv))  # (`aten._convolution`)
    rules.update(dict.fromkeys(ATTENTION_OPS, _attention))
    return rules


# Keyed by overload packet, like `flop_counter`'s registry. `_scaled_mm` (float8) has no
# backward; the other formula ops are backward kernels themselves (counted only when run).
BACKWARD_RULES = _rules()


def backward_flops(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], out: Any) -> int:
    """FLOPs of the backward of one forward op (0 where it has no rule)."""
    rule = BACKWARD_RULES.get(func._overloadpacket)
    if rule is None:
        return 0
    return rule(out, *args, **kwargs)


def moved_bytes(args: tuple[Any, ...], kwargs: Mapping[str, Any], out: Any) -> int:
    """Bytes one op reads (its distinct tensor arguments) and writes (its distinct outputs).
    ATen schemas nest tensors one level at most (`Tensor[]`), so no pytree walk (which made
    the structure pass a third slower)."""
    return _bytes_of((*args, *kwargs.values())) + _bytes_of(out)


def _nbytes(t: torch.Tensor) -> int:
    """numel x element size; a sparse COO tensor's values and indices (`nbytes` refuses
    sparse tensors: an `Embedding(sparse=True)`'s gradient)."""
    try:
        return int(t.nbytes)
    except RuntimeError:
        if t.layout is not torch.sparse_coo:
            raise
        return int(t._values().nbytes + t._indices().nbytes)


def _bytes_of(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return _nbytes(value)
    if not isinstance(value, (tuple, list)):
        return 0
    total, seen = 0, set()
    for item in value:
        for t in item if isinstance(item, (tuple, list)) else (item,):
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                total += _nbytes(t)  # logical bytes
    return int(total)


def is_work(func: Any) -> bool:
    """An op that is work of the call it runs in: not a view (no data moved), not a
    higher-order operator (`torch.cond` & co.: the ops inside it are not seen)."""
    return not (is_view(func) or isinstance(func, HigherOrderOperator))


def is_view(func: Any) -> bool:
    """An op that returns a view of its input (no data moved)."""
    return bool(getattr(func, "is_view", False))
