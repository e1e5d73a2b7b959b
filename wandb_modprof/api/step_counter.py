"""Which training steps `watch` samples: every `log_freq`-th, or with `log_freq="auto"` when
the measured cost of sampling allows (`api.overhead`). Also where each step's start is timed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from wandb_modprof._warn import warn_safely
from wandb_modprof.api.overhead import OverheadMeter
from wandb_modprof.capture.step import hook_cost
from wandb_modprof.capture.structure import calibration


class StepCounter:
    """Counts training steps and says which ones to sample.

    A training step is a forward of the watched model with `model.training` and grad enabled
    (eval, `no_grad` and `inference_mode` forwards are not counted). With an `optimizer`, steps
    are optimizer steps instead: with gradient accumulation, the first micro-batch of every
    `log_freq`-th optimizer step is sampled. Steps are 1-based and the `log_freq`-th,
    `2*log_freq`-th ... are sampled, so the warm-up first step is skipped unless `log_freq=1`.
    """

    def __init__(
        self, log_freq: int | str, optimizer: torch.optim.Optimizer | None, budget: float
    ) -> None:
        self.log_freq = log_freq  # an int, or "auto": sample when `meter` says it is due
        self.budget = budget  # log_freq="auto": the share of training time sampling may take
        self.meter = OverheadMeter()
        self.passes: Callable[[], int] = lambda: 0  # structure passes so far (the capture's)
        self.hook_s: Callable[[], float] | None = None  # the root hooks' own seconds so far
        self._floor_told = False
        self._passes = 0
        self.forwards = 0
        self.optimizer_steps = 0
        self._last_sampled = 0
        self._handle = None
        if optimizer is not None:
            self._handle = optimizer.register_step_post_hook(self._on_optimizer_step)

    def follow(self, capture: Any) -> None:
        """Read `capture`'s structure passes and its root hooks' clock (`Capture.root_hook_s`),
        with the interpreter's cost to reach them (`capture.step.hook_cost`): the floor."""
        structures = capture.structures
        self.passes = lambda: structures.passes
        self.hook_s = lambda: capture.root_hook_s
        self.meter.reach_s = hook_cost.measured().call_ns * 1e-9

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_steps += 1

    @property
    def counts_optimizer_steps(self) -> bool:
        return self._handle is not None

    @property
    def steps(self) -> int:
        return self.optimizer_steps if self._handle is not None else self.forwards

    @staticmethod
    def is_training_forward(module: nn.Module) -> bool:
        return module.training and torch.is_grad_enabled() and not torch.is_inference_mode_enabled()

    def pass_allowed(self, module: nn.Module) -> bool:
        """Whether a structure pass may take this forward: a training one and, with
        `log_freq="auto"`, one the budget allows (`OverheadMeter.pass_due`)."""
        if not self.is_training_forward(module):
            return False
        if isinstance(self.log_freq, int):
            return True
        return self.meter.pass_due(self.budget, calibrating=not calibration.calibrated())

    def __call__(self, module: nn.Module) -> int | None:
        if not self.is_training_forward(module):
            return None
        passes = self.passes()
        if passes != self._passes:  # the step that just ended was a structure pass
            self._passes = passes
            self.meter.mark("structure")
        self.meter.step(hooks_s=self.hook_s() if self.hook_s is not None else None)
        self.forwards += 1
        step = self.optimizer_steps + 1 if self._handle is not None else self.forwards
        if step == self._last_sampled:
            return None
        if isinstance(self.log_freq, int):
            if step % self.log_freq:
                return None
        elif step < 2 or not self.meter.due(self.budget):  # step 1: warm-up or structure pass
            if self.meter.floor_over is not None and not self._floor_told:
                self._tell_floor(module, *self.meter.floor_over)
            return None
        self._last_sampled = step
        self.meter.mark("sampled")
        return step

    def _tell_floor(self, module: nn.Module, floor: float, typical: float) -> None:
        self._floor_told = True
        warn_safely(
            f"wandb_modprof: watching {type(module).__name__} costs {1e6 * floor:.1f} us of each "
            f"{1e6 * typical:.0f} us training step ({100 * floor / typical:.2f} %) before any "
            f"sample, at or above overhead={self.budget:g}: log_freq='auto' samples nothing "
            "while that holds. Pass a larger settings=Settings(overhead=...) or a fixed log_freq "
            "to sample this model. "
            "Training is not affected.",
            RuntimeWarning,
        )

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
