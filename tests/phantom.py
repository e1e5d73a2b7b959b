"""Phantom models: modules whose forward and backward cost a time known by construction.

Each phantom call runs a custom autograd Function that busy-waits to a deadline on the host
clock, in its forward and in its backward; a container spins for its own work and then calls
its children. So every module call's true inclusive and self time is known without running
anything unobserved, and a profiler's figures can be compared with it directly
(`tests/capture/test_accuracy_by_construction.py`, `benchmarks/accuracy.py`).

Why the comparison holds on a shared, loaded machine: a spin ends at its deadline whatever
happened during it (a preemption inside a spin costs nothing extra), and preemption anywhere
else only ever *adds* time. So over several samples the minimum of a measured time is the
truth plus what the measurement itself adds; the median (what the panel colours by) also
carries how loaded the machine was, and is not a statement about the profiler.

The small work of a call beyond its nominal spin (the Function's Python overhead, the module
call, the spin's overshoot of its deadline at 1 ms) is measured once on unobserved cells
(`overheads`) and added to the truth. Longer spins overshoot a little more (about 1 % of their
length here), which the truth leaves out: it errs low, never in the profiler's favour.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import wandb_modprof


def spin(seconds: float) -> None:
    """Busy-wait `seconds` on the monotonic clock (a sleep would yield the core)."""
    if seconds <= 0:
        return
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


class _Spin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, fwd_s: float, bwd_s: float) -> torch.Tensor:  # type: ignore[override]
        ctx.bwd_s = bwd_s
        # Saved and read back in the backward, as real layers do: non-reentrant checkpointing
        # recomputes a region only when its backward unpacks a saved tensor.
        ctx.save_for_backward(x)
        spin(fwd_s)
        return x * 1.0  # a new tensor: the Function's node joins the graph

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        (_x,) = ctx.saved_tensors
        spin(ctx.bwd_s)
        return grad, None, None


@dataclass(frozen=True)
class Cost:
    """Milliseconds of spin in one call's own code: forward, backward."""

    fwd_ms: float
    bwd_ms: float


class Cell(nn.Module):
    """A leaf of known cost."""

    def __init__(self, cost: Cost) -> None:
        super().__init__()
        self.cost = cost

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Spin.apply(x, self.cost.fwd_ms / 1e3, self.cost.bwd_ms / 1e3)


class Stage(nn.Module):
    """A container with work of its own (a spin) and then its children in sequence; `repeat`
    calls the first child again at the end (a reused module: two calls, two keys)."""

    def __init__(self, own: Cost, cells: list[Cost], repeat: bool = False) -> None:
        super().__init__()
        self.own = own
        self.cells = nn.ModuleList(Cell(c) for c in cells)
        self.repeat = repeat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _Spin.apply(x, self.own.fwd_ms / 1e3, self.own.bwd_ms / 1e3)
        for cell in self.cells:
            x = cell(x)
        if self.repeat:
            x = self.cells[0](x)
        return x


class Checkpointed(nn.Module):
    """A stage run under activation checkpointing: its forward runs again in the backward."""

    def __init__(self, stage: Stage, use_reentrant: bool) -> None:
        super().__init__()
        self.stage = stage
        self.use_reentrant = use_reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.stage, x, use_reentrant=self.use_reentrant)


class Phantom(nn.Module):
    """Three stages of known cost: a plain one, one that reuses a child, and a checkpointed
    one; each cell 1.5-3 ms and each stage's own code 2-2.5 ms, so that the non-spin work of a
    call, and the interpreter's work around each hooked child call that lands in its parent's
    self time (tens of microseconds on a 2-core VM), are a few percent at most."""

    def __init__(self, use_reentrant: bool = False) -> None:
        super().__init__()
        c = Cost

        self.plain = Stage(c(2.0, 1.5), [c(2.0, 3.0), c(1.5, 2.0), c(3.0, 1.5)])
        self.reused = Stage(c(2.5, 1.0), [c(2.5, 2.0), c(1.5, 3.0)], repeat=True)
        self.ckpt = Checkpointed(Stage(c(2.0, 1.0), [c(2.0, 2.5), c(1.5, 1.5)]), use_reentrant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ckpt(self.reused(self.plain(x)))


@dataclass
class Truth:
    """True times of one call key, in milliseconds (None: not a quantity of this call)."""

    fwd_ms: float
    bwd_ms: float
    fwd_self_ms: float
    bwd_self_ms: float
    recompute_ms: float | None = None


@dataclass(frozen=True)
class Overheads:
    """Time of one phantom call beyond its nominal spin, measured with nothing attached."""

    fwd_ms: float  # a module call of a Cell: module dispatch, the Function's forward, overshoot
    bwd_ms: float  # the Function's backward node, per node, in a chain of cells


def overheads(repeats: int = 7, calls: int = 40, spin_ms: float = 1.0) -> Overheads:
    """What one phantom call costs beyond its nominal spin, with nothing attached: batches of
    `calls` calls of a cell spinning `spin_ms` (forward), and a backward through a chain of
    `calls` such cells (its nodes run one after another), per call, less `spin_ms`. A real spin
    is measured, not a zero one: on a VM a spin overshoots its deadline (timer and scheduler
    ticks), part of every phantom call's true cost. The fastest batch of `repeats`, as the
    comparisons take the fastest sample."""
    cell = Cell(Cost(spin_ms, spin_ms))
    x = torch.ones(4, requires_grad=True)
    fwd, bwd = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            cell(x)
        fwd.append((time.perf_counter() - start) / calls)
        y = x
        for _ in range(calls):
            y = cell(y)
        loss = y.sum()
        start = time.perf_counter()
        loss.backward()
        bwd.append((time.perf_counter() - start) / calls)
    return Overheads(min(fwd) * 1e3 - spin_ms, min(bwd) * 1e3 - spin_ms)


def truth(model: Phantom, over: Overheads) -> dict[str, Truth]:
    """The true time of every call key of one step of `model` (keys as wandb_modprof names
    them: `<qualified name>#<call index>`)."""
    out: dict[str, Truth] = {}

    # Under checkpointing a call's forward runs again inside the backward: its recompute, which
    # its backward time includes (a container's: its own code's and its children's).
    def stage_truth(name: str, stage: Stage, recompute: bool) -> Truth:
        own_f, own_b = stage.own.fwd_ms + over.fwd_ms, stage.own.bwd_ms + over.bwd_ms
        calls = [(f"{name}.cells.{i}#0", cell) for i, cell in enumerate(stage.cells)]
        if stage.repeat:
            calls.append((f"{name}.cells.0#1", stage.cells[0]))
        fwd, bwd = own_f, own_b
        for key, cell in calls:
            f, b = cell.cost.fwd_ms + over.fwd_ms, cell.cost.bwd_ms + over.bwd_ms
            r = f if recompute else 0.0
            out[key] = Truth(f, b + r, f, b + r, recompute_ms=r if recompute else None)
            fwd, bwd = fwd + f, bwd + b
        r = fwd if recompute else 0.0
        st = Truth(fwd, bwd + r, own_f, own_b + (own_f if recompute else 0.0))
        st.recompute_ms = r if recompute else None
        out[f"{name}#0"] = st
        return st

    stages = [
        stage_truth("plain", model.plain, False),
        stage_truth("reused", model.reused, False),
        stage_truth("ckpt.stage", model.ckpt.stage, True),
    ]
    ck = stages[2]
    out["ckpt#0"] = Truth(ck.fwd_ms, ck.bwd_ms, 0.0, 0.0, recompute_ms=ck.recompute_ms)
    out["<root>#0"] = Truth(sum(s.fwd_ms for s in stages), sum(s.bwd_ms for s in stages), 0.0, 0.0)
    return out


METRICS = ("fwd_ms", "bwd_ms", "fwd_self_ms", "bwd_self_ms", "recompute_ms")


def profiled(model: Phantom, samples: int) -> wandb_modprof.Profile:
    """`samples` sampled steps of `model` under `wandb_modprof.profile`, after one untimed step
    (a process's first forward and backward pay its one-time start-up)."""
    torch.set_num_threads(1)
    x = torch.ones(8, requires_grad=True)
    model(x).sum().backward()
    with wandb_modprof.profile(model, structure=False) as prof:
        for _ in range(samples):
            model(x).sum().backward()
    return prof


def errors(
    prof: wandb_modprof.Profile, model: Phantom, over: Overheads, statistic: str = "min"
) -> dict[str, float]:
    """Relative error (measured / true - 1) of `statistic` over samples ("min" or "median"),
    per "<key> <metric>", for every true time >= 1 ms."""
    stats, out = prof.stats(), {}
    for key, true in truth(model, over).items():
        if key not in stats:
            raise KeyError(f"{key} not profiled; got {sorted(stats)}")
        for metric in METRICS:
            value = getattr(true, metric)
            if value is None or value < 1.0:
                continue
            # The wrapper that calls torch.utils.checkpoint is not itself recomputed, only its
            # children are: a container's recompute as the sum of its children's is not yet
            # reported (recompute_ms is None there).
            if metric == "recompute_ms" and key == "ckpt#0":
                continue
            measured = getattr(stats[key].metrics[metric], statistic)
            out[f"{key} {metric}"] = measured / value - 1.0
    return out
