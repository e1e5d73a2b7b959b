"""A forward that runs branches in a thread pool: the calls made on other threads are not
measured (their time is their caller's own time, as documented), the forward thread's calls
are, every sample is kept and nothing is warned; training is unchanged."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
import wandb
from torch import nn

import wandb_modprof


class Branches(nn.Module):
    def __init__(self, pool: ThreadPoolExecutor) -> None:
        super().__init__()
        self.branches = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(4))
        self.head = nn.Linear(16, 2)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = list(self.pool.map(lambda branch: branch(x), self.branches))
        return self.head(torch.stack(outs).sum(0))


def test_profile_keeps_every_sample_and_measures_the_forward_thread_calls() -> None:
    torch.manual_seed(0)
    with ThreadPoolExecutor(4) as pool:
        model, x = Branches(pool), torch.randn(8, 16)
        twin = Branches(pool)
        twin.load_state_dict(model.state_dict())
        for _ in range(5):  # before: about half the one-step profiles had no sample
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with wandb_modprof.profile(model) as prof:
                    model(x).square().sum().backward()
            assert prof.num_samples == 1
            records = {r.key: r for r in prof.invocations()}
            assert list(records) == ["<root>#0", "head#0"]  # the branches ran on other threads
            root = records["<root>#0"]
            assert root.fwd_ms > 0 and root.bwd_ms is not None and root.bwd_ms > 0
            assert root.fwd_self_ms > 0  # the branches' time is the root's own
            twin(x).square().sum().backward()
        for p, q in zip(model.parameters(), twin.parameters(), strict=True):
            assert p.grad is not None and torch.equal(p.grad, q.grad)


def test_watch_keeps_every_sample() -> None:
    with ThreadPoolExecutor(4) as pool:
        model, x = Branches(pool), torch.randn(8, 16)
        handle = wandb_modprof.watch(model, log_freq=1, run=wandb.init(mode="disabled"))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # before: "forward hooks fired out of order"
                for _ in range(7):
                    model(x).sum().backward()
                prof = handle.profile()
            # one structure pass, the other 6 steps sampled (before: 0 to 4 of 7 kept)
            assert prof.num_samples == 6
        finally:
            handle.unwatch()
