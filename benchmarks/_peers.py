"""The tools a user would pick instead of wandb_modprof, each wrapped around every training step.

Each `Tool` is attached to its own deep copy of the model and used the way a user would to get
per-step data:

* ``torch.profiler``: a fresh ``torch.profiler.profile(activities=[CPU])`` (plus CUDA on a
  GPU) around each step, then ``prof.events()`` (the profiler parses its events lazily: this is
  the minimum a user pays to read anything). Default settings give op-level data only: per-module
  numbers would need ``with_stack=True`` or ``with_modules=True``, which cost more;
* ``torch.profiler (memory)``: the same with ``profile_memory=True``: per-op allocations;
* ``MemTracker``: ``torch.distributed._tools.mem_tracker.MemTracker`` (torch's per-module memory
  tracker by category), ``track_external(model, optimizer)`` once, ``with tracker:`` around
  each step and ``reset_mod_stats()`` after it (otherwise its snapshots grow every step);
* ``FlopCounterMode``: ``torch.utils.flop_counter.FlopCounterMode(display=False)`` around each
  step, then ``get_flop_counts()`` (per-module FLOPs, no time, no memory);
* ``DeepSpeed-style timer``: what DeepSpeed's flops profiler does for latency, written here
  (DeepSpeed itself is not installed): a forward pre-hook and a forward hook on every module,
  ``time.perf_counter()`` in both, ``torch.cuda.synchronize()`` before each reading on CUDA,
  durations summed per module and read after the step. Forward only. The real profiler also
  patches ``torch.nn.functional`` to count FLOPs and MACs, which this timer does not, so it
  is a lower bound of DeepSpeed's cost;
* ``wandb.watch``: ``run.watch(model, log="all", log_freq=1)`` on a real offline W&B run in a
  temporary directory: parameter and gradient histograms every step (hooks on every step).

and wandb_modprof itself: unsampled (``log_freq=10**9``), sampled (``log_freq=1``, W&B log off
as in benchmarks/overhead.py) and sampled with every sample logged to a disabled W&B run.

`bwd_or_mem` says whether a tool measures per-module backward time or memory, the things
wandb_modprof is judged against ("below every peer that measures per-module backward or
memory"): MemTracker (memory per module) and torch.profiler with memory (per op, the closest
torch.profiler comes). The DeepSpeed-style timer (forward time), FlopCounterMode (FLOPs),
torch.profiler's defaults (op time) and wandb.watch (histograms) measure neither.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import wandb
from torch import nn

import wandb_modprof

UNSAMPLED_LOG_FREQ = 10**9


class Tool:
    """No tool: the plain model (also the A/A control copy)."""

    key = "plain"
    label = "plain (no tool)"
    gives = "-"
    bwd_or_mem = False

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def step(self) -> AbstractContextManager[Any]:
        """The context around one whole step (zero_grad, forward, loss, backward, optimizer)."""
        return nullcontext()

    def read(self) -> None:
        """What a user does after each step to get the step's data."""

    def close(self) -> None:
        """Remove hooks and free what the tool holds."""


class Control(Tool):
    key = "control"
    label = "plain copy (A/A control)"


def _run_env(tmp: str) -> None:
    """W&B kept offline inside `tmp`, as tests/conftest.py does (never the network)."""
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):
        os.environ[var] = os.path.join(tmp, var.lower())
        os.makedirs(os.environ[var], exist_ok=True)
    os.environ.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CONSOLE="off",
        WANDB_DISABLE_GIT="true",
        WANDB_DISABLE_CODE="true",
    )
    os.environ.pop("WANDB_API_KEY", None)


@contextlib.contextmanager
def wandb_runs() -> Iterator[Callable[[str], Any]]:
    """`new_run(mode)` makes W&B runs ("disabled" or "offline", in a temporary directory);
    all are finished on exit."""
    runs: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="modprof-bench-") as tmp:
        _run_env(tmp)

        def new_run(mode: str) -> Any:
            run = wandb.init(mode=mode, dir=tmp, project="modprof-bench", reinit="create_new")
            runs.append(run)
            return run

        try:
            yield new_run
        finally:
            for run in runs:
                run.finish()


class ModProf(Tool):
    bwd_or_mem = True
    gives = "fwd + bwd time, memory by kind, norms, FLOPs per module call"

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        run: Any,
        log_freq: int,
        logged: bool,
    ) -> None:
        super().__init__(model, optimizer)
        self.handle = wandb_modprof.watch(model, log_freq=log_freq, run=run)
        if not logged:
            # measurement alone: the W&B log (table + wandb.Table per sample) is its own row
            self.handle._wandb_log = None
        if log_freq == UNSAMPLED_LOG_FREQ:
            self.key, self.label = "unsampled", "wandb_modprof, unsampled (log_freq=10**9)"
        elif logged:
            self.key, self.label = "logged", "wandb_modprof, sampled + W&B log (log_freq=1)"
        else:
            self.key, self.label = "sampled", "wandb_modprof, sampled (log_freq=1)"

    def close(self) -> None:
        self.handle.unwatch()


class TorchProfiler(Tool):
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, memory: bool) -> None:
        super().__init__(model, optimizer)
        self.memory = memory
        self.activities = [torch.profiler.ProfilerActivity.CPU]
        if next(model.parameters()).is_cuda:
            self.activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.key = "torch_profiler_mem" if memory else "torch_profiler"
        self.label = "torch.profiler (profile_memory=True)" if memory else "torch.profiler"
        self.gives = "op time + op allocations" if memory else "op time (no modules)"
        self.bwd_or_mem = memory
        self._prof: Any = None

    def step(self) -> AbstractContextManager[Any]:
        self._prof = torch.profiler.profile(activities=self.activities, profile_memory=self.memory)
        return self._prof  # type: ignore[no-any-return]

    def read(self) -> None:
        self._prof.events()
        self._prof = None


class MemTrackerTool(Tool):
    key = "memtracker"
    label = "MemTracker"
    gives = "memory by category per module (no time)"
    bwd_or_mem = True

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        from torch.distributed._tools.mem_tracker import MemTracker

        super().__init__(model, optimizer)
        self.tracker = MemTracker()
        self.tracker.track_external(model, optimizer)

    def step(self) -> AbstractContextManager[Any]:
        return self.tracker

    def read(self) -> None:
        self.tracker.reset_mod_stats()


class FlopCounter(Tool):
    key = "flop_counter"
    label = "FlopCounterMode"
    gives = "FLOPs per module (no time, no memory)"

    def step(self) -> AbstractContextManager[Any]:
        from torch.utils.flop_counter import FlopCounterMode

        self._mode = FlopCounterMode(display=False)
        return self._mode

    def read(self) -> None:
        self._mode.get_flop_counts()


class DeepSpeedTimer(Tool):
    """DeepSpeed flops-profiler-style forward latency per module (see the module docstring)."""

    key = "deepspeed_timer"
    label = "DeepSpeed-style timer (sync per module)"
    gives = "forward time per module (no backward)"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().__init__(model, optimizer)
        sync = torch.cuda.synchronize if next(model.parameters()).is_cuda else None
        self.durations: dict[nn.Module, float] = {}
        starts: dict[nn.Module, list[float]] = {}

        def pre(module: nn.Module, args: Any) -> None:
            if sync is not None:
                sync()
            starts.setdefault(module, []).append(time.perf_counter())

        def post(module: nn.Module, args: Any, output: Any) -> None:
            if sync is not None:
                sync()
            elapsed = time.perf_counter() - starts[module].pop()
            self.durations[module] = self.durations.get(module, 0.0) + elapsed

        self.handles = [
            h for m in model.modules() for h in (m.register_forward_pre_hook(pre),
                                                 m.register_forward_hook(post))
        ]  # fmt: skip

    def read(self) -> None:
        self.last = dict(self.durations)  # what a user would log per step
        self.durations.clear()

    def close(self) -> None:
        for h in self.handles:
            h.remove()


class WandbWatch(Tool):
    key = "wandb_watch"
    label = 'wandb.watch(log="all", log_freq=1)'
    gives = "parameter + gradient histograms (no time, no memory)"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, run: Any) -> None:
        super().__init__(model, optimizer)
        self.run = run
        run.watch(model, log="all", log_freq=1)

    def close(self) -> None:
        self.run.unwatch(self.model)


ALL = (
    "plain",
    "control",
    "unsampled",
    "sampled",
    "logged",
    "torch_profiler",
    "torch_profiler_mem",
    "memtracker",
    "flop_counter",
    "deepspeed_timer",
    "wandb_watch",
)


def make_tool(  # noqa: PLR0911 (one return per tool reads best)
    key: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    new_run: Callable[[str], Any],
    shared: dict[str, Any],
) -> Tool:
    """The tool `key` (one of ALL) attached to `model`; `shared` keeps one offline run for
    every wandb.watch of the process."""
    if key == "plain":
        return Tool(model, optimizer)
    if key == "control":
        return Control(model, optimizer)
    if key in ("unsampled", "sampled", "logged"):
        log_freq = UNSAMPLED_LOG_FREQ if key == "unsampled" else 1
        return ModProf(model, optimizer, new_run("disabled"), log_freq, logged=key == "logged")
    if key in ("torch_profiler", "torch_profiler_mem"):
        return TorchProfiler(model, optimizer, memory=key == "torch_profiler_mem")
    if key == "memtracker":
        return MemTrackerTool(model, optimizer)
    if key == "flop_counter":
        return FlopCounter(model, optimizer)
    if key == "deepspeed_timer":
        return DeepSpeedTimer(model, optimizer)
    if key == "wandb_watch":
        if "offline" not in shared:
            shared["offline"] = new_run("offline")
        return WandbWatch(model, optimizer, shared["offline"])
    raise SystemExit(f"unknown tool {key!r}; known: {', '.join(ALL)}")
