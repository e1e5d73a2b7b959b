"""Deep models: what trains unwatched at Python's default recursion limit trains watched."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

import wandb_modprof
from tests.helpers import disabled_run

DEFAULT_LIMIT = 1000


class Chain(nn.Module):
    """`depth` levels, each calling its child, then a Linear."""

    def __init__(self, depth: int, dim: int = 4) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.inner = Chain(depth - 1, dim) if depth > 1 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inner is not None:
            x = self.inner(x)
        out: torch.Tensor = self.fc(x)
        return out


@pytest.fixture(autouse=True)
def default_limit() -> Iterator[None]:
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(DEFAULT_LIMIT)
    yield
    sys.setrecursionlimit(before)


def chain(depth: int) -> Chain:
    sys.setrecursionlimit(10 * DEFAULT_LIMIT)  # building it recurses (our test code, not theirs)
    try:
        torch.manual_seed(0)
        return Chain(depth)
    finally:
        sys.setrecursionlimit(DEFAULT_LIMIT)


def train(model: nn.Module, steps: int = 3) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def trains_unwatched(depth: int) -> bool:
    try:
        train(chain(depth), steps=1)
    except RecursionError:
        return False
    return True


def deepest_unwatched() -> int:
    """The deepest chain (in steps of 10) training unwatched at the default limit here."""
    depth = 200
    while trains_unwatched(depth + 10):
        depth += 10
    return depth


def profile_watched(structure: bool) -> Callable[[nn.Module], tuple[list[torch.Tensor], int]]:
    def run(model: nn.Module) -> tuple[list[torch.Tensor], int]:
        with wandb_modprof.profile(model, structure=structure) as prof:
            losses = train(model)
        records = prof.invocations()
        assert len({r.key for r in records}) == len(records)
        return losses, len(records)

    return run


def watch_watched(model: nn.Module) -> tuple[list[torch.Tensor], int]:
    run = disabled_run()
    handle = wandb_modprof.watch(model, log_freq=1, run=run)
    try:
        losses = train(model)
        records = handle.profile().invocations()
    finally:
        wandb_modprof.unwatch(model)
    return losses, len(records)


@pytest.mark.parametrize("how", ["profile", "profile-no-structure", "watch"])
def test_deep_chain_trains_and_measures_every_level(how: str) -> None:
    depths = [200, deepest_unwatched()]
    for depth in depths:
        expected = train(chain(depth))
        model = chain(depth)
        measure = {
            "profile": profile_watched(True),
            "profile-no-structure": profile_watched(False),
            "watch": watch_watched,
        }[how]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an internal-error warning fails the test
            losses, calls = measure(model)
        assert calls == 2 * depth, depth  # every Chain and every Linear: one record per call
        for got, want in zip(losses, expected, strict=True):
            assert torch.equal(got, want), depth
    assert sys.getrecursionlimit() == DEFAULT_LIMIT  # the raised limit was put back
