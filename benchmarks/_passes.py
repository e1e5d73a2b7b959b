"""Structure passes over a run (imported by `structure.py`): how many ran, what each pass step
cost against a plain step, with the passes reusing what earlier ones followed
(`capture/structure/known_calls.py`) and without (every pass follows every call)."""

from __future__ import annotations

import copy
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

import wandb_modprof


@dataclass(frozen=True)
class PassRun:
    passes: int
    partial: int
    followed_share: float  # calls followed over calls met, all passes together
    ratio_median: float  # a pass step over the median plain step
    ratio_max: float
    pass_steps_s: float  # all pass steps, wall
    structures: int


def run_passes(
    build: Callable[[], nn.Module],
    forward: Callable[[nn.Module, int], torch.Tensor],
    steps: int,
    log_freq: int,
    reuse: bool,
) -> PassRun:
    """`steps` steps of a watched model (W&B disabled) interleaved with an unwatched twin."""
    import wandb

    torch.manual_seed(0)
    model = build()
    plain = copy.deepcopy(model)

    def step(m: nn.Module, i: int) -> float:
        start = time.perf_counter()
        m.zero_grad(set_to_none=True)
        forward(m, i).backward()
        return time.perf_counter() - start

    step(plain, 0)
    handle = wandb_modprof.watch(model, log_freq=log_freq, run=wandb.init(mode="disabled"))
    driver = handle._capture.structures
    if not reuse:
        driver.budget = None
        driver.reuse = False
    plain_s, pass_s = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (more than 8 sequences; a short run)
        for i in range(1, steps + 1):
            plain_s.append(step(plain, i))
            before = driver.passes
            took = step(model, i)
            if driver.passes > before:
                pass_s.append(took)
        handle.unwatch()
    records = driver.records
    typical = statistics.median(plain_s)
    return PassRun(
        passes=len(records),
        partial=sum(r.followed < r.calls for r in records),
        followed_share=sum(r.followed for r in records) / max(1, sum(r.calls for r in records)),
        ratio_median=statistics.median(pass_s) / typical if pass_s else 0.0,
        ratio_max=max(pass_s) / typical if pass_s else 0.0,
        pass_steps_s=sum(pass_s),
        structures=driver.sink.num_structures(),
    )
