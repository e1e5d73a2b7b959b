"""CUDA paths: device events, allocator peaks, and no device synchronisation in hooks.

Skipped without a GPU; run on a lent GPU machine with `pytest tests/test_cuda.py`.
"""

from __future__ import annotations

import pytest
import torch
from conftest import requires_cuda
from models import ResNet, TinyGPT, gpt_input, resnet_input

import wandb_modprof

pytestmark = requires_cuda


def test_event_timing_and_memory_on_cuda():
    model = ResNet().cuda()
    x = resnet_input(32, 64).cuda()
    model(x).sum().backward()
    torch.cuda.synchronize()
    with wandb_modprof.profile(model, structure=False) as prof:
        model(x).sum().backward()
    recs = prof.invocations()
    root = recs[0]
    assert root.fwd_ms > 0 and root.bwd_ms > 0
    assert root.fwd_mem_peak_bytes is not None and root.fwd_mem_peak_bytes > 0
    assert root.fwd_mem_delta_bytes is not None and root.fwd_mem_delta_bytes > 0
    assert root.bwd_mem_peak_bytes is not None
    conv = next(r for r in recs if r.module_type == "Conv2d")
    assert conv.bwd_ms > 0 and conv.fwd_mem_peak_bytes >= 0


def test_sampled_step_never_synchronises_the_device():
    model = TinyGPT(dim=256, layers=4).cuda()
    x = gpt_input(8, 32).cuda()
    handle = wandb_modprof.watch(model, log_freq=1, structure=False)
    model(x).float().mean().backward()  # warm-up sample
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(x).float().mean().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    prof = handle.unwatch()
    assert prof.num_samples == 2


def test_bitwise_identical_on_cuda():
    import copy

    torch.manual_seed(0)
    a = TinyGPT().cuda()
    b = copy.deepcopy(a)
    x = gpt_input().cuda()
    la = a(x).float().mean()
    la.backward()
    with wandb_modprof.profile(b, structure=False):
        lb = b(x).float().mean()
        lb.backward()
    assert torch.equal(la, lb)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa.grad, pb.grad)


@pytest.mark.parametrize("mode", ["auto", "cpu"])
def test_timing_modes_on_cuda(mode):
    model = TinyGPT().cuda()
    with wandb_modprof.profile(model, timing=mode, structure=False) as prof:
        model(gpt_input().cuda()).float().mean().backward()
    assert prof.invocations()[0].bwd_ms > 0
