"""Module hooks for one model, routed to the step session being captured.

The root module always carries one forward pre-hook and one forward hook (cheap: a counter and
a few attribute reads). Every other module gets hooks only while a sampled step is being
captured (`watch`), or for the whole `with profile(...)` block; modules without hooks take
`nn.Module._call_impl`'s fast path (which submodules carry hooks, and when: the base class,
`submodule_hooks.SubmoduleHooks`). Process-global module hooks are used only for TorchScript
submodules, and only while they are hooked (`model/scripted.py`).

`Capture` builds its parts from the options (clock, device memory, structure driver) and
attaches and detaches them. Each part owns its state and is held, not inherited:

* `root_hooks.RootHooks`: the root hooks' step boundaries (sampled, a structure pass, or
  untouched; the sampled forward's end);
* `session_hooks.SessionHooks`: a sampled step's session from its start to the sink (the
  submodules' hook bodies, the gradients read at its end, internal errors);
* `submodule_hooks.SubmoduleHooks`: which submodules carry hooks, and when; the model index;
* `structure.structure_driver.StructureDriver`: the structure passes.
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
from wandb_modprof.capture.session_hooks import InternalErrors, SessionHooks
from wandb_modprof.capture.sink import SampleSink
from wandb_modprof.capture.step import hook_cost
from wandb_modprof.capture.step import registry as _registry
from wandb_modprof.capture.step import torch_private as tp
from wandb_modprof.capture.step.clock import Clock, CpuClock, make_clock, model_device
from wandb_modprof.capture.step.warmup import after_warmup
from wandb_modprof.capture.structure.structure_driver import StructureDriver
from wandb_modprof.capture.submodule_hooks import SubmoduleHooks


class Capture:
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
        self.model = model
        self.options = options
        if options.nvtx:
            check_available()
        device = model_device(model)
        refuse_meta_model(type_name(model), device)  # (an ensemble's base)
        clock = make_clock(options, device)
        if isinstance(clock, CpuClock):
            clock.cost = hook_cost.measured()
        memory: DeviceMemory | None = None
        if device.type != "cpu":  # allocator deltas and peaks
            memory = AcceleratorMemory(device)
        self.errors = InternalErrors()
        # which GradScaler's scale the sampled gradients carry (only where norms are read)
        self.loss_scales = LossScaleWatch(model, self.errors.warn_once) if options.norms else None
        self.sink = sink
        self.modules = SubmoduleHooks(model, hooks_only_when_sampling)
        self.structures = StructureDriver(
            self.modules,
            self.errors.warn_once,
            sink,
            options.structure,
            structure_eligible,
            (options.peak_flops, options.peak_bw),
        )
        self.sessions = SessionHooks(
            model=model,
            options=options,
            optimizer=optimizer,
            clock=clock,
            memory=memory,
            loss_scales=self.loss_scales,
            sink=sink,
            modules=self.modules,
            structures=self.structures,
            errors=self.errors,
        )
        self.modules.connect(self.sessions.pre, self.sessions.post, self.sessions.busy)
        # The first step's sample is the model's first step in this process when nothing says
        # the model ran before (`registry.cold_model`); `warmup=` steps run untimed instead.
        cold = not options.warmup and _registry.cold_model(model)
        self.roots = RootHooks(
            model,
            self.modules,
            self.sessions,
            self.structures,
            after_warmup(should_sample, options.warmup),
            cold,
        )
        self._root_handles: list[Removable] = []
        self.owner: object = None  # the WatchHandle / ProfileBlock: alive as long as the hooks
        self.attached = False

    # ---- what other parts of the package read ------------------------------------------
    @property
    def clock(self) -> Clock:
        return self.sessions.clock

    @clock.setter
    def clock(self, clock: Clock) -> None:  # (tests: a clock of known speed)
        self.sessions.clock = clock

    @property
    def memory(self) -> DeviceMemory | None:
        return self.sessions.memory

    @memory.setter
    def memory(self, memory: DeviceMemory | None) -> None:  # (tests: a scripted allocator)
        self.sessions.memory = memory

    @property
    def timed_forward(self) -> StepSession | None:
        """The step session of the timed forward now running, if any."""
        return self.sessions.forward

    @property
    def transformed_steps(self) -> int:
        return self.roots.transformed_steps

    @property
    def root_hook_s(self) -> float:
        return self.roots.root_hook_s

    def warn_once(self, where: str, error: Exception) -> None:
        self.errors.warn_once(where, error)

    # ---- attach / detach ---------------------------------------------------------------
    def attach(self) -> None:
        # (around the compiled call for a root compiled in place: `compiled.hook_calls`)
        self._root_handles = hook_calls(self.model, self.roots.pre, self.roots.post)
        self.attached = True
        _registry.attach_capture(self)
        if self.loss_scales is not None:
            self.loss_scales.open()
        self.modules.attach_unless_lazy()

    def detach(self) -> None:
        """Remove every hook; samples whose backward never came are dropped."""
        for handle in self._root_handles:
            handle.remove()
        self._root_handles = []
        self.modules.drop()  # (its hooks hold the sessions' bound methods)
        self.sessions.end_interrupted_forward()  # (cut short by a KeyboardInterrupt)
        if self.structures.current is not None:
            self.structures.end()
        self.structures.between_steps()
        self.sessions.close()
        self.attached = False
        _registry.detach_capture(self)
        if self.loss_scales is not None:
            self.loss_scales.close()
        self.sink.resolve_pending(force=True)

    def quiet(self) -> None:
        """In a forked child: sample nothing, draw no graph, deliver nothing (`registry`)."""
        self.roots.should_sample = _never
        self.roots.deliver = _nothing
        self.structures.enabled = self.structures.due = False
        self.sessions.sample_due = False
        self.sessions.pending = []
        self.attached = False

    # ---- after each sample (`watch`) ---------------------------------------------------
    def set_after_sample(self, fn: Callable[[], bool]) -> None:
        self.sessions.after_sample = fn
        self.roots.deliver = delivery(self.sessions, fn, self)


def _never(module: nn.Module) -> None:
    return None


def _nothing() -> None:
    return None
