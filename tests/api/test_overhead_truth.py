"""The overhead a watched run reports against what it costs: an unwatched twin.

The truth is the twin: the same model (a deep copy), optimizer, seed and batch, its training
steps interleaved one for one with the watched model's in this process, so the machine's drift
and bursts fall on both alike. What a sample leaves to the next step (garbage to collect)
falls on the twin's step that follows it: the truth is slightly low by that. What watching
cost is the watched steps' total time less the twin's; the run reports
`handle.overhead.cost_s`. They must agree within a factor of 1.25, or
within 1 percentage point of the twin's training time, whichever is larger (a few
microseconds per step cannot be told from the two copies' own difference on a small model).
Sampled with a fixed `log_freq`, so both the floor (every step) and the samples are in it.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Callable

import pytest
import torch
from helpers import disabled_run
from models import ResNet, TinyGPT, gpt2_from_config, gpt_input, resnet_input
from torch import nn

import wandb_modprof

pytestmark = pytest.mark.accuracy


def _mlp(layers: int) -> nn.Module:
    widths = [64] + [256] * (layers - 1) + [10]
    mods: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        mods += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor], int]] = {
    # name: (model, batch, steps)
    "linear-1": (lambda: _mlp(1), lambda: torch.randn(32, 64), 1500),
    "mlp-3": (lambda: _mlp(3), lambda: torch.randn(32, 64), 1500),
    "tinygpt": (TinyGPT, gpt_input, 400),
    "resnet": (ResNet, lambda: resnet_input(4, 16), 200),
    "gpt2": (gpt2_from_config, lambda: torch.randint(0, 512, (4, 32)), 200),
}


def _loss(out: object) -> torch.Tensor:
    logits = getattr(out, "logits", out)
    assert isinstance(logits, torch.Tensor)
    return logits.float().pow(2).mean()


@pytest.mark.parametrize("name", list(CASES))
def test_the_reported_overhead_is_what_an_unwatched_twin_shows(name):
    make, batch, steps = CASES[name]
    torch.manual_seed(0)
    base, x = make(), batch()
    base.train()
    watched, twin = copy.deepcopy(base), copy.deepcopy(base)
    optims = [torch.optim.SGD(m.parameters(), lr=1e-4) for m in (watched, twin)]
    handle = wandb_modprof.watch(watched, log_freq=25, run=disabled_run())
    spent = [0.0, 0.0]
    for _ in range(steps):
        # One order throughout: the run measures a step from its root forward to the next,
        # and with the twin's step always between two of the watched model's, each of those
        # spans holds one twin step (alternating orders would put 0 or 2 into a span).
        for k in (0, 1):
            model, opt = (watched, twin)[k], optims[k]
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            _loss(model(x)).backward()
            opt.step()
            spent[k] += time.perf_counter() - start
    over = handle.overhead
    prof = handle.unwatch()
    assert prof.num_samples >= steps // 25 - 2
    truth = spent[0] - spent[1]
    reported = over.cost_s
    share_gap = abs(reported - truth) / spent[1]
    assert truth > 0, f"{name}: the watched copy was not slower ({truth * 1e3:.1f} ms)"
    within = 1 / 1.25 <= reported / truth <= 1.25 or share_gap <= 0.01
    assert within, (
        f"{name}: reported {reported * 1e3:.1f} ms, the twin shows {truth * 1e3:.1f} ms "
        f"({reported / truth:.2f}x, {100 * share_gap:.2f} points of {spent[1]:.2f} s)"
    )
