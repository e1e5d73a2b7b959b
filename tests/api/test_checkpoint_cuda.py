"""A checkpoint plan on CUDA: the realised activation bytes within the plan's margin, and the
memory peak the allocator's (`torch.cuda.max_memory_allocated`), set beside the prediction.

Skipped without a GPU; run on a lent GPU machine with `pytest tests/api/test_checkpoint_cuda.py`
(and `benchmarks/checkpoint.py --device cuda` for the figures)."""

from __future__ import annotations

import torch
from checkpoint_runs import loss, profiled, realised
from conftest import requires_cuda
from models import TinyGPT, gpt_input

import wandb_modprof

pytestmark = requires_cuda


def test_a_plan_on_cuda_realises_its_bytes_and_the_allocator_peak_falls():
    torch.manual_seed(0)
    model = TinyGPT(dim=256, layers=4).cuda()
    x = gpt_input(8, 128).cuda()
    plan = profiled(model, x).checkpoint_plan("50%")
    assert plan.calls and plan.peak_bytes_now is not None and plan.peak_bytes_now > 0

    def step_peak() -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss(model, x).backward()
        torch.cuda.synchronize()
        model.zero_grad(set_to_none=True)
        return torch.cuda.max_memory_allocated() - before

    step_peak()  # allocator warm-up
    unplanned = step_peak()
    with wandb_modprof.apply_checkpoint_plan(model, plan) as applied:
        got = realised(model, x)
        planned = step_peak()
        with wandb_modprof.profile(model, structure=False) as after:
            loss(model, x).backward()
        outcome = applied.outcome(after)
    assert abs(got - plan.predicted_activation_bytes) <= plan.margin_bytes
    assert outcome.peak_bytes.realised is not None and outcome.peak_bytes.realised > 0
    # the plan frees activations, so the whole step's allocator peak falls
    assert planned < unplanned, (planned, unplanned)
