"""Overhead against the peer tools, and accuracy against kernel-level ground truth, on CUDA.

Run on a machine with a CUDA GPU (about 4 minutes on one H200; ``--quick`` about a minute):

    .venv/bin/python benchmarks/gpu.py [--quick] [--out PATH]
    .venv/bin/python benchmarks/gpu.py --dry-run   # no GPU needed: CI smoke

Without CUDA it stops at once with exit status 2 and says so. ``--dry-run`` builds every model
and tool on the CPU at the smallest size and runs each code path once (overhead rounds, time
and activation checks, the kernel matching), then prints the report of that run, marked as
such, and exits 0: it proves the script still runs, it measures nothing.

What is measured on the GPU (a CUDA build of torch 2.13 is needed; wandb_modprof's default
``timing="auto"`` records CUDA events in its hooks and reads them after the step):

* overhead: the method of benchmarks/peers.py (identical copies side by side, shuffled blocks,
  A/A control, bootstrap CI) with ``torch.cuda.synchronize()`` before and after every timed
  step, at GPU sizes (benchmarks/_workloads.py ``gpu``: GPT-2 small's shape, seq 512, batch 8;
  BERT-base's; a ResNet with widths 64/128/256 on 128x3x64x64). torch.profiler records CPU and
  CUDA activity; the DeepSpeed-style timer synchronises the device in every hook, as DeepSpeed
  does; wandb.watch runs offline;
* accuracy: benchmarks/_truth.py with ``kernel_truth=True``: per module call, the span of the
  kernels its forward ops launched (first start to last end, from torch.profiler's CUDA
  activity matched by correlation id), and for backward the sum over the call's autograd nodes
  of their kernels' spans; errors as in benchmarks/accuracy.py (calls >= 1 % of the step).
  ``busy`` is the kernels' summed duration, to show how much of a span is idle gaps;
* activation bytes against MemTracker on the CUDA device.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch
from _report import emit, revision
from _truth import activation_checks, time_checks
from _workloads import make_workloads, returned_bytes
from accuracy import mem_row, time_row
from peers import run as run_overhead

import wandb_modprof

NO_CUDA = (
    "benchmarks/gpu.py needs a CUDA GPU and a CUDA build of torch: torch {version} reports "
    "torch.cuda.is_available() == False. Run it on a GPU machine, or use --dry-run to check "
    "the script on the CPU (it measures nothing)."
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and repeats")
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU, tiny models, every code path once (CI)"
    )
    parser.add_argument("--models", default="resnet,gpt2,bert", help="comma-separated")
    parser.add_argument("--tools", default=None, help="comma-separated (default: all)")
    parser.add_argument("--rounds", type=int, help="overhead rounds (default 10; quick 4)")
    parser.add_argument("--repeats", type=int, help="accuracy repeats (default 3; quick 1)")
    parser.add_argument("--out", metavar="PATH", help="also write the markdown report to PATH")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print(NO_CUDA.format(version=torch.__version__), file=sys.stderr)
        return 2
    device = "cpu" if args.dry_run else "cuda"
    size = "quick" if args.dry_run else "gpu"
    light = args.quick or args.dry_run
    rounds = args.rounds or (2 if args.dry_run else 4 if args.quick else 10)
    repeats = args.repeats or (1 if light else 3)
    started = time.perf_counter()
    if device == "cpu":
        torch.set_num_threads(1)  # a 2-core CI machine: one thread, no oversubscription
    if device == "cuda":
        torch.backends.cudnn.benchmark = False  # the same kernels every step
        name = torch.cuda.get_device_name()
        machine = f"{name}, CUDA {torch.version.cuda}"
    else:
        machine = "CPU (dry run: nothing is measured)"

    # ---- overhead, the peers.py machinery on `device` -----------------------------------------
    overhead_args = argparse.Namespace(
        quick=args.dry_run,  # targets are judged on a real run only
        models=args.models,
        tools=args.tools or ",".join(__import__("_peers").ALL),
        rounds=rounds,
        block=2 if args.dry_run else 3,
        warmup=1 if args.dry_run else 2,
        seed=0,
    )
    given = sys.argv[1:] if argv is None else argv
    overhead, _ = run_overhead(overhead_args, size, device, "gpu.py", given)
    print(f"[overhead done, {time.perf_counter() - started:.0f} s]", file=sys.stderr)

    # ---- accuracy against kernel-level ground truth ------------------------------------------
    time_rows, busy_lines, mem_rows = [], [], []
    for workload in make_workloads(args.models, size, device):
        torch.manual_seed(0)
        model = workload.build().train()

        def make_loss(model: torch.nn.Module = model, w: object = workload) -> torch.Tensor:
            return w.loss(model)  # type: ignore[attr-defined, no-any-return]

        runs = [time_checks(model, make_loss, kernel_truth=True) for _ in range(repeats)]
        time_rows.append(time_row(workload.name, runs))
        judged = [c for c in runs[-1] if c.share >= 0.01]
        fwd_ratio = [
            c.fwd_busy_ms / c.fwd_truth_ms for c in judged if c.fwd_busy_ms and c.fwd_truth_ms
        ]
        bwd_ratio = [
            c.bwd_busy_ms / c.bwd_truth_ms for c in judged if c.bwd_busy_ms and c.bwd_truth_ms
        ]
        if fwd_ratio and bwd_ratio:
            busy_lines.append(
                f"- {workload.name}: kernel busy / span, median over judged calls: forward "
                f"{statistics.median(fwd_ratio):.2f}, backward {statistics.median(bwd_ratio):.2f}"
            )
        mem = activation_checks(
            model, workload.forward, workload.loss_of, workload.blocks(model), returned_bytes
        )
        mem_rows.append(mem_row(workload.name, mem))
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
        print(
            f"[{workload.name} accuracy done, {time.perf_counter() - started:.0f} s]",
            file=sys.stderr,
        )

    truth = (
        "kernel spans (dry run: no kernels on a CPU, so every truth is 0)"
        if args.dry_run
        else "kernel spans (CUDA activity)"
    )
    report = "\n".join(
        [
            "## wandb_modprof on CUDA"
            + (" (DRY RUN on CPU: numbers mean nothing)" if args.dry_run else ""),
            "",
            f"wandb_modprof {wandb_modprof.__version__} at git {revision()}, torch "
            f"{torch.__version__}, Python {platform.python_version()}, {machine}. Total "
            f"{time.perf_counter() - started:.0f} s.",
            "",
            "### Overhead per step against the peers",
            "",
            overhead,
            "### Per-module time against " + truth + " (calls >= 1 % of the step)",
            "",
            "| model | repeats | calls judged | fwd median err | fwd worst err | "
            "fwd per-repeat medians | bwd median err | bwd worst err | bwd per-repeat medians "
            "| within 15 % or 0.1 ms |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *time_rows,
            "",
            *busy_lines,
            "",
            "### Activation bytes against MemTracker",
            "",
            "| model | blocks | blocks exact | worst block err | model act MiB (ours) "
            "| MemTracker MiB | model err |",
            "|---|---|---|---|---|---|---|",
            *mem_rows,
            "",
        ]
    )
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
