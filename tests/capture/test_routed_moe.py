"""A routed mixture of experts fed a new random batch at every step: a router sends each token
to one expert, so the experts called, and the tokens each gets, change from step to step.

Truth by construction: each expert is two bias-free `Linear`s, 2 x in x out FLOPs per row
each, and the rows each expert got on each step are the router's `bincount`, recorded by the
model itself. One structure pass, every expert that ran counted, its FLOPs those of its mean
rows over the sampled steps, and training bitwise the unwatched twin's."""

from __future__ import annotations

import copy
import warnings

import torch
from helpers import disabled_run
from test_kept_counts import DIM, HIDDEN, Expert
from torch import nn

import wandb_modprof
from wandb_modprof.view.graphs import merge

EXPERTS, TOKENS, STEPS = 16, 24, 40
ROW_FLOPS = 2 * (2 * DIM * HIDDEN)  # up and down, per row


class Top1(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(DIM, EXPERTS, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))
        self.loads: list[list[int]] = []  # per forward: tokens per expert

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        choice = self.router(x).argmax(-1)
        self.loads.append(torch.bincount(choice, minlength=EXPERTS).tolist())
        out = torch.zeros_like(x)
        for e in sorted(set(choice.tolist())):
            rows = (choice == e).nonzero()[:, 0]
            out = out.index_add(0, rows, self.experts[e](x[rows]))
        return out


def batch(step: int) -> torch.Tensor:
    return torch.randn(TOKENS, DIM, generator=torch.Generator().manual_seed(step))


def test_new_routes_every_step_take_one_pass_and_scale_each_experts_flops() -> None:
    torch.manual_seed(0)
    model = Top1()
    twin = copy.deepcopy(model)
    opt, twin_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin))
    pass_steps: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "more than 8 sequences"
        handle = wandb_modprof.watch(model, log_freq=1, run=disabled_run())
        driver = handle._capture.structures
        for step in range(STEPS):
            for m, o in ((model, opt), (twin, twin_opt)):
                before = driver.passes
                o.zero_grad(set_to_none=True)
                m(batch(step)).pow(2).mean().backward()
                o.step()
                if m is model and driver.passes > before:
                    pass_steps.append(step)
        prof = handle.unwatch()
    assert len(pass_steps) <= 2
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters(), strict=True)
    )
    # the rows each expert got on the sampled steps (every step but the passes'), by bincount;
    # the first is the start-up sample, left out of the statistics (`Sample.cold_start`)
    loads = [model.loads[s] for s in range(STEPS) if s not in pass_steps][1:]
    calls = {c.key: c for c in merge(prof.structures(), prof.stats().values()).calls}
    ran = [e for e in range(EXPERTS) if any(load[e] for load in loads)]
    assert len(ran) >= EXPERTS // 2
    for e in range(EXPERTS):
        key = f"experts.{e}#0"
        truth = [load[e] for load in loads if load[e]]
        if not truth:
            assert key not in prof.stats()
            continue
        rows = prof.stats()[key].metrics["rows"]
        assert rows.count == len(truth), key
        assert (rows.min, rows.max) == (min(truth), max(truth)), key
        mean = sum(truth) / len(truth)
        assert abs(rows.mean - mean) < 1e-9, key
        call = calls[key]
        assert call.flops_known and call.rows_linear, key
        assert call.fwd_flops == round(ROW_FLOPS * mean), (key, call.fwd_flops, mean)
    assert prof.flops_unknown == 0
