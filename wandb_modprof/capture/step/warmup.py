"""`warmup=`: a model's first steps counted but never sampled."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


def after_warmup(
    should_sample: Callable[[nn.Module], int | None], warmup: int
) -> Callable[[nn.Module], int | None]:
    """`should_sample` with its first `warmup` steps counted but never sampled (`warmup=`);
    itself without a warm-up, so the unsampled path does not change."""
    if not warmup:
        return should_sample
    left = [warmup]

    def sample(module: nn.Module) -> int | None:
        step = should_sample(module)  # (counted either way)
        if left[0]:
            left[0] -= 1
            return None
        return step

    return sample
