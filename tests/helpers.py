"""Shared test helpers: hook inspection, training-step drivers and a cheap W&B run."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
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


def strict_json(text: str) -> Any:
    """`json.loads` that rejects NaN / Infinity (W&B writes them bare; browsers refuse them)."""

    def reject(constant: str) -> Any:
        raise ValueError(f"non-JSON constant {constant} in a table file")

    return json.loads(text, parse_constant=reject)


def check_logged_tables(files: Sequence[Path], columns: Sequence[str]) -> None:
    """Every W&B table file is strict JSON with these columns, 1 to 10,000 rows and only
    finite numbers."""
    for path in files:
        data = strict_json(path.read_text())
        assert data["columns"] == list(columns)
        assert 0 < len(data["data"]) <= 10_000
        assert not any(
            isinstance(cell, float) and not math.isfinite(cell)
            for row in data["data"]
            for cell in row
        )


def profiled(model: nn.Module, x: torch.Tensor, steps: int = 3) -> Any:
    """A `wandb_modprof.profile` of `steps` forward + backward steps (the first is the
    structure pass)."""
    import wandb_modprof

    with wandb_modprof.profile(model) as prof:
        for _ in range(steps):
            model(x).sum().backward()
    return prof
