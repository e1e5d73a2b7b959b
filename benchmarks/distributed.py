"""Cost of gathering per-rank statistics to rank 0, on CPU processes with gloo.

Run (about a minute; ``--quick`` is the CI smoke run: 2 processes, a few steps):

    .venv/bin/python benchmarks/distributed.py [--quick] [--procs 2 4]

Method
------
For each process count (default 2 and 4; one intra-op thread each) the script starts that
many ranks of itself (``--worker``, env:// rendezvous on 127.0.0.1). Every rank trains the
same small GPT-style transformer (tests/models.py ``TinyGPT``) wrapped in
``DistributedDataParallel`` under ``watch(log_freq=1, structure=False)``: every step is
sampled, and rank 0 builds and logs the table each step (to a disabled W&B run: nothing on
disk). Two configurations alternate in blocks of ``--block`` steps, in an order shuffled per
round with the same seed on every rank:

* ``sampled``  -- the per-rank channel switched off: what a single process pays per sample;
* ``gathered`` -- the same plus the gathering: every rank but 0 publishes its compact
  statistics to the store at its next forward, rank 0 reads every rank's before it builds the
  table (waiting, if need be, for a rank's newest sample; `api.distributed.GATHER_WAIT_S` at most).

A step is zero_grad, forward, loss, backward (DDP's allreduce) and SGD step, timed on every
rank with ``time.perf_counter_ns``; the first step of a block is not timed. DDP keeps the
ranks in step, so what rank 0 spends gathering shows in every rank's step time. Reported:
median step time of rank 0 per configuration, the ratio gathered / sampled with the added
milliseconds, and the gathering's own cost timed around the calls: ``publish`` on ranks > 0
(encode + two store sets, which never wait for a reply) and ``collect`` on rank 0 (reading the
store, any wait for a late rank, folding). The machine has 2 cores: 4 processes share them,
so those figures include contention.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 (the usual alias)
from torch import nn

import wandb_modprof

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from models import TinyGPT, gpt_input

CONFIGS = ("sampled", "gathered")


def _timed(fn: Any, into: list[float]) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            into.append((time.perf_counter_ns() - t0) / 1e6)

    return wrapper


def worker(rounds: int, block: int, out: Path) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = nn.parallel.DistributedDataParallel(TinyGPT())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = gpt_input(4, 32)
    run = None
    if rank == 0:
        import wandb

        run = wandb.init(mode="disabled")
    handle = wandb_modprof.watch(model, log_freq=1, run=run, structure=False)
    channel = handle._ranks
    assert channel is not None
    publish_ms: list[float] = []
    collect_ms: list[float] = []
    channel.publish = _timed(channel.publish, publish_ms)  # type: ignore[method-assign]
    channel.collect = _timed(channel.collect, collect_ms)  # type: ignore[method-assign]

    def step() -> float:
        t0 = time.perf_counter_ns()
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        F.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
        opt.step()
        return (time.perf_counter_ns() - t0) / 1e6

    for _ in range(3):  # warm-up
        step()
    times: dict[str, list[float]] = {c: [] for c in CONFIGS}
    order = random.Random(0)  # the same order on every rank
    for _ in range(rounds):
        configs = list(CONFIGS)
        order.shuffle(configs)
        for config in configs:
            handle._ranks = channel if config == "gathered" else None
            step()  # not timed: the previous configuration's sample is delivered here
            times[config].extend(step() for _ in range(block - 1))
    handle._ranks = channel
    handle.unwatch()
    result = {"rank": rank, "times": times, "publish_ms": publish_ms, "collect_ms": collect_ms}
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def launch(procs: int, rounds: int, block: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        children = []
        for rank in range(procs):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            env.update(RANK=str(rank), WORLD_SIZE=str(procs), OMP_NUM_THREADS="1")
            env.update(WANDB_SILENT="true", WANDB_MODE="disabled")
            cmd = [sys.executable, __file__, "--worker", tmp, "--rounds", str(rounds)]
            cmd += ["--block", str(block)]
            children.append(subprocess.Popen(cmd, env=env))
        for child in children:
            if child.wait(timeout=600) != 0:
                raise SystemExit(f"a rank failed (exit {child.returncode})")
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(procs)]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run: 2 processes, tiny")
    parser.add_argument("--procs", type=int, nargs="+", default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 15)
    if args.worker:
        worker(rounds, args.block, Path(args.worker))
        return
    procs = args.procs or ([2] if args.quick else [2, 4])
    print(
        f"torch {torch.__version__}, gloo, 1 thread per rank, TinyGPT under DDP, every step "
        f"sampled and logged by rank 0 (disabled run); {rounds} rounds x {args.block - 1} "
        "timed steps per configuration; medians\n"
    )
    print(
        "| processes | sampled step ms (rank 0) | gathered step ms (rank 0) | ratio | +ms "
        "| publish ms (ranks > 0) | collect ms (rank 0) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in procs:
        results = launch(n, rounds, args.block)
        rank0 = results[0]
        sampled = _median(rank0["times"]["sampled"])
        gathered = _median(rank0["times"]["gathered"])
        publish = _median([t for r in results[1:] for t in r["publish_ms"]])
        collect = _median(rank0["collect_ms"])
        print(
            f"| {n} | {sampled:.2f} | {gathered:.2f} | {gathered / sampled:.3f}x | "
            f"{gathered - sampled:+.2f} | {publish:.3f} | {collect:.3f} |"
        )


if __name__ == "__main__":
    main()
