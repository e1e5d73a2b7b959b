"""The floor under wandb_modprof's capture: torch's own hook machinery with hooks that do nothing.

Run (about a minute on 2 CPU cores):

    .venv/bin/python benchmarks/hook_floor.py [--modules N]

On the tree of ``scale.py``'s ``nested-N`` (Linear -> ReLU -> Linear blocks, width 8, batch 2),
without wandb_modprof, one torch thread, all in one process: each variant's step once per round,
9 rounds interleaved, the training thread's CPU time (the collector off inside the steps); each
figure is the median over rounds of a hooked step less the plain step of the same round:

* module hooks: a forward pre-hook and a forward hook on every module (what times a forward);
* node hooks: a pre-hook and a hook on every autograd node of the step (what times a backward
  per module), registered after the forward as a sampled step does; registering alone is
  timed too (each registration builds an ``OrderedDict`` and a ``RemovableHandle`` in Python);
* saved-tensor hooks: identity pack / unpack hooks (what counts activation memory).

Each is reported per module call: the extra cost of capturing with the hooks the product needs
before any of its own work. ``floor_us_per_call`` measures the same on any model and loss (what
``scale.py`` reports beside each of its models, in the same process).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def _cpu_s(step: Callable[[], object]) -> float:
    """The training thread's CPU time of one run of `step`, the collector off (emptied before):
    a shared machine's preemptions do not count, its collections cannot land inside."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.thread_time()
        step()
        return time.thread_time() - t0
    finally:
        gc.enable()


def _paired_s(variants: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Each variant once per round, rounds interleaved (the order rotates each round), so a
    drift of the machine over the measurement reaches every variant alike: the CPU seconds of
    each variant, per round."""
    names = list(variants)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            out[name].append(_cpu_s(variants[name]))
    return out


def _extra_s(times: dict[str, list[float]], hooked: str, base: str) -> float:
    """The median over rounds of `hooked` minus `base` in the same round."""
    return statistics.median(h - b for h, b in zip(times[hooked], times[base], strict=True))


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


@dataclass(frozen=True)
class Floor:
    """torch's no-op hook machinery on one model, microseconds per module call."""

    calls: int  # module calls per step
    nodes: int  # autograd nodes per step
    plain_ms: float  # the plain step
    register_us_per_node: float  # of node_us: registering the two hooks (OrderedDict, handle)
    module_us: float
    node_us: float
    saved_us: float

    @property
    def total_us(self) -> float:
        return self.module_us + self.node_us + self.saved_us


def floor_us_per_call(
    model: nn.Module, loss_of: Callable[[nn.Module], torch.Tensor], repeats: int = 9
) -> Floor:
    """The floor of `model` with `loss_of(model)` as its step's forward: module pre/post hooks on
    every module, pre/post hooks on every autograd node (registered after the forward, as a
    sampled step does), identity saved-tensor hooks; each against the plain step (the node hooks
    against a plain step that walks the graph as registering does), per module call: the median
    over `repeats` interleaved rounds of the training thread's CPU time, collector off, of each
    hooked step less the plain one of the same round. Leaves no hook behind."""
    counted = [0]

    def count(_module: nn.Module, _args: Any) -> None:
        counted[0] += 1

    handles = [m.register_forward_pre_hook(count) for m in model.modules()]
    try:
        loss_of(model).backward()
    finally:
        for handle in handles:
            handle.remove()
    calls = counted[0]

    def plain() -> None:
        loss_of(model).backward()
        model.zero_grad(set_to_none=True)

    def walked() -> None:
        loss = loss_of(model)
        _nodes(loss.grad_fn)
        loss.backward()
        model.zero_grad(set_to_none=True)

    nodes_seen: list[int] = []
    registering: list[float] = []

    def node_hooked() -> None:
        loss = loss_of(model)
        nodes = _nodes(loss.grad_fn)
        t0 = time.perf_counter()
        for node in nodes:
            node.register_prehook(lambda grad_outputs: None)
            node.register_hook(lambda grad_inputs, grad_outputs: None)
        registering.append(time.perf_counter() - t0)
        nodes_seen.append(len(nodes))
        loss.backward()
        model.zero_grad(set_to_none=True)

    def saved_hooked() -> None:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            loss_of(model).backward()
        model.zero_grad(set_to_none=True)

    def module_hooked() -> None:
        handles = [m.register_forward_pre_hook(lambda mod, a: None) for m in model.modules()]
        handles += [m.register_forward_hook(lambda mod, a, out: None) for m in model.modules()]
        try:
            t0 = time.thread_time()
            plain()
            module_steps.append(time.thread_time() - t0)
        finally:
            for handle in handles:
                handle.remove()

    module_steps: list[float] = []  # the module-hooked step alone, registering apart
    plain()
    times = _paired_s(
        {
            "plain": plain,
            "module": module_hooked,
            "walk": walked,
            "node": node_hooked,
            "saved": saved_hooked,
        },
        repeats,
    )
    # the module-hooked step without its registering and removing (done once per watch)
    times["module"] = module_steps[-len(times["plain"]) :]
    base = statistics.median(times["plain"])
    per_call = 1e6 / calls
    return Floor(
        calls,
        nodes_seen[0],
        base * 1e3,
        statistics.median(registering) / nodes_seen[0] * 1e6,
        _extra_s(times, "module", "plain") * per_call,
        _extra_s(times, "node", "walk") * per_call,
        _extra_s(times, "saved", "plain") * per_call,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=10_000, help="about this many modules")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    blocks = [
        nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)) for _ in range(args.modules // 4)
    ]
    model = nn.Sequential(*blocks)
    x = torch.randn(2, 8)
    floor = floor_us_per_call(model, lambda m: m(x).sum())
    print(
        f"torch {torch.__version__}, {floor.calls} modules, {floor.nodes} autograd nodes per step"
    )
    print(
        f"plain step: {floor.plain_ms:.0f} ms "
        f"({floor.plain_ms * 1e3 / floor.calls:.1f} us per module call)"
    )
    print(f"module pre/post hooks: +{floor.module_us:.1f} us per call")
    print(
        f"node pre/post hooks: +{floor.node_us:.1f} us per call "
        f"(registering: {floor.register_us_per_node:.1f} us/node)"
    )
    print(f"saved-tensor hooks: +{floor.saved_us:.1f} us per call")
    print(f"floor: {floor.total_us:.0f} us per module call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
