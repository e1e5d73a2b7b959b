"""One rank of a distributed test (`tests/api/test_distributed.py` starts one process per rank).

    python tests/dist_worker.py SCENARIO OUT_DIR     # RANK, WORLD_SIZE, MASTER_* in the env

Scenarios:
- `straggler`: a DDP model under `watch(log_freq=2)`, 7 steps; `slow` sleeps 20 ms per forward
  on rank 1 only. Rank 0 logs to an offline W&B run in `OUT_DIR/rank0`; other ranks have none.
- `raise`: a plain model (no DDP: no collective of DDP's own can wait), rank 1 raises inside
  forward at its first sampled step and exits; rank 0 trains on and unwatches.
- `fsdp2`: `fully_shard` on each block and the model (CPU, gloo), 5 steps under `watch`.

Each rank writes `OUT_DIR/rank<R>.json`: module names, timings and rank 0's last table.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import wandb_modprof


class Sleeper(nn.Module):
    """Identity that sleeps `delay_s` per forward: a straggling module on one rank."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return x


class Raiser(nn.Module):
    """Identity that raises on its `raise_at`-th training forward (0: never)."""

    def __init__(self, raise_at: int) -> None:
        super().__init__()
        self.raise_at = raise_at
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.raise_at:
            raise RuntimeError("rank 1 fails inside forward")
        return x


class Net(nn.Module):
    def __init__(self, middle: nn.Module) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.act = nn.ReLU()
        self.slow = middle
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.slow(self.act(self.fc1(x))))


def _run(rank: int, out: Path) -> Any:
    if rank != 0:
        return None
    import wandb

    return wandb.init(mode="offline", project="modprof-dist", dir=str(out / "rank0"), entity="me")


def _steps(model: nn.Module, steps: int, run: Any) -> None:
    """Training steps; rank 0 logs the loss, so each table file carries its own run step."""
    x = torch.randn(16, 32)
    for _ in range(steps):
        loss = model(x).pow(2).mean()
        loss.backward()
        if run is not None:
            run.log({"loss": float(loss)})


def _table(handle: wandb_modprof.WatchHandle) -> list[dict[str, Any]]:
    return [dict(r) for r in handle.profile().table().resolved()]


def straggler(rank: int, out: Path) -> dict[str, Any]:
    model = Net(Sleeper(0.02 if rank == 1 else 0.0))
    ddp = nn.parallel.DistributedDataParallel(model)
    run = _run(rank, out)
    handle = wandb_modprof.watch(ddp, log_freq=2)
    _steps(ddp, 7, run)  # 1: structure pass; 2, 4, 6 sampled
    prof = handle.unwatch()
    if run is not None:
        run.finish()
    return {
        "key": handle.key,
        "model_name": prof.model_name,
        "names": sorted(prof.stats()),
        "samples": prof.num_samples,
    }


def raise_on_rank1(rank: int, out: Path) -> dict[str, Any]:
    model = Net(Raiser(2 if rank == 1 else 0))  # forward 1: structure pass, 2: sampled
    run = _run(rank, out)
    handle = wandb_modprof.watch(model, log_freq=2)
    t0 = time.monotonic()
    _steps(model, 8, run)  # rank 1 raises here and exits
    prof = handle.unwatch()
    elapsed = time.monotonic() - t0
    if run is not None:
        run.finish()
    return {"elapsed_s": elapsed, "samples": prof.num_samples}


def fsdp2(rank: int, out: Path) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    model = Net(nn.Sequential(nn.Linear(64, 64), nn.ReLU()))
    fully_shard(model.slow)
    fully_shard(model)
    run = _run(rank, out)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle = wandb_modprof.watch(model, log_freq=2)
        _steps(model, 5, run)
        prof = handle.unwatch()
    if run is not None:
        run.finish()
    stats = prof.stats()
    return {
        "names": sorted(stats),
        "types": {k: s.module_type for k, s in stats.items()},
        "param_bytes": {k: s.mean("param_bytes") for k, s in stats.items()},
        "bwd_ms": {k: s.mean("bwd_ms") for k, s in stats.items()},
        "warnings": [str(w.message) for w in caught if "wandb_modprof" in str(w.message)],
        "samples": prof.num_samples,
    }


SCENARIOS = {"straggler": straggler, "raise": raise_on_rank1, "fsdp2": fsdp2}


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = SCENARIOS[scenario](rank, out)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    if scenario == "fsdp2":
        # About 1 run in 10 under pytest, a rank aborted after all this, while the interpreter
        # shut down ("terminate called without an active exception"): gloo's worker threads
        # can still hold FSDP2's async work (tensors with Python references) at finalization
        # (pytorch/pytorch#179291). Not what this test is about: skip the finalization.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
