"""The module graph of a model with compiled regions, from its eager modules on fake tensors.

The structure pass follows tensors op by op, which compiled code does not allow; running the
compiled regions eagerly instead (`force_eager`) changes what that training step computes
(fused kernels round differently). So for a model with compiled code the pass runs beside
the step, before its forward: the same forward, eagerly, on `FakeTensor`s (shapes and dtypes
only, no data, no RNG draws), with the parameters and buffers swapped for fake copies for the
call (a BatchNorm's `num_batches_tracked += 1` lands on the copy). The user's step then runs
as it would have, compiled, and its numerics are untouched. Names are the user's (the
wrappers' `_orig_mod` is looked through), so the graph's calls match the measured ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from wandb_modprof.capture.inert_hook import under_compile
from wandb_modprof.capture.memory.static_memory import ROOT_NAME
from wandb_modprof.capture.model.compiled import (
    compiled_in_place,
    eager_modules,
    is_compiled_wrapper,
    mark_regions,
    region_roots,
    unwrapped,
)
from wandb_modprof.capture.model.scripted import ScriptedHandle, is_scripted
from wandb_modprof.capture.model.wrappers import inner_model, type_name
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.structure.structure_pass import StructurePass
from wandb_modprof.records.calls import Structure


def fake_structure(
    model: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[Structure | None, Exception | None]:
    """The graph of `model(*args, **kwargs)` traced on fake tensors: (structure, None), or
    (None, the error) when the pass could not follow this forward."""
    # Looked up here: FakeTensorMode brings in torch's fake tensors (Dynamo is loaded
    # already: the model has compiled code).
    fake_tensor, fake_tensor_mode, reparametrize_module = tp.fake_tensor_api()

    # DDP's forward would broadcast and reduce: the model inside it is traced (its modules are
    # named as in the user's model, as the capture names them).
    outer = unwrapped(model)  # torch.compile(ddp) and DDP(torch.compile(model)) alike
    inner = inner_model(outer)
    eager = outer if inner is None else unwrapped(inner)
    structure = StructurePass(eager, training=eager.training, fake_type=fake_tensor)
    handles = _hook(structure, eager)
    # No real tensor may enter an op: FakeTensorMode would run an op on real tensors only (an
    # in-place `self.count += 1` on a plain tensor attribute) for real, changing the model.
    # The FLOP mode refuses such an op before it runs; the pass fails (a warning; the step
    # then runs as always).
    mode = fake_tensor_mode(allow_non_fake_inputs=False)
    try:
        with mode:
            fake: dict[str, torch.Tensor] = {
                name: mode.from_tensor(t)
                for name, t in [*eager.named_parameters(), *eager.named_buffers()]
            }
            fake_args, fake_kwargs = tp.tree_map_only(
                torch.Tensor, mode.from_tensor, (args, kwargs)
            )
            with reparametrize_module(eager, fake, tie_weights=True):
                structure.push_modes()  # force_eager: compiled regions run their eager code
                try:
                    structure.enter(eager, ROOT_NAME, type_name(model), fake_args, fake_kwargs)
                    # `forward`, not `__call__`: the root's hooks are ours (or run compiled).
                    out = eager.forward(*fake_args, **fake_kwargs)
                    structure.exit(eager, out)
                finally:
                    structure.pop_modes()
    except Exception as error:  # the user's step still runs; the graph is left out
        return None, error
    finally:
        for handle in handles:
            handle.remove()
    if structure.failed or not structure.forward_done:
        return None, structure.error or RuntimeError("forward hooks fired out of order")
    graph = structure.finish()
    roots = {ROOT_NAME} if _root_compiled(model, inner, eager) else region_roots(eager)
    return dataclasses.replace(graph, calls=mark_regions(graph.calls, roots)), None


def _root_compiled(model: nn.Module, inner: nn.Module | None, eager: nn.Module) -> bool:
    """The whole forward is one compiled region: the watched model is a `torch.compile`
    wrapper (or DDP around one), the model was compiled in place (`model.compile()`), or our
    root hook runs under a wrapper around the watched model (`compiled = torch.compile(model)`
    after `watch(model)`)."""
    return (
        under_compile()
        or is_compiled_wrapper(model)
        or (inner is not None and is_compiled_wrapper(inner))
        or compiled_in_place(model)
        or compiled_in_place(eager)
    )


def _hook(structure: StructurePass, eager: nn.Module) -> list[RemovableHandle | ScriptedHandle]:
    """Temporary hooks on every module below the root, compiled regions included (they run
    eagerly in this pass; Dynamo never sees these hooks: they are gone before the step)."""
    handles: list[RemovableHandle | ScriptedHandle] = []
    for name, module in eager_modules(eager):
        if module is eager:
            continue
        label = (name, type_name(module))

        def pre(m: nn.Module, a: Any, k: Any, label: tuple[str, str] = label) -> None:
            structure.enter(m, label[0], label[1], a, k)

        def post(m: nn.Module, a: Any, k: Any, r: Any) -> None:
            structure.exit(m, r)

        if is_scripted(module):  # refuses module hooks: measured as one call
            handles.append(ScriptedHandle(module, pre, post))
            continue
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))
    return handles
