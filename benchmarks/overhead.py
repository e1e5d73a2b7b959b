"""Step-time overhead of `wandb_modprof.watch` on CPU, for unsampled and for sampled steps.

Run (full run about 2-3 minutes; ``--quick`` is the CI smoke run, a few seconds):

    .venv/bin/python benchmarks/overhead.py [--quick] [--out PATH]

Method
------
For each model (a small GPT-style transformer and a small ResNet with BasicBlocks, both from
the test model zoo, tests/models.py) one model is built and deep-copied, so every configuration
has identical weights, its own SGD optimizer and the same fixed batch:

* ``plain``     -- no hooks at all: the baseline;
* ``control``   -- a second plain copy (A/A control, its ratio to ``plain`` shows the noise
  floor and any bias of the method; drop it with ``--no-control``);
* ``unsampled`` -- ``watch(model, log_freq=10**9)``: only the root module's pre-hook and hook
  run, so every step is an unsampled step;
* ``sampled``   -- ``watch(model, log_freq=1)``: every step is sampled: every module is hooked
  for the forward and removed after the backward, autograd nodes are hooked, saved-tensor hooks
  count activation bytes, gradient bytes and norms are read and the sample is folded into the
  running statistics (all default options); measurement alone, W&B logging switched off;
* ``sampled_nocurve`` -- ``sampled`` with the step's memory curve switched off (issue 18: on
  CPU each saved storage's +bytes / -bytes events are not recorded): ``sampled`` less this row
  is what the curve costs a sampled step;
* ``logged``    -- the same, plus what a W&B run pays per sample: at the next step's forward the
  profile table and its ``wandb.Table`` + custom chart are built and logged to a disabled run
  (nothing is written to disk). With ``log_freq=100`` this cost is paid once per 100 steps.

A step is ``zero_grad(set_to_none=True)``, forward, cross-entropy loss, backward and
``optimizer.step()``, timed with ``time.perf_counter_ns``. After warm-up, the configurations
run side by side in rounds: in each round every configuration runs a short block of
consecutive steps (``--block``, default 4), in an order shuffled afresh every round (seeded).
The first step of a block is not timed: it reloads this copy's weights into the caches, which
the previous copy evicted. So the timed steps run as in a training loop (the same model back
to back, the cost a sampled step leaves behind lands on the next step of the same
configuration), while alternating every few hundred milliseconds spreads the slow drift and
bursts of a shared machine evenly over the configurations. Torch runs with one intra-op thread
(``--threads``): on a 2-core shared machine a second thread mostly measures contention.

Reading the numbers
-------------------
``median ms`` is the median step time of a configuration; ``min``/``max`` show the spread (a
large ``max`` is a step hit by another process or a GC pass; medians ignore those). ``ratio``
is median(config) / median(plain), the headline figure, and ``+ms`` the absolute cost per step,
median(config) - median(plain). ``95% CI`` is a bootstrap over rounds (whole rounds are
resampled, keeping the configurations paired, and the ratio of medians recomputed);
``segments`` is the lowest and highest ratio of medians over consecutive segments of rounds
(how much the figure moves during the run). Targets (from the issue): unsampled <= 1.01x,
sampled <= 1.15x on the small transformer; the ResNet's sampled ratio is information only. If
the ``control`` row's interval is wider than about 1 +- 0.01, the machine was too noisy during
the run to resolve the 1.01x target: re-run, or raise ``--rounds``.

``--hotspots N`` additionally runs cProfile over sampled steps of the transformer and prints
the N functions with the most own time, overall and within wandb_modprof (cProfile inflates
Python-heavy code such as hooks: use it to rank hotspots, not to size them).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import cProfile
import gc
import os
import platform
import pstats
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (the usual alias)
import wandb
from _report import emit, revision
from torch import nn

import wandb_modprof
from wandb_modprof.capture import session as _session
from wandb_modprof.capture.memory.activations import ActivationCounter

UNSAMPLED_LOG_FREQ = 10**9
UNSAMPLED_TARGET = 1.01
SAMPLED_TARGET = 1.15


# The models are the test suite's zoo (tests/models.py): one definition of the GPT-style
# transformer (tied head, causal SDPA) and of the torchvision-style ResNet.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from models import ResNet, TinyGPT  # noqa: E402  (needs the path above)


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
    widths: tuple[int, ...]
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
        build=lambda: TinyGPT(vocab=vocab, dim=dim, heads=heads, layers=layers, ctx=ctx),
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
        build=lambda: ResNet(widths, blocks=blocks),
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
    times_ms: list[list[float]] = field(default_factory=list)  # [round][step in block]
    curve: bool = True  # False: the memory curve is off (`sampled_nocurve`)


def _disabled_run() -> Any:
    """A no-op W&B run: each sample still builds its table and W&B objects (the cost a real
    run pays on a sampled step, minus writing the file), then logs nowhere."""
    return wandb.init(mode="disabled")


def make_configs(workload: Workload, control: bool) -> list[Config]:
    torch.manual_seed(0)
    base = workload.build().train()
    specs: list[tuple[str, str, int | None]] = [("plain", "plain (no hooks)", None)]
    if control:
        specs.append(("control", "plain copy (A/A control)", None))
    specs += [
        ("unsampled", "watched, unsampled (log_freq=10**9)", UNSAMPLED_LOG_FREQ),
        ("sampled", "watched, sampled (log_freq=1)", 1),
        ("sampled_nocurve", "watched, sampled, memory curve off", 1),
        ("logged", "watched, sampled + W&B log (log_freq=1)", 1),
    ]
    configs = []
    for name, label, log_freq in specs:
        model = copy.deepcopy(base)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        handle = (
            None
            if log_freq is None
            else wandb_modprof.watch(model, log_freq=log_freq, run=_disabled_run())
        )
        if handle is not None and name != "logged":
            # measurement alone: the W&B log (table + wandb.Table per sample) is its own row
            handle._wandb_log = None
        configs.append(
            Config(name, label, model, optimizer, handle, curve=name != "sampled_nocurve")
        )
    return configs


class _NoCurve(ActivationCounter):
    """The saved-tensor counter without the memory curve (`sampled_nocurve`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["curve"] = False
        super().__init__(*args, **kwargs)


@contextlib.contextmanager
def _curve_off() -> Iterator[None]:
    """Sessions started inside build their counter without the curve (the session module
    looks the class up when a sampled step starts)."""
    saved = _session.ActivationCounter
    _session.ActivationCounter = _NoCurve  # type: ignore[misc]
    try:
        yield
    finally:
        _session.ActivationCounter = saved  # type: ignore[misc]


def train_step(config: Config, workload: Workload) -> None:
    with contextlib.nullcontext() if config.curve else _curve_off():
        config.optimizer.zero_grad(set_to_none=True)
        loss = workload.loss(config.model(workload.inputs), workload.targets)
        torch.autograd.backward(loss)
        config.optimizer.step()


def timed_step(config: Config, workload: Workload) -> float:
    start = time.perf_counter_ns()
    train_step(config, workload)
    return (time.perf_counter_ns() - start) / 1e6


def shuffled_rounds(
    configs: Sequence[Any],
    step: Callable[[Any], object],
    timed: Callable[[Any], float],
    warmup: int,
    rounds: int,
    block: int,
    seed: int,
) -> None:
    """Warm up, then `rounds` rounds; in each, every config runs `block` consecutive steps
    (`step(config)`, then `timed(config)` in ms appended to `config.times_ms`).

    The order of the configs is shuffled afresh every round. The first step of each block is
    untimed: it refills the caches with this copy's weights, which the previous copy evicted.
    Shared by every side-by-side benchmark (peers.py too).
    """
    for _ in range(warmup):
        for config in configs:
            step(config)
    rng = np.random.default_rng(seed)
    gc.collect()
    for _ in range(rounds):
        for k in rng.permutation(len(configs)):
            config = configs[k]
            step(config)
            config.times_ms.append([timed(config) for _ in range(block - 1)])


def measure(
    configs: list[Config], workload: Workload, warmup: int, rounds: int, block: int, seed: int
) -> None:
    shuffled_rounds(
        configs,
        lambda c: train_step(c, workload),
        lambda c: timed_step(c, workload),
        warmup,
        rounds,
        block,
        seed,
    )


def check_sampling(configs: list[Config], expected_steps: int) -> None:
    """The benchmark is only meaningful if the watched copies sampled as intended."""
    for config in configs:
        if config.handle is None:
            continue
        prof = config.handle.profile()
        samples = prof.num_samples
        # The first training step is the structure pass (untimed, during warm-up).
        sampled = ("sampled", "sampled_nocurve", "logged")
        expected = expected_steps - 1 if config.name in sampled else 0
        if samples != expected or len(prof.structures()) != 1:
            raise SystemExit(
                f"{config.name}: expected {expected} sampled steps and one structure pass, "
                f"the profile has {samples} and {len(prof.structures())}"
            )


# ---- statistics ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    model: str
    name: str
    label: str
    median_ms: float
    min_ms: float
    max_ms: float
    ratio: float
    ci_low: float
    ci_high: float
    segment_low: float
    segment_high: float
    target: float | None


def ratio_stats(
    times: np.ndarray, base: np.ndarray, boot: int, segments: int, rng: np.random.Generator
) -> tuple[float, float, float, float, float]:
    """Ratio of medians, its 95% round-bootstrap interval, and its min/max over segments.

    `times` and `base` are [round, step] arrays of the same shape; rounds are the resampling
    unit, so a burst of noise that hit one round stays within one resampled unit.
    """
    ratio = float(np.median(times) / np.median(base))
    idx = rng.integers(0, len(times), size=(boot, len(times)))
    flat = (boot, -1)
    boots = np.median(times[idx].reshape(flat), axis=1) / np.median(base[idx].reshape(flat), axis=1)
    low, high = (float(v) for v in np.quantile(boots, [0.025, 0.975]))
    per_segment = [
        float(np.median(t) / np.median(b))
        for t, b in zip(
            np.array_split(times, segments), np.array_split(base, segments), strict=True
        )
    ]
    return ratio, low, high, min(per_segment), max(per_segment)


def summarise(
    workload: Workload, configs: list[Config], boot: int, segments: int, judge: bool
) -> list[Row]:
    rng = np.random.default_rng(0)
    base = np.asarray(configs[0].times_ms)
    targets = {"unsampled": UNSAMPLED_TARGET, "sampled": workload.sampled_target} if judge else {}
    rows = []
    for config in configs:
        times = np.asarray(config.times_ms)
        ratio, low, high, seg_low, seg_high = ratio_stats(times, base, boot, segments, rng)
        rows.append(
            Row(
                model=workload.name,
                name=config.name,
                label=config.label,
                median_ms=float(np.median(times)),
                min_ms=float(times.min()),
                max_ms=float(times.max()),
                ratio=ratio,
                ci_low=low,
                ci_high=high,
                segment_low=seg_low,
                segment_high=seg_high,
                target=targets.get(config.name),
            )
        )
    return rows


def markdown_table(rows: list[Row]) -> str:
    columns = [
        "model", "config", "median ms", "min ms", "max ms", "+ms", "ratio", "95% CI",
        "segments", "target", "met",
    ]  # fmt: skip
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        base = row.name == "plain"
        plain_ms = row.median_ms / row.ratio
        cells = [
            row.model,
            row.label,
            f"{row.median_ms:.2f}",
            f"{row.min_ms:.2f}",
            f"{row.max_ms:.2f}",
            "" if base else f"{row.median_ms - plain_ms:+.2f}",
            f"{row.ratio:.3f}x",
            "" if base else f"{row.ci_low:.3f} - {row.ci_high:.3f}",
            "" if base else f"{row.segment_low:.3f} - {row.segment_high:.3f}",
            "" if row.target is None else f"<= {row.target:.2f}x",
            "" if row.target is None else ("yes" if row.ratio <= row.target else "**no**"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- hotspots ------------------------------------------------------------------------------
def _where(filename: str, line: int, func: str) -> str:
    """`wandb_modprof/capture/backward/node_stamps.py:120 hook_nodes`, or
    `torch/nn/modules/module.py:...`."""
    if filename == "~":  # a builtin
        return func
    path = filename.replace(os.sep, "/")
    repo = Path(__file__).resolve().parents[1].as_posix() + "/"
    for anchor in ("/site-packages/", repo):
        if anchor in path:
            path = path.split(anchor, 1)[1]
    return f"{path}:{line} {func}" if line else f"{path} {func}".strip()


def hotspots(workload: Workload, steps: int, top: int) -> str:
    """cProfile over `steps` sampled steps: the `top` functions by own time, overall and
    within wandb_modprof, as markdown tables."""
    torch.manual_seed(0)
    model = workload.build().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    handle = wandb_modprof.watch(model, log_freq=1, run=_disabled_run())
    config = Config("sampled", "", model, optimizer, handle)
    try:
        for _ in range(3):
            train_step(config, workload)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            train_step(config, workload)
        profiler.disable()
    finally:
        assert config.handle is not None
        config.handle.unwatch()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    entries = [
        (_where(file, line, func), calls, own, cum)
        for (file, line, func), (_, calls, own, cum, _) in stats.items()
    ]
    total = sum(e[2] for e in entries)
    parts = [
        f"cProfile, {workload.name}, {steps} sampled steps: {1e3 * total / steps:.1f} ms of "
        "profiled time per step (cProfile inflates Python-heavy code: rank, do not size)."
    ]
    views = (
        ("all code", "", 2),
        ("wandb_modprof only", "wandb_modprof/", 2),
        ("wandb_modprof only", "wandb_modprof/", 3),
    )
    for title, keep, key in views:
        chosen = sorted((e for e in entries if keep in e[0]), key=lambda e: -float(e[key]))[:top]
        order = "own" if key == 2 else "cumulative"
        parts.append(
            f"\n{title}, top {len(chosen)} by {order} time:\n\n"
            "| own ms/step | cum ms/step | calls/step | function |\n|---|---|---|---|"
        )
        parts += [
            f"| {1e3 * own / steps:.2f} | {1e3 * cum / steps:.2f} | {calls / steps:.0f} "
            f"| `{where}` |"
            for where, calls, own, cum in chosen
        ]
    return "\n".join(parts) + "\n"


# ---- main ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Median step time of watched vs unwatched models, for unsampled and sampled steps, "
            "measured side by side in one process. See the module docstring for the method."
        )
    )
    parser.add_argument("--quick", action="store_true", help="tiny smoke run for CI (seconds)")
    parser.add_argument("--out", metavar="PATH", help="also write the markdown report to PATH")
    parser.add_argument("--rounds", type=int, help="timed rounds per model (default 80; quick 30)")
    parser.add_argument(
        "--block", type=int, help="steps per config per round, first untimed (default 4; quick 3)"
    )
    parser.add_argument("--warmup", type=int, help="untimed rounds per model (default 5; quick 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the order shuffle")
    parser.add_argument(
        "--models", default="transformer,resnet", help="comma-separated: transformer, resnet"
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
    defaults = {"rounds": (80, 30), "block": (4, 3), "warmup": (5, 2)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.rounds < 2 or args.block < 2 or args.warmup < 1 or args.threads < 1:
        parser.error("need --rounds >= 2, --block >= 2, --warmup >= 1 and --threads >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    wanted = {m.strip() for m in args.models.split(",") if m.strip()}
    workloads = [w for w in make_workloads(args.quick) if w.name in wanted]
    if not workloads:
        raise SystemExit(f"--models: nothing to run in {args.models!r}")
    boot, segments = (200, 2) if args.quick else (2000, 4)
    started = time.perf_counter()
    rows: list[Row] = []
    for workload in workloads:
        configs = make_configs(workload, control=not args.no_control)
        try:
            measure(configs, workload, args.warmup, args.rounds, args.block, args.seed)
            check_sampling(configs, args.warmup + args.rounds * args.block)
        finally:
            for config in configs:
                if config.handle is not None:
                    config.handle.unwatch()
        rows += summarise(workload, configs, boot, segments, judge=not args.quick)
        elapsed = time.perf_counter() - started
        print(f"[{workload.name} done, {elapsed:.0f} s]", file=sys.stderr, flush=True)

    given = sys.argv[1:] if argv is None else argv
    command = " ".join([".venv/bin/python benchmarks/overhead.py", *given])
    models = "\n".join(f"- {w.name}: {w.description}" for w in workloads)
    steps = args.rounds * (args.block - 1)
    quick_note = (
        "--quick: tiny models, a smoke test of the script; the ratios say nothing about the "
        "targets, which are not judged.\n\n"
        if args.quick
        else ""
    )
    report = (
        f"Command: `{command}`\n\n"
        f"{quick_note}"
        f"wandb_modprof {wandb_modprof.__version__} at git {revision()}, "
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {args.threads}. "
        f"Per model: {args.warmup} warm-up rounds, then {args.rounds} rounds of "
        f"{args.block} consecutive steps per configuration in shuffled order, first step of "
        f"each block untimed: {steps} timed steps per configuration. "
        f"Total {time.perf_counter() - started:.0f} s.\n\n"
        f"{models}\n\n"
        f"{markdown_table(rows)}\n\n"
        f"ratio = median(config) / median(plain); +ms = median(config) - median(plain); "
        f"95% CI: bootstrap over rounds ({boot} resamples); segments: lowest - highest ratio "
        f"over {segments} consecutive segments of rounds.\n"
    )
    emit(report, args.out)
    if args.hotspots > 0:
        transformer = next((w for w in workloads if w.name == "transformer"), workloads[0])
        print(hotspots(transformer, steps=3 if args.quick else 20, top=args.hotspots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
