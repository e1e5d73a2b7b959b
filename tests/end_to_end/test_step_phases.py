"""The step's phases around the modules (`Profile.step_phases`), against planted truth.

Each test plants a known cost in one phase, outside the modules: a `Dataset` whose
`__getitem__` sleeps (`between`), an optimizer whose `step` sleeps (`optimizer`), a loss that
sleeps (`loss`). Each sleep's real length is the truth of its step (`SLEPT`: a loaded machine
oversleeps). The phase must read that cost within 10 % or 2 ms (the work around it, a
`zero_grad` or the data loader's own, is well under a millisecond here), and no other phase may
hold it; with two data-loader workers prefetching, the overlap must show as a smaller
`between`. Timing tests: marked
`accuracy`, run serially on their own.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import RecordingRun
from torch import nn
from torch.utils.data import DataLoader, Dataset

import wandb_modprof
from wandb_modprof.capture.step.clock import CpuClock
from wandb_modprof.capture.step_phases import (
    NO_BACKWARD,
    NO_OPTIMIZER,
    NO_STEP_BEFORE_NEXT,
    PhaseStamps,
    PhaseWatch,
)
from wandb_modprof.records.phases import PHASES

pytestmark = pytest.mark.accuracy

LOAD_S, OPTIMIZER_S, LOSS_S = 0.030, 0.025, 0.015  # planted costs
STEPS = 12
SLEPT: list[float] = []  # the planted sleeps' real lengths (ms), in this process


def _sleep(seconds: float) -> None:
    t0 = time.perf_counter()
    time.sleep(seconds)
    SLEPT.append((time.perf_counter() - t0) * 1e3)


def _planted_ms() -> float:
    """The median real length of the sleeps planted since the last call."""
    ms = statistics.median(SLEPT)
    SLEPT.clear()
    return ms


class SlowData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Items that take `seconds` each to load (batch size 1: a batch's load time)."""

    def __init__(self, n: int, seconds: float) -> None:
        self.n, self.seconds = n, seconds
        gen = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 16, generator=gen), torch.randn(n, 1, generator=gen)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.seconds:
            _sleep(self.seconds)
        return self.x[i], self.y[i]


class SlowSGD(torch.optim.SGD):
    """SGD whose `step` takes `seconds` more."""

    def __init__(self, params: object, seconds: float) -> None:
        super().__init__(params, lr=0.01)  # type: ignore[arg-type]
        self.seconds = seconds

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        if self.seconds:
            _sleep(self.seconds)
        return super().step(closure)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


def _train(
    loader: DataLoader[tuple[torch.Tensor, torch.Tensor]],
    optimizer_s: float = 0.0,
    loss_s: float = 0.0,
    pass_optimizer: bool = True,
) -> wandb_modprof.Profile:
    model = _model()
    opt = SlowSGD(model.parameters(), optimizer_s)
    with wandb_modprof.profile(
        model, optimizer=opt if pass_optimizer else None, structure=False
    ) as prof:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            if loss_s:
                _sleep(loss_s)
            loss.backward()
            opt.step()
            opt.zero_grad()
    return prof


def _near(measured: float, truth_ms: float) -> bool:
    return abs(measured - truth_ms) <= max(2.0, 0.1 * truth_ms)


def _elsewhere(phases: dict[str, float], planted: str, truth_ms: float) -> None:
    """No other phase holds the planted cost (a fifth of it, at the most)."""
    assert all(ms < 0.2 * truth_ms for p, ms in phases.items() if p != planted), phases


def test_between_is_the_data_loading_time(tmp_path: Path) -> None:
    SLEPT.clear()
    prof = _train(DataLoader(SlowData(STEPS, LOAD_S), batch_size=1))
    phases, truth = prof.step_phases(), _planted_ms()
    assert list(phases) == list(PHASES)  # every phase measured, in step order
    assert _near(phases["between"], truth), (phases, truth)
    _elsewhere(phases, "between", truth)
    # the forward and backward are the root call's own
    stats = prof.stats()[prof.invocations()[0].key]
    assert phases["forward"] == pytest.approx(stats.typical("fwd_ms"))
    # the profile file keeps them: the medians and the last sample's own
    loaded = wandb_modprof.load(prof.save(tmp_path / "p.json"))
    assert loaded.step_phases() == phases
    last = loaded.last_sample
    assert last is not None and last.totals.phases == prof.last_sample.totals.phases


def test_data_loader_workers_overlap_shows_as_a_smaller_between() -> None:
    loader = DataLoader(SlowData(4 * STEPS, LOAD_S), batch_size=1, num_workers=2, prefetch_factor=4)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with wandb_modprof.profile(model, optimizer=opt, structure=False) as prof:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            time.sleep(LOAD_S)  # the step takes as long as one item's load: two workers keep up
            opt.step()
            opt.zero_grad()
    assert prof.step_phases()["between"] < 0.5 * LOAD_S * 1e3, prof.step_phases()


def test_a_slow_optimizer_step_is_the_optimizer_phase() -> None:
    SLEPT.clear()
    prof = _train(DataLoader(SlowData(STEPS, 0.0), batch_size=1), optimizer_s=OPTIMIZER_S)
    phases, truth = prof.step_phases(), _planted_ms()
    assert _near(phases["optimizer"], truth), (phases, truth)
    _elsewhere(phases, "optimizer", truth)  # the optimizer's time is not in `between`


def test_under_gradient_accumulation_the_optimizer_given_is_waited_for() -> None:
    """Three micro-batches per optimizer step, each micro-batch's forward sampled: the step
    that applies a sample's gradients comes after later micro-batches' forwards. With the
    optimizer given, each sample holds that step's time; `between` stays the gap to the next
    forward (the next micro-batch's load), not the optimizer's."""
    SLEPT.clear()
    model = _model()
    opt = SlowSGD(model.parameters(), OPTIMIZER_S)
    loader = DataLoader(SlowData(3 * STEPS, LOAD_S), batch_size=1)
    with wandb_modprof.profile(model, optimizer=opt, structure=False) as prof:
        for i, (x, y) in enumerate(loader):
            nn.functional.mse_loss(model(x), y).backward()
            if i % 3 == 2:
                opt.step()
                opt.zero_grad()
    # (the loader loads each item when the loop asks for it: 3 loads, then the step's sleep)
    steps = SLEPT[3::4]
    loads = [ms for i, ms in enumerate(SLEPT) if i % 4 != 3]
    assert len(steps) == STEPS and len(loads) == 3 * STEPS
    SLEPT.clear()
    phases = prof.step_phases()
    assert list(phases) == list(PHASES), prof.snapshot().phases
    assert _near(phases["optimizer"], statistics.median(steps)), (phases, steps)
    assert _near(phases["between"], statistics.median(loads)), (phases, loads)
    # each of the 3 micro-batches between two optimizer steps was a sample, resolved when
    # its optimizer step had run (the last ones: when the profile was read)
    assert prof.num_samples == 3 * STEPS


def test_a_sample_gives_up_on_an_optimizer_that_does_not_step() -> None:
    """The optimizer given never steps: each sample waits only until the next sample's
    backward (or the end of the capture), is resolved, and names why; no hook is left."""
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(1, 16)
    with wandb_modprof.profile(model, optimizer=opt, structure=False) as prof:
        for _ in range(4):
            model(x).sum().backward()
        assert prof.num_samples == 4  # (read: the last one is forced)
    phases = prof.snapshot().phases
    assert phases is not None and "optimizer" in phases.unmeasured
    assert set(phases.median_ms) == {"between", "forward", "loss", "backward"}
    assert not _global_optimizer_pre_hooks and not _global_optimizer_post_hooks


def test_the_phase_watch_waits_past_the_next_forward_for_the_optimizer_given() -> None:
    """Each sample's stamps, one at a time: settled at the next forward unless the optimizer
    given has yet to step; then settled by its step, or given up with why."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watch, clock = PhaseWatch(opt), CpuClock()
    first, second, third = PhaseStamps(), PhaseStamps(), PhaseStamps()
    watch.after_backward(first, clock)
    watch.at_forward()  # the next micro-batch: the optimizer has not stepped
    assert not first.settled and first.next_forward is not None
    watch.after_backward(second, clock)  # the next sample's backward: the first gives up
    assert first.settled and first.why_no_optimizer == NO_STEP_BEFORE_NEXT
    watch.at_forward()
    opt.step()  # the step the second sample waited for
    assert second.settled and second.optimizer_end > second.next_forward
    watch.after_backward(third, clock, backward=False)  # a forward alone waits for no step
    watch.at_forward()
    assert third.settled
    watch.close()


def test_the_optimizer_is_found_when_not_passed() -> None:
    SLEPT.clear()
    loader = DataLoader(SlowData(STEPS, 0.0), batch_size=1)
    prof = _train(loader, optimizer_s=OPTIMIZER_S, pass_optimizer=False)
    truth = _planted_ms()
    assert _near(prof.step_phases()["optimizer"], truth), (prof.step_phases(), truth)


def test_a_loss_with_a_known_extra_cost_is_the_loss_phase() -> None:
    SLEPT.clear()
    prof = _train(DataLoader(SlowData(STEPS, 0.0), batch_size=1), loss_s=LOSS_S)
    phases, truth = prof.step_phases(), _planted_ms()
    assert _near(phases["loss"], truth), (phases, truth)
    _elsewhere(phases, "loss", truth)


def test_phases_not_measured_are_named_with_why() -> None:
    model = _model()
    x = torch.randn(1, 16)
    with wandb_modprof.profile(model, structure=False) as prof:
        for _ in range(3):
            model(x).sum().backward()  # no optimizer
        with torch.no_grad():
            model(x)
    phases = prof.snapshot().phases
    assert phases is not None
    assert "optimizer" not in phases.median_ms
    assert phases.unmeasured["optimizer"] == NO_OPTIMIZER
    assert set(phases.median_ms) == {"between", "forward", "loss", "backward"}
    # a forward without backward: no loss nor backward phase for it
    with wandb_modprof.profile(model, structure=False) as prof, torch.no_grad():
        model(x)
        model(x)
    only = prof.snapshot().phases
    assert only is not None and only.unmeasured["backward"] == NO_BACKWARD
    assert "forward" in only.median_ms and "between" in only.median_ms
    text = prof.summary()
    assert "step phases (median): between steps" in text and NO_BACKWARD in text


def test_watch_logs_each_samples_phases_as_wandb_scalars() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = RecordingRun()
    handle = wandb_modprof.watch(model, log_freq=2, run=run, optimizer=opt)
    x, y = torch.randn(4, 16), torch.randn(4, 1)
    for _ in range(8):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    prof = handle.unwatch()
    key = "modprof/Sequential/phase/"
    logged = [d for d, _, _ in run.calls if any(k.startswith(key) for k in d)]
    assert len(logged) >= 3
    for name in ("forward", "loss", "backward", "optimizer", "between"):
        assert any(f"{key}{name}_ms" in d for d in logged), name
    assert all(v >= 0 for d in logged for k, v in d.items() if k.startswith(key))
    assert set(prof.step_phases()) == set(PHASES)


def test_the_regression_gate_compares_phases_as_it_compares_modules() -> None:
    """B's data loading takes three times A's: its `between` row regresses, by its fastest
    sample, with its share of the step."""
    a = _train(DataLoader(SlowData(STEPS, LOAD_S / 3), batch_size=1))
    b = _train(DataLoader(SlowData(STEPS, LOAD_S), batch_size=1))
    check = wandb_modprof.check_regression(a, b, fail_above=1.5)
    rows = {c.key: c for c in check.regressed}
    between = rows["(phase) between steps"]
    assert not check.passed and between.module_type == "step phase"
    assert 2.5 < between.fastest_ratio < 3.5 and between.share > 0.5
    assert "(phase) between steps" in check.format()
    # a memory mode has no phases
    memory = wandb_modprof.check_regression(a, b, fail_above=1.5, mode="act")
    assert not any(c.key.startswith("(phase)") for c in memory.regressed + memory.within_noise)
