"""Step-time overhead of `wandb_modprof.watch` on CPU: unsampled and sampled training steps.

Run:

    cd /work/main && .venv/bin/python benchmarks/overhead.py [--quick] [--out PATH]

Method
------
For each model (a small GPT-style transformer and a small ResNet with BasicBlocks, both defined
in this file) one model is built and deep-copied, so every configuration has identical weights,
its own SGD optimizer and the same fixed batch:

* ``plain``     -- no hooks at all (the baseline);
* ``control``   -- a second plain copy (A/A control: its ratio to ``plain`` is the noise floor;
  drop it with ``--no-control``);
* ``unsampled`` -- ``watch(model, log_freq=10**9)``: only the root module's pre-hook and hook
  run, every step is an unsampled step;
* ``sampled``   -- ``watch(model, log_freq=1)``: every step is sampled, i.e. every module is
  hooked for the forward and the backward, autograd nodes are hooked, saved-tensor hooks count
  activation bytes, gradients and norms are read and the sample is folded into the statistics.

A timed step is ``zero_grad(set_to_none=True)``, forward, cross-entropy loss, backward and
``optimizer.step()``, timed with ``time.perf_counter_ns``. After warm-up rounds, the
configurations run interleaved in rounds of one step each; the order within a round rotates
(plain, control, unsampled, sampled; then control, unsampled, sampled, plain; ...) so no
configuration always follows the same neighbour. Slow drift of a shared, noisy machine (other
jobs, frequency changes) therefore hits every configuration alike. Torch runs with one intra-op
thread by default (``--threads``): on a 2-core shared machine a second thread mostly measures
contention with whatever else runs there.

Reading the numbers
-------------------
``median ms`` is the median step time of a configuration; ``min``/``max`` show the spread
(a large ``max`` is a step hit by another process or a GC pass, which the medians ignore).
``ratio`` is median(config) / median(plain), the headline figure. ``95% CI`` is a paired
bootstrap over rounds (rounds are resampled, the ratio of medians recomputed); ``blocks`` is
the lowest and highest ratio of medians over consecutive blocks of rounds (run-to-run
variation). ``+ms`` is the absolute cost per step, median(config) - median(plain). Targets
(from the issue): unsampled <= 1.01x, sampled <= 1.15x on the small transformer (the ResNet's
sampled ratio is reported for information). If the ``control`` row's interval is wider than
1 +- 0.01, the machine is too noisy to resolve the 1.01x target in this run: re-run, or raise
``--rounds``.

``--hotspots N`` additionally runs cProfile over sampled steps of the transformer and prints
the N functions with the most own time, to show where a sampled step's overhead goes.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import io
import os
import platform
import pstats
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import wandb_modprof

UNSAMPLED_LOG_FREQ = 10**9
UNSAMPLED_TARGET = 1.01
SAMPLED_TARGET = 1.15


# ---- models --------------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 style decoder: pre-norm blocks, causal SDPA, head tied to the token embedding."""

    def __init__(self, vocab: int, ctx: int, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.h = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: two 3x3 convs, in-place ReLU called twice, optional downsample."""

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """CIFAR-style ResNet: a 3x3 stem and one stage of `blocks` BasicBlocks per width."""

    def __init__(self, widths: tuple[int, ...], blocks: int, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        stages: list[nn.Module] = []
        inplanes = widths[0]
        for i, width in enumerate(widths):
            stride = 1 if i == 0 else 2
            layer = [BasicBlock(inplanes, width, stride)]
            layer += [BasicBlock(width, width) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*layer))
            inplanes = width
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


@dataclass(frozen=True)
class Workload:
    """A model factory plus one fixed batch; `loss` maps (output, target) to a scalar."""

    name: str
    description: str
    build: Callable[[], nn.Module]
    inputs: torch.Tensor
    targets: torch.Tensor
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    sampled_target: float | None  # None: the sampled ratio is reported, not judged


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_workloads(quick: bool) -> list[Workload]:
    gen = torch.Generator().manual_seed(0)
    if quick:
        vocab, ctx, dim, heads, layers, batch = 256, 32, 64, 4, 2, 2
        widths, blocks, img, img_batch = (8, 16), 1, 16, 4
    else:
        vocab, ctx, dim, heads, layers, batch = 1000, 64, 256, 4, 4, 4
        widths, blocks, img, img_batch = (16, 32, 64), 2, 32, 16
    gpt = Workload(
        name="transformer",
        description=(
            f"GPT: {layers} layers, dim {dim}, {heads} heads, seq {ctx}, batch {batch}, "
            f"vocab {vocab}, tied head"
        ),
        build=lambda: GPT(vocab, ctx, dim, heads, layers),
        inputs=torch.randint(0, vocab, (batch, ctx), generator=gen),
        targets=torch.randint(0, vocab, (batch, ctx), generator=gen),
        loss=_lm_loss,
        sampled_target=SAMPLED_TARGET,
    )
    resnet = Workload(
        name="resnet",
        description=(
            f"ResNet: widths {widths}, {blocks} BasicBlocks per stage, "
            f"{img_batch}x3x{img}x{img} input, 10 classes"
        ),
        build=lambda: ResNet(widths, blocks),
        inputs=torch.randn(img_batch, 3, img, img, generator=gen),
        targets=torch.randint(0, 10, (img_batch,), generator=gen),
        loss=F.cross_entropy,
        sampled_target=None,
    )
    return [gpt, resnet]


# ---- measurement ---------------------------------------------------------------------------
@dataclass
class Config:
    name: str
    label: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    handle: wandb_modprof.WatchHandle | None = None
    times_ms: list[float] = field(default_factory=list)


def make_configs(workload: Workload, control: bool) -> list[Config]:
    torch.manual_seed(0)
    base = workload.build().train()
    specs: list[tuple[str, str, int | None]] = [("plain", "plain (no hooks)", None)]
    if control:
        specs.append(("control", "plain copy (A/A control)", None))
    specs += [
        ("unsampled", f"watched, unsampled (log_freq={UNSAMPLED_LOG_FREQ:.0e})", UNSAMPLED_LOG_FREQ),
        ("sampled", "watched, sampled (log_freq=1)", 1),
    ]
    configs = []
    for name, label, log_freq in specs:
        model = copy.deepcopy(base)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        handle = None if log_freq is None else wandb_modprof.watch(model, log_freq=log_freq)
        configs.append(Config(name, label, model, optimizer, handle))
    return configs


def train_step(config: Config, workload: Workload) -> None:
    config.optimizer.zero_grad(set_to_none=True)
    loss = workload.loss(config.model(workload.inputs), workload.targets)
    loss.backward()
    config.optimizer.step()


def timed_step(config: Config, workload: Workload) -> float:
    start = time.perf_counter_ns()
    train_step(config, workload)
    return (time.perf_counter_ns() - start) / 1e6


def measure(configs: list[Config], workload: Workload, warmup: int, rounds: int) -> None:
    """Warm up, then run `rounds` rounds of one step per config in rotating order."""
    for _ in range(warmup):
        for config in configs:
            train_step(config, workload)
    gc.collect()
    n = len(configs)
    for r in range(rounds):
        for k in range(n):
            config = configs[(r + k) % n]
            config.times_ms.append(timed_step(config, workload))


def check_sampling(configs: list[Config], warmup: int, rounds: int) -> None:
    """The benchmark is only meaningful if the watched copies sampled as intended."""
    for config in configs:
        if config.handle is None:
            continue
        samples = config.handle.profile().num_samples
        expected = warmup + rounds if config.name == "sampled" else 0
        if samples != expected:
            raise SystemExit(
                f"{config.name}: expected {expected} sampled steps, the profile has {samples}"
            )


# ---- statistics ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    model: str
    config: str
    name: str
    median_ms: float
    min_ms: float
    max_ms: float
    ratio: float
    ci_low: float
    ci_high: float
    block_low: float
    block_high: float
    target: float | None


def ratio_stats(
    times: np.ndarray, base: np.ndarray, boot: int, blocks: int, rng: np.random.Generator
) -> tuple[float, float, float, float, float]:
    """Ratio of medians, paired bootstrap 95% interval, min/max over consecutive blocks."""
    ratio = float(np.median(times) / np.median(base))
    idx = rng.integers(0, len(times), size=(boot, len(times)))
    boots = np.median(times[idx], axis=1) / np.median(base[idx], axis=1)
    low, high = (float(v) for v in np.quantile(boots, [0.025, 0.975]))
    per_block = [
        float(np.median(t) / np.median(b))
        for t, b in zip(
            np.array_split(times, blocks), np.array_split(base, blocks), strict=True
        )
    ]
    return ratio, low, high, min(per_block), max(per_block)


def summarise(
    workload: Workload, configs: list[Config], boot: int, blocks: int
) -> list[Row]:
    rng = np.random.default_rng(0)
    base = np.asarray(configs[0].times_ms)
    rows = []
    for config in configs:
        times = np.asarray(config.times_ms)
        ratio, low, high, blow, bhigh = ratio_stats(times, base, boot, blocks, rng)
        target = {"unsampled": UNSAMPLED_TARGET, "sampled": workload.sampled_target}.get(
            config.name
        )
        rows.append(
            Row(
                model=workload.name,
                config=config.label,
                name=config.name,
                median_ms=float(np.median(times)),
                min_ms=float(times.min()),
                max_ms=float(times.max()),
                ratio=ratio,
                ci_low=low,
                ci_high=high,
                block_low=blow,
                block_high=bhigh,
                target=target,
            )
        )
    return rows


def markdown_table(rows: list[Row]) -> str:
    header = (
        "| model | config | median ms | min ms | max ms | +ms | ratio | 95% CI | blocks "
        "| target | met |"
    )
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for row in rows:
        plain = row.name == "plain"
        base_ms = row.median_ms / row.ratio
        target = "" if row.target is None else f"<= {row.target:.2f}x"
        met = "" if row.target is None else ("yes" if row.ratio <= row.target else "**no**")
        lines.append(
            f"| {row.model} | {row.config} | {row.median_ms:.2f} | {row.min_ms:.2f} "
            f"| {row.max_ms:.2f} | {'' if plain else f'{row.median_ms - base_ms:+.2f}'} "
            f"| {row.ratio:.3f}x "
            f"| {'' if plain else f'{row.ci_low:.3f} - {row.ci_high:.3f}'} "
            f"| {'' if plain else f'{row.block_low:.3f} - {row.block_high:.3f}'} "
            f"| {target} | {met} |"
        )
    return "\n".join(lines)


# ---- hotspots ------------------------------------------------------------------------------
def hotspots(workload: Workload, steps: int, top: int) -> str:
    """cProfile over `steps` sampled steps; the `top` functions by own time."""
    torch.manual_seed(0)
    model = workload.build().train()
    config = Config("sampled", "", model, torch.optim.SGD(model.parameters(), lr=1e-3))
    config.handle = wandb_modprof.watch(model, log_freq=1)
    for _ in range(3):
        train_step(config, workload)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        train_step(config, workload)
    profiler.disable()
    config.handle.unwatch()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    return f"cProfile of {steps} sampled steps of {workload.name} (sorted by own time)\n" + (
        out.getvalue().split("\n", 1)[1] if "\n" in out.getvalue() else out.getvalue()
    )


# ---- main ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Median step time of watched vs unwatched models, unsampled and sampled steps, "
            "measured interleaved in one process."
        )
    )
    parser.add_argument("--quick", action="store_true", help="tiny smoke run for CI (< 20 s)")
    parser.add_argument("--out", metavar="PATH", help="also write the markdown report here")
    parser.add_argument("--rounds", type=int, help="timed rounds per model (default 200, quick 15)")
    parser.add_argument("--warmup", type=int, help="untimed rounds per model (default 10, quick 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument(
        "--models",
        default="transformer,resnet",
        help="comma-separated subset of: transformer, resnet",
    )
    parser.add_argument(
        "--no-control", action="store_true", help="skip the A/A control copy of the plain model"
    )
    parser.add_argument(
        "--hotspots",
        type=int,
        default=0,
        metavar="N",
        help="also cProfile sampled transformer steps and print the top N functions",
    )
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 15 if args.quick else 200
    if args.warmup is None:
        args.warmup = 3 if args.quick else 10
    if args.rounds < 2 or args.warmup < 1 or args.threads < 1:
        parser.error("need --rounds >= 2, --warmup >= 1 and --threads >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    workloads = [w for w in make_workloads(args.quick) if w.name in wanted]
    if not workloads:
        raise SystemExit(f"--models: nothing to run in {args.models!r}")
    boot, blocks = (200, 3) if args.quick else (2000, 5)
    started = time.perf_counter()
    rows: list[Row] = []
    for workload in workloads:
        configs = make_configs(workload, control=not args.no_control)
        try:
            measure(configs, workload, args.warmup, args.rounds)
            check_sampling(configs, args.warmup, args.rounds)
        finally:
            for config in configs:
                if config.handle is not None:
                    config.handle.unwatch()
        rows += summarise(workload, configs, boot, blocks)
        print(
            f"# {workload.name}: {args.rounds} rounds done "
            f"({time.perf_counter() - started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )

    command = "cd /work/main && .venv/bin/python benchmarks/overhead.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    models = "\n".join(f"- {w.name}: {w.description}" for w in workloads)
    report = (
        f"Command: `{command.strip()}`\n\n"
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()} with {os.cpu_count()} CPUs, torch threads {args.threads}, "
        f"{args.warmup} warm-up + {args.rounds} timed rounds per model, one step per "
        f"configuration per round (rotating order), {time.perf_counter() - started:.0f} s.\n\n"
        f"{models}\n\n"
        f"{markdown_table(rows)}\n\n"
        f"ratio = median(config) / median(plain); 95% CI: paired bootstrap over rounds "
        f"({boot} resamples); blocks: min - max ratio over {blocks} consecutive blocks of "
        f"rounds.\n"
    )
    print(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(report)
    if args.hotspots > 0:
        transformer = next((w for w in workloads if w.name == "transformer"), workloads[0])
        print(hotspots(transformer, steps=5 if args.quick else 30, top=args.hotspots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
