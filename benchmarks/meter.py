"""The overhead a watched run reports against what it costs: an unwatched twin, side by side.

Run (about 4 minutes; ``--quick`` is the CI smoke run, a few seconds):

    .venv/bin/python benchmarks/meter.py [--quick] [--models linear-1,mlp-3,...] [--out PATH]

Per model, in one process, one torch thread, a disabled W&B run: the model and a deep copy (the
twin: same weights, optimizer, seed and batch) train side by side, one step each in turn, the
twin's step always after the watched one's (so each span the run measures, from one root
forward to the next, holds exactly one twin step). Realised: the watched steps' total time less
the twin's. Reported: ``handle.overhead.cost_s`` at the end. Target: within a factor of 1.25,
or 1 percentage point of the twin's training time, whichever is larger. Three runs per model:

* ``log_freq=N`` (a fixed interval): the floor on every step, the samples and the one-time
  structure pass, reported and realised;
* ``auto``: ``log_freq="auto", overhead=0.01``: the realised share against the budget (the
  one-time structure pass, which runs on step 1 whatever the budget, shown apart);
* ``A/A``: two unwatched copies measured the same way: the realised figure when nothing differs.

The watched model's first step in the process carries the roofline's calibration (about 0.25 s
on CPU, once per process): it runs once before the models are measured, so each model's
``once`` column is its own structure pass.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import wandb
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from scale import Case, gpt2, nested

import wandb_modprof

RATIO, POINTS = 1.25, 1.0  # the target: a factor, or percentage points of training time


def _mlp(layers: int) -> Case:
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))

    def build() -> nn.Module:
        widths = [64] + [256] * (layers - 1) + [10]
        mods: list[nn.Module] = []
        for a, b in itertools.pairwise(widths):
            mods += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*mods[:-1])

    name = f"{'linear' if layers == 1 else 'mlp'}-{layers}"
    return Case(name, build, lambda m: m(x).pow(2).mean())


def _zoo(name: str) -> Case:
    from models import ResNet, TinyGPT, gpt_input, resnet_input

    if name == "tinygpt":
        ids = gpt_input()
        return Case(name, TinyGPT, lambda m: m(ids).float().pow(2).mean())
    x = resnet_input(4, 16)
    return Case(name, ResNet, lambda m: m(x).float().pow(2).mean())


# model: (its case, steps, log_freq)
CASES: dict[str, tuple[Callable[[], Case], int, int]] = {
    "linear-1": (lambda: _mlp(1), 3000, 50),
    "mlp-3": (lambda: _mlp(3), 3000, 50),
    "tinygpt": (lambda: _zoo("tinygpt"), 600, 50),
    "resnet": (lambda: _zoo("resnet"), 300, 25),
    "gpt2-12": (lambda: gpt2(12), 200, 25),
    "nested-10000": (lambda: nested(10_000), 60, 15),
}
DEFAULT = ",".join(CASES)


@dataclass
class Run:
    steps: int
    samples: int
    reported_s: float
    realised_s: float
    twin_s: float
    once_s: float
    floor_us: float
    calls: int

    @property
    def ratio(self) -> float:
        return self.reported_s / self.realised_s if self.realised_s > 0 else float("inf")

    @property
    def gap_points(self) -> float:
        return 100 * abs(self.reported_s - self.realised_s) / self.twin_s

    @property
    def met(self) -> bool:
        return 1 / RATIO <= self.ratio <= RATIO or self.gap_points <= POINTS


def _pair(case: Case, steps: int, log_freq: int | str | None) -> Run:
    """The watched model (None: a second unwatched copy, the A/A control) and its twin."""
    torch.manual_seed(0)
    base = case.build()
    base.train()
    models = [copy.deepcopy(base), copy.deepcopy(base)]
    optims = [torch.optim.SGD(m.parameters(), lr=1e-4) for m in models]
    handle = None
    if log_freq is not None:
        handle = wandb_modprof.watch(
            models[0],
            log_freq=log_freq,
            run=wandb.init(mode="disabled"),
            settings=wandb_modprof.Settings(overhead=0.01),
        )
    spent = [0.0, 0.0]
    for _ in range(steps):
        for k in (0, 1):
            start = time.perf_counter()
            optims[k].zero_grad(set_to_none=True)
            case.forward(models[k]).backward()
            optims[k].step()
            spent[k] += time.perf_counter() - start
    reported, samples, once, floor, calls = 0.0, 0, 0.0, 0.0, 0
    if handle is not None:
        over = handle.overhead
        prof = handle.unwatch()
        reported, samples, once, floor = over.cost_s, over.samples, over.once_s, over.floor_s
        calls = len(prof.invocations())  # (one record per call key: the calls of a step)
    return Run(steps, samples, reported, spent[0] - spent[1], spent[1], once, 1e6 * floor, calls)


def _row(name: str, log_freq: str, run: Run, control: Run) -> str:
    per_step = 1e3 * run.twin_s / run.steps
    realised_pct, reported_pct = (100 * s / run.twin_s for s in (run.realised_s, run.reported_s))
    return (
        f"| {name} | {run.calls} | {per_step:.2f} | {log_freq} | {run.steps} | {run.samples} "
        f"| {run.floor_us:.1f} | {1e3 * run.once_s:.0f} | {1e3 * run.reported_s:.0f} "
        f"| {1e3 * run.realised_s:.0f} | {run.ratio:.2f}x | {reported_pct:.2f} "
        f"| {realised_pct:.2f} | {'yes' if run.met else '**no**'} "
        f"| {100 * control.realised_s / control.twin_s:+.2f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT, help="comma-separated: " + DEFAULT)
    parser.add_argument("--quick", action="store_true", help="CI smoke run: two small models")
    parser.add_argument("--out", metavar="PATH", help="also write the markdown report to PATH")
    args = parser.parse_args(argv)
    names = ["linear-1", "mlp-3"] if args.quick else args.models.split(",")
    scale = 10 if args.quick else 1
    torch.set_num_threads(1)
    started = time.perf_counter()
    _pair(_mlp(1), 3, 1)  # the roofline's calibration: once per process, before the figures
    lines = [
        "| model | calls / step | twin ms / step | log_freq | steps | samples | floor us / step "
        "| once ms | reported ms | realised ms | reported / realised | reported % "
        "| realised % | target | A/A % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        make, steps, freq = CASES[name]
        case, steps = make(), max(20, steps // scale)
        control = _pair(case, steps, None)
        lines.append(_row(name, str(freq), _pair(case, steps, freq), control))
        lines.append(_row(name, "auto (1 %)", _pair(case, steps, "auto"), control))
    given = sys.argv[1:] if argv is None else argv
    command = " ".join([".venv/bin/python benchmarks/meter.py", *given])
    text = (
        f"Command: `{command}`\n\n"
        f"torch {torch.__version__}, 1 torch thread, disabled W&B run; realised = watched "
        f"steps' time - twin's; target: reported within {RATIO}x of realised or {POINTS:g} "
        f"percentage point of the twin's time. Total {time.perf_counter() - started:.0f} s.\n\n"
        + "\n".join(lines)
    )
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
