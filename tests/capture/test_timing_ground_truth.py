"""Per-module times agree with torch.profiler, measured on the same step.

Ground truth, independent of our hooks:
* forward: the profiler's Python tracer records every `nn.Module` call ("nn.Module: Conv2d_3");
  in start order these are exactly our invocations. The event spans the module's hooks too, so
  the time of our own hook functions called directly by `Module._call_impl` (traced as
  Python events from wandb_modprof/) is subtracted: what is left is the module's forward.
* backward: the profiler records every autograd node's execution ("ConvolutionBackward0")
  tagged with the sequence number of the forward op that created it; summing the events whose
  number lies in an invocation's `[seq_start, seq_end)` gives its backward cost as the profiler
  sees it (MEASUREMENT.md). AccumulateGrad events carry no sequence number; the engine runs a
  parameter's AccumulateGrad right after the node that produced its gradient (it has the
  highest priority), so one that runs between two of the invocation's own nodes is part of
  that invocation's backward and is added (we charge it there too). Leaving them out made the
  truth read ~10 % low on GPT-2's attention projections (0.6-0.9 of the tolerance, every run).

Tolerance, for every invocation taking >= 1 % of the step (forward + backward): within 15 % of
the ground truth or 0.1 ms (0.5 % of these steps), whichever is larger, on the median of
`STEPS` paired steps (each step measured by us and the profiler at once; the median of the
per-step pairs, so one step that a host hiccup hit in one window and not the other does not
decide it: on a shared 2-core machine one step in ~10 had a single 0.3 ms outlier). The garbage
collector is paused during the measured steps, and each model is measured in a fresh
interpreter (`_in_fresh_process`). What remains is the cost of our own hooks between the
profiler's event and our stamps; on these models the median error was 0.1-6 % (asserted < 10 %:
the machine is shared).
"""

from __future__ import annotations

import gc
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from models import ResNet, gpt2_from_config, resnet_input
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

import wandb_modprof

REL_TOL = 0.15
STEPS = 3


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: on a shared 2-core machine, OpenMP worker threads that lose their
    core turn a 1 ms op into a 50 ms one at random, in one window and not the other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


ABS_TOL_MS = 0.1


def _profiled_step(model, make_loss, with_stack):
    gc.collect()
    gc.disable()
    try:
        with (
            torch_profile(activities=[ProfilerActivity.CPU], with_stack=with_stack) as tp,
            wandb_modprof.profile(model, structure=False) as prof,
        ):
            make_loss().backward()
    finally:
        gc.enable()
    model.zero_grad(set_to_none=True)
    return prof, list(tp.events())


def _measure(model, make_loss):
    """`STEPS` pairs of steps, each measured by us and the profiler at once: the first of a
    pair with the Python tracer (forward truth), the second without it, since tracing our
    Python node hooks adds microseconds per node inside our backward windows but outside the
    profiler's node events."""
    for _ in range(2):  # warm-up: allocator, lazy init
        make_loss().backward()
        model.zero_grad(set_to_none=True)
    steps = []
    for _ in range(STEPS):
        fwd_prof, fwd_events = _profiled_step(model, make_loss, with_stack=True)
        bwd_prof, bwd_events = _profiled_step(model, make_loss, with_stack=False)
        modules = sorted(
            (e for e in fwd_events if e.name.startswith("nn.Module: ")),
            key=lambda e: e.time_range.start,
        )
        # The executed autograd functions, in the order they ran: nodes ("AddmmBackward0") and
        # AccumulateGrad (sequence number -1).
        executed = sorted(
            (
                e
                for e in bwd_events
                if e.name == "torch::autograd::AccumulateGrad"
                or (
                    e.sequence_nr >= 0
                    and not e.name.startswith("autograd::")
                    and "Backward" in e.name
                )
            ),
            key=lambda e: e.time_range.start,
        )
        steps.append((fwd_prof, bwd_prof, modules, executed))
    return steps


def _gt_bwd_ms(executed, seq_start: int, seq_end: int) -> float:
    """The invocation's nodes, plus the AccumulateGrad runs between two of them."""
    mine = [seq_start <= e.sequence_nr < seq_end for e in executed]
    total = 0.0
    last_node_mine = False
    pending = 0.0  # AccumulateGrad time since the last node
    for event, is_mine in zip(executed, mine, strict=True):
        if event.sequence_nr < 0:
            pending += event.time_range.elapsed_us()
            continue
        if is_mine:
            total += event.time_range.elapsed_us() + (pending if last_node_mine else 0.0)
        last_node_mine = is_mine
        pending = 0.0
    return total / 1000


def _our_hooks_us(module_event) -> float:
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


def _compare(steps):
    first_fwd, first_bwd = steps[0][0].invocations(), steps[0][1].invocations()
    totals = steps[0][1].last_sample.totals
    step_ms = totals.fwd_ms + totals.bwd_ms
    # Per invocation and direction: (ours, truth) of every step.
    pairs: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for fwd_prof, bwd_prof, modules, executed in steps:
        records, bwd_records = fwd_prof.invocations(), bwd_prof.invocations()
        assert len(modules) == len(records) == len(bwd_records) == len(first_fwd)
        for i, (rec, brec, mod) in enumerate(zip(records, bwd_records, modules, strict=True)):
            assert rec.key == brec.key == first_fwd[i].key
            # Same module type in the same order: the profiler's names are "<Class>_<n>".
            assert mod.name.removeprefix("nn.Module: ").rsplit("_", 1)[0] == rec.module_type
            assert rec.fwd_ms is not None and brec.bwd_ms is not None
            gt_fwd = (mod.time_range.elapsed_us() - _our_hooks_us(mod)) / 1000
            gt_bwd = _gt_bwd_ms(executed, brec.seq_start, brec.seq_end)
            pairs.setdefault((i, "fwd"), []).append((rec.fwd_ms, gt_fwd))
            pairs.setdefault((i, "bwd"), []).append((brec.bwd_ms, gt_bwd))
    errors = []
    checked = 0
    for i, brec in enumerate(first_bwd):
        if brec.fwd_ms + (brec.bwd_ms or 0.0) < 0.01 * step_ms:
            continue
        checked += 1
        for what in ("fwd", "bwd"):
            # The step whose difference is the median: ours and truth stay a measured pair.
            ours, truth = sorted(pairs[(i, what)], key=lambda p: p[0] - p[1])[STEPS // 2]
            assert abs(ours - truth) <= max(REL_TOL * truth, ABS_TOL_MS), (
                first_fwd[i].key,
                what,
                ours,
                truth,
                pairs[(i, what)],
            )
            if truth > 0.1:
                errors.append(abs(ours - truth) / truth)
    assert checked >= 10
    return statistics.median(errors)


def _check_resnet() -> None:
    torch.manual_seed(0)
    model = ResNet()
    x = resnet_input(16, 32)
    median = _compare(_measure(model, lambda: model(x).sum()))
    assert median < 0.10, median


def _check_gpt2() -> None:
    torch.manual_seed(0)
    model = gpt2_from_config()
    ids = torch.randint(0, 512, (4, 64))
    median = _compare(_measure(model, lambda: model(input_ids=ids, labels=ids).loss))
    assert median < 0.10, median


def _in_fresh_process(check: str) -> None:
    """Run `check` (a function above) in a fresh interpreter with one intra-op thread.

    Inside the whole suite, what earlier tests leave running in the process (W&B service
    threads, inductor's compile workers, stores) lands in single microsecond windows of one
    side and not the other: the comparison and its tolerance are the same here, only the
    process is clean (as when this file runs alone)."""
    here = Path(__file__).resolve().parent
    code = (
        "import sys, torch; "
        f"sys.path[:0] = [{str(here.parent)!r}, {str(here)!r}]; "
        "torch.set_num_threads(1); "
        f"import test_timing_ground_truth as t; t.{check}()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=900, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


# Serially, with the cores to themselves (the `accuracy` tests): beside the parallel suite the
# training thread is preempted between autograd nodes, which lands in the root's backward window
# and in no node's event (GPT-2's root backward read 25.0 ms against the nodes' 16.4 ms).
@pytest.mark.accuracy
def test_resnet_matches_profiler():
    _in_fresh_process("_check_resnet")


@pytest.mark.accuracy
def test_gpt2_matches_profiler():
    pytest.importorskip("transformers")
    _in_fresh_process("_check_gpt2")
