"""Ground truth from the model with nothing of ours attached (issue 15, MEASUREMENT.md).

`_truth.py` compares with torch.profiler on the *same* step, which our hooks have already
perturbed. Here every reported time is compared with the module running unobserved:

* forward, inclusive: on the model with nothing of ours attached, each module timed alone
  by one pre/post forward-hook pair (`time.perf_counter_ns`), nothing else hooked inside its
  window. Modules at the same depth of the module tree do not run inside one another, so one
  step per depth level times all modules of that level at once. The root (depth 0) is the
  plain model's forward wall time under one hook pair;
* forward, self: on the same step, the parents (one depth up) are hooked too: a parent's
  window less its children's windows, less a calibrated plain hook pair's cost per child call
  (`_plain_hook_gap_ms`, ~1-2 us). Same-step differences: a container's self time is a small
  difference of large numbers, which step-to-step noise swamps (two steps' inclusive truths
  gave the root a self time below zero);
* backward, inclusive: on a plain step with torch.profiler (CPU, no Python tracer) and,
  instead of our hooks, one pre/post forward-hook pair per module that only reads the autograd
  sequence counter (no tensor touched, nothing in the backward). A call's backward is the sum
  of the profiler's node events whose sequence number lies in the call's range, plus the
  AccumulateGrad runs between two of its own nodes (tests/capture/test_timing_ground_truth.py);
  backward self: a call's less its child calls' on the same step.

Our side: `wandb_modprof.profile(model, structure=False)` over one step, as a sampled step of
`watch`. Steps are interleaved (ours, the depth levels, the backward step) `repeats` times;
per call and metric the median of each side over the repeats is compared. Garbage collection
is paused inside every measured step, one torch thread.
"""

from __future__ import annotations

import copy
import gc
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from _truth import bwd_truth_ms, executed_autograd
from torch import nn
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

import wandb_modprof
from wandb_modprof.capture.memory.static_memory import ROOT_NAME as ROOT

METRICS = ("fwd", "fwd_self", "bwd", "bwd_self")


@dataclass(frozen=True)
class Check:
    """One call and metric: our median and the unobserved truth's median, in ms."""

    key: str
    metric: str
    share: float  # inclusive (fwd + bwd) truth / the step's, the "takes >= 1 %" test
    ours_ms: float
    truth_ms: float


@contextmanager
def _quiet_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _names(model: nn.Module) -> dict[nn.Module, str]:
    names: dict[nn.Module, str] = {}
    for name, module in model.named_modules():
        names.setdefault(module, name or ROOT)
    return names


@contextmanager
def _hook_pairs(
    modules: dict[nn.Module, str],
    on_pre: Callable[[str], Any],
    on_post: Callable[[str, Any], None],
) -> Iterator[None]:
    """One pre/post forward-hook pair per module; `on_pre`'s result goes to `on_post`."""
    handles = []
    open_calls: dict[int, list[Any]] = defaultdict(list)
    for module, name in modules.items():

        def pre(mod: nn.Module, args: Any, name: str = name) -> None:
            open_calls[id(mod)].append(on_pre(name))

        def post(mod: nn.Module, args: Any, out: Any, name: str = name) -> None:
            on_post(name, open_calls[id(mod)].pop())

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class _Calls:
    """Per-call values keyed as ours are: the n-th call of a module in the plain step is the
    n-th call of it in our records (the same calls run in the same order), whatever our key
    scheme (a shared module's calls are keyed under their caller)."""

    def __init__(self, keys: dict[str, list[str]]) -> None:
        self.values: dict[str, Any] = {}
        self._keys = keys
        self._count: dict[str, int] = defaultdict(int)

    def key(self, name: str) -> str:
        index = self._count[name]
        self._count[name] += 1
        return self._keys[name][index]


def _keys_by_module(records: list[Any]) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = defaultdict(list)
    for rec in records:  # in call order
        keys[rec.module_name].append(rec.key)
    return dict(keys)


def _plain_hook_gap_ms(repeats: int = 9, calls: int = 64) -> float:
    """What one plain hook pair costs a module's caller outside the module's own window (ms):
    a call's total time with the pair on it less the window the pair measures, the fastest of
    `repeats` batches (interference only adds). Taken out of a parent's self-time truth per
    hooked child call."""

    class Leaf(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    leaves = [Leaf() for _ in range(calls)]
    windows: list[float] = []
    best = float("inf")
    with _hook_pairs(
        {leaf: str(i) for i, leaf in enumerate(leaves)},
        lambda name: time.perf_counter_ns(),
        lambda name, start: windows.append(time.perf_counter_ns() - start),
    ):
        x = torch.zeros(1)
        for _ in range(repeats + 1):
            windows.clear()
            t0 = time.perf_counter_ns()
            for leaf in leaves:
                x = leaf(x)
            total = time.perf_counter_ns() - t0
            best = min(best, (total - sum(windows)) / calls)
    return max(0.0, best / 1e6)


def _call_depths(records: list[Any]) -> dict[str, int]:
    """Module name -> depth of its (first) call in the call tree, from our records. Not the
    name's depth: a `ModuleList` is never called, so `blocks.0` is the root's child."""
    depths: dict[str, int] = {}
    for rec in records:  # `depth` is the call's depth in the call tree
        depths.setdefault(rec.module_name, rec.depth)
    return depths


def _forward_truth(
    plain: nn.Module,
    make_loss: Callable[[], torch.Tensor],
    hook_gap_ms: float,
    records: list[Any],
) -> tuple[dict[str, float], dict[str, float]]:
    """Per call key: inclusive forward truth and self forward truth (ms), from one plain step
    depth of the call tree (of our `records` of the same step).

    The step for depth d hooks depths d - 1 and d: a depth-d module has nothing of ours inside
    its window (its inclusive truth, timed alone), and each depth-(d - 1) module's window less
    its children's windows, on the same step, is its self time (less `hook_gap_ms` per child
    call: the children's hook pairs run inside it). Self times from the same step, not as the
    difference of two steps' inclusive times: a container's self time is a small difference of
    large numbers, which step-to-step noise would swamp. The root alone on the first step."""
    depths, keys = _call_depths(records), _keys_by_module(records)
    depth_of_key = {rec.key: rec.depth for rec in records}
    names = {m: n for m, n in _names(plain).items() if n in depths}  # modules that were called
    incl: dict[str, float] = {}
    selfs: dict[str, float] = {}
    for depth in sorted(set(depths.values())):
        level = {m: n for m, n in names.items() if depths[n] in (depth - 1, depth)}
        calls = _Calls(keys)
        stack: list[str] = []
        kids: dict[str, list[str]] = defaultdict(list)

        def on_pre(
            name: str,
            calls: _Calls = calls,
            stack: list[str] = stack,
            kids: dict[str, list[str]] = kids,
        ) -> tuple[str, int]:
            key = calls.key(name)  # counted before the stamp: outside the window
            if stack:
                kids[stack[-1]].append(key)
            stack.append(key)
            return key, time.perf_counter_ns()

        def on_post(
            name: str, opened: tuple[str, int], calls: _Calls = calls, stack: list[str] = stack
        ) -> None:
            end = time.perf_counter_ns()
            key, start = opened
            calls.values[key] = (end - start) / 1e6
            stack.pop()

        with _hook_pairs(level, on_pre, on_post), _quiet_gc():
            make_loss().backward()
        plain.zero_grad(set_to_none=True)
        for key, ms in calls.values.items():
            if depth_of_key[key] == depth:
                incl[key] = ms
            else:
                inner = kids.get(key, [])
                selfs[key] = ms - sum(calls.values[k] for k in inner) - hook_gap_ms * len(inner)
    for key, ms in incl.items():  # the deepest modules: leaves, self time is inclusive time
        selfs.setdefault(key, ms)
    return incl, selfs


def _backward_truth(
    plain: nn.Module, make_loss: Callable[[], torch.Tensor], keys: dict[str, list[str]]
) -> dict[str, float]:
    calls = _Calls(keys)
    seq = torch._C._autograd._get_sequence_nr

    def on_pre(name: str) -> tuple[str, int]:
        return calls.key(name), seq()

    def on_post(name: str, opened: tuple[str, int]) -> None:
        key, start = opened
        calls.values[key] = (start, seq())

    with (
        _hook_pairs(_names(plain), on_pre, on_post),
        _quiet_gc(),
        torch_profile(activities=[ProfilerActivity.CPU]) as tp,
    ):
        make_loss().backward()
    plain.zero_grad(set_to_none=True)
    executed = executed_autograd(list(tp.events()))
    return {key: bwd_truth_ms(executed, lo, hi) for key, (lo, hi) in calls.values.items()}


def _ours(model: nn.Module, make_loss: Callable[[], torch.Tensor]) -> list[Any]:
    with _quiet_gc(), wandb_modprof.profile(model, structure=False) as prof:
        make_loss().backward()
    model.zero_grad(set_to_none=True)
    return list(prof.invocations())


def unobserved_checks(
    model: nn.Module,
    make_plain_loss: Callable[[nn.Module], torch.Tensor],
    repeats: int,
    copy_model: bool = False,
) -> tuple[list[Check], list[Check]]:
    """Every call of one step and metric, ours against the unobserved truth (see the module
    docstring), and the same calls' truth from the even repeats against the odd repeats' (an
    A/A of the method; empty below 2 repeats). `make_plain_loss(m)` runs one forward of module
    `m` and returns the loss.

    The plain steps run on `model` itself between our steps (nothing of ours is attached once
    `profile` exits), or with `copy_model` on a deep copy. The copy's truth differed from the
    same model's by 5-8 % on TinyGPT's MLP backward (its tensors live elsewhere in memory): a
    bias of the method, not of the profiler, so the same object is the default."""
    plain = copy.deepcopy(model) if copy_model else model
    for m in {id(model): model, id(plain): plain}.values():  # warm-up: allocator, lazy init
        for _ in range(2):
            make_plain_loss(m).backward()
            m.zero_grad(set_to_none=True)
    hook_gap_ms = _plain_hook_gap_ms()
    first = _ours(model, lambda: make_plain_loss(model))
    keys = _keys_by_module(first)
    ours_runs: list[list[Any]] = []
    fwd_runs: list[dict[str, float]] = []
    fwd_self_runs: list[dict[str, float]] = []
    bwd_runs: list[dict[str, float]] = []
    for _ in range(repeats):
        ours_runs.append(_ours(model, lambda: make_plain_loss(model)))
        incl, selfs = _forward_truth(plain, lambda: make_plain_loss(plain), hook_gap_ms, first)
        fwd_runs.append(incl)
        fwd_self_runs.append(selfs)
        bwd_runs.append(_backward_truth(plain, lambda: make_plain_loss(plain), keys))
    records = ours_runs[0]
    children: dict[str, list[str]] = defaultdict(list)
    for rec in records:
        if rec.parent_key is not None:
            children[rec.parent_key].append(rec.key)

    def truths(picked: range) -> dict[tuple[str, str], float]:
        """The truth of every call and metric: medians over the repeats in `picked`."""

        def median_of(runs: list[dict[str, float]], key: str) -> float:
            return statistics.median(runs[i][key] for i in picked)

        out: dict[tuple[str, str], float] = {}
        for rec in records:
            out[(rec.key, "fwd")] = median_of(fwd_runs, rec.key)
            out[(rec.key, "fwd_self")] = median_of(fwd_self_runs, rec.key)
            out[(rec.key, "bwd")] = median_of(bwd_runs, rec.key)
            # per step, then the median: each backward step gives every call's truth at once
            out[(rec.key, "bwd_self")] = statistics.median(
                bwd_runs[i][rec.key] - sum(bwd_runs[i][k] for k in children[rec.key])
                for i in picked
            )
        return out

    truth = truths(range(repeats))
    ours: dict[tuple[str, str], float] = {}
    by_key = [{r.key: r for r in run} for run in ours_runs]
    for rec in records:
        for metric in METRICS:
            attr = {"fwd": "fwd_ms", "fwd_self": "fwd_self_ms", "bwd": "bwd_ms"}.get(
                metric, "bwd_self_ms"
            )
            ours[(rec.key, metric)] = statistics.median(
                getattr(run[rec.key], attr) or 0.0 for run in by_key
            )
    root = records[0].key
    step = truth[(root, "fwd")] + truth[(root, "bwd")]

    def checks(
        left: dict[tuple[str, str], float], right: dict[tuple[str, str], float]
    ) -> list[Check]:
        return [
            Check(
                key=rec.key,
                metric=metric,
                share=(truth[(rec.key, "fwd")] + truth[(rec.key, "bwd")]) / step,
                ours_ms=left[(rec.key, metric)],
                truth_ms=right[(rec.key, metric)],
            )
            for rec in records
            for metric in METRICS
        ]

    # The method against itself: the truth of the even repeats as "ours", of the odd ones as
    # the truth. Its error is the floor under which no comparison with it can go.
    if repeats < 2:
        return checks(ours, truth), []
    half = checks(truths(range(0, repeats, 2)), truths(range(1, repeats, 2)))
    return checks(ours, truth), half
