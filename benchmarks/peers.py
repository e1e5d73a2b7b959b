"""Step-time overhead of wandb_modprof against the tools users would pick instead, in one run.

Run (full run about 5 minutes on 2 CPU cores; ``--quick`` is the CI smoke run, seconds):

    .venv/bin/python benchmarks/peers.py [--quick] [--out PATH]

Method (the house method of benchmarks/overhead.py, whose statistics it imports)
-------------------------------------------------------------------------------
For each model (ResNet-style net, GPT-2 and a BERT encoder, both from transformers configs;
benchmarks/_workloads.py) one model is built and deep-copied once per configuration, so all have
identical weights, their own SGD optimizer and the same fixed batch. Configurations
(benchmarks/_peers.py says exactly how each tool is used on every step): the plain model, a
second plain copy (A/A control: the noise floor), wandb_modprof unsampled / sampled / sampled +
W&B log, torch.profiler (defaults; with ``profile_memory=True``), MemTracker, FlopCounterMode,
a DeepSpeed-style synchronising per-module timer and ``wandb.watch(log="all", log_freq=1)``.

A step is: the tool's per-step context entered, ``zero_grad(set_to_none=True)``, forward, loss,
backward, ``optimizer.step()``, context left, then what the user does to read the step's data
(e.g. ``prof.events()``); all of it timed with ``time.perf_counter_ns`` (after a
``torch.cuda.synchronize()`` on both ends on a GPU). After warm-up (which holds wandb_modprof's
structure pass), rounds: in each, every configuration runs ``--block`` consecutive steps (the
first untimed: it refills the caches with this copy's weights), in an order shuffled afresh each
round, so drift and bursts of a shared machine hit all configurations alike.

``ratio`` = median(config) / median(plain); ``95% CI`` a bootstrap over rounds (paired);
``min``/``max`` the spread of single steps. Targets (issue 8): unsampled <= 1.01x, sampled
<= 1.15x, and sampled below every tool that measures per-module backward time or memory
(``bwd/mem`` column: MemTracker and torch.profiler with memory).
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from _peers import ALL, Tool, make_tool, wandb_runs
from _report import emit, revision
from _workloads import Workload, make_workloads
from overhead import ratio_stats, shuffled_rounds  # the house method, defined once

import wandb_modprof

UNSAMPLED_TARGET = 1.01
SAMPLED_TARGET = 1.15


@dataclass
class Config:
    tool: Tool
    times_ms: list[list[float]] = field(default_factory=list)  # [round][timed step in block]


def make_configs(
    workload: Workload, keys: list[str], new_run: Callable[[str], Any], shared: dict[str, Any]
) -> list[Config]:
    torch.manual_seed(0)
    base = workload.build().train()
    configs = []
    for key in keys:
        model = copy.deepcopy(base)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        configs.append(Config(make_tool(key, model, optimizer, new_run, shared)))
    return configs


def run_step(config: Config, workload: Workload) -> None:
    tool = config.tool
    with tool.step():
        tool.optimizer.zero_grad(set_to_none=True)
        workload.loss(tool.model).backward()
        tool.optimizer.step()
    tool.read()


def timed_step(config: Config, workload: Workload, cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter_ns()
    run_step(config, workload)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter_ns() - start) / 1e6


def measure(
    configs: list[Config], workload: Workload, warmup: int, rounds: int, block: int, seed: int
) -> None:
    cuda = workload.device.type == "cuda"
    shuffled_rounds(
        configs,
        lambda c: run_step(c, workload),
        lambda c: timed_step(c, workload, cuda),
        warmup,
        rounds,
        block,
        seed,
    )


@dataclass(frozen=True)
class Row:
    model: str
    key: str
    label: str
    gives: str
    bwd_or_mem: bool
    median_ms: float
    min_ms: float
    max_ms: float
    ratio: float
    ci_low: float
    ci_high: float
    seg_low: float
    seg_high: float


def summarise(workload: Workload, configs: list[Config], boot: int, segments: int) -> list[Row]:
    rng = np.random.default_rng(0)
    base = np.asarray(configs[0].times_ms)
    rows = []
    for config in configs:
        times = np.asarray(config.times_ms)
        ratio, low, high, seg_low, seg_high = ratio_stats(times, base, boot, segments, rng)
        tool = config.tool
        rows.append(
            Row(
                workload.name,
                tool.key,
                tool.label,
                tool.gives,
                tool.bwd_or_mem,
                float(np.median(times)),
                float(times.min()),
                float(times.max()),
                ratio,
                low,
                high,
                seg_low,
                seg_high,
            )
        )
    return rows


def judge(rows: list[Row]) -> dict[str, tuple[str, bool]]:
    """Per row key: (target text, met) for the rows that have a target."""
    peers = [r for r in rows if r.bwd_or_mem and not r.key.startswith(("sampled", "logged"))]
    peers = [r for r in peers if r.key not in ("unsampled",)]
    cheapest = min(peers, key=lambda r: r.ratio) if peers else None
    out: dict[str, tuple[str, bool]] = {}
    for row in rows:
        if row.key == "unsampled":
            out[row.key] = (f"<= {UNSAMPLED_TARGET:.2f}x", row.ratio <= UNSAMPLED_TARGET)
        elif row.key == "sampled":
            text, met = f"<= {SAMPLED_TARGET:.2f}x", row.ratio <= SAMPLED_TARGET
            if cheapest is not None:
                text += f" and < {cheapest.ratio:.2f}x ({cheapest.label})"
                met = met and row.ratio < cheapest.ratio
            out[row.key] = (text, met)
        elif row.key == "logged" and cheapest is not None:
            out[row.key] = (
                f"< {cheapest.ratio:.2f}x ({cheapest.label})",
                row.ratio < cheapest.ratio,
            )
    return out


def markdown_table(rows: list[Row], judged: bool) -> str:
    columns = [
        "model", "tool", "bwd/mem", "median ms", "min ms", "max ms", "+ms",
        "ratio", "95% CI", "target", "met",
    ]  # fmt: skip
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    by_model: dict[str, list[Row]] = {}
    for row in rows:
        by_model.setdefault(row.model, []).append(row)
    for model_rows in by_model.values():
        targets = judge(model_rows) if judged else {}
        plain_ms = model_rows[0].median_ms
        for row in model_rows:
            base = row.key == "plain"
            target, met = targets.get(row.key, ("", None))
            cells = [
                row.model,
                row.label,
                "yes" if row.bwd_or_mem else "no",
                f"{row.median_ms:.2f}",
                f"{row.min_ms:.2f}",
                f"{row.max_ms:.2f}",
                "" if base else f"{row.median_ms - plain_ms:+.2f}",
                f"{row.ratio:.3f}x",
                "" if base else f"{row.ci_low:.3f} - {row.ci_high:.3f}",
                target,
                "" if met is None else ("yes" if met else "**no**"),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def legend(rows: list[Row]) -> str:
    """What each tool gives per module, and whether it counts for the target."""
    lines = ["| tool | per-module data | bwd/mem |", "|---|---|---|"]
    seen = set()
    for row in rows:
        if row.key not in seen and row.key not in ("plain", "control"):
            seen.add(row.key)
            lines.append(f"| {row.label} | {row.gives} | {'yes' if row.bwd_or_mem else 'no'} |")
    return "\n".join(lines)


def noise_lines(rows: list[Row]) -> str:
    """Per model: the plain step's min / median / max and the A/A control's ratio and CI."""
    out = []
    for row in rows:
        if row.key == "plain":
            out.append(
                f"- {row.model}: plain step min / median / max {row.min_ms:.1f} / "
                f"{row.median_ms:.1f} / {row.max_ms:.1f} ms"
            )
        elif row.key == "control":
            out[-1] += (
                f"; A/A control {row.ratio:.3f}x (95% CI {row.ci_low:.3f} - {row.ci_high:.3f}, "
                f"segments {row.seg_low:.3f} - {row.seg_high:.3f})"
            )
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="wandb_modprof's step-time overhead against peer tools, side by side."
    )
    parser.add_argument("--quick", action="store_true", help="tiny smoke run for CI (seconds)")
    parser.add_argument("--out", metavar="PATH", help="also write the markdown report to PATH")
    parser.add_argument("--models", default="resnet,gpt2,bert", help="comma-separated")
    parser.add_argument("--tools", default=",".join(ALL), help="comma-separated: " + ",".join(ALL))
    parser.add_argument("--rounds", type=int, help="timed rounds per model (default 16; quick 2)")
    parser.add_argument("--block", type=int, help="steps per config per round (default 3)")
    parser.add_argument("--warmup", type=int, help="untimed rounds per model (default 2; quick 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the order shuffle")
    args = parser.parse_args(argv)
    defaults = {"rounds": (16, 2), "block": (3, 2), "warmup": (2, 1)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.rounds < 2 or args.block < 2 or args.warmup < 1:
        parser.error("need --rounds >= 2, --block >= 2, --warmup >= 1")
    return args


def run(
    args: argparse.Namespace, size: str, device: str, script: str, given: list[str]
) -> tuple[str, list[Row]]:
    """Measure every workload and tool; the markdown report and its rows."""
    keys = [k.strip() for k in args.tools.split(",") if k.strip()]
    keys = ["plain", *(k for k in keys if k != "plain")]
    workloads = make_workloads(args.models, size, device)
    boot, segments = (200, 2) if args.quick else (2000, 4)
    started = time.perf_counter()
    rows: list[Row] = []
    with wandb_runs() as new_run:
        shared: dict[str, Any] = {}
        for workload in workloads:
            configs = make_configs(workload, keys, new_run, shared)
            try:
                measure(configs, workload, args.warmup, args.rounds, args.block, args.seed)
            finally:
                for config in configs:
                    config.tool.close()
            rows += summarise(workload, configs, boot, segments)
            print(f"[{workload.name} done, {time.perf_counter() - started:.0f} s]", file=sys.stderr)
            del configs
            gc.collect()
    steps = args.rounds * (args.block - 1)
    quick_note = (
        "--quick: tiny models, a smoke test of the script; targets not judged.\n\n"
        if args.quick
        else ""
    )
    command = " ".join([f".venv/bin/python benchmarks/{script}", *given])
    models = "\n".join(f"- {w.name}: {w.description}" for w in workloads)
    report = (
        f"Command: `{command}`\n\n{quick_note}"
        f"wandb_modprof {wandb_modprof.__version__} at git {revision()}, "
        f"torch {torch.__version__}, "
        f"wandb {__import__('wandb').__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, "
        f"device {device}. Per model: {args.warmup} warm-up round(s), then {args.rounds} rounds of "
        f"{args.block} consecutive steps per configuration in shuffled order, first of each block "
        f"untimed: {steps} timed steps per configuration. Total "
        f"{time.perf_counter() - started:.0f} s.\n\n{models}\n\n"
        f"{legend(rows)}\n\n{markdown_table(rows, judged=not args.quick)}\n\n"
        "ratio = median(config) / median(plain); +ms = median(config) - median(plain); 95% CI: "
        f"bootstrap over rounds ({boot} resamples). bwd/mem: the tool measures per-module "
        "backward time or memory (the targets compare wandb_modprof's sampled step with the "
        "cheapest of those).\n\nNoise:\n\n"
        f"{noise_lines(rows)}\n"
    )
    return report, rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    given = sys.argv[1:] if argv is None else argv
    report, _ = run(args, "quick" if args.quick else "cpu", "cpu", "peers.py", given)
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
