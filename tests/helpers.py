"""Shared test helpers: hook inspection, training-step drivers and a cheap W&B run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from wandb_modprof import InvocationRecord


def hook_counts(model: nn.Module) -> dict[str, int]:
    """Number of module hooks of every kind on every submodule (root included)."""
    out = {}
    for name, m in model.named_modules():
        out[name or "<root>"] = (
            len(m._forward_pre_hooks)
            + len(m._forward_hooks)
            + len(m._backward_hooks)
            + len(m._backward_pre_hooks)
        )
    return out


def by_key(records: list[InvocationRecord]) -> dict[str, InvocationRecord]:
    return {r.key: r for r in records}


def children(records: list[InvocationRecord], key: str) -> list[InvocationRecord]:
    return [r for r in records if r.parent_key == key]


def train_step(
    model: nn.Module, x: torch.Tensor, loss_fn: Callable[[object], torch.Tensor] | None = None
) -> torch.Tensor:
    out = model(x)
    loss = loss_fn(out) if loss_fn else out.float().pow(2).mean()  # type: ignore[union-attr]
    loss.backward()
    return loss.detach()


def disabled_run() -> Any:
    """A no-op W&B run for `watch(run=...)` (~4 ms): it logs nowhere, and `run.summary[key]`
    holds the last object logged under `key`."""
    import wandb

    return wandb.init(mode="disabled")
