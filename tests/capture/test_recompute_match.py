"""A module called twice inside one checkpointed function (first on a large tensor, then a small
one): each recompute is matched to the call it repeats (`capture/backward/recompute.py`, by the
shapes of its arguments), in both checkpoint modes, so neither call gets the other's recompute
or backward time."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import wandb_modprof


class TwiceInOneRegion(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(256, 256)
        self.reentrant = reentrant

    def both(self, big: torch.Tensor, small: torch.Tensor) -> torch.Tensor:
        return self.fc(big).sum() + self.fc(small).sum()

    def forward(self, big: torch.Tensor, small: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.both, big, small, use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_each_recompute_goes_to_the_call_it_repeats(reentrant: bool) -> None:
    torch.manual_seed(0)
    model = TwiceInOneRegion(reentrant)
    big = torch.randn(2048, 256, requires_grad=True)
    small = torch.randn(2, 256, requires_grad=True)
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):
            model(big, small).backward()
    stats = prof.stats()
    first, second = stats["fc#0"], stats["fc#1"]
    fwd0, fwd1 = first.typical("fwd_ms"), second.typical("fwd_ms")
    rec0, rec1 = first.typical("recompute_ms"), second.typical("recompute_ms")
    bwd0, bwd1 = first.typical("bwd_ms"), second.typical("bwd_ms")
    assert None not in (fwd0, fwd1, rec0, rec1, bwd0, bwd1)
    assert fwd0 > 5 * fwd1  # (the large call is the slow one: the test can tell them apart)
    # before: call #0 got the small call's recompute and call #1 the large one's
    assert rec0 > 5 * rec1, (rec0, rec1)
    assert bwd0 > 5 * bwd1, (bwd0, bwd1)
