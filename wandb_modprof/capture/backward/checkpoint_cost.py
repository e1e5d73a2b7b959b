"""What activation checkpointing costs per call beyond the forward it runs again: torch's
non-reentrant `checkpoint` machinery (its saved-tensor hooks, the frame it keeps, the recompute
it sets up in backward), measured once per process on this host.

A checkpoint plan's predicted step time (`view.checkpoint_plan`) adds this to each planned
call's recompute, and its knapsack prices every call with it, so a plan of many tiny calls
(the experts of a mixture of experts, a fraction of a millisecond each) is not taken for
cheap. Measured on the host: the cost is Python and dispatcher work. On an accelerator whose
host runs ahead of it, part of it hides behind the device's work, so there it is an upper
estimate.

>>> 0.0 < checkpoint_call_ms() < 50.0
True
"""

from __future__ import annotations

import functools
import statistics
import time

import torch
from torch import nn
from torch.nn.utils import skip_init
from torch.utils.checkpoint import checkpoint

from wandb_modprof.capture.step.random_state import keeping

ROUNDS = 5  # interleaved rounds; the median of their per-call costs is the answer
CALLS = 15  # calls per round and variant


def known_call_ms() -> float | None:
    """`checkpoint_call_ms()` where this process measured it already; None otherwise. Never
    measures: a table build (the ones `watch` logs during training, `Profile.table()`, the
    report) takes no calibration, so its plan is priced only where an explicit plan
    (`Profile.checkpoint_plan()`, `summary(mode="ckpt")`, `wandb-modprof plan`) measured the
    cost in this process first (a fraction of a second, once, every random generator left
    where it was)."""
    if checkpoint_call_ms.cache_info().currsize:
        return checkpoint_call_ms()
    return None


@functools.cache
@keeping("the checkpoint cost's calibration")
def checkpoint_call_ms() -> float:
    """The median extra time (ms) one checkpointed call of a tiny `nn.Linear` takes, forward
    and backward, over the same call unwrapped plus one more forward of it (the recompute,
    which a plan prices from the profile). At least 0; cached for the process.

    Its data are constants: `nn.Linear(4, 4)` would initialise its weights from torch's global
    generator and `torch.randn` draw from it, moving every later dropout mask and data draw of
    the user's run (`skip_init` builds the layer without initialising it)."""
    with torch.enable_grad():
        lin: nn.Linear = skip_init(nn.Linear, 4, 4)  # type: ignore[no-untyped-call]
        with torch.no_grad():
            lin.weight.fill_(0.25)
            lin.bias.fill_(0.5)
        x = torch.full((2, 4), 0.5, requires_grad=True)

        def plain() -> None:
            lin(x).sum().backward()

        def wrapped() -> None:
            out: torch.Tensor = checkpoint(lin, x, use_reentrant=False)
            out.sum().backward()  # type: ignore[no-untyped-call]

        def forward() -> None:
            lin(x)

        costs = []
        for _ in range(ROUNDS):
            t_plain, t_wrapped, t_forward = (_per_call(f) for f in (plain, wrapped, forward))
            costs.append(t_wrapped - t_plain - t_forward)
    return max(0.0, statistics.median(costs))


def _per_call(run: object) -> float:
    """The mean ms of one of `CALLS` calls of `run`, after one untimed call."""
    assert callable(run)
    run()
    start = time.perf_counter()
    for _ in range(CALLS):
        run()
    return (time.perf_counter() - start) * 1000.0 / CALLS
