"""A sampled step's gradient readings: per-parameter gradient bytes and parameter / gradient L2
norms, read at the end of the sampled backward (before the optimizer or `zero_grad` runs) and
summed per module where the sample is resolved. Gradient norms are divided by the step's loss
scale where a `torch.amp.GradScaler` multiplied the loss (`loss_scale`): they are the unscaled
norms, as `clip_grad_norm_` after `scaler.unscale_` reads them.

Read on the training thread per parameter (plain lists, the norms one stacked device tensor:
no sync inside the backward); summed per module later (`GradientReading.resolve`), in the
worker process when the sample is handed over, against the model index's tables
(`static_memory.ModelIndex.members`) sent there once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from wandb_modprof.capture.memory.loss_scale import LossScale
from wandb_modprof.capture.memory.static_memory import (
    Members,
    ModelIndex,
    dedup_bytes,
    local_tensor,
)
from wandb_modprof.capture.memory.storage import extents
from wandb_modprof.capture.step.torch_private import foreach_norm


@dataclass(frozen=True)
class GradientState:
    """Read at the end of the sampled backward, before the optimizer or `zero_grad` runs."""

    grad_bytes: dict[str, int]
    param_norm: dict[str, float]
    grad_norm: dict[str, float | None]


def _local_grad(param: nn.Parameter) -> torch.Tensor | None:
    grad = param.grad
    if grad is None or type(grad) is torch.Tensor:
        return grad  # (no attribute lookup that fails: 20,000 of those were 5 ms)
    return local_tensor(grad)


def _locals(params: list[nn.Parameter]) -> list[torch.Tensor]:
    """`local_tensor` of each: a plain `Parameter` is never a DTensor (its type would be one)."""
    kind = nn.Parameter
    return [p if type(p) is kind else local_tensor(p) for p in params]


@dataclass(frozen=True)
class GradientReading:
    """A sampled step's gradient readings per parameter (an index's order), on the host: plain
    data, resolved per module where the sample is (`resolve`)."""

    grad_sizes: list[int]  # bytes of each parameter's gradient (0: none)
    shared_bytes: dict[str, int] | None  # per module, when gradients share memory (rare)
    param_sq: list[float]  # squared L2 norms ([] : norms off)
    grad_sq: list[float | None]  # None: no gradient
    # `grad_sq` had a GradScaler's loss scale divided out. A gradient that is not finite is
    # then the scaler's overflow: it skips that step, discarding these gradients, and the
    # true norms were lost in the scaled backward, so no module has a gradient norm in that
    # sample (None). Without a scaler an inf / NaN norm is the model's own, and is kept.
    loss_scaled: bool = False

    def resolve(self, members: Members, names: set[str]) -> GradientState:
        """Per named module: gradient bytes, parameter and gradient norms of its subtree."""
        own = {name: members[name] for name in names if name in members}
        if self.shared_bytes is not None:
            grad_bytes = self.shared_bytes
        else:
            sizes = self.grad_sizes
            grad_bytes = {name: sum(map(sizes.__getitem__, idx)) for name, idx in own.items()}
        param_norm: dict[str, float] = {}
        grad_norm: dict[str, float | None] = {}
        if self.param_sq:
            param_sq, grad_sq = self.param_sq, self.grad_sq
            overflow = self.loss_scaled and not all(
                math.isfinite(g) for g in grad_sq if g is not None
            )
            for name, idx in own.items():
                param_norm[name] = sum(param_sq[i] for i in idx) ** 0.5
                with_grad = [g for g in (grad_sq[i] for i in idx) if g is not None]
                grad_norm[name] = sum(with_grad) ** 0.5 if with_grad and not overflow else None
        return GradientState(grad_bytes, param_norm, grad_norm)


@dataclass(frozen=True)
class PendingGradientState:
    """Norms stay device tensors (one per kind, stacked) until the sample is resolved or
    handed over: no sync inside the backward."""

    members: Members  # the index's (not a copy)
    names: set[str]  # the sample's modules
    grad_sizes: list[int]
    shared_bytes: dict[str, int] | None
    # stacked (a list across devices), one per parameter; None: norms off
    param_norms: torch.Tensor | list[torch.Tensor] | None
    grad_norms: torch.Tensor | list[torch.Tensor] | None  # one per parameter with a gradient
    grad_present: list[bool]
    loss_scale: LossScale | None = None  # settled by the optimizer step after the backward

    def reading(self) -> GradientReading:
        """The readings on the host (one device sync for the norms), gradient norms divided by
        the step's loss scale."""
        param_sq = _squares(self.param_norms)
        grad_sq: list[float | None] = []
        scale = None
        if self.param_norms is not None:
            scale = self.loss_scale.read() if self.loss_scale is not None else None
            it = iter(_squares(self.grad_norms, scale))
            grad_sq = [next(it) if has else None for has in self.grad_present]
        return GradientReading(
            self.grad_sizes, self.shared_bytes, param_sq, grad_sq, loss_scaled=scale is not None
        )

    def resolve(self) -> GradientState:
        return self.reading().resolve(self.members, self.names)


def _grad_sizes(grads: list[torch.Tensor | None]) -> tuple[list[int], bool]:
    """Bytes of each gradient, and whether two of them may share memory (then the caller
    deduplicates by extent). Plain dense tensors (the usual case) are read in one pass and
    checked for overlap by address and size (a match across devices only sends it to the exact
    check); any other kind (a subclass, a sparse layout) always goes to the exact check."""
    sizes: list[int] = []
    addresses: set[tuple[int, int]] = set()
    counted = 0
    unusual = False
    plain, strided = torch.Tensor, torch.strided
    for g in grads:
        if g is None:
            n = 0
        elif type(g) is plain and g.layout == strided and not g.is_meta:
            n = g.nbytes
            if n:
                addresses.add((g.data_ptr(), n))
                counted += 1
        else:
            n = sum(b for _, b in extents(g))
            unusual = True
        sizes.append(n)
    return sizes, unusual or len(addresses) < counted


def gradient_state(
    index: ModelIndex, names: set[str], norms: bool, loss_scale: LossScale | None = None
) -> PendingGradientState:
    """Gradient bytes now; parameter and gradient L2 norms as pending device tensors, the
    gradients' to be divided by `loss_scale` when they are read."""
    grads = [_local_grad(p) for p in index.params]
    grad_sizes, maybe_shared = _grad_sizes(grads)
    shared: dict[str, int] | None = None
    if maybe_shared:
        grad_extents = [[] if g is None else list(extents(g)) for g in grads]
        flat = [key for ext in grad_extents for key, _ in ext]
        if len(set(flat)) != len(flat):
            # Two gradients share memory (slices of one buffer, tied): a module's bytes are
            # deduplicated by extent within its subtree.
            shared = {
                name: dedup_bytes(kv for i in index.members[name] for kv in grad_extents[i])
                for name in names
                if name in index.members
            }
    param_norms: torch.Tensor | list[torch.Tensor] | None = None
    grad_norms: torch.Tensor | list[torch.Tensor] | None = None
    present = [g is not None for g in grads]
    if norms and index.params:
        # (no `detach()`: `_l2_norms` runs under no_grad, and 20,000 detaches were 18 ms)
        param_norms = _stacked(_l2_norms(_locals(index.params)))
        with_grad = [g for g in grads if g is not None]
        grad_norms = _stacked(_l2_norms(with_grad)) if with_grad else None
    return PendingGradientState(
        index.members, names, grad_sizes, shared, param_norms, grad_norms, present, loss_scale
    )


def _stacked(norms: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """The 0-d norms as one tensor on their device (no sync); a model split over devices
    keeps its list (read one by one when the sample is resolved, as before)."""
    try:
        return torch.stack(norms)
    except RuntimeError:  # on several devices
        return norms


def _squares(
    norms: torch.Tensor | list[torch.Tensor] | None, scale: torch.Tensor | None = None
) -> list[float]:
    """Squared norms, divided by `scale` first, as floats (the one sync with the device). In
    float64: a GradScaler's scale is a power of two, so the division is exact, and an inf or
    NaN norm (an overflow) stays one."""
    if norms is None:
        return []
    if isinstance(norms, torch.Tensor):
        wide = norms.double()
        if scale is not None:
            wide = wide / scale.to(wide.device, torch.float64)
        squares: list[float] = wide.square().cpu().tolist()
        return squares
    divisor = 1.0 if scale is None else float(scale)
    return [v * v for v in (float(t) / divisor for t in norms)]


def _dense_values(tensor: torch.Tensor) -> torch.Tensor:
    """The values whose L2 norm is the tensor's: sparse COO is coalesced (duplicates add up)."""
    if tensor.layout == torch.sparse_coo:
        return tensor.coalesce()._values()
    if tensor.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        return tensor.values()
    return tensor


_WIDE = {torch.float32, torch.float64}  # accumulated in their own precision
_NARROW = {torch.float16, torch.bfloat16}  # accumulated in float32


def _l2_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms in fused calls, accumulated in at least float32 (a bf16 norm of a large
    tensor loses most of its digits) and float64 in float64; non-float tensors count as 0."""
    if not tensors:
        return []
    with torch.no_grad():
        dtypes = {t.dtype for t in tensors}
        if {t.layout for t in tensors} == {torch.strided}:
            # one precision class (the usual case): one call, no per-tensor bookkeeping
            # (without `dtype`, float32 takes the fused path: a third faster on the CPU)
            if dtypes <= _WIDE:
                return list(foreach_norm(tensors, 2))
            if dtypes <= _NARROW:
                return list(foreach_norm(tensors, 2, dtype=torch.float32))
        values = [_dense_values(t) for t in tensors]
        zero = torch.zeros((), dtype=torch.float32)
        out = [zero] * len(values)
        wide: list[int] = []
        narrow: list[int] = []
        for i, t in enumerate(values):
            if t.layout != torch.strided or not t.is_floating_point():
                continue  # counts as 0
            if t.dtype in _WIDE:
                wide.append(i)
            elif t.dtype in _NARROW:
                narrow.append(i)
            else:  # a float8 kind, which norms do not take: widened first
                out[i] = torch.linalg.vector_norm(t.to(torch.float32))
        if wide:
            for i, norm in zip(wide, foreach_norm([values[i] for i in wide], 2),
                               strict=True):  # fmt: skip
                out[i] = norm
        if narrow:
            picked = [values[i] for i in narrow]
            norms = foreach_norm(picked, 2, dtype=torch.float32)
            for i, norm in zip(narrow, norms, strict=True):
                out[i] = norm
        return out
