"""Apply a checkpoint plan to a model: the planned modules' forwards run under
`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`, reversibly.

>>> plan = prof.checkpoint_plan("50%")                              # doctest: +SKIP
>>> with wandb_modprof.apply_checkpoint_plan(model, plan):          # doctest: +SKIP
...     model(x).sum().backward()          # blocks recomputed in backward, less memory
>>> applied = wandb_modprof.apply_checkpoint_plan(model, "plan.json")  # doctest: +SKIP
>>> applied.remove()                                                # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from wandb_modprof._errors import ModProfError
from wandb_modprof._warn import warn_at_user
from wandb_modprof.records.checkpoint import CheckpointPlan
from wandb_modprof.view.checkpoint_outcome import PlanOutcome, plan_outcome

# Our wrapper says what it is (a dunder attribute: the function's own, nothing global), so a
# second plan over the same module is refused instead of checkpointing twice.
_MARK = "__modprof_checkpoint__"


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
    (`torch.compile`; plan and apply before compiling), a plan naming modules the model lacks
    or the root, and a module already wrapped.

    Running statistics (BatchNorm, InstanceNorm with `track_running_stats`) are updated once
    per step, as without the plan: the recompute in backward runs with every such module of
    the subtree that is training having its `running_mean`, `running_var` and
    `num_batches_tracked` copied before and copied back after (in training they normalise
    with the batch's statistics, so the recompute's outputs are the forward's).

    A wrapped forward checkpoints only when grad is enabled (evaluation runs as before). Keyword
    arguments reach the forward, except those `checkpoint` itself takes (`use_reentrant`,
    `context_fn`, `determinism_check`, `debug`, `preserve_rng_state`); tensors among them are
    handed to `checkpoint` by position, so the input it keeps is a saved tensor the profile
    counts. A module that modifies
    its input in place cannot be checkpointed (the kept input changes; torch's version check
    raises in backward); the planner never picks an in-place leaf (it frees nothing).

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
    missing = [n for n in checked.module_names if n not in modules or n == ""]
    if missing:
        raise ModProfError(
            f"apply_checkpoint_plan: expected the plan's modules in {type(model).__name__}; got "
            f"{len(missing)} it lacks: {', '.join(missing[:5])} (a plan of another model?)"
        )
    for name in checked.module_names:
        _check_module(modules[name], name)
    applied = AppliedPlan(checked)
    for name in checked.module_names:
        module = modules[name]
        own = module.__dict__.get("forward", _NONE)
        wrapped = _checkpointed(module.forward, module, name)
        setattr(module, "forward", wrapped)  # noqa: B010  (a method)
        applied._wrapped.append(_Wrapped(module, name, own))
    return applied


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
    # Compiled modules are `torch._dynamo.eval_frame.OptimizedModule`; importing dynamo only to
    # ask costs a second where nothing was compiled, so ask only when it is already loaded.
    import sys

    if "torch._dynamo" not in sys.modules:
        return False
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(module, OptimizedModule)


def _check_module(module: nn.Module, name: str) -> None:
    if _compiled(module):
        raise ModProfError(
            f"apply_checkpoint_plan: expected uncompiled modules; got {name!r} compiled "
            "(OptimizedModule): apply the plan before compiling"
        )
    if getattr(module.__dict__.get("forward"), _MARK, False):
        raise ModProfError(
            f"apply_checkpoint_plan: expected modules not checkpointed yet; got {name!r} "
            "already wrapped by a plan (remove() that plan first)"
        )


def _checkpointed(forward: Callable[..., Any], module: nn.Module, name: str) -> Callable[..., Any]:
    # modules that may keep running statistics (read again at every recompute: a module may
    # be put in eval mode, or its statistics switched off, after the plan is applied)
    norms = [m for m in module.modules() if hasattr(m, "track_running_stats")]
    warned = False

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal warned
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        cache = _kv_cache(args, kwargs)
        if cache is not None:  # a recompute would extend the cache a second time: run plainly
            if not warned:
                warned = True
                warn_at_user(
                    f"wandb_modprof: apply_checkpoint_plan: {name} is not "
                    f"checkpointed while its call gets a key/value cache ({cache}): a "
                    "recompute would append to the cache again and break the backward. Train "
                    "with model.config.use_cache = False (as transformers' own gradient "
                    "checkpointing does) for the plan to apply.",
                    RuntimeWarning,
                )
            return forward(*args, **kwargs)
        once = _stats_updated_once(forward, norms)
        # Tensors given by keyword go to `checkpoint` by position: it keeps positional tensors
        # as saved tensors (counted in `act_bytes`, released after backward), keyword ones only
        # in a closure that saved-tensor hooks never see (the kept input would go uncounted).
        names = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
        if not names:
            return checkpoint(once, *args, use_reentrant=False, **kwargs)
        n = len(args)

        def by_keyword(*flat: Any, **rest: Any) -> Any:
            return once(*flat[:n], **rest, **dict(zip(names, flat[n:], strict=True)))

        tensors = [kwargs.pop(k) for k in names]
        return checkpoint(by_keyword, *args, *tensors, use_reentrant=False, **kwargs)

    setattr(run, _MARK, True)
    return run


def _kv_cache(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """The type of a key/value cache among a call's arguments (a `transformers` Cache: it has
    `update` and `get_seq_length`), None if there is none."""
    for value in (*args, *kwargs.values()):
        kind = type(value)
        if hasattr(kind, "update") and hasattr(kind, "get_seq_length"):
            return kind.__name__
    return None


def _stats_updated_once(forward: Callable[..., Any], norms: list[nn.Module]) -> Callable[..., Any]:
    """`forward` for one checkpointed call: `checkpoint` runs it in the forward, then again for
    each recompute in backward; those later runs leave running statistics as they found them."""
    runs = 0

    def once(*args: Any, **kwargs: Any) -> Any:
        nonlocal runs
        runs += 1
        if runs == 1:
            return forward(*args, **kwargs)
        with _running_stats_kept(norms):
            return forward(*args, **kwargs)

    return once


RUNNING_STATS = ("running_mean", "running_var", "num_batches_tracked")


@contextlib.contextmanager
def _running_stats_kept(norms: list[nn.Module]) -> Iterator[None]:
    """Copies of the running statistics of every module in `norms` that updates them now
    (training, `track_running_stats`), put back on leaving (also when the recompute stops
    early: non-reentrant checkpointing raises once it has what backward needs)."""
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    with torch.no_grad():
        for m in norms:
            if m.training and getattr(m, "track_running_stats", False):
                for name in RUNNING_STATS:
                    buffer = getattr(m, name, None)
                    if isinstance(buffer, torch.Tensor):
                        kept.append((buffer, buffer.clone()))
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, copy in kept:
                buffer.copy_(copy)
