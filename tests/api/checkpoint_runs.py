"""What the checkpoint-plan tests share: the models planned, a loss, and how they are profiled
before and after a plan (`test_checkpoint_plan.py`, `test_checkpoint_outcome.py`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from models import ResNet, TinyGPT, gpt_input, resnet_input
from torch import nn

import wandb_modprof


def mlp_stack(width: int = 32, depth: int = 4) -> nn.Sequential:
    """Blocks of Linear, ReLU, Linear, ReLU: each block's last ReLU saves the output that the
    next block's first Linear saves again (a shared output the plan must not count as freed)."""
    blocks = [
        nn.Sequential(
            nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width), nn.ReLU()
        )
        for _ in range(depth)
    ]
    return nn.Sequential(*blocks, nn.Linear(width, 10))


def loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).float().pow(2).mean()


def profiled(model: nn.Module, x: torch.Tensor, steps: int = 2) -> wandb_modprof.Profile:
    """A structure pass and `steps` timed steps (after an untimed warm-up step), grads
    cleared."""
    loss(model, x).backward()
    with wandb_modprof.profile(model) as prof:
        for _ in range(steps):
            loss(model, x).backward()
    model.zero_grad(set_to_none=True)
    return prof


def realised(model: nn.Module, x: torch.Tensor) -> int:
    """The root's activation bytes measured on one timed step of `model` as it is now."""
    loss(model, x).backward()
    with wandb_modprof.profile(model, structure=False) as prof:
        loss(model, x).backward()
    model.zero_grad(set_to_none=True)
    act = prof.snapshot().stats["<root>#0"].typical("act_bytes")
    assert act is not None
    return round(act)


# TinyGPT: blocks of LayerNorm, attention, MLP; the MLP stack: shared outputs between blocks;
# the ResNet: conv, BatchNorm (running statistics), in-place ReLU, residual adds
MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "TinyGPT": lambda: (TinyGPT(), gpt_input()),
    "MLP": lambda: (mlp_stack(), torch.randn(16, 32)),
    "ResNet": lambda: (ResNet(), resnet_input()),
}
