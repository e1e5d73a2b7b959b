"""Regressions for the edge cases a code review found (each failed before its fix)."""

from __future__ import annotations

import copy
import io
import weakref
from typing import ClassVar

import pytest
import torch
from helpers import disabled_run, hook_counts
from torch import nn
from torch.optim.swa_utils import AveragedModel

import wandb_modprof
from wandb_modprof.capture import autograd_private as ap


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))


class Interruptible(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.interrupt = False

    def forward(self, x):
        x = torch.relu(self.a(x))
        if self.interrupt:
            raise KeyboardInterrupt  # Ctrl-C: Module._call_impl runs no always-call hooks
        return self.b(x)


def test_keyboard_interrupt_in_a_sampled_forward_does_not_stick():
    model, x = Interruptible(), torch.randn(4, 8)
    handle = wandb_modprof.watch(model, log_freq=2, structure=False, run=disabled_run())
    model(x).sum().backward()
    model.interrupt = True
    with pytest.raises(KeyboardInterrupt):
        model(x)  # step 2, sampled
    model.interrupt = False
    for _ in range(20):  # steps 3..22: 10 sampled
        model(x).sum().backward()
    assert not ap.saved_tensors_hooks_active()
    assert handle.unwatch().num_samples == 10
    assert all(v == 0 for v in hook_counts(model).values())


def test_keyboard_interrupt_inside_a_profile_block():
    model, x = Interruptible(), torch.randn(4, 8)
    model.interrupt = True
    with pytest.raises(KeyboardInterrupt), wandb_modprof.profile(model, structure=False):
        model(x)
    assert not ap.saved_tensors_hooks_active()
    assert all(v == 0 for v in hook_counts(model).values())


class Pyramid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x)).mean()
        if x.shape[-1] > 8:
            y = y + self(nn.functional.avg_pool2d(x, 2))  # the root calls itself
        return y


def test_a_root_that_calls_itself_is_one_step():
    model = Pyramid()
    handle = wandb_modprof.watch(model, log_freq=3, structure=False, run=disabled_run())
    for _ in range(6):
        model(torch.randn(2, 3, 32, 32)).backward()
    assert handle.steps == 6
    prof = handle.unwatch()
    assert prof.num_samples == 2
    keys = [r.key for r in prof.invocations()]
    assert keys == ["<root>#0", "conv#0", "<root>#1", "conv#1", "<root>#2", "conv#2"]


def test_copies_of_a_watched_model_are_plain_models():
    model = _mlp()
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    model(torch.randn(2, 8)).sum().backward()
    clone = copy.deepcopy(model)
    AveragedModel(model)
    torch.save(model, io.BytesIO())
    clone(torch.randn(2, 8)).sum().backward()  # the copy trains, unmeasured
    assert handle.profile().num_samples == 1
    model(torch.randn(2, 8)).sum().backward()  # the original is still watched
    assert handle.unwatch().num_samples == 2


def test_forward_inside_an_except_block_is_measured():
    model, x = _mlp(), torch.randn(4, 8)
    with wandb_modprof.profile(model, structure=False) as prof:
        try:
            raise MemoryError("batch too large")
        except MemoryError:
            model(x[:2]).sum().backward()  # the retry
    assert prof.num_samples == 1 and prof.invocations()[0].bwd_ms > 0


class Probe(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x * 2).mean(0).detach()  # its graph is freed at once


class Keep(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x * 3)  # sigmoid keeps its output for backward


class ProbeKeep(nn.Module):
    def __init__(self, n: int = 16) -> None:
        super().__init__()
        self.probes = nn.ModuleList(Probe() for _ in range(n))
        self.keeps = nn.ModuleList(Keep() for _ in range(n))

    def forward(self, x):
        out = 0
        for p, k in zip(self.probes, self.keeps, strict=True):
            out = out + p(x) + k(x)
        return out


def test_activation_bytes_count_what_is_still_saved_when_addresses_are_reused():
    model = ProbeKeep()
    with wandb_modprof.profile(model, structure=False) as prof:
        model(torch.randn(8, 256, requires_grad=True)).sum().backward()
    recs = prof.invocations()
    assert [r.act_self_bytes for r in recs if r.module_type == "Keep"] == [8 * 256 * 4] * 16
    assert [r.act_self_bytes for r in recs if r.module_type == "Probe"] == [0] * 16


class Track(torch.autograd.Function):
    alive: ClassVar[weakref.WeakSet] = weakref.WeakSet()

    @staticmethod
    def forward(ctx, x):
        token = type("Token", (), {})()
        ctx.token = token
        Track.alive.add(token)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g


class TruncatedRNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(64, 64)
        self.peak = 0

    def forward(self, h):
        for t in range(32):
            if t % 4 == 0:
                h = h.detach()  # older graphs become garbage
            h = Track.apply(torch.tanh(self.cell(h)))
            self.peak = max(self.peak, len(Track.alive))
        return h


def test_sampled_steps_do_not_keep_discarded_graphs_alive():
    model, h0 = TruncatedRNN(), torch.randn(16, 64)
    model(h0).sum().backward()
    plain = model.peak
    model.peak = 0
    handle = wandb_modprof.watch(model, log_freq=1, structure=False, run=disabled_run())
    model(h0).sum().backward()
    assert model.peak == plain == 4
    assert handle.unwatch().num_samples == 1


def test_sparse_gradients_are_sized_and_normed():
    model = nn.Sequential(nn.Embedding(10_000, 16, sparse=True))
    ids = torch.tensor([[1, 5, 5, 9]])
    with wandb_modprof.profile(model, structure=False) as prof:
        model(ids).sum().backward()
    grad = model[0].weight.grad
    rec = prof.invocations()[0]
    real = grad._indices().nbytes + grad._values().nbytes
    assert rec.grad_bytes == real < model[0].weight.nbytes // 100
    assert rec.grad_norm == pytest.approx(float(grad.coalesce()._values().norm()), rel=1e-5)


def test_gradients_in_one_flat_buffer_are_charged_by_slice():
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params))
    offset = 0
    for p in params:  # what DDP's gradient_as_bucket_view does
        p.grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    with wandb_modprof.profile(model, structure=False) as prof:
        model(torch.randn(4, 64)).sum().backward()
    keys = {r.key: r for r in prof.invocations()}
    assert keys["0#0"].grad_bytes == (64 * 64 + 64) * 4
    assert keys["<root>#0"].grad_bytes == flat.nbytes


class FailingBackward(torch.autograd.Function):
    fail = True

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if FailingBackward.fail:
            raise RuntimeError("boom")
        return g


def test_a_backward_that_raised_leaves_no_hooks_after_unwatch(monkeypatch):
    from wandb_modprof.capture import session as _session

    calls = []
    original = _session.StepSession._node_pre

    def counting(self, slot, grad_outputs):
        calls.append(id(self))
        return original(self, slot, grad_outputs)

    monkeypatch.setattr(_session.StepSession, "_node_pre", counting)
    model, x = _mlp(), torch.randn(4, 8)
    handle = wandb_modprof.watch(model, log_freq=2, structure=False, run=disabled_run())
    model(x).sum().backward()
    loss = model(FailingBackward.apply(x.clone().requires_grad_())).sum()  # sampled
    with pytest.raises(RuntimeError, match="boom"):
        loss.backward()
    FailingBackward.fail = False
    model(x).sum().backward()
    handle.unwatch()
    before = len(calls)
    for _ in range(3):
        model(x).sum().backward()
    assert len(calls) == before  # `loss` (and its graph) is alive, its hooks are not
    del loss


def test_modules_replaced_inside_a_profile_block_are_measured():
    model, x = _mlp(), torch.randn(4, 8)
    with wandb_modprof.profile(model, structure=False) as prof:
        model(x).sum().backward()
        model[2] = nn.Linear(8, 2)
        model(x).sum().backward()
    assert [r.key for r in prof.invocations()] == ["<root>#0", "0#0", "1#0", "2#0"]
