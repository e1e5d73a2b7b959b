"""`watch` / `unwatch`: sample every `log_freq`-th training step of a training loop."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import _registry
from ._capture import Capture
from ._errors import ModProfError
from ._options import Options, check_bool, parse_timing
from ._profile import Profile
from ._validate import check_log_freq, check_model, check_optimizer, check_run


class _StepCounter:
    """Counts training steps and says which ones to sample.

    A training step is a forward of the watched model with `model.training` and grad enabled
    (eval, `no_grad` and `inference_mode` forwards are not counted). With an `optimizer`, steps
    are optimizer steps instead: with gradient accumulation, the first micro-batch of every
    `log_freq`-th optimizer step is sampled. Steps are 1-based and the `log_freq`-th,
    `2*log_freq`-th ... are sampled, so the warm-up first step is skipped unless `log_freq=1`.
    """

    def __init__(self, log_freq: int, optimizer: torch.optim.Optimizer | None) -> None:
        self.log_freq = log_freq
        self.forwards = 0
        self.optimizer_steps = 0
        self._last_sampled = 0
        self._handle = None
        if optimizer is not None:
            self._handle = optimizer.register_step_post_hook(self._on_optimizer_step)

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_steps += 1

    @property
    def steps(self) -> int:
        return self.optimizer_steps if self._handle is not None else self.forwards

    @staticmethod
    def is_training_forward(module: nn.Module) -> bool:
        return module.training and torch.is_grad_enabled() and not torch.is_inference_mode_enabled()

    def __call__(self, module: nn.Module) -> int | None:
        if not self.is_training_forward(module):
            return None
        self.forwards += 1
        step = self.optimizer_steps + 1 if self._handle is not None else self.forwards
        if step % self.log_freq or step == self._last_sampled:
            return None
        self._last_sampled = step
        return step

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()


class WatchHandle:
    """Returned by `watch`; `profile()` gives the aggregated measurements so far."""

    kind = "watched"

    def __init__(
        self,
        model: nn.Module,
        log_freq: int,
        run: Any,
        optimizer: torch.optim.Optimizer | None,
        options: Options,
    ) -> None:
        self.model = model
        self.log_freq = log_freq
        self.run = run  # W&B logging arrives with the panel; the run is kept for it
        self._counter = _StepCounter(log_freq, optimizer)
        self._capture = Capture(
            model,
            options,
            optimizer,
            self._counter,
            hooks_only_when_sampling=True,
            structure_eligible=self._counter.is_training_forward,
        )
        self._capture.owner = self

    @property
    def steps(self) -> int:
        """Training steps counted so far (see `watch` for what counts as a step)."""
        return self._counter.steps

    @property
    def active(self) -> bool:
        return self._capture.attached

    def profile(self) -> Profile:
        """The aggregated profile; waits for the device only for samples not yet resolved."""
        self._capture.profile._resolve_pending(force=True)
        return self._capture.profile

    def unwatch(self) -> Profile:
        """Remove every hook (module, root, optimizer) and return the final profile."""
        if self._capture.attached:
            self._capture.detach()
            self._counter.remove()
            _registry.release(self.model, self)
        return self._capture.profile

    def __repr__(self) -> str:
        state = "active" if self.active else "removed"
        return (
            f"<wandb_modprof.WatchHandle {type(self.model).__name__} log_freq={self.log_freq} "
            f"steps={self.steps} samples={self._capture.profile._num_samples} {state}>"
        )


def watch(
    model: nn.Module,
    log_freq: int = 100,
    run: Any = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    timing: str = "auto",
    activations: bool = True,
    norms: bool = True,
    structure: bool = True,
    nvtx: bool = False,
) -> WatchHandle:
    """Measure every module of `model` on every `log_freq`-th training step.

    >>> handle = wandb_modprof.watch(model, log_freq=100)      # doctest: +SKIP
    >>> for batch in loader:                                   # doctest: +SKIP
    ...     loss = model(batch).loss; loss.backward(); opt.step(); opt.zero_grad()
    >>> print(handle.profile().summary())                      # doctest: +SKIP

    Between samples the model carries one cheap forward pre-hook and one forward hook on the
    root module only; every other module runs hook-free. On a sampled step, hooks are added
    before its forward and removed when its backward has finished.

    Args:
        model: the module to measure (the same object the training loop calls).
        log_freq: sample every `log_freq`-th training step (>= 1).
        run: the W&B run to log to (default: `wandb.run`); logging comes with the W&B panel.
        optimizer: if given, steps are counted as optimizer steps (gradient accumulation) and
            optimizer-state bytes are measured per module.
        timing: "auto" (host clock on CPU, device events on accelerators), "cpu" or "device".
        activations: measure bytes saved for backward (saved-tensor hooks on sampled steps).
        norms: measure parameter and gradient norms per module.
        structure: capture the module graph (dataflow between calls) and FLOPs on the first
            training step, and again after a sampled step that called a new sequence of
            modules. That step is never timed (if it was due for sampling, it is skipped).
        nvtx: on sampled steps, emit NVTX ranges `<module>.forward` / `<module>.backward` for
            Nsight Systems (needs a CUDA build of torch).
    """
    check_model(model, "watch()")
    options = Options(
        timing=parse_timing(timing),
        activations=check_bool("activations", activations),
        norms=check_bool("norms", norms),
        structure=check_bool("structure", structure),
        nvtx=check_bool("nvtx", nvtx),
    )
    handle = WatchHandle(
        model, check_log_freq(log_freq), check_run(run), check_optimizer(optimizer), options
    )
    _registry.claim(model, handle, "watching")
    try:
        handle._capture.attach()
    except BaseException:
        _registry.release(model, handle)
        raise
    return handle


def unwatch(model: nn.Module | None = None) -> None:
    """Remove wandb_modprof's hooks from `model`, or from every watched model if None."""
    if model is None:
        for owner in _registry.owners():
            if isinstance(owner, WatchHandle):
                owner.unwatch()
        return
    check_model(model, "unwatch()")
    owner = _registry.owner_of(model)
    if not isinstance(owner, WatchHandle):
        raise ModProfError(
            f"unwatch() expected a model passed to watch(); {type(model).__name__} is not watched"
        )
    owner.unwatch()
