"""Per-module parameter, buffer and optimizer-state bytes (gradient bytes and norms:
`gradient_readings`), and the model index both read them with.

All figures are inclusive of submodules and storage-deduplicated within a module's subtree, so
tied weights (GPT-2's embedding and head) count once. A module called several times shows its
full figures on every invocation: the memory is shared, not split.

What does not change between samples (which parameters belong to which module, their bytes)
lives in a `ModelIndex` that is rebuilt only when the model's modules or parameters change.

A lazy module's (`nn.LazyLinear`, any `LazyModuleMixin`) parameters and buffers hold no data
until its first forward materialises them (same objects, new data): until then they are left
out (no bytes, no norms), and the index says so (`ModelIndex.lazy`), so that the capture can
tell the forward that materialised them (`hooks.Capture`) and the next index counts them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parameter import is_lazy

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
                parts.append(_NO_DATA if is_lazy(held) else local_tensor(held).data_ptr())
        for buffer in module._buffers.values():
            if buffer is not None:
                parts.append(id(buffer))
                parts.append(_NO_DATA if is_lazy(buffer) else local_tensor(buffer).data_ptr())
        parts.append(0)  # end of this module's tensors
    return tuple(parts)


# An uninitialised lazy tensor's place in the fingerprint (it has no data pointer: reading one
# raises): materialising it in place gives it one, so the fingerprint changes.
_NO_DATA = -1


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


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
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


def dedup_bytes(keyed: Iterable[tuple[StorageKey, int]]) -> int:
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
    # Some parameter or buffer was an uninitialised lazy one, left out: the forward that
    # materialises it makes this index out of date (`current`).
    lazy: bool = False

    def current(self, model: nn.Module) -> bool:
        return _fingerprint(model) == self.fingerprint


def build_index(model: nn.Module) -> ModelIndex:
    """FSDP2 models: each parameter is its sharded DTensor, whose bytes, gradient bytes and
    norms are those of this rank's shard (its count is the full parameter's). Uninitialised
    lazy parameters and buffers are left out until materialised."""
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
    lazy = False
    for name, module in modules.values():
        own: list[int] = []
        for p in _parameters(module, sharded):
            if is_lazy(p):
                lazy = True
                continue
            if id(p) not in index:
                index[id(p)] = len(params)
                params.append(p)
                param_storages.append(list(extents(local_tensor(p))))
            own.append(index[id(p)])
        members[name] = own
        static[name] = (
            dedup_bytes(kv for i in own for kv in param_storages[i]),
            sum(params[i].numel() for i in own),
            dedup_bytes(kv for b in _data(module.buffers()) for kv in extents(local_tensor(b))),
        )
    # Saved tensors are matched by whole storage: a parameter's storage is never an activation.
    excluded = {key for p in params for key, _ in storages(local_tensor(p))}
    excluded |= {key for p in _data(model.parameters()) for key, _ in storages(local_tensor(p))}
    buffers = list(model.buffers())
    excluded |= {key for b in _data(buffers) for key, _ in storages(local_tensor(b))}
    lazy = lazy or any(is_lazy(b) for b in buffers)
    return ModelIndex(_fingerprint(model), modules, params, members, static, excluded, lazy)


def _data(tensors: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
    """The tensors that hold data: uninitialised lazy ones left out."""
    return (t for t in tensors if not is_lazy(t))


def optim_bytes(params: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> list[int]:
    """Optimizer-state bytes of each of `params` (an index's, in its order), read now."""
    optim_param: list[int] = []
    states = optimizer.state
    plain, strided = torch.Tensor, torch.strided
    for p in params:
        state = states.get(p)
        total = 0
        if state:
            for value in state.values():
                if type(value) is plain and value.layout == strided:
                    # (a plain dense tensor spans its own bytes: read in one call)
                    if value.dim() > 0:
                        total += value.nbytes
                # 0-d tensors (Adam's `step`) are bookkeeping, not state memory.
                elif isinstance(value, torch.Tensor) and value.dim() > 0:
                    total += dedup_bytes(extents(local_tensor(value)))
        optim_param.append(total)
    return optim_param


StaticTable = dict[str, tuple[int, int, int]]  # `ModelIndex.static`
Members = dict[str, list[int]]  # `ModelIndex.members`


def static_of(
    static: StaticTable, members: Members, names: set[str], optim_param: list[int] | None
) -> dict[str, StaticMemory]:
    """Static bytes of the named modules from an index's tables (plain data: the worker
    process builds them too) and the optimizer's per-parameter bytes."""
    out: dict[str, StaticMemory] = {}
    for name in names:
        if name not in static:
            continue
        param_bytes, count, buffer_bytes = static[name]
        optim = sum(optim_param[i] for i in members[name]) if optim_param is not None else None
        out[name] = StaticMemory(param_bytes, count, buffer_bytes, optim)
    return out


@dataclass(frozen=True)
class PendingOptimizerBytes:
    """An optimizer's state bytes per parameter, awaiting their read: read when the sample is
    resolved or handed to the worker, after `optimizer.step()` made or grew the state (read at
    the end of the backward, a first step would show none). Data awaiting a read, as the
    gradient norms are: the index's parameter list (not a copy) and the optimizer."""

    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer

    def read(self) -> list[int]:
        return optim_bytes(self.params, self.optimizer)


@dataclass(frozen=True)
class StaticReadings:
    """What a sample's static memory is resolved from: the model index's per-module tables
    (the index's own dicts, not copies; the worker gets them once per index) and the optimizer's
    bytes per parameter (`optim`: read, awaiting their read, or None: no optimizer)."""

    members: Members
    static: StaticTable
    optim: list[int] | PendingOptimizerBytes | None

    def optim_read(self) -> list[int] | None:
        """The optimizer's bytes per parameter, read now if they await their read."""
        optim = self.optim
        return optim.read() if isinstance(optim, PendingOptimizerBytes) else optim

    def resolve(self, names: set[str]) -> dict[str, StaticMemory]:
        """Static bytes of the named modules (of their subtrees)."""
        return static_of(self.static, self.members, names, self.optim_read())


def static_readings(index: ModelIndex, optimizer: torch.optim.Optimizer | None) -> StaticReadings:
    """A sample's static readings from `index`: three references, nothing read on the step."""
    pending = PendingOptimizerBytes(index.params, optimizer) if optimizer is not None else None
    return StaticReadings(index.members, index.static, pending)
