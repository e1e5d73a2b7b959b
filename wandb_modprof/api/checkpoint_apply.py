"""Apply a checkpoint plan to a model: the planned modules' forwards run under
`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`, reversibly.

>>> plan = prof.checkpoint_plan("50%")                              # doctest: +SKIP
>>> with wandb_modprof.apply_checkpoint_plan(model, plan):          # doctest: +SKIP
...     model(x).sum().backward()          # blocks recomputed in backward, less memory
>>> applied = wandb_modprof.apply_checkpoint_plan(model, "plan.json")  # doctest: +SKIP
>>> applied.remove()                                                # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from torch import nn

from wandb_modprof._errors import ModProfError
from wandb_modprof.api.checkpoint_forward import CheckpointedForward
from wandb_modprof.capture.model.wrappers import type_name
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.records.checkpoint import CheckpointPlan
from wandb_modprof.view.checkpoint_outcome import PlanOutcome, plan_outcome


@dataclass
class _Wrapped:
    module: nn.Module
    name: str
    own_forward: Any  # the instance attribute `forward` before ours; `_NONE` if there was none


_NONE = object()


@dataclass
class AppliedPlan:
    """The modules of a plan, wrapped; `remove()` (or leaving the `with` block) restores their
    original forwards. `module_names` lists what is wrapped, in the plan's order."""

    plan: CheckpointPlan
    _wrapped: list[_Wrapped] = field(default_factory=list, repr=False)

    @property
    def module_names(self) -> tuple[str, ...]:
        return tuple(w.name for w in self._wrapped)

    @property
    def active(self) -> bool:
        """True until `remove()`."""
        return bool(self._wrapped)

    def outcome(self, profile_after: object) -> PlanOutcome:
        """The plan beside the run: `profile_after` (a `Profile` or its `snapshot()`) profiled
        the model with this plan applied. Realised activation bytes, memory peak, step time
        and each planned module's recompute time, each with the prediction and the error
        (`view.checkpoint_outcome`); `.text()` prints it."""
        return plan_outcome(self.plan, profile_after)

    def remove(self) -> None:
        """Restore every wrapped module's forward (a second call does nothing)."""
        while self._wrapped:
            w = self._wrapped.pop()
            if w.own_forward is _NONE:
                delattr(w.module, "forward")  # the class's forward shows through again
            else:
                setattr(w.module, "forward", w.own_forward)  # noqa: B010  (mypy: a method)

    def __enter__(self) -> AppliedPlan:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


def apply_checkpoint_plan(
    model: nn.Module, plan: CheckpointPlan | Mapping[str, Any] | str | os.PathLike[str]
) -> AppliedPlan:
    """Checkpoint the forward of every module `plan` names (`use_reentrant=False`; the RNG
    state is preserved, so dropout draws the same mask in the recompute).

    `plan`: a `CheckpointPlan` (`Profile.checkpoint_plan`), its `to_json()` dict, or the path
    of a JSON file holding that dict. Refused with a `ModProfError`: a compiled model
    (`torch.compile`; plan and apply before compiling), a plan naming the root (`''`), a module
    the model lacks or a module of another class than the plan's `module_type` (the plan of
    another model), and a module already wrapped.

    A recompute in backward runs as the forward did: buffers the forward writes (running
    statistics, spectral norm's power-iteration vectors, any buffer updated in place or
    replaced) are put back as the forward found them for the recompute, and as the backward
    found them after it, so they are updated once per call, as without the plan; inputs the
    forward modifies in place (a block opening with `ReLU(inplace=True)`) are kept as copies.
    Both are learnt at each module's first call, which keeps copies of all its inputs and
    buffers (`api.checkpoint_forward`).

    A wrapped forward checkpoints only when grad is enabled (evaluation runs as before). Keyword
    arguments reach the forward, except those `checkpoint` itself takes (`use_reentrant`,
    `context_fn`, `determinism_check`, `debug`, `preserve_rng_state`); tensors among them are
    handed to `checkpoint` by position, so the input it keeps is a saved tensor the profile
    counts.

    The planned model copies as a model: `copy.deepcopy` (an EMA, `AveragedModel`) gives a
    planned copy computing from its own weights; `pickle` and `torch.save(model)` write it
    without the plan (the file loads without wandb_modprof; apply the plan again after
    loading).

    Examples:
        >>> plan = prof.checkpoint_plan(0.5)                                # doctest: +SKIP
        >>> applied = wandb_modprof.apply_checkpoint_plan(model, plan)     # doctest: +SKIP
        >>> applied.module_names                                            # doctest: +SKIP
        ('blocks.0', 'blocks.1.mlp')
        >>> applied.remove()                                                # doctest: +SKIP
    """
    if not isinstance(model, nn.Module):
        raise ModProfError(
            f"apply_checkpoint_plan(model=...): expected a torch.nn.Module; got "
            f"{type(model).__name__}"
        )
    checked = _as_plan(plan)
    if _compiled(model):
        raise ModProfError(
            "apply_checkpoint_plan(model=...): expected an uncompiled model; got a "
            "torch.compile'd one (OptimizedModule): apply the plan to the model before "
            "compiling it"
        )
    modules = dict(model.named_modules(remove_duplicate=False))
    _check_names(model, modules, checked)
    for name in checked.module_names:
        _check_module(modules[name], name)
    applied = AppliedPlan(checked)
    for name in checked.module_names:
        module = modules[name]
        own = module.__dict__.get("forward", _NONE)
        wrapped = CheckpointedForward(module, name, None if own is _NONE else own)
        setattr(module, "forward", wrapped)  # noqa: B010  (mypy: a method)
        applied._wrapped.append(_Wrapped(module, name, own))
    return applied


def _check_names(model: nn.Module, modules: Mapping[str, nn.Module], plan: CheckpointPlan) -> None:
    """The plan's modules are the model's: named, never the root, of the plan's classes."""
    where = f"apply_checkpoint_plan(model={type(model).__name__})"
    made = f" It was made on {plan.model_name}." if plan.model_name else ""
    hint = f"(a plan of another model?{made})"
    if "" in plan.module_names:
        raise ModProfError(
            f"{where}: expected modules inside the model; got '' (the root module) in the "
            "plan: the root is never checkpointed (a plan written by hand?)"
        )
    missing = [n for n in plan.module_names if n not in modules]
    if missing:
        raise ModProfError(
            f"{where}: expected the plan's modules in the model; got {len(missing)} it lacks: "
            f"{', '.join(missing[:5])} {hint}"
        )
    # The class name the profile recorded (`type_name`: the user's class under DDP or FSDP2
    # wrappers); a hand-written entry without one is checked by name only.
    wrong = [
        (c.module_name, c.module_type, type_name(modules[c.module_name]))
        for c in plan.calls
        if c.module_type and type_name(modules[c.module_name]) != c.module_type
    ]
    if wrong:
        name, planned, found = wrong[0]
        more = f" ({len(wrong) - 1} more differ)" if len(wrong) > 1 else ""
        raise ModProfError(
            f"{where}: expected the plan's module classes; got {name!r} of class {found} where "
            f"the plan has {planned}{more} {hint}"
        )


def _as_plan(plan: object) -> CheckpointPlan:
    if isinstance(plan, CheckpointPlan):
        return plan
    if isinstance(plan, Mapping):
        return CheckpointPlan.from_json(plan, "apply_checkpoint_plan(plan)")
    if isinstance(plan, (str, os.PathLike)):
        path = Path(plan)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ModProfError(
                f"apply_checkpoint_plan(plan={str(path)!r}): expected a JSON file written from "
                f"CheckpointPlan.to_json(); got {type(e).__name__}: {e}"
            ) from None
        return CheckpointPlan.from_json(data, str(path))
    raise ModProfError(
        "apply_checkpoint_plan(plan=...): expected a CheckpointPlan, its to_json() dict or a "
        f"JSON file path; got {type(plan).__name__}"
    )


def _compiled(module: nn.Module) -> bool:
    # Importing Dynamo only to ask costs a second where nothing was compiled: asked only
    # when it is loaded already (None otherwise).
    compiled = tp.compiled_module_type()
    return compiled is not None and isinstance(module, compiled)


def _check_module(module: nn.Module, name: str) -> None:
    if _compiled(module):
        raise ModProfError(
            f"apply_checkpoint_plan: expected uncompiled modules; got {name!r} compiled "
            "(OptimizedModule): apply the plan before compiling"
        )
    if isinstance(module.__dict__.get("forward"), CheckpointedForward):
        raise ModProfError(
            f"apply_checkpoint_plan: expected modules not checkpointed yet; got {name!r} "
            "already wrapped by a plan (remove() that plan first)"
        )
