"""Cost of the structure pass and of turning a profile into its table, on CPU.

Run (about a minute; ``--quick`` is the CI smoke run, a few seconds):

    .venv/bin/python benchmarks/structure.py [--quick]

What is measured, side by side in one run (ratios, not absolute seconds: the machine is shared):

* ``structure step / plain step``: one training step (forward, loss, backward) of a model with
  the structure pass active (TorchFunctionMode following every tensor op, TorchDispatchMode
  counting FLOPs, module hooks), over the same step without any hooks. This is the one-off
  cost `watch` pays on the first training step, and again after the call sequence changes.
  Steps alternate plain / structure so drift affects both alike; medians over the repeats.
* ``sampled`` / ``derived step ms``: a one-step `profile` block (a sampled step, every hook)
  with ``structure=False``, and the same with the default ``structure=True``, where that first
  sample also derives the module graph from its own forward
  (`capture/structure/step_dataflow`: input and output slots and identity maps at every call
  boundary, each hooked node's inputs, edges resolved when the root returns). ``root fwd ms``:
  the root's reported forward in each, i.e. how much of that bookkeeping lands inside the
  timed window (in parents' self time).
  Alternating with the plain step; medians over the repeats.
* ``table ms``: `prof.table()` for the same model: merge, view graphs, layout of every view,
  rows. Also for a 2,000-invocation transformer (TinyGPT with 200 blocks), the issue's layout
  target ("well under a second").

* ``passes over a run``: every structure pass of a watched run (``log_freq=4``, W&B disabled)
  stepped beside an unwatched twin: how many, how many covered only part of the model, the
  share of calls they followed, each pass step over the median plain step (median / max) and
  all pass steps' seconds; with the passes reusing what earlier ones followed
  (`capture/structure/known_calls.py`, at most 2,500 calls per pass) and without (every pass
  follows every call). Models: the nested 10,000-call tree of ``scale.py`` (its first graph,
  8 steps) and a top-2-of-64-expert MoE (``scale.py``'s ``moe-8x64x2``) fed 16 new random
  tokens per step, so the experts called change from step to step, over 100 steps.

Models: the test zoo's TinyGPT and ResNet (tests/models.py) and GPT-2 from `transformers`
(built from a config, random weights).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from models import ResNet, TinyGPT, gpt2_from_config, gpt_input, resnet_input

import wandb_modprof
from wandb_modprof.capture.hooks import Capture
from wandb_modprof.capture.options import Options
from wandb_modprof.stats.accumulator import ProfileAccumulator

Step = Callable[[], None]


def _loss(out: object) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.float().pow(2).mean()
    return out.loss  # type: ignore[attr-defined, no-any-return]


def _models(quick: bool) -> list[tuple[str, nn.Module, Callable[[nn.Module], object]]]:
    gpt_x = gpt_input(4, 32)
    res_x = resnet_input(8, 32)
    ids = torch.randint(0, 512, (4, 64))
    models: list[tuple[str, nn.Module, Callable[[nn.Module], object]]] = [
        ("TinyGPT (2 blocks)", TinyGPT(), lambda m: m(gpt_x)),
        ("ResNet (3 stages)", ResNet(), lambda m: m(res_x)),
    ]
    if not quick:
        models.append(
            (
                "GPT-2 (transformers, 4 layers)",
                gpt2_from_config(layers=4),
                lambda m: m(input_ids=ids, labels=ids),
            )
        )
    return models


def _time(fn: Step) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def structure_step_ratio(
    model: nn.Module, forward: Callable[[nn.Module], object], repeats: int
) -> tuple[float, float, float]:
    """Median plain step ms, median structure step ms, their ratio."""

    def plain() -> None:
        _loss(forward(model)).backward()
        model.zero_grad(set_to_none=True)

    def structured() -> None:
        # A fresh capture whose first forward is a structure pass, as `watch` runs it.
        sink = ProfileAccumulator(type(model).__name__)
        capture = Capture(
            model, Options(), None, lambda m: None, hooks_only_when_sampling=True, sink=sink
        )
        capture.attach()
        try:
            _loss(forward(model)).backward()
        finally:
            capture.detach()
        assert sink.num_structures() == 1
        model.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up
        plain()
        structured()
    plain_ms, structure_ms = [], []
    for _ in range(repeats):
        plain_ms.append(_time(plain))
        structure_ms.append(_time(structured))
    p, s = statistics.median(plain_ms), statistics.median(structure_ms)
    return p, s, s / p


def derived_step_cost(
    model: nn.Module, forward: Callable[[nn.Module], object], repeats: int
) -> tuple[float, float, float, float]:
    """Median step ms of a one-step `profile` block without / with the graph derivation, and
    the median root forward ms each reports."""

    def one_step(structure: bool) -> tuple[float, float]:
        with wandb_modprof.profile(model, structure=structure) as prof:
            step_ms = _time(lambda: _loss(forward(model)).backward())
        model.zero_grad(set_to_none=True)
        assert len(prof.structures()) == (1 if structure else 0)
        root_ms = prof.invocations()[0].fwd_ms
        assert root_ms is not None
        return step_ms, root_ms

    for _ in range(2):  # warm-up
        one_step(False)
        one_step(True)
    plain: list[tuple[float, float]] = []
    derived: list[tuple[float, float]] = []
    for _ in range(repeats):
        plain.append(one_step(False))
        derived.append(one_step(True))
    med = statistics.median
    return (
        med(p[0] for p in plain),
        med(d[0] for d in derived),
        med(p[1] for p in plain),
        med(d[1] for d in derived),
    )


def table_ms(
    model: nn.Module, forward: Callable[[nn.Module], object], repeats: int
) -> tuple[int, int, float]:
    with wandb_modprof.profile(model) as prof:
        for _ in range(2):
            _loss(forward(model)).backward()
    prof.table()  # warm-up (imports)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        table = prof.table()
        times.append((time.perf_counter() - t0) * 1e3)
    return len(prof.stats()), len(table.rows), statistics.median(times)


def passes_table(quick: bool) -> None:
    from _passes import run_passes
    from scale import moe, nested

    tree = nested(300 if quick else 10_000)
    experts = moe("2x8x2" if quick else "8x64x2")

    def routed(m: nn.Module, step: int) -> torch.Tensor:
        ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(step))
        return m(input_ids=ids, labels=ids).loss  # type: ignore[no-any-return]

    runs = [
        (tree.name, tree.build, lambda m, step: tree.forward(m), 8),
        (f"{experts.name}, 16 new tokens a step", experts.build, routed, 10 if quick else 100),
    ]
    print("\n| model | steps | passes | reuse | partial | calls followed | pass step / plain "
          "(med / max) | pass steps s | graphs |")  # fmt: skip
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for name, build, forward, steps in runs:
        for reuse in (True, False):
            r = run_passes(build, forward, steps, log_freq=4, reuse=reuse)
            print(
                f"| {name} | {steps} | {r.passes} | {'yes' if reuse else 'no'} | {r.partial} | "
                f"{100 * r.followed_share:.0f} % | {r.ratio_median:.1f}x / {r.ratio_max:.1f}x | "
                f"{r.pass_steps_s:.1f} | {r.structures} |"
            )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run: tiny and fast")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    repeats = 2 if args.quick else 15
    print(f"torch {torch.__version__}, 1 thread, {repeats} repeats, medians\n")
    header = (
        "model, plain step ms, structure step ms, ratio, sampled step ms, derived step ms, "
        "root fwd ms sampled / derived, invocations, table rows, table ms"
    )
    print("| " + " | ".join(header.split(", ")) + " |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, model, forward in _models(args.quick):
        p, s, ratio = structure_step_ratio(model, forward, repeats)
        sampled, derived, root_s, root_d = derived_step_cost(model, forward, repeats)
        calls, rows, t_ms = table_ms(model, forward, repeats)
        print(
            f"| {name} | {p:.1f} | {s:.1f} | {ratio:.2f}x | {sampled:.1f} | "
            f"{derived:.1f} ({derived / sampled:.2f}x) | {root_s:.2f} / {root_d:.2f} | "
            f"{calls} | {rows} | {t_ms:.1f} |"
        )
    passes_table(args.quick)
    layers = 8 if args.quick else 200  # 10 invocations per block: ~2,000 invocations in all
    big = TinyGPT(dim=32, heads=2, layers=layers)
    big_x = gpt_input(2, 16)
    calls, rows, t_ms = table_ms(big, lambda m: m(big_x), 3 if args.quick else 5)
    print(f"| TinyGPT ({layers} blocks) | - | - | - | - | - | - | {calls} | {rows} | {t_ms:.1f} |")


if __name__ == "__main__":
    main()
