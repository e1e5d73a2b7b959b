"""The floor under wandb_modprof's capture: torch's own hook machinery with hooks that do nothing.

Run (about a minute on 2 CPU cores):

    .venv/bin/python benchmarks/hook_floor.py [--modules N]

On the tree of ``scale.py``'s ``nested-N`` (Linear -> ReLU -> Linear blocks, width 8, batch 2),
without wandb_modprof, one torch thread, medians of 5 steps each, all in one process:

* module hooks: a forward pre-hook and a forward hook on every module (what times a forward);
* node hooks: a pre-hook and a hook on every autograd node of the step (what times a backward
  per module), registered after the forward as a sampled step does; registering alone is
  timed too (each registration builds an ``OrderedDict`` and a ``RemovableHandle`` in Python);
* saved-tensor hooks: identity pack / unpack hooks (what counts activation memory).

Each is reported per module call: the extra cost of capturing with the hooks the product needs
before any of its own work.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def _median_s(step: Callable[[], object], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _nodes(root: Any) -> set[Any]:
    seen: set[Any] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(nxt for nxt, _ in node.next_functions)
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=10_000, help="about this many modules")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    blocks = [
        nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)) for _ in range(args.modules // 4)
    ]
    model = nn.Sequential(*blocks)
    calls = sum(1 for _ in model.modules())
    x = torch.randn(2, 8)

    def plain() -> None:
        model(x).sum().backward()

    def walked() -> None:
        loss = model(x).sum()
        _nodes(loss.grad_fn)
        loss.backward()

    registering: list[float] = []
    counted: list[int] = []

    def node_hooked() -> None:
        loss = model(x).sum()
        nodes = _nodes(loss.grad_fn)
        t0 = time.perf_counter()
        for node in nodes:
            node.register_prehook(lambda grad_outputs: None)
            node.register_hook(lambda grad_inputs, grad_outputs: None)
        registering.append(time.perf_counter() - t0)
        counted.append(len(nodes))
        loss.backward()

    def saved_hooked() -> None:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            model(x).sum().backward()

    for _ in range(2):  # warm-up
        plain()
    base = _median_s(plain)
    handles = [m.register_forward_pre_hook(lambda mod, a: None) for m in model.modules()]
    handles += [m.register_forward_hook(lambda mod, a, out: None) for m in model.modules()]
    module_hooked = _median_s(plain)
    for handle in handles:
        handle.remove()
    walk = _median_s(walked)
    nodes_hooked = _median_s(node_hooked)
    saved = _median_s(saved_hooked)
    per_call = 1e6 / calls
    module_us = (module_hooked - base) * per_call
    node_us = (nodes_hooked - walk) * per_call
    saved_us = (saved - base) * per_call
    register_us = statistics.median(registering) / counted[0] * 1e6
    print(f"torch {torch.__version__}, {calls} modules, {counted[0]} autograd nodes per step")
    print(f"plain step: {base * 1e3:.0f} ms ({base * per_call:.1f} us per module call)")
    print(f"module pre/post hooks: +{module_us:.1f} us per call")
    print(
        f"node pre/post hooks: +{node_us:.1f} us per call (registering: {register_us:.1f} us/node)"
    )
    print(f"saved-tensor hooks: +{saved_us:.1f} us per call")
    print(f"floor: {module_us + node_us + saved_us:.0f} us per module call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
