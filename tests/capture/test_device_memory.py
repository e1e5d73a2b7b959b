"""Accelerator memory folding (fwd delta/peak, bwd peak) with a scripted allocator.

The real reader is `torch.accelerator` on a GPU (see test_cuda.py); here a fake allocator with
the same semantics (allocated, peak since reset) is driven by the model itself, so the nesting
arithmetic is checked exactly on CPU.
"""

from __future__ import annotations

import torch
from torch import nn

import wandb_modprof


class FakeAllocator:
    def __init__(self) -> None:
        self.current = 1000
        self.high = self.current

    def alloc(self, n: int) -> None:
        self.current += n
        self.high = max(self.high, self.current)

    def free(self, n: int) -> None:
        self.current -= n

    # DeviceMemory protocol
    def allocated(self) -> int:
        return self.current

    def peak(self) -> int:
        return self.high

    def reset_peak(self) -> None:
        self.high = self.current


ALLOC = FakeAllocator()


class Spike(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fwd_spike, keep, bwd_spike):
        ctx.bwd_spike = bwd_spike
        ALLOC.alloc(fwd_spike)
        ALLOC.free(fwd_spike - keep)  # temporary workspace, `keep` bytes stay
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        ALLOC.alloc(ctx.bwd_spike)
        ALLOC.free(ctx.bwd_spike)
        return grad, None, None, None


class Leaf(nn.Module):
    def __init__(self, fwd_spike: int, keep: int, bwd_spike: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.spec = (fwd_spike, keep, bwd_spike)

    def forward(self, x):
        return Spike.apply(x * self.w, *self.spec)


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Leaf(fwd_spike=500, keep=100, bwd_spike=700)
        self.b = Leaf(fwd_spike=600, keep=50, bwd_spike=200)

    def forward(self, x):
        return self.b(self.a(x))


def test_forward_delta_and_nested_peaks():
    model = Pair()
    block = wandb_modprof.profile(model, structure=False)
    block._capture.memory = ALLOC
    with block as prof:
        model(torch.ones(3)).sum().backward()
    r = {rec.key: rec for rec in prof.invocations()}
    a, b, root = r["a#0"], r["b#0"], r["<root>#0"]
    assert (a.fwd_mem_delta_bytes, a.fwd_mem_peak_bytes) == (100, 500)
    assert (b.fwd_mem_delta_bytes, b.fwd_mem_peak_bytes) == (50, 600)
    # the root's peak is b's spike on top of a's 100 kept bytes
    assert root.fwd_mem_delta_bytes == 150
    assert root.fwd_mem_peak_bytes == 100 + 600
    # backward: each leaf's spike, measured from its own start; the root sees the larger one
    assert a.bwd_mem_peak_bytes == 700
    assert b.bwd_mem_peak_bytes == 200
    assert root.bwd_mem_peak_bytes == 700


def test_cpu_models_report_no_device_memory_but_peaks_of_the_saved_curve():
    model = Pair()
    with wandb_modprof.profile(model, structure=False) as prof:
        model(torch.ones(3)).sum().backward()
    rec = prof.invocations()[0]
    assert rec.fwd_mem_delta_bytes is None  # an allocator delta: accelerators only
    # the peaks come from the CPU memory curve (tests/capture/test_memory_curve.py): here the
    # forward saves x * w's inputs and nothing is released before its end
    assert rec.fwd_mem_peak_bytes == rec.act_bytes
    assert rec.bwd_mem_peak_bytes is not None
