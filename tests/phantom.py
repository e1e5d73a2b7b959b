"""Phantom models: modules whose forward and backward cost a time known by construction.

Each phantom call runs a custom autograd Function that busy-waits to a deadline on the host
clock, in its forward and in its backward; a container spins for its own work and then calls
its children. So every module call's true inclusive and self time is known without running
anything unobserved, and a profiler's figures can be compared with it directly
(`tests/capture/test_accuracy_by_construction.py`, `benchmarks/accuracy.py`).

Why the comparison holds on a shared, loaded machine. Each spin logs how long it really took
(`SpinLog`): a preemption inside a spin that outlasts its deadline lengthens the spin, and that
length is the truth of the step it happened in, for the profiler and for the truth alike. What
is left for a preemption to spoil is the short work between spins (a module call's dispatch,
the Function's Python, the autograd engine between nodes): it only ever *adds* time to the
measured figure. So each sample is compared with its own truth (`step_truth`), and over
several samples the smallest error is what the measurement itself adds, while the median error
also carries how loaded the machine was. With a busy loop on every core this holds: the
scheduler preempts the process every few milliseconds, mostly inside spins.

The small work of a call beyond its spin (the Function's Python overhead, the module call) is
measured once on unobserved cells (`overheads`), its real spins subtracted, and added to the
truth.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import wandb_modprof
from wandb_modprof.records.sample import InvocationRecord


def spin(seconds: float) -> float:
    """Busy-wait `seconds` on the monotonic clock (a sleep would yield the core); returns the
    milliseconds it really took (more than `seconds` when the process was preempted across its
    deadline)."""
    start = now = time.perf_counter()
    deadline = start + seconds
    while now < deadline:
        now = time.perf_counter()
    return (now - start) * 1e3


@dataclass
class SpinLog:
    """The real length (ms) of every spin of one module's own code since the last `clear`, in
    the order they ran: forward, recompute (a forward run again inside the backward, under
    activation checkpointing) and backward."""

    fwd: list[float] = field(default_factory=list)
    recompute: list[float] = field(default_factory=list)
    bwd: list[float] = field(default_factory=list)

    def clear(self) -> None:
        self.fwd.clear()
        self.recompute.clear()
        self.bwd.clear()


class _Spin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, fwd_s: float, bwd_s: float, log: SpinLog) -> torch.Tensor:  # type: ignore[override]
        ctx.bwd_s, ctx.log = bwd_s, log
        # Saved and read back in the backward, as real layers do: non-reentrant checkpointing
        # recomputes a region only when its backward unpacks a saved tensor.
        ctx.save_for_backward(x)
        ms = spin(fwd_s)
        # Inside a backward (a graph task is running) a forward is a checkpoint's recompute.
        in_backward = torch._C._current_graph_task_id() >= 0
        (log.recompute if in_backward else log.fwd).append(ms)
        return x * 1.0  # a new tensor: the Function's node joins the graph

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:  # type: ignore[override]
        (_x,) = ctx.saved_tensors
        ctx.log.bwd.append(spin(ctx.bwd_s))
        return grad, None, None, None


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
        self.log = SpinLog()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Spin.apply(x, self.cost.fwd_ms / 1e3, self.cost.bwd_ms / 1e3, self.log)


class Stage(nn.Module):
    """A container with work of its own (a spin) and then its children in sequence; `repeat`
    calls the first child again at the end (a reused module: two calls, two keys)."""

    def __init__(self, own: Cost, cells: list[Cost], repeat: bool = False) -> None:
        super().__init__()
        self.own = own
        self.log = SpinLog()
        self.cells = nn.ModuleList(Cell(c) for c in cells)
        self.repeat = repeat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _Spin.apply(x, self.own.fwd_ms / 1e3, self.own.bwd_ms / 1e3, self.log)
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

    def stages(self) -> list[tuple[str, Stage, bool]]:
        """(qualified name, stage, checkpointed) of each stage."""
        return [
            ("plain", self.plain, False),
            ("reused", self.reused, False),
            ("ckpt.stage", self.ckpt.stage, True),
        ]

    def clear_logs(self) -> None:
        for module in self.modules():
            if isinstance(module, Cell | Stage):
                module.log.clear()


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
    """Time of one phantom call beyond its spin, measured with nothing attached."""

    fwd_ms: float  # a module call of a Cell: module dispatch, the Function's forward
    bwd_ms: float  # the Function's backward node, per node, in a chain of cells


def overheads(repeats: int = 7, calls: int = 40, spin_ms: float = 1.0) -> Overheads:
    """What one phantom call costs beyond its spin, with nothing attached: batches of `calls`
    calls of a cell spinning `spin_ms` (forward), and a backward through a chain of `calls`
    such cells (its nodes run one after another), per call, less the spins' real lengths. The
    fastest batch of `repeats`, as the comparisons take the least perturbed sample."""
    cell = Cell(Cost(spin_ms, spin_ms))
    x = torch.ones(4, requires_grad=True)
    fwd, bwd = [], []
    for _ in range(repeats):
        cell.log.clear()
        start = time.perf_counter()
        for _ in range(calls):
            cell(x)
        fwd.append(((time.perf_counter() - start) * 1e3 - sum(cell.log.fwd)) / calls)
        y = x
        for _ in range(calls):
            y = cell(y)
        loss = y.sum()
        cell.log.clear()
        start = time.perf_counter()
        loss.backward()
        bwd.append(((time.perf_counter() - start) * 1e3 - sum(cell.log.bwd)) / calls)
    return Overheads(min(fwd), min(bwd))


@dataclass(frozen=True)
class _Spins:
    """One call's own spins (ms): its forward, backward and recompute (0 where none)."""

    fwd: float
    bwd: float
    recompute: float


def _nominal(cost: Cost, recompute: bool) -> _Spins:
    return _Spins(cost.fwd_ms, cost.bwd_ms, cost.fwd_ms if recompute else 0.0)


def _logged(log: SpinLog, call: int, calls: int, recompute: bool) -> _Spins:
    """Call `call` of `calls` (in forward order) of a module that logged its spins: the
    backward runs the calls in reverse order."""
    expected = (calls, calls, calls if recompute else 0)
    got = (len(log.fwd), len(log.bwd), len(log.recompute))
    if got != expected:
        raise ValueError(f"spins (fwd, bwd, recompute) logged {got}, expected {expected}")
    return _Spins(
        log.fwd[call], log.bwd[calls - 1 - call], log.recompute[call] if recompute else 0.0
    )


def _truth(model: Phantom, over: Overheads, logged: bool) -> dict[str, Truth]:
    out: dict[str, Truth] = {}

    def spins_of(module: Cell | Stage, cost: Cost, call: int, calls: int, rec: bool) -> _Spins:
        return _logged(module.log, call, calls, rec) if logged else _nominal(cost, rec)

    # Under checkpointing a call's forward runs again inside the backward: its recompute, which
    # its backward time includes (a container's: its own code's and its children's).
    def stage_truth(name: str, stage: Stage, recompute: bool) -> Truth:
        own = spins_of(stage, stage.own, 0, 1, recompute)
        own_f, own_b = own.fwd + over.fwd_ms, own.bwd + over.bwd_ms
        own_r = own.recompute + over.fwd_ms if recompute else 0.0
        calls = [(f"{name}.cells.{i}#0", cell, 0) for i, cell in enumerate(stage.cells)]
        if stage.repeat:
            calls.append((f"{name}.cells.0#1", stage.cells[0], 1))
        fwd, bwd, rec = own_f, own_b, own_r
        for key, cell, call in calls:
            count = 2 if stage.repeat and cell is stage.cells[0] else 1
            s = spins_of(cell, cell.cost, call, count, recompute)
            f, b = s.fwd + over.fwd_ms, s.bwd + over.bwd_ms
            r = s.recompute + over.fwd_ms if recompute else 0.0
            out[key] = Truth(f, b + r, f, b + r, recompute_ms=r if recompute else None)
            fwd, bwd, rec = fwd + f, bwd + b, rec + r
        st = Truth(fwd, bwd + rec, own_f, own_b + own_r, rec if recompute else None)
        out[f"{name}#0"] = st
        return st

    stages = [stage_truth(name, stage, ck) for name, stage, ck in model.stages()]
    ck = stages[2]
    out["ckpt#0"] = Truth(ck.fwd_ms, ck.bwd_ms, 0.0, 0.0, recompute_ms=ck.recompute_ms)
    out["<root>#0"] = Truth(sum(s.fwd_ms for s in stages), sum(s.bwd_ms for s in stages), 0.0, 0.0)
    return out


def truth(model: Phantom, over: Overheads) -> dict[str, Truth]:
    """The nominal true time of every call key of one step of `model` (keys as wandb_modprof
    names them: `<qualified name>#<call index>`): spins as set, on an idle core."""
    return _truth(model, over, logged=False)


def step_truth(model: Phantom, over: Overheads) -> dict[str, Truth]:
    """The true time of every call key of the step `model` just ran (after `clear_logs`): its
    spins' real lengths, which include the preemptions that fell inside them."""
    return _truth(model, over, logged=True)


METRICS = ("fwd_ms", "bwd_ms", "fwd_self_ms", "bwd_self_ms", "recompute_ms")


@dataclass
class PhantomRun:
    """A profiled run of a phantom: the profile, and each sampled step's records (by key)
    beside that step's truth."""

    prof: wandb_modprof.Profile
    model: Phantom
    over: Overheads
    steps: list[tuple[dict[str, InvocationRecord], dict[str, Truth]]]


def profiled(model: Phantom, samples: int, over: Overheads) -> PhantomRun:
    """`samples` sampled steps of `model` under `wandb_modprof.profile`, after one untimed step
    (a process's first forward and backward pay its one-time start-up), each step's records
    read back (between steps, outside every measured window) beside its truth."""
    torch.set_num_threads(1)
    x = torch.ones(8, requires_grad=True)
    model(x).sum().backward()
    steps, last = [], None
    with wandb_modprof.profile(model, structure=False) as prof:
        for _ in range(samples):
            model.clear_logs()
            model(x).sum().backward()
            sample = prof.last_sample
            if sample is None or sample is last:
                raise RuntimeError(f"step {len(steps)} left no sample of its own")
            last = sample
            steps.append(({r.key: r for r in sample.invocations}, step_truth(model, over)))
    return PhantomRun(prof, model, over, steps)


def errors(run: PhantomRun, statistic: str = "min") -> dict[str, float]:
    """Per "<key> <metric>", for every nominal true time >= 1 ms: the relative error
    (measured / true - 1) of each sample against its own step's truth, reduced over samples by
    `statistic`: "min" (the least perturbed sample: what the measurement adds) or "median"."""
    reduce = {"min": min, "median": statistics.median}[statistic]
    out = {}
    for key, nominal in truth(run.model, run.over).items():
        for metric in METRICS:
            value = getattr(nominal, metric)
            if value is None or value < 1.0:
                continue
            # The wrapper that calls torch.utils.checkpoint is not itself recomputed, only its
            # children are: a container's recompute as the sum of its children's is not yet
            # reported (recompute_ms is None there).
            if metric == "recompute_ms" and key == "ckpt#0":
                continue
            per_sample = []
            for records, true in run.steps:
                if key not in records:
                    raise KeyError(f"{key} not profiled; got {sorted(records)}")
                measured = getattr(records[key], metric)
                per_sample.append(measured / getattr(true[key], metric) - 1.0)
            out[f"{key} {metric}"] = reduce(per_sample)
    return out
