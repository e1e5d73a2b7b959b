"""Structure passes that do not start over (`capture/structure/known_calls.py`): a pass after a
routing change follows only the calls that changed, a large model's first graph is spread
over passes of a bounded number of calls, and either way the graph is the one a single full
pass gives (the truth here: a fresh profile of an identical copy, whose one pass follows every
call). Every step sets the gradients to None first, as training loops do: the backward of a
parameter's first gradient does less work than one added to an existing gradient."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import Any

import torch
from helpers import disabled_run
from models import MoEModel, routed_input
from torch import nn
from torch.overrides import _get_current_function_mode_stack

import wandb_modprof
from wandb_modprof import Structure
from wandb_modprof.capture.structure.pass_modes import structure_pass_active


def full_pass(model: nn.Module, x: torch.Tensor) -> Structure:
    """The graph of one forward as a single pass that follows every call sees it."""
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):  # (the first, timed, derives a graph; the second is the pass)
            step(model, x)
    (structure,) = prof.structures()
    assert all(c.flops_known and c.bwd_work_known for c in structure.calls)
    return dataclasses.replace(structure, roofline=None)


def step(model: nn.Module, x: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()


def stored(prof: wandb_modprof.Profile, signature: str) -> Structure:
    (structure,) = [s for s in prof.structures() if s.signature == signature]
    return dataclasses.replace(structure, roofline=None)


def watched_moe() -> tuple[MoEModel, MoEModel, torch.Tensor, torch.Tensor, Any]:
    """A watched routed MoE (log_freq=1), its unwatched twin, and inputs routed to experts
    (0, 1) and (2, 3)."""
    torch.manual_seed(0)
    model = MoEModel()
    twin = copy.deepcopy(model)
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    return model, twin, routed_input((0, 1), 1), routed_input((2, 3), 2), handle


def test_a_routing_change_costs_a_pass_over_what_changed_with_the_full_pass_graph() -> None:
    model, twin, first, second, handle = watched_moe()
    # 1: sampled, derives a graph; 2: the pass; 3: sampled, a new sequence; 4: the next pass
    for x in (first, first, second, second):
        step(model, x)
    records = handle._capture.structures.records
    prof = handle.unwatch()
    assert [r.complete for r in records] == [True, True]
    whole, after = records
    assert whole.followed == whole.calls == 12
    # the routing block (its children changed) and the two experts it had never called, with
    # their calls (w1, the shared act_fn, w2): 1 + 2 * 4; the root, `inp`, `moe.router` known
    assert after.followed == 9 and after.calls == 12
    # the summary says how many passes ran, and what they cost
    assert "; 2 structure passes (1 over part of the model), their forwards " in prof.summary()
    truth_first, truth_second = full_pass(twin, first), full_pass(twin, second)
    assert stored(prof, truth_first.signature) == truth_first
    assert stored(prof, truth_second.signature) == truth_second


class Fork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.use_b = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b(x) if self.use_b else self.a(x)) + x


class TwoForks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p, self.q = Fork(), Fork()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(self.p(x))


def test_a_known_call_that_calls_others_during_the_pass_is_followed_by_the_next() -> None:
    model = TwoForks()
    twin = copy.deepcopy(model)
    x = torch.randn(4, 8)
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    # steps 1-2 as before; 3 (sampled): `p` takes its other branch; 4 (the pass): `q` does too,
    # which no sample showed: the pass finds `q` changed and leaves it to pass 5
    for p_b, q_b in ((False, False), (False, False), (True, False), (True, True), (True, True)):
        model.p.use_b, model.q.use_b = p_b, q_b
        step(model, x)
    records = handle._capture.structures.records
    prof = handle.unwatch()
    assert [r.complete for r in records] == [True, False, True]
    twin.p.use_b = twin.q.use_b = True
    truth = full_pass(twin, x)
    assert stored(prof, truth.signature) == truth
    assert len(prof.structures()) == 2  # (the sequence of step 3 never had a pass of its own)


def nested(blocks: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        *(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)) for _ in range(blocks))
    )


def test_a_first_graph_over_several_passes_of_a_budget_each_is_the_one_pass_graph() -> None:
    model, plain = nested(10), nested(10)  # 41 calls
    x = torch.randn(2, 8)
    truth = full_pass(copy.deepcopy(model), x)
    handle = wandb_modprof.watch(model, log_freq=10**6, run=disabled_run())
    driver = handle._capture.structures
    driver.budget = 12
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a run this short is told to sample more often)
        for _ in range(8):
            step(model, x)
            step(plain, x)
        prof = handle.unwatch()
    records = driver.records
    assert [r.complete for r in records] == [False, False, False, True]
    assert all(0 < r.followed <= 12 for r in records)
    assert sum(r.followed for r in records) == 41  # each call followed once
    assert stored(prof, truth.signature) == truth
    # training unchanged: the gradients of an unwatched twin, bit for bit
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


class Probe(nn.Module):
    """Notes, during its forward, whether a mode of ours is on and whether a pass is seen."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.seen: list[tuple[int, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((len(_get_current_function_mode_stack()), structure_pass_active()))
        return self.lin(x)


def test_a_known_call_runs_without_our_modes_while_the_pass_is_still_seen() -> None:
    model = nn.Sequential(Probe(), Fork())
    x = torch.randn(2, 8)
    handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
    for use_b in (False, False, True, True):
        model[1].use_b = use_b
        step(model, x)
    records = handle._capture.structures.records
    handle.unwatch()
    assert [r.complete for r in records] == [True, True]
    seen = model[0].seen
    # step 2, the whole pass: followed with the mode on; step 4: known, run without it, and
    # another model's capture still sees a pass running (it must not time this forward)
    assert seen[1] == (1, True) and seen[3] == (0, True)
    assert seen[0] == seen[2] == (0, False)  # sampled steps
    assert not _get_current_function_mode_stack()


def test_the_budget_counts_calls_no_pass_followed_yet() -> None:
    model, twin, first, second, handle = watched_moe()
    driver = handle._capture.structures
    driver.budget = 3
    # 12 calls: the first graph over 4 passes of 3 new calls each (steps 2-5); step 6 shows a
    # new routing, and from step 7 on the passes follow the routing block (known, not counted)
    # and the new experts' 8 calls, 3 a pass
    for x in (first,) * 5 + (second,) * 5:
        step(model, x)
    records = driver.records
    prof = handle.unwatch()
    assert [(r.followed, r.complete) for r in records] == [
        (3, False), (3, False), (3, False), (3, True),
        (4, False), (4, False), (3, True),
    ]  # fmt: skip
    for x in (first, second):
        truth = full_pass(twin, x)
        assert stored(prof, truth.signature) == truth
