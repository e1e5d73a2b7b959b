"""Module hooks for one model, routed to the step session being captured.

The root module always carries one forward pre-hook and one forward hook (cheap: a counter and
a few attribute reads). Every other module gets hooks only while a sampled step is being
captured (`watch`), or for the whole `with profile(...)` block; modules without hooks take
`nn.Module._call_impl`'s fast path (which submodules carry hooks, and when: the base class,
`submodule_hooks.SubmoduleHooks`). Process-global module hooks are used only for TorchScript
submodules, and only while they are hooked (`model/scripted.py`).

Here `Capture` is built from the options (clock, device memory, structure driver), attached
and detached. Its hook bodies are its base classes, each the base of the one before it, so
that they read the capture's state in one attribute read:

* `root_hooks.RootHooks`: the root hooks' step boundaries (sampled, a structure pass, or
  untouched; the sampled forward's end);
* `session_hooks.SessionHooks`: a sampled step's session from its start to the sink (the
  submodules' hook bodies, the gradients read at its end, internal errors);
* `submodule_hooks.SubmoduleHooks`: which submodules carry hooks, and when; the model index.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from wandb_modprof.capture.backward.nvtx import check_available
from wandb_modprof.capture.delivery import delivery
from wandb_modprof.capture.memory.device_memory import AcceleratorMemory, DeviceMemory
from wandb_modprof.capture.memory.loss_scale import LossScaleWatch
from wandb_modprof.capture.model.compiled import Removable, hook_calls
from wandb_modprof.capture.model.transforms import refuse_meta_model
from wandb_modprof.capture.model.wrappers import type_name
from wandb_modprof.capture.options import Options
from wandb_modprof.capture.root_hooks import RootHooks
from wandb_modprof.capture.session import StepSession
from wandb_modprof.capture.sink import SampleSink
from wandb_modprof.capture.step import hook_cost
from wandb_modprof.capture.step import registry as _registry
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.step.clock import CpuClock, make_clock, model_device
from wandb_modprof.capture.step.warmup import after_warmup
from wandb_modprof.capture.structure.structure_driver import StructureDriver


class Capture(RootHooks):
    """Installs and removes hooks; creates a `StepSession` per sampled root forward and hands
    it, once its backward ended, to `sink`."""

    def __init__(
        self,
        model: nn.Module,
        options: Options,
        optimizer: torch.optim.Optimizer | None,
        should_sample: Callable[[nn.Module], int | None],
        hooks_only_when_sampling: bool,
        structure_eligible: Callable[[nn.Module], bool] = lambda module: True,
        *,
        sink: SampleSink,
    ) -> None:
        tp.check()
        super().__init__(model, hooks_only_when_sampling)  # (`submodule_hooks`)
        self.options = options
        self.optimizer = optimizer
        self._should_sample = after_warmup(should_sample, options.warmup)
        if options.nvtx:
            check_available()
        device = model_device(model)
        refuse_meta_model(type_name(model), device)  # (an ensemble's base)
        self.clock = make_clock(options, device)
        if isinstance(self.clock, CpuClock):
            self.clock.cost = hook_cost.measured()
        self.memory: DeviceMemory | None = None
        if device.type != "cpu":  # allocator deltas and peaks
            self.memory = AcceleratorMemory(device)
        # which GradScaler's scale the sampled gradients carry (only where norms are read)
        self.loss_scales = LossScaleWatch(model, self.warn_once) if options.norms else None
        self.sink = sink
        self.structures = StructureDriver(
            self, sink, options.structure, structure_eligible, (options.peak_flops, options.peak_bw)
        )
        self._root_handles: list[Removable] = []
        self.owner: object = None  # the WatchHandle / ProfileBlock: alive as long as the hooks
        self._forward: StepSession | None = None
        self._sessions: list[StepSession] = []
        self._stale_sessions: list[StepSession] = []  # their saved-tensor hooks await popping
        self._root_depth = 0  # nesting of root calls (a root may call itself)
        # `watch`'s W&B logging: called outside the autograd engine, at the next root forward
        # after a sample finished; returns False to be asked again on a later step.
        self.after_sample: Callable[[], bool] | None = None
        self.sample_due = False  # a sample finished: hand it over at the next root forward
        self._deliver_fn: Callable[[], None] = lambda: None
        self._warned = False
        self.attached = False
        # The first step's sample is the model's first step in this process when nothing says
        # the model ran before (`registry.cold_model`); `warmup=` steps run untimed instead.
        self._cold = not options.warmup and _registry.cold_model(model)
        self._cold_step = False  # the step now starting is that first step
        self._first_steps = 2  # counts down over the first two steps, then never read again
        # the root hooks' own seconds so far, read with the clock inside them: the floor of
        # `watch` that every step pays (`api.overhead`)
        self.root_hook_s = 0.0

    # ---- attach / detach ---------------------------------------------------------------
    def attach(self) -> None:
        # (around the compiled call for a root compiled in place: `compiled.hook_calls`)
        self._root_handles = hook_calls(self.model, self._root_pre, self._root_post)
        self.attached = True
        _registry.attach_capture(self)
        if self.loss_scales is not None:
            self.loss_scales.open()
        if not self._lazy_children:
            self._attach_children()

    def detach(self) -> None:
        """Remove every hook; samples whose backward never came are dropped."""
        for handle in self._root_handles:
            handle.remove()
        self._root_handles = []
        self._detach_children()
        self._children = None  # (its hooks hold the capture's bound methods)
        if self._forward is not None:  # interrupted mid-forward (KeyboardInterrupt)
            self._end_failed_forward(self._forward)
            self._forward = None
        if self.structures.current is not None:
            self.structures.end()
        self.structures.between_steps()
        for session in self._sessions:
            session.abandon()
        self._sessions = []
        self.attached = False
        _registry.detach_capture(self)
        if self.loss_scales is not None:
            self.loss_scales.close()
        self.sink.resolve_pending(force=True)

    # ---- after each sample (`watch`) ---------------------------------------------------
    def set_after_sample(self, fn: Callable[[], bool]) -> None:
        self.after_sample = fn
        self._deliver_fn = delivery(self, fn)
