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


def _exact_grad_bytes(module: nn.Module) -> int:
    """A module's gradient bytes written out: each distinct (address, size) extent once."""
    seen: dict[tuple[int, int], int] = {}
    for p in module.parameters():
        if p.grad is not None and p.grad.numel():
            seen[(p.grad.data_ptr(), p.grad.nbytes)] = p.grad.nbytes
    return sum(seen.values())


def test_gradients_that_alias_count_once_per_module():
    """Two parameters whose gradients are the same memory (a framework's shared buffer): the
    module holding both is charged it once, each leaf its full size."""
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False))
    with wandb_modprof.profile(model, structure=False, norms=False) as prof:
        out = model(torch.randn(2, 8)).sum()
        shared = torch.zeros(8, 8)
        model[0].weight.grad = shared
        model[1].weight.grad = shared  # accumulation adds into the one buffer
        out.backward()
    keys = {r.key: r for r in prof.invocations()}
    assert keys["0#0"].grad_bytes == keys["1#0"].grad_bytes == 8 * 8 * 4
    assert keys["<root>#0"].grad_bytes == _exact_grad_bytes(model) == 8 * 8 * 4


class _Mixed(nn.Module):
    """A first layer in `dtype`, a float32 second one."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8).to(dtype)
        self.b = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).float())


def _norm(*tensors: torch.Tensor) -> float:
    return sum(float(t.detach().double().square().sum()) for t in tensors) ** 0.5


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_norms_of_every_floating_dtype_are_measured(dtype: torch.dtype):
    """A float64 part of a model (or a half one) is sampled like the rest: float64 norms
    accumulate in float64 (exact to 1e-12), half types in float32."""
    torch.manual_seed(0)
    model = _Mixed(dtype)
    x = torch.randn(3, 8, dtype=dtype)
    with wandb_modprof.profile(model, structure=False) as prof:
        model(x).sum().backward()
    assert prof.num_samples == 1
    keys = {r.key: r for r in prof.invocations()}
    tol = 1e-12 if dtype == torch.float64 else 1e-3
    assert keys["a#0"].param_norm == pytest.approx(_norm(*model.a.parameters()), rel=tol)
    assert keys["a#0"].grad_norm == pytest.approx(
        _norm(*(p.grad for p in model.a.parameters())), rel=tol
    )
    everything = _norm(*model.parameters())
    assert keys["<root>#0"].param_norm == pytest.approx(everything, rel=1e-3)


def test_a_float64_model_is_sampled_with_float64_norms():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).double()
    with wandb_modprof.profile(model, structure=False) as prof:
        for _ in range(2):
            model(torch.randn(4, 8, dtype=torch.float64)).sum().backward()
    assert prof.num_samples == 2
    keys = {r.key: r for r in prof.invocations()}
    assert keys["0#0"].param_norm == pytest.approx(_norm(*model[0].parameters()), rel=1e-12)
