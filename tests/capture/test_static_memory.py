"""Static memory: parameter, gradient and optimizer bytes and norms (sparse gradients, flat
buffers).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import wandb_modprof


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
