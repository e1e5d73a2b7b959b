"""Ground truth for per-module times and activation bytes, independent of wandb_modprof's hooks.

The method of tests/capture/test_timing_ground_truth.py and
tests/capture/test_activations.py (MEASUREMENT.md), as functions that return every comparison
instead of asserting:

* forward (CPU): the profiler's Python tracer records every ``nn.Module`` call
  (``nn.Module: Conv2d_3``); in start order these are exactly our invocations. The event spans
  our own hook functions too, so their traced time is subtracted;
* backward (CPU): the sum of the profiler's autograd node events (``ConvolutionBackward0``)
  whose forward sequence number lies in the invocation's ``[seq_start, seq_end)``. Measured on a
  second step without the Python tracer (tracing our node hooks would add time inside our
  windows but outside the profiler's node events);
* CUDA (`kernel_truth=True`): the same module and node events, but the truth is the device
  time of the kernels their ops launched (the profiler's CUDA activity, matched to host ops by
  correlation id): ``span`` from the first kernel's start to the last one's end, and ``busy``,
  the sum of kernel durations. wandb_modprof's CUDA times are stream time between events
  recorded in the hooks, which is the span when the GPU is the bottleneck;
* activation bytes: PyTorch's ``MemTracker`` on the same step, ``ACT`` bytes after the forward
  of a module minus before it, for the blocks (where creator and saver coincide, see
  tests/capture/test_activations.py) and for the whole model minus what the forward returned.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

import wandb_modprof


@dataclass(frozen=True)
class TimeCheck:
    """One invocation: our forward / backward ms and the profiler's, and its share of the step."""

    key: str
    module_type: str
    share: float  # (fwd + bwd) / (step fwd + bwd), by our numbers
    fwd_ms: float
    fwd_truth_ms: float
    bwd_ms: float
    bwd_truth_ms: float
    fwd_busy_ms: float | None = None  # CUDA only: kernel busy time
    bwd_busy_ms: float | None = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _profiled_step(
    model: nn.Module, make_loss: Callable[[], torch.Tensor], with_stack: bool, cuda: bool
) -> tuple[wandb_modprof.Profile, list[Any]]:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    device = next(model.parameters()).device
    gc.collect()
    gc.disable()  # a collection inside one window only would be an error of neither tool
    try:
        _sync(device)
        with (
            torch_profile(activities=activities, with_stack=with_stack) as tp,
            wandb_modprof.profile(model, structure=False) as prof,
        ):
            make_loss().backward()
            _sync(device)
    finally:
        gc.enable()
    model.zero_grad(set_to_none=True)
    return prof, list(tp.events())


def _our_hooks_us(module_event: Any) -> float:
    """Time in wandb_modprof functions anywhere inside this module's event: the hooks its
    `_call_impl` calls, its children's, and our saved-tensor pack hooks inside its ops (all
    of which we take out of our own numbers, capture/step/clock.py)."""
    total = 0.0
    todo = list(module_event.cpu_children)
    while todo:
        event = todo.pop()
        if "wandb_modprof" in event.name:
            total += event.time_range.elapsed_us()  # and not below: counted once
        else:
            todo.extend(event.cpu_children)
    return total


class _Kernels:
    """Kernel intervals (us) of the host ops inside a host event's interval, same thread."""

    def __init__(self, events: list[Any]) -> None:
        by_corr: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for e in events:
            if e.device_type == DeviceType.CUDA and e.linked_correlation_id > 0:
                by_corr[e.linked_correlation_id].append((e.time_range.start, e.time_range.end))
        # host ops that launched kernels, per thread, by start time
        self.ops: dict[int, list[tuple[float, float, list[tuple[float, float]]]]] = defaultdict(
            list
        )
        for e in events:
            # host ops (linked id 0; CUDA runtime calls link to their op and are skipped)
            frontend = e.device_type == DeviceType.CPU and e.linked_correlation_id == 0
            if frontend and e.id in by_corr and not e.is_async:
                self.ops[e.thread].append((e.time_range.start, e.time_range.end, by_corr[e.id]))
        for ops in self.ops.values():
            ops.sort(key=lambda o: o[0])

    def inside(self, event: Any) -> list[tuple[float, float]]:
        start, end = event.time_range.start, event.time_range.end
        return [
            k for s, e, ks in self.ops.get(event.thread, ()) if s >= start and e <= end for k in ks
        ]


def _span_busy_ms(kernels: list[tuple[float, float]]) -> tuple[float, float]:
    if not kernels:
        return 0.0, 0.0
    span = max(e for _, e in kernels) - min(s for s, _ in kernels)
    return span / 1000, sum(e - s for s, e in kernels) / 1000


def _align(events: list[Any], types: list[str]) -> list[Any]:
    """The profiler's module events that are our invocations, in order: it also records
    modules outside the model (transformers builds its `CrossEntropyLoss` inside the forward)."""
    kept: list[Any] = []
    for event in events:
        if len(kept) < len(types) and _type(event) == types[len(kept)]:
            kept.append(event)
    return kept


def _type(event: Any) -> str:
    return str(event.name.removeprefix("nn.Module: ").rsplit("_", 1)[0])


def executed_autograd(events: list[Any]) -> list[Any]:
    """The autograd functions a step executed, in the order they ran: nodes
    (``AddmmBackward0``) and AccumulateGrad (sequence number -1)."""
    return sorted(
        (
            e
            for e in events
            if e.name == "torch::autograd::AccumulateGrad"
            or (e.sequence_nr >= 0 and not e.name.startswith("autograd::") and "Backward" in e.name)
        ),
        key=lambda e: e.time_range.start,
    )


def bwd_truth_ms(executed: list[Any], seq_start: int, seq_end: int) -> float:
    """A call's backward: its nodes (sequence number in ``[seq_start, seq_end)``) plus the
    AccumulateGrad runs between two of them, which the engine runs right after the node that
    produced the gradient (tests/capture/test_timing_ground_truth.py uses the same rule;
    ``time_checks`` below still sums the nodes alone)."""
    total = 0.0
    last_node_mine = False
    pending = 0.0  # AccumulateGrad time since the last node
    for event in executed:
        if event.sequence_nr < 0:
            pending += event.time_range.elapsed_us()
            continue
        mine = seq_start <= event.sequence_nr < seq_end
        if mine:
            total += event.time_range.elapsed_us() + (pending if last_node_mine else 0.0)
        last_node_mine = mine
        pending = 0.0
    return total / 1000


def time_checks(
    model: nn.Module, make_loss: Callable[[], torch.Tensor], kernel_truth: bool = False
) -> list[TimeCheck]:
    """Every invocation of one forward + backward, measured by us and by the profiler at once
    (two steps: forward truth with the Python tracer, backward truth without it)."""
    for _ in range(2):  # warm-up: allocator, lazy init, cuDNN / cuBLAS heuristics
        make_loss().backward()
        model.zero_grad(set_to_none=True)
    fwd_prof, fwd_events = _profiled_step(model, make_loss, True, kernel_truth)
    bwd_prof, bwd_events = _profiled_step(model, make_loss, False, kernel_truth)
    modules = sorted(
        (e for e in fwd_events if e.name.startswith("nn.Module: ")),
        key=lambda e: e.time_range.start,
    )
    nodes = [
        e
        for e in bwd_events
        if e.sequence_nr >= 0
        and e.device_type == DeviceType.CPU
        and not e.name.startswith("autograd::")
        and "Backward" in e.name
    ]
    fwd_kernels = _Kernels(fwd_events) if kernel_truth else None
    bwd_kernels = _Kernels(bwd_events) if kernel_truth else None
    records, bwd_records = fwd_prof.invocations(), bwd_prof.invocations()
    modules = _align(modules, [r.module_type for r in records])
    if not len(modules) == len(records) == len(bwd_records):
        raise RuntimeError(
            f"profiler saw {len(modules)} module calls, we {len(records)} / {len(bwd_records)}"
        )
    totals = bwd_prof.last_sample.totals
    step_ms = (totals.fwd_ms or 0.0) + (totals.bwd_ms or 0.0)
    checks = []
    for rec, brec, mod in zip(records, bwd_records, modules, strict=True):
        if rec.key != brec.key or _type(mod) != rec.module_type:
            raise RuntimeError(f"call order differs at {rec.key} / {brec.key} / {mod.name}")
        mine = [e for e in nodes if brec.seq_start <= e.sequence_nr < brec.seq_end]
        fwd_busy = bwd_busy = None
        if fwd_kernels is not None and bwd_kernels is not None:
            fwd_truth, fwd_busy = _span_busy_ms(fwd_kernels.inside(mod))
            spans = [_span_busy_ms(bwd_kernels.inside(e)) for e in mine]
            bwd_truth, bwd_busy = sum(s for s, _ in spans), sum(b for _, b in spans)
        else:
            fwd_truth = (mod.time_range.elapsed_us() - _our_hooks_us(mod)) / 1000
            bwd_truth = sum(e.time_range.elapsed_us() for e in mine) / 1000
        bwd_ms = brec.bwd_ms or 0.0
        checks.append(
            TimeCheck(
                key=rec.key,
                module_type=rec.module_type,
                share=(brec.fwd_ms + bwd_ms) / step_ms if step_ms > 0 else 0.0,
                fwd_ms=rec.fwd_ms,
                fwd_truth_ms=fwd_truth,
                bwd_ms=bwd_ms,
                bwd_truth_ms=bwd_truth,
                fwd_busy_ms=fwd_busy,
                bwd_busy_ms=bwd_busy,
            )
        )
    return checks


@dataclass(frozen=True)
class MemCheck:
    name: str
    act_bytes: int
    memtracker_bytes: int


def activation_checks(
    model: nn.Module,
    forward: Callable[[nn.Module], Any],
    loss_of: Callable[[Any], torch.Tensor],
    blocks: list[tuple[str, nn.Module]],
    returned_bytes: Callable[[Any], int],
) -> list[MemCheck]:
    """Activation bytes of `blocks` and of the whole model ("<root>", minus the returned
    outputs), ours and MemTracker's, on the same step."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _ModState

    device = next(model.parameters()).device
    loss_of(forward(model)).backward()  # warm-up
    model.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker, wandb_modprof.profile(model, structure=False) as prof:
        out = forward(model)
        loss_of(out).backward()
    _sync(device)
    recs = {r.key: r for r in prof.invocations()}
    dev = device if device.type == "cpu" else torch.device(device.type, device.index or 0)

    def delta(module: nn.Module) -> int:
        snaps = tracker.memory_tracking[module].snapshots
        pre = snaps[_ModState.PRE_FW][-1][dev][_MemRefType.ACT]
        post = snaps[_ModState.POST_FW][-1][dev][_MemRefType.ACT]
        return int(post - pre)

    checks = [MemCheck(name, recs[f"{name}#0"].act_bytes or 0, delta(m)) for name, m in blocks]
    root = recs["<root>#0"].act_bytes or 0
    checks.append(MemCheck("<root>", root, delta(model) - returned_bytes(out)))
    model.zero_grad(set_to_none=True)
    return checks
