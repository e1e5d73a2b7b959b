"""Per-module parameter, buffer, gradient and optimizer-state bytes, and parameter/gradient norms.

All figures are inclusive of submodules and storage-deduplicated within a module's subtree, so
tied weights (GPT-2's embedding and head) count once. A module called several times shows its
full figures on every invocation: the memory is shared, not split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ._storage import StorageKey, storages


@dataclass(frozen=True)
class StaticMemory:
    param_bytes: int
    param_count: int
    buffer_bytes: int
    optim_bytes: int | None


@dataclass(frozen=True)
class GradientState:
    """Read at the end of the sampled backward, before the optimizer or `zero_grad` runs."""

    grad_bytes: dict[str, int]
    param_norm: dict[str, float]
    grad_norm: dict[str, float | None]


def _unique_params(module: nn.Module) -> list[nn.Parameter]:
    # `parameters()` already removes repeated Parameter objects (tied weights are one object).
    return list(module.parameters())


def _bytes(tensors: list[torch.Tensor]) -> int:
    seen: dict[StorageKey, int] = {}
    for tensor in tensors:
        for key, nbytes in storages(tensor):
            seen[key] = nbytes
    return sum(seen.values())


def _optimizer_tensors(
    optimizer: torch.optim.Optimizer, params: list[nn.Parameter]
) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for param in params:
        state = optimizer.state.get(param)
        if not state:
            continue
        out.extend(v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return out


def static_memory(
    modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer | None
) -> dict[str, StaticMemory]:
    """`modules` maps qualified name to module, for the modules that were invoked."""
    result: dict[str, StaticMemory] = {}
    for name, module in modules.items():
        params = _unique_params(module)
        result[name] = StaticMemory(
            param_bytes=_bytes(list(params)),
            param_count=sum(p.numel() for p in params),
            buffer_bytes=_bytes(list(module.buffers())),
            optim_bytes=None
            if optimizer is None
            else _bytes(_optimizer_tensors(optimizer, params)),
        )
    return result


@dataclass(frozen=True)
class PendingGradientState:
    """Norms stay 0-d device tensors until the sample is resolved: no sync inside the backward."""

    grad_bytes: dict[str, int]
    members: dict[str, list[int]]  # module name -> indices into the parameter list
    param_norms: list[torch.Tensor]
    grad_norms: list[torch.Tensor | None]

    def resolve(self) -> GradientState:
        param_sq = [v * v for v in _to_floats(self.param_norms)]
        grad_present = _to_floats([g for g in self.grad_norms if g is not None])
        it = iter(grad_present)
        grad_sq = [None if g is None else next(it) ** 2 for g in self.grad_norms]
        param_norm: dict[str, float] = {}
        grad_norm: dict[str, float | None] = {}
        if self.param_norms:
            for name, idx in self.members.items():
                param_norm[name] = sum(param_sq[i] for i in idx) ** 0.5
                with_grad = [g for g in (grad_sq[i] for i in idx) if g is not None]
                grad_norm[name] = sum(with_grad) ** 0.5 if with_grad else None
        return GradientState(self.grad_bytes, param_norm, grad_norm)


def _to_floats(tensors: list[torch.Tensor]) -> list[float]:
    if not tensors:
        return []
    devices = {t.device for t in tensors}
    if len(devices) == 1:
        values: list[float] = torch.stack(tensors).double().cpu().tolist()
        return values
    return [float(t) for t in tensors]


def gradient_state(modules: dict[str, nn.Module], norms: bool) -> PendingGradientState:
    """Gradient bytes now; parameter and gradient L2 norms as pending device tensors."""
    index: dict[int, int] = {}
    params: list[nn.Parameter] = []
    members: dict[str, list[int]] = {}
    grad_bytes: dict[str, int] = {}
    for name, module in modules.items():
        own = _unique_params(module)
        for p in own:
            if id(p) not in index:
                index[id(p)] = len(params)
                params.append(p)
        members[name] = [index[id(p)] for p in own]
        grad_bytes[name] = _bytes([p.grad for p in own if p.grad is not None])
    param_norms: list[torch.Tensor] = []
    grad_norms: list[torch.Tensor | None] = []
    if norms and params:
        param_norms = _l2_norms([p.detach() for p in params])
        grads = [p.grad.detach() if p.grad is not None else None for p in params]
        computed = iter(_l2_norms([g for g in grads if g is not None]))
        grad_norms = [next(computed) if g is not None else None for g in grads]
    return PendingGradientState(grad_bytes, members, param_norms, grad_norms)


def _normable(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() and tensor.layout == torch.strided


def _l2_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """fp32-accumulated L2 norms, one fused call; non-float or sparse tensors count as 0."""
    with torch.no_grad():
        dense = [t for t in tensors if _normable(t)]
        # fp32 accumulation: a bf16 norm of a large tensor loses most of its digits.
        computed = iter(torch._foreach_norm(dense, 2, dtype=torch.float32) if dense else [])
        zero = torch.zeros((), dtype=torch.float32)
        return [next(computed) if _normable(t) else zero for t in tensors]
