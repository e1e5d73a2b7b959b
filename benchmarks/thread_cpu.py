"""What one logged sample costs the training thread in CPU time, against torch's hook floor.

Run (one to two minutes per model on 2 CPU cores):

    .venv/bin/python benchmarks/thread_cpu.py [--models nested-10000,gpt2-12,...] [--cycles 16]

Per model, in one process, one torch thread, an offline W&B run:

* ``floor``: torch's own hook machinery with no-op hooks on a deep copy of the model
  (``hook_floor.floor_us_per_call``: module pre/post hooks, pre/post hooks on every autograd
  node, identity saved-tensor hooks), per step;
* ``thread``: a model watched with ``log_freq=4`` (the worker process on: ``offload=True``) and
  an unwatched twin stepped alternately; per cycle of 4 steps, the watched steps' training-
  thread CPU (``time.thread_time``) minus the twin's: the sampled step, the hand-off and
  whatever else the thread does for that sample. Median (and range) over ``--cycles`` cycles
  after one warm-up cycle; as a multiple of the floor. ``A/A``: the same difference between
  two unwatched twins (what the method reads when nothing differs);
* ``all-in``: the same cycles' CPU of this whole process (its other threads included) plus
  the worker process's (``/proc/<pid>/stat``), minus the twin's: the sample's work wherever
  it runs (W&B's own service process not included). The mean over the cycles, so the tables
  the schedule logs in them (``sinks/wandb/table_schedule.py``: the 1st, 2nd, 4th, 8th, 16th
  sample's) count at their share of a run that short; a longer run logs fewer per sample;
* ``first step``: the watched model's first step (the structure pass, the worker's start),
  training-thread CPU over a plain step, in plain steps;
* ``unwatch`` (wall seconds, and the training thread's CPU of it) and ``run.finish``.

Models: ``nested-N`` (``scale.py``'s tree of Linear -> ReLU -> Linear blocks), ``gpt2-L``
(``scale.py``: GPT-2 from a config, L layers), ``moe-LxExK`` (``_moe.py``: L layers, E
experts, top-K routing, the same 64 tokens every step) and ``moe-LxExK-rT`` (T new random
tokens every step, so the experts called change from step to step). Default: nested-10000,
moe-8x64x2 (tiny experts), moe-18x128x8 (nearly every expert called), moe-8x64x2-r16,
gpt2-12.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from _peers import wandb_runs
from _report import emit, revision
from hook_floor import Floor, floor_us_per_call
from scale import Case, gpt2, moe, nested
from torch import nn

import wandb_modprof

FREQ = 4  # log_freq of the watched model
# the 10,000-call tree; a MoE of tiny experts; one of 18 layers x 128 experts, top-8 of 64
# tokens (nearly every expert called); the tiny one fed 16 new tokens a step (top-k routing
# changes the experts called); GPT-2 (12 layers)
DEFAULT_MODELS = "nested-10000,moe-8x64x2,moe-18x128x8,moe-8x64x2-r16,gpt2-12"
THREAD_X, ALL_IN_X, UNWATCH_S = 1.5, 3.0, 2.0  # targets: x the floor, x the floor, seconds
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Result:
    case: str
    floor: Floor
    thread_ms: list[float] = field(default_factory=list)  # per cycle (one logged sample)
    control_ms: list[float] = field(default_factory=list)  # A/A: twin minus twin
    all_in_ms: list[float] = field(default_factory=list)
    first_step_plain: float = 0.0  # first watched step's thread CPU, in plain steps
    unwatch_s: float = 0.0
    unwatch_thread_s: float = 0.0
    finish_s: float = 0.0

    @property
    def floor_ms(self) -> float:
        return self.floor.total_us * self.floor.calls / 1e3


def _worker_cpu_s(handle: Any) -> float:
    """The worker process's CPU so far (0: none, or not on Linux)."""
    handoff = getattr(handle, "_handoff", None)
    worker = handoff.supervisor.worker if handoff is not None else None
    if worker is None:
        return 0.0
    try:
        with open(f"/proc/{worker.proc.pid}/stat") as file:
            fields = file.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0.0


def _step(model: nn.Module, case: Case) -> tuple[float, float]:
    """One training step: (thread CPU s, process CPU s)."""
    t0, p0 = time.thread_time(), time.process_time()
    case.forward(model).backward()
    model.zero_grad(set_to_none=True)
    return time.thread_time() - t0, time.process_time() - p0


def measure(case: Case, cycles: int, new_run: Callable[[str], Any]) -> Result:
    torch.manual_seed(0)
    plain = case.build().train()
    twin = copy.deepcopy(plain)
    watched = copy.deepcopy(plain)
    result = Result(case.name, floor_us_per_call(copy.deepcopy(plain), case.forward))
    run = new_run("offline")
    plain_step = min(_step(plain, case)[0] for _ in range(3))
    handle = wandb_modprof.watch(
        watched, log_freq=FREQ, run=run, settings=wandb_modprof.Settings(offload=True)
    )
    try:
        first, _ = _step(watched, case)
        result.first_step_plain = first / plain_step
        for _ in range(FREQ - 1):
            _step(watched, case)
        for _ in range(FREQ * 10):  # a large model's first graph takes a few passes
            if not handle._capture.structures.due:
                break
            _step(watched, case)
        for cycle in range(cycles + 1):
            thread = process = control = 0.0
            worker0 = _worker_cpu_s(handle)
            for _ in range(FREQ):
                w, wp = _step(watched, case)
                p, pp = _step(plain, case)
                t, _ = _step(twin, case)
                thread += w - p
                process += wp - pp
                control += t - p
                run.log({"loss": 0.0})
            worker = _worker_cpu_s(handle) - worker0
            if cycle >= 1:  # the first: warm-up (the worker's start, its first answer)
                result.thread_ms.append(thread * 1e3)
                result.all_in_ms.append((process + worker) * 1e3)
                result.control_ms.append(control * 1e3)
        start, cpu = time.perf_counter(), time.thread_time()
        handle.unwatch()
        result.unwatch_s = time.perf_counter() - start
        result.unwatch_thread_s = time.thread_time() - cpu
    finally:
        handle.unwatch()
    start = time.perf_counter()
    run.finish()
    result.finish_s = time.perf_counter() - start
    return result


def routed(shape: str, tokens: int) -> Case:
    """`moe(shape)` fed `tokens` new random tokens every step: top-k routing then calls other
    experts from step to step, as a real MoE does (a new call sequence, a structure pass
    over what changed, after a sample shows one)."""
    base = moe(shape)
    steps = [0]

    def forward(model: nn.Module) -> torch.Tensor:
        steps[0] += 1
        ids = torch.randint(0, 256, (1, tokens), generator=torch.Generator().manual_seed(steps[0]))
        return model(input_ids=ids, labels=ids).loss  # type: ignore[no-any-return]

    return Case(f"{base.name}-r{tokens}", base.build, forward)


def _cases(names: str) -> list[Case]:
    """`nested-N`, `gpt2-L`, `moe-LxExK`, `moe-LxExK-rT` (`routed`)."""
    out = []
    for name in names.split(","):
        kind, _, shape = name.partition("-")
        if kind == "nested":
            out.append(nested(int(shape)))
        elif kind == "gpt2":
            out.append(gpt2(int(shape)))
        elif "-r" in shape:
            shape, _, tokens = shape.partition("-r")
            out.append(routed(shape, int(tokens)))
        else:
            out.append(moe(shape))
    return out


def _range(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def _met(value: float, target: float, unit: str, judged: bool) -> str:
    if not judged:
        return f"<= {target:g}{unit}"
    return f"<= {target:g}{unit} {'yes' if value <= target else '**no**'}"


def table(results: list[Result], judged: bool) -> str:
    lines = [
        "| model | calls | nodes | plain ms | floor ms (module / node / saved) "
        "| thread ms / sample | thread x floor | target | A/A ms "
        "| all-in ms / sample: mean, median (range) | all-in x floor (mean) | target "
        "| first step (plain steps) | unwatch s (thread s) | target | finish s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        f = r.floor
        per = f.calls / 1e3
        thread = statistics.median(r.thread_ms) / r.floor_ms
        all_in = statistics.fmean(r.all_in_ms) / r.floor_ms
        lines.append(
            f"| {r.case} | {f.calls} | {f.nodes} | {f.plain_ms:.0f} | {r.floor_ms:.0f} "
            f"({f.module_us * per:.0f} / {f.node_us * per:.0f} / {f.saved_us * per:.0f}) "
            f"| {_range(r.thread_ms)} | {thread:.2f}x | {_met(thread, THREAD_X, 'x', judged)} "
            f"| {_range(r.control_ms)} "
            f"| {statistics.fmean(r.all_in_ms):.0f}, {_range(r.all_in_ms)} | {all_in:.2f}x "
            f"| {_met(all_in, ALL_IN_X, 'x', judged)} | {r.first_step_plain:.1f} "
            f"| {r.unwatch_s:.2f} ({r.unwatch_thread_s:.2f}) "
            f"| {_met(r.unwatch_s, UNWATCH_S, ' s', judged)} | {r.finish_s:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated")
    parser.add_argument("--cycles", type=int, default=16, help="logged samples measured")
    parser.add_argument("--quick", action="store_true", help="CI smoke run: a small model")
    parser.add_argument("--out", metavar="PATH", help="also write the markdown report to PATH")
    args = parser.parse_args(argv)
    models, cycles = ("nested-400", 2) if args.quick else (args.models, args.cycles)
    torch.set_num_threads(1)
    started = time.perf_counter()
    with wandb_runs() as new_run:
        results = [measure(case, cycles, new_run) for case in _cases(models)]
    given = sys.argv[1:] if argv is None else argv
    command = " ".join([".venv/bin/python benchmarks/thread_cpu.py", *given])
    emit(
        f"Command: `{command}`\n\n"
        f"wandb_modprof at git {revision()}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"1 torch thread, offline W&B run, log_freq={FREQ}, worker process on; {cycles} logged "
        f"samples per model after one warm-up (all-in: the mean over them, every table the "
        "schedule logged in them included). "
        f"Total {time.perf_counter() - started:.0f} s.\n\n"
        + table(results, judged=not args.quick)
        + "\n",
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
