"""Per-module parameter, buffer, gradient and optimizer-state bytes, and parameter/gradient norms.

All figures are inclusive of submodules and storage-deduplicated within a module's subtree, so
tied weights (GPT-2's embedding and head) count once. A module called several times shows its
full figures on every invocation: the memory is shared, not split.

What does not change between samples (which parameters belong to which module, their bytes)
lives in a `ModelIndex` that is rebuilt only when the model's modules or parameters change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from wandb_modprof.capture.memory.storage import StorageKey, extents, storages
from wandb_modprof.capture.model.compiled import compiled_in_place, is_compiled_wrapper
from wandb_modprof.capture.model.scripted import is_scripted
from wandb_modprof.capture.model.wrappers import inner_model

ROOT_NAME = "<root>"


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


def hookable_modules(model: nn.Module) -> dict[int, tuple[str, nn.Module]]:
    """id -> (qualified name, module) for every module we may hook.

    A compiled region is measured at its boundary as one leaf: hooks inside one would be
    traced by Dynamo (graph breaks, recompiles). A `torch.compile(module)` wrapper is hooked
    as usual (its hooks run eagerly) and nothing under its `_orig_mod`; a module compiled in
    place with `Module.compile()` (the root included) is hooked around its compiled call
    (`compiled.hook_compiled_boundary`) and nothing below it.

    A `DistributedDataParallel` wrapper is the root (its forward is the step) and the modules
    inside are named as in the user's model (`fc1`, not `module.fc1`). The wrapped model
    itself is not hooked: its call is the root's, and DDP's own work is the root's self time.
    """
    out: dict[int, tuple[str, nn.Module]] = {}
    skip_prefixes: list[str] = []
    inner = inner_model(model)
    if inner is not None:
        out[id(model)] = (ROOT_NAME, model)
        if is_compiled_wrapper(inner):  # DDP(torch.compile(model)): one leaf, the root
            return out
    walked = model if inner is None else inner
    for name, module in walked.named_modules():
        if module is inner or any(name == p or name.startswith(p + ".") for p in skip_prefixes):
            continue
        out[id(module)] = (name or ROOT_NAME, module)
        # a compiled region, or a TorchScript module: one call, nothing below it hooked
        if compiled_in_place(module) or is_compiled_wrapper(module) or is_scripted(module):
            if not name:
                return out  # the whole model is one compiled region
            skip_prefixes.append(name)
    return out


def _fingerprint(model: nn.Module) -> tuple[object, ...]:
    """Identity of every module, parameter and buffer (and where its data lives), in one walk.

    Checked once per sampled step, so it avoids `parameters()`/`buffers()`, which each walk
    the module tree again. FSDP2 parameters count as their persistent sharded parameter: the
    unsharded one registered during a forward is reallocated every step."""
    # Flat ints, not a tuple per tensor: ints are not tracked by the garbage collector, and
    # a tuple per parameter made the walk of a 28,000-module model trigger collections.
    # (Unambiguous in practice: every entry is the address of an object alive now.)
    parts: list[int] = []
    sharded: dict[tuple[int, str], nn.Parameter] = {}
    for module in model.modules():
        parts.append(id(module))
        if _is_fsdp2(module):
            sharded.update(_fsdp2_params(module))
        for pname, param in module._parameters.items():
            if param is not None:
                held = sharded.get((id(module), pname), param) if sharded else param
                parts.append(id(held))
                parts.append(_local(held).data_ptr())
        for buffer in module._buffers.values():
            if buffer is not None:
                parts.append(id(buffer))
                parts.append(_local(buffer).data_ptr())
        parts.append(0)  # end of this module's tensors
    return tuple(parts)


def _is_fsdp2(module: nn.Module) -> bool:
    """`fully_shard` swaps the module's class for one with `_get_fsdp_state`: asked of the
    class, since `hasattr` on the module goes through `Module.__getattr__`, which raises (and
    builds an AttributeError) for every ordinary module."""
    return hasattr(type(module), "_get_fsdp_state")


def _fsdp2_params(module: nn.Module) -> dict[tuple[int, str], nn.Parameter]:
    """FSDP2 (`fully_shard`): (id(module), parameter name) -> the sharded parameter (a DTensor
    holding this rank's shard) of every parameter this FSDP module manages. Private torch API
    (torch 2.13): if it changes, the registered parameters are used as they are."""
    try:
        group = module._get_fsdp_state()._fsdp_param_group  # type: ignore[operator]
        if group is None:
            return {}
        return {
            (id(fp._module_info.module), fp._module_info.param_name): fp.sharded_param
            for fp in group.fsdp_params
        }
    except AttributeError:
        return {}


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank holds); any other tensor as it is. Norms and
    bytes are read from it: a DTensor reduction would start a collective."""
    local = getattr(tensor, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else tensor


def _parameters(
    module: nn.Module, sharded: dict[tuple[int, str], nn.Parameter]
) -> Iterable[nn.Parameter]:
    """`module.parameters()` (unique objects: tied weights once), FSDP2 ones as sharded."""
    seen: set[int] = set()
    for m in module.modules():
        for pname, registered in m._parameters.items():
            if registered is None:
                continue
            param = sharded.get((id(m), pname), registered)
            if id(param) not in seen:
                seen.add(id(param))
                yield param


def _dedup_bytes(keyed: Iterable[tuple[StorageKey, int]]) -> int:
    return sum(dict(keyed).values())


@dataclass(frozen=True)
class ModelIndex:
    """The model's hookable modules and, per module name, the indices of its subtree's
    (unique) parameters; static bytes precomputed."""

    fingerprint: tuple[object, ...]
    modules: dict[int, tuple[str, nn.Module]]
    params: list[nn.Parameter]
    members: dict[str, list[int]]
    static: dict[str, tuple[int, int, int]]  # name -> (param bytes, param count, buffer bytes)
    excluded: set[StorageKey]  # storages of parameters and buffers: never activations

    def current(self, model: nn.Module) -> bool:
        return _fingerprint(model) == self.fingerprint


def build_index(model: nn.Module) -> ModelIndex:
    """FSDP2 models: each parameter is its sharded DTensor, whose bytes, gradient bytes and
    norms are those of this rank's shard (its count is the full parameter's)."""
    modules = hookable_modules(model)
    sharded: dict[tuple[int, str], nn.Parameter] = {}
    for module in model.modules():
        if _is_fsdp2(module):
            sharded.update(_fsdp2_params(module))
    index: dict[int, int] = {}
    params: list[nn.Parameter] = []
    param_storages: list[list[tuple[StorageKey, int]]] = []
    members: dict[str, list[int]] = {}
    static: dict[str, tuple[int, int, int]] = {}
    for name, module in modules.values():
        own: list[int] = []
        for p in _parameters(module, sharded):
            if id(p) not in index:
                index[id(p)] = len(params)
                params.append(p)
                param_storages.append(list(extents(_local(p))))
            own.append(index[id(p)])
        members[name] = own
        static[name] = (
            _dedup_bytes(kv for i in own for kv in param_storages[i]),
            sum(params[i].numel() for i in own),
            _dedup_bytes(kv for b in module.buffers() for kv in extents(_local(b))),
        )
    # Saved tensors are matched by whole storage: a parameter's storage is never an activation.
    excluded = {key for p in params for key, _ in storages(_local(p))}
    excluded |= {key for p in model.parameters() for key, _ in storages(_local(p))}
    excluded |= {key for b in model.buffers() for key, _ in storages(_local(b))}
    return ModelIndex(_fingerprint(model), modules, params, members, static, excluded)


def static_memory(
    index: ModelIndex, names: set[str], optimizer: torch.optim.Optimizer | None
) -> dict[str, StaticMemory]:
    """Static bytes of the named modules; optimizer-state bytes read now."""
    optim_param: list[int] = []
    if optimizer is not None:
        for p in index.params:
            state = optimizer.state.get(p)
            total = 0
            if state:
                for value in state.values():
                    # 0-d tensors (Adam's `step`) are bookkeeping, not state memory.
                    if isinstance(value, torch.Tensor) and value.dim() > 0:
                        total += _dedup_bytes(extents(_local(value)))
            optim_param.append(total)
    out: dict[str, StaticMemory] = {}
    for name in names:
        if name not in index.static:
            continue
        param_bytes, count, buffer_bytes = index.static[name]
        optim = sum(optim_param[i] for i in index.members[name]) if optimizer is not None else None
        out[name] = StaticMemory(param_bytes, count, buffer_bytes, optim)
    return out


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


def gradient_state(index: ModelIndex, names: set[str], norms: bool) -> PendingGradientState:
    """Gradient bytes now; parameter and gradient L2 norms as pending device tensors."""
    grads = [None if p.grad is None else _local(p.grad) for p in index.params]
    grad_extents = [[] if g is None else list(extents(g)) for g in grads]
    members = {name: index.members[name] for name in names if name in index.members}
    flat = [key for ext in grad_extents for key, _ in ext]
    if len(set(flat)) == len(flat):
        # No two gradients share memory (the usual case): a module's bytes are the sum of its
        # parameters', with no per-module deduplication.
        sizes = [sum(n for _, n in ext) for ext in grad_extents]
        grad_bytes = {name: sum(map(sizes.__getitem__, idx)) for name, idx in members.items()}
    else:
        grad_bytes = {
            name: _dedup_bytes(kv for i in idx for kv in grad_extents[i])
            for name, idx in members.items()
        }
    param_norms: list[torch.Tensor] = []
    grad_norms: list[torch.Tensor | None] = []
    if norms and index.params:
        # (no `detach()`: `_l2_norms` runs under no_grad, and 20,000 detaches were 18 ms)
        param_norms = _l2_norms([_local(p) for p in index.params])
        present = [g for g in grads if g is not None]
        computed = iter(_l2_norms(present))
        grad_norms = [next(computed) if g is not None else None for g in grads]
    return PendingGradientState(grad_bytes, members, param_norms, grad_norms)


def _normable(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() and tensor.layout == torch.strided


def _dense_values(tensor: torch.Tensor) -> torch.Tensor:
    """The values whose L2 norm is the tensor's: sparse COO is coalesced (duplicates add up)."""
    if tensor.layout == torch.sparse_coo:
        return tensor.coalesce()._values()
    if tensor.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        return tensor.values()
    return tensor


def _l2_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """fp32-accumulated L2 norms, one fused call; non-float tensors count as 0."""
    with torch.no_grad():
        strided = torch.strided
        if all(t.layout == strided and t.is_floating_point() for t in tensors):
            # every tensor dense and floating (the usual case): the same call, without the
            # per-tensor checks below
            return list(torch._foreach_norm(tensors, 2, dtype=torch.float32)) if tensors else []
        tensors = [_dense_values(t) for t in tensors]
        dense = [t for t in tensors if _normable(t)]
        # fp32 accumulation: a bf16 norm of a large tensor loses most of its digits.
        computed = iter(torch._foreach_norm(dense, 2, dtype=torch.float32) if dense else [])
        zero = torch.zeros((), dtype=torch.float32)
        return [next(computed) if _normable(t) else zero for t in tensors]
