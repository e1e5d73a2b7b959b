"""The cap on the module graphs kept (`pass_schedule.MAX_STRUCTURES`): a model that calls a
new sequence of modules at every step keeps exactly as many graphs as docs/measurement.md says
("at most 8 variants"), with one warning, under `watch` and under `profile`. A new sequence at
every step is the hard case: a sampled step derives a graph into the last place and asks for a
pass to refine it, and that pass, on the next step, meets yet another sequence."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
import torch
from helpers import disabled_run
from torch import nn

import wandb_modprof
from wandb_modprof.capture.structure.pass_schedule import MAX_STRUCTURES
from wandb_modprof.view.graphs import merge

DOCS = Path(__file__).resolve().parents[2] / "docs" / "measurement.md"
STEPS = 40


def documented_cap() -> int:
    """The number of graph variants docs/measurement.md says are kept."""
    text = " ".join(DOCS.read_text(encoding="utf-8").split())
    found = re.findall(r"at most (\d+) variants", text)
    assert len(found) == 1, found
    return int(found[0])


class Repeated(nn.Module):
    """One Linear called `calls` times: each count is its own sequence of modules."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.calls):
            x = self.lin(x)
        return x

    def route(self, step: int) -> None:
        self.calls = 1 + step


class Routed(nn.Module):
    """Five experts, those of the step's bit pattern called in turn (a router's choice): a
    branchy model whose sequences are not nested counts of one call."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(5))
        self.pattern = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, expert in enumerate(self.experts):
            if self.pattern >> i & 1:
                x = expert(x)
        return x

    def route(self, step: int) -> None:
        self.pattern = 1 + (step * 7) % 31  # 31 distinct non-empty subsets, none repeated


@contextmanager
def watched(model: nn.Module) -> Iterator[Callable[[], wandb_modprof.Profile]]:
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    result: list[wandb_modprof.Profile] = []
    try:
        yield lambda: result[0]
    finally:
        result.append(handle.unwatch())


@contextmanager
def profiled(model: nn.Module) -> Iterator[Callable[[], wandb_modprof.Profile]]:
    with wandb_modprof.profile(model) as prof:
        yield lambda: prof


@pytest.mark.parametrize("model_type", [Repeated])
@pytest.mark.parametrize("capture", [watched, profiled])
def test_a_new_sequence_at_every_step_keeps_the_documented_number_of_graphs(
    model_type: type[Repeated | Routed],
    capture: Callable[[nn.Module], AbstractContextManager[Callable[[], wandb_modprof.Profile]]],
) -> None:
    assert documented_cap() == MAX_STRUCTURES == 8
    model = model_type()
    warned = pytest.warns(RuntimeWarning, match="different sequences of modules")
    with warned as caught, capture(model) as result:
        for step in range(STEPS):
            model.route(step)
            model(torch.randn(2, 4)).sum().backward()
    assert len([w for w in caught if "different sequences" in str(w.message)]) == 1
    prof = result()
    signatures = {s.signature for s in prof.structures()}
    assert len(prof.structures()) == len(signatures) == MAX_STRUCTURES
    assert prof.num_samples > STEPS // 2  # the passes took some steps, the rest were sampled


@pytest.mark.parametrize("capture", [watched, profiled])
def test_a_router_that_picks_new_experts_every_step_needs_one_pass(
    capture: Callable[[nn.Module], AbstractContextManager[Callable[[], wandb_modprof.Profile]]],
) -> None:
    """31 subsets of identical experts, none repeated: the experts no pass met take the counts
    of the one it did (their twin), so one pass and one grown graph hold every expert, with
    no warning and no call left without FLOPs. (`Repeated` above has no twins: a new number of
    calls of one module is a new call, which only a pass can count.)"""
    model = Routed()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with capture(model) as result:
            for step in range(STEPS):
                model.route(step)
                model(torch.randn(2, 4)).sum().backward()
    prof = result()
    # the first sample's own graph, the one pass's (on another route), and the sampled
    # steps' graphs grown into one
    assert len(prof.structures()) == 3
    calls = {c.key: c for c in merge(prof.structures(), prof.stats().values()).calls}
    experts = [k for k in prof.stats() if k.startswith("experts.")]
    assert len(experts) == 5
    for key in experts:  # a Linear(4, 4) with bias on 2 rows: 2 x 2 x 4 x 4 FLOPs
        assert calls[key].flops_known and calls[key].fwd_flops == 64, key
    assert prof.flops_unknown == 0
