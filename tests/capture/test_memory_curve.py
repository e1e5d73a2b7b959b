"""The step's memory curve (`capture/memory_curve.py`) and the CPU per-call peaks read from it.

The CPU curve is checked against the other accountings of the same step: at the end of the
forward the curve holds the parameters, buffers and the root's activation bytes (counted by
the saved-tensor hook at a different time, from storages still saved); after the backward
every saved tensor is released and the gradients are there; a call's forward peak is its
activation bytes when nothing it saved was released inside it. The accelerator curve is
driven by a scripted allocator (tests/capture/test_device_memory.py's) and read back exactly.
"""

from __future__ import annotations

import pytest
import torch
from models import MLP, ResNet, gpt2_from_config, resnet_input
from test_device_memory import ALLOC, Pair

import wandb_modprof


def _profiled(model, step):
    step().backward()  # warm-up, then a clean step: gradients created by this backward
    model.zero_grad(set_to_none=True)
    with wandb_modprof.profile(model, structure=False) as prof:
        step().backward()
    return prof.snapshot().last


def _level(curve, t_ms):
    """Live bytes at `t_ms` from the recorded points (a step function)."""
    live = curve.live_bytes[0]
    for t, b in zip(curve.t_ms, curve.live_bytes, strict=True):
        if t <= t_ms:
            live = b
    return live


def _static(sample):
    root = sample.invocations[0]
    return root.param_bytes + root.buffer_bytes


def _resnet():
    model = ResNet()
    x = resnet_input(4, 16)
    return model, lambda: model(x).sum()


def _gpt2():
    model = gpt2_from_config(layers=2)
    ids = torch.randint(0, 512, (2, 32))
    return model, lambda: model(input_ids=ids, labels=ids).loss


@pytest.mark.parametrize("build", [_resnet, _gpt2], ids=["resnet", "gpt2"])
def test_cpu_curve_agrees_with_activation_and_gradient_bytes(build):
    model, step = build()
    sample = _profiled(model, step)
    curve = sample.memory
    root = sample.invocations[0]
    assert curve is not None and curve.source == "saved"
    assert len(curve.t_ms) == len(curve.live_bytes) > 10
    assert list(curve.t_ms) == sorted(curve.t_ms)
    # before anything ran: parameters and buffers only (gradients were set to None)
    assert curve.live_bytes[0] == _static(sample)
    # end of the forward: what the saved-tensor hook counted as still saved
    fwd_end = root.fwd_start_ms + root.fwd_wall_ms
    assert _level(curve, fwd_end) == _static(sample) + root.act_bytes
    # end of the backward: every saved tensor released, every gradient created
    assert curve.live_bytes[-1] == _static(sample) + root.grad_bytes
    assert max(curve.live_bytes) >= _static(sample) + root.act_bytes


def test_cpu_forward_peak_is_the_saved_bytes_when_nothing_is_released():
    model = MLP(16)
    x = torch.randn(8, 16)
    sample = _profiled(model, lambda: model(x).sum())
    for rec in sample.invocations:
        assert rec.fwd_mem_peak_bytes == rec.act_bytes, rec.key
        assert rec.bwd_mem_peak_bytes is not None and rec.bwd_mem_peak_bytes >= 0
    # the backward of `down` runs first: its gradients (weight and bias) are created on top
    # of what was live as its first node started, none released before them
    down = next(r for r in sample.invocations if r.key == "down#0")
    assert down.bwd_mem_peak_bytes >= sum(p.numel() * 4 for p in model.down.parameters()) - (
        down.act_self_bytes
    )


def test_gradients_that_existed_before_the_step_are_in_the_baseline():
    model = MLP(16)
    x = torch.randn(8, 16)
    model(x).sum().backward()  # gradients stay: this step accumulates into them
    with wandb_modprof.profile(model, structure=False) as prof:
        model(x).sum().backward()
    sample = prof.snapshot().last
    curve = sample.memory
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    assert curve.live_bytes[0] == _static(sample) + grads
    assert curve.live_bytes[-1] == _static(sample) + grads  # accumulated in place


def test_saved_tensors_are_released_as_their_nodes_run():
    model = MLP(16)
    x = torch.randn(8, 16)
    sample = _profiled(model, lambda: model(x).sum())
    r = {rec.key: rec for rec in sample.invocations}
    # as `up`'s backward starts, `down` and `act` have run: their saved inputs are gone and
    # `down`'s gradients exist; `up` still holds the input it saved
    down_grads = sum(p.numel() * p.element_size() for p in model.down.parameters())
    expected = _static(sample) + r["up#0"].act_self_bytes + down_grads
    assert _level(sample.memory, r["up#0"].bwd_start_ms) == expected


def test_no_curve_without_activation_hooks():
    model = MLP(16)
    x = torch.randn(8, 16)
    with wandb_modprof.profile(model, structure=False, activations=False) as prof:
        model(x).sum().backward()
    sample = prof.snapshot().last
    assert sample.memory is None
    assert all(r.fwd_mem_peak_bytes is None for r in sample.invocations)


def test_device_curve_reads_the_allocator_at_every_boundary():
    model = Pair()
    block = wandb_modprof.profile(model, structure=False)
    block._capture.memory = ALLOC
    start = ALLOC.current
    with block as prof:
        model(torch.ones(3)).sum().backward()
    sample = prof.snapshot().last
    curve = sample.memory
    assert curve is not None and curve.source == "device"
    assert list(curve.t_ms) == sorted(curve.t_ms)
    # 3 calls x 2 forward boundaries, then 2 per backward node that ran
    runs = [r for r in sample.runs if r.kind == "node"]
    assert len(curve.t_ms) == 6 + 2 * len(runs)
    # forward: start, a keeps 100, b keeps 50; the backward's spikes are freed inside nodes
    assert curve.live_bytes[0] == start
    assert max(curve.live_bytes) == start + 150
    assert curve.live_bytes[-1] == start + 150
    # the device peaks still come from the allocator's peak counter, not the curve
    assert {r.key: r.fwd_mem_peak_bytes for r in sample.invocations}["a#0"] == 500


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_curve_is_the_allocator_at_the_boundaries():
    model = MLP(256).cuda()
    x = torch.randn(64, 256, device="cuda")
    sample = _profiled(model, lambda: model(x).sum())
    curve = sample.memory
    assert curve is not None and curve.source == "device"
    assert list(curve.t_ms) == sorted(curve.t_ms) and min(curve.live_bytes) >= 0
    runs = [r for r in sample.runs if r.kind == "node"]
    assert len(curve.t_ms) == 2 * len(sample.invocations) + 2 * len(runs)
    # the parameters are allocated throughout; the peaks are the allocator's
    assert min(curve.live_bytes) >= _static(sample)
    assert all(r.fwd_mem_peak_bytes is not None for r in sample.invocations)
