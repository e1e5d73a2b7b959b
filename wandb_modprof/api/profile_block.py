"""`with profile(model) as prof:` measures every forward (and its backward) inside the block."""

from __future__ import annotations

from types import TracebackType

import torch
from torch import nn

from wandb_modprof._validate import check_model, check_optimizer
from wandb_modprof.api.profile import Profile
from wandb_modprof.api.settings import (
    PROFILE_FIELDS,
    Settings,
    accepts_moved,
    capture_options,
    check_settings,
)
from wandb_modprof.capture.hooks import Capture
from wandb_modprof.capture.model.wrappers import type_name
from wandb_modprof.capture.options import Options
from wandb_modprof.capture.root_hooks import recover_interrupted_captures
from wandb_modprof.capture.step import registry as _registry
from wandb_modprof.stats.accumulator import ProfileAccumulator


class ProfileBlock:
    """The context manager `profile` returns: `with` hooks the model and gives the `Profile`
    that the block's forwards fill; leaving the block (also by an exception) removes the hooks.

    A model is hooked by one `watch` or `profile` at a time: entering the block raises
    `ModProfError` if the model is already watched or inside another profile block.
    """

    kind = "profiled"

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer | None, options: Options
    ) -> None:
        self.model = model
        self._forwards = 0
        acc = ProfileAccumulator(type_name(model))
        self._profile = Profile(acc.model_name, acc)
        self._capture = Capture(
            model, options, optimizer, self._every_forward, hooks_only_when_sampling=False, sink=acc
        )
        self._capture.owner = self

    def _every_forward(self, module: nn.Module) -> int:
        self._forwards += 1
        return self._forwards

    def __enter__(self) -> Profile:
        # a step of another model that an exception cut short leaves nothing pushed here
        recover_interrupted_captures()
        _registry.claim(self.model, self, "profiling")
        try:
            self._capture.attach()
        except BaseException:
            _registry.release(self.model, self)
            raise
        return self._profile

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._capture.detach()
        _registry.release(self.model, self)


@accepts_moved("profile", PROFILE_FIELDS)
def profile(
    model: nn.Module,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    activations: bool = True,
    norms: bool = True,
    structure: bool = True,
    settings: Settings | None = None,
) -> ProfileBlock:
    """Measure every forward of `model` (and its backward) inside a `with` block.

    Every forward inside the block is one sample, train or eval, with or without grad; its
    backward is measured when it runs inside the block. Arguments as for `watch`; `settings`
    takes `Settings`' fields but the five of a W&B run (`offload`, `overhead`, `chart`,
    `default_mode`, `default_scale`).

    One step is enough: the first timed forward with no module graph yet derives the graph
    (calls, dataflow edges) from what it records anyway, so a block of one forward + backward
    gives times, memory, graph, trace and report (FLOPs not measured: marked so). With
    `structure=True` (the default) the next forward is a structure pass: untimed, it adds FLOPs
    and the edges only Python-level tracing sees, and replaces the derived graph. A later
    forward that calls a new sequence of modules triggers one more structure pass.
    `structure=False` times every forward and the graph has no dataflow edges.

    A model's first step in the process is mostly one-time start-up (allocator growth, kernel
    selection, lazy initialisation). A sample of it is marked so (`Sample.cold_start`; the
    summary, report and panel say it), and left out of the statistics once a later sample
    exists. `settings=Settings(warmup=N)` runs the block's first N forwards untimed instead.

    Examples:
        >>> with wandb_modprof.profile(model) as prof:              # doctest: +SKIP
        ...     model(x).sum().backward()
        >>> print(prof.summary())                                   # doctest: +SKIP
    """
    check_model(model, "profile()")
    given = check_settings(settings, "profile()")
    options = capture_options(given, activations=activations, norms=norms, structure=structure)
    return ProfileBlock(model, check_optimizer(optimizer), options)
