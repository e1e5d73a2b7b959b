"""What a checkpoint plan predicts against what the planned model realises (activation memory,
memory peak, step time) on GPT-2, a ResNet-18 and a mixture of experts, at 75, 50 and 25 % of
today's activation memory. A few minutes on 2 cores; ``--quick`` (CI smoke): a tiny GPT-2, 50 %.

    .venv/bin/python benchmarks/checkpoint.py [--quick] [--out PATH] [--device cuda]

Method. Each model (seeded) is profiled as docs/checkpointing.md does (a warm-up step, then a
`profile` block of three steps, the second the structure pass), planned at each budget
(`Profile.checkpoint_plan`; a budget no plan reaches is reported so), the plan applied
(`apply_checkpoint_plan`) and the planned model profiled for two timed steps after a warm-up:
`applied.outcome(after)` sets its root call's `act_bytes`, memory peak and step time beside
the prediction. Truth, with nothing of ours attached:

* activation bytes: one unwatched step with our own `saved_tensors_hooks` around the forward
  (the loss outside it, as for the root call), unplanned and planned, counted as
  capture/memory/activations.py counts `act_bytes`: whole storages, each once by
  `(device, data_ptr)`, parameters and buffers left out, only those still saved when the
  forward ends. Both see the inputs a checkpoint keeps (`apply_checkpoint_plan` hands tensor
  keyword arguments to `checkpoint` by position, so they are saved tensors too).
* memory peak: on CPU (no allocator) the profile's saved-tensor curve, so not independent of
  the product and blind to what a recompute saves again. With ``--device cuda`` the profile's
  peaks are the allocator's, and the whole step's peak is read unwatched as well:
  `max_memory_allocated()` after `reset_peak_memory_stats()`, less what was allocated before.
* step time: the unwatched model, a second copy (A/A control) and one copy per plan (deep
  copies, the plan applied) in rounds of short blocks, shuffled afresh each round, the first
  step of a block untimed (`overhead.shuffled_rounds`). A step clears the grads and runs
  forward, a cheap loss (``out.float().pow(2).mean()``) and backward; no optimizer step, so
  weights and routing stay fixed. Realised: median(planned) / median(unplanned); predicted:
  `predicted_step_ms / step_ms_now`. One torch thread (``--threads``).

Targets (the issue's): the peak within 10 % of the prediction; the activation memory above the
budget by at most the plan's margin (and, the plan's own claim, within the margin of the
prediction); the step-time ratio within 15 % of the predicted one.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _report import emit, revision
from overhead import shuffled_rounds  # the house method, defined once
from torch import nn

import wandb_modprof
from wandb_modprof import CheckpointPlan, ModProfError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from models import ResNet18

BUDGETS = ("75%", "50%", "25%")
PEAK_TARGET, STEP_TARGET = 10.0, 15.0  # percent


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    build: Callable[[], nn.Module]
    inputs: torch.Tensor


class _Logits(nn.Module):
    """An HF causal LM's logits; no KV cache, as in training (a recompute would append twice)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, use_cache=False).logits  # type: ignore[no-any-return]


def _gpt2(vocab: int, dim: int, layers: int, seq: int) -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=seq, n_embd=dim, n_layer=layers, n_head=4,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return _Logits(transformers.GPT2LMHeadModel(config))


def make_workloads(quick: bool, device: torch.device) -> list[Workload]:
    gen = torch.Generator().manual_seed(0)
    vocab, dim, layers, seq, batch = (256, 64, 2, 32, 2) if quick else (1000, 256, 4, 128, 4)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
    gpt2 = Workload(
        "gpt2",
        f"GPT-2 (transformers GPT2LMHeadModel from a config, random weights, dropout off): "
        f"{layers} layers, dim {dim}, 4 heads, vocab {vocab}, seq {seq}, batch {batch}",
        lambda: _gpt2(vocab, dim, layers, seq),
        ids,
    )
    if quick:
        return [gpt2]
    from _moe import moe_model

    resnet = Workload(
        "resnet18",
        "ResNet-18 (tests/models.py: torchvision's layout, BatchNorm in training, dropout 0.2 "
        "before the classifier): 8x3x64x64 input, 10 classes",
        ResNet18,
        torch.randn(8, 3, 64, 64, generator=gen).to(device),
    )
    moe = Workload(
        "moe",
        "Qwen2-MoE from a config with one module per expert (benchmarks/_moe.py): 4 layers, "
        "16 experts, top-2 routing, hidden 16, 64 tokens",
        lambda: _Logits(moe_model(layers=4, experts=16, top_k=2)),
        torch.randint(0, 256, (1, 64), generator=gen).to(device),
    )
    return [gpt2, resnet, moe]


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).float().pow(2).mean()


def profiled(model: nn.Module, x: torch.Tensor, structure: bool) -> wandb_modprof.Profile:
    """A warm-up step, then a profile of three steps (the second the structure pass) or two."""
    loss_of(model, x).backward()
    with wandb_modprof.profile(model, structure=structure) as prof:
        for _ in range(3 if structure else 2):
            model.zero_grad(set_to_none=True)
            loss_of(model, x).backward()
    model.zero_grad(set_to_none=True)
    return prof


def saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes saved for backward when one unwatched forward ends, counted as `act_bytes`."""

    def key(t: torch.Tensor) -> tuple[str, int]:
        return str(t.device), t.untyped_storage().data_ptr()

    static = {key(t) for t in (*model.parameters(), *model.buffers())}
    saved: dict[tuple[str, int], tuple[int, list[weakref.ref[torch.Tensor]]]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        # what autograd keeps is this detached tensor: alive until the backward releases it
        box, k = t.detach(), key(t)
        if k not in static:
            entry = saved.get(k)
            if entry is None or not any(r() is not None for r in entry[1]):
                # new, or a freed storage's address reused by a new one: a new storage
                entry = saved[k] = (t.untyped_storage().nbytes(), [])
            entry[1].append(weakref.ref(box))
        return box

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda box: box):
        out = model(x)
    total = sum(n for n, refs in saved.values() if any(r() is not None for r in refs))
    out.float().pow(2).mean().backward()
    model.zero_grad(set_to_none=True)
    return total


@dataclass
class Copy:
    """One unwatched copy in the timed rounds (`shuffled_rounds` appends to `times_ms`)."""

    name: str
    model: nn.Module
    times_ms: list[list[float]] = field(default_factory=list)


def time_copies(copies: list[Copy], x: torch.Tensor, rounds: int, block: int) -> None:
    sync = torch.cuda.synchronize if x.device.type == "cuda" else lambda: None

    def step(c: Copy) -> float:
        c.model.zero_grad(set_to_none=True)
        sync()  # a GPU step ends when its kernels do
        start = time.perf_counter_ns()
        loss_of(c.model, x).backward()
        sync()
        return (time.perf_counter_ns() - start) / 1e6

    shuffled_rounds(copies, step, step, warmup=2, rounds=rounds, block=block, seed=0)


@dataclass(frozen=True)
class Run:
    """One model at one budget: the plan and everything measured against it."""

    model: str
    budget: str
    plan: CheckpointPlan | None  # None: no plan reaches the budget (`unreachable` says why)
    unreachable: str = ""
    outcome: Any = None  # wandb_modprof.view.checkpoint_outcome.PlanOutcome
    truth_now: int = 0
    truth_planned: int = 0
    step_peaks: tuple[int, int] = (0, 0)  # the whole step's peak above its start: now, planned
    step_ratio: float = 0.0
    aa_ratio: float = 0.0


def step_peak(prof: wandb_modprof.Profile, model: nn.Module, x: torch.Tensor) -> int:
    """The step's peak above its start: CUDA, the allocator's, unwatched; CPU, the curve's."""
    if x.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss_of(model, x).backward()
        torch.cuda.synchronize()
        model.zero_grad(set_to_none=True)
        return torch.cuda.max_memory_allocated() - before
    sample = prof.last_sample
    curve = None if sample is None else sample.memory
    return 0 if curve is None else max(curve.live_bytes) - curve.live_bytes[0]


def measure(w: Workload, budgets: tuple[str, ...], args: argparse.Namespace) -> list[Run]:
    torch.manual_seed(0)
    base, x = w.build().to(w.inputs.device).train(), w.inputs
    prof = profiled(base, x, structure=True)
    truth_now, peak_now = saved_bytes(base, x), step_peak(prof, base, x)
    copies = [Copy("plain", copy.deepcopy(base)), Copy("control", copy.deepcopy(base))]
    runs: list[Run] = []
    for budget in budgets:
        try:
            plan = prof.checkpoint_plan(budget)
        except ModProfError as e:
            best = str(e).split(". ", 1)[-1].split(";")[0]  # "The best reachable is ..."
            runs.append(Run(w.name, budget, None, f"unreachable: {best}"))
            continue
        with wandb_modprof.apply_checkpoint_plan(base, plan) as applied:
            after = profiled(base, x, structure=False)
            peaks, outcome = (peak_now, step_peak(after, base, x)), applied.outcome(after)
            runs.append(
                Run(w.name, budget, plan, "", outcome, truth_now, saved_bytes(base, x), peaks)
            )
        planned = copy.deepcopy(base)
        wandb_modprof.apply_checkpoint_plan(planned, plan)  # kept: this copy is planned
        copies.append(Copy(budget, planned))
    time_copies(copies, x, args.rounds, args.block)
    plain = float(np.median(copies[0].times_ms))
    ratio = {c.name: float(np.median(c.times_ms)) / plain for c in copies}
    return [replace(r, step_ratio=ratio.get(r.budget, 0), aa_ratio=ratio["control"]) for r in runs]


# ---- the report ----------------------------------------------------------------------------
COLUMNS = (
    "model, budget", "budget MiB", "now MiB", "predicted MiB", "realised MiB (profile)",
    "realised MiB (unwatched)", "margin", "error", "target", "above budget by", "target",
    "peak predicted MiB", "peak realised MiB", "peak error", "target",
    "step peak MiB ({}): now -> planned", "planned modules", "step ratio predicted",
    "step ratio realised", "step error", "target", "A/A ratio",
)  # fmt: skip
TARGETS = (
    "activation memory within the plan's margin of the prediction",
    "activation memory above the budget by at most the plan's margin",
    f"memory peak within {PEAK_TARGET:.0f} % of the prediction",
    f"step-time ratio within {STEP_TARGET:.0f} % of the prediction",
    "the profile's activation bytes equal the unwatched count, unplanned and planned",
)


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def judged(ok: bool, target: str) -> str:
    # the target in the cell, then the verdict: tools/bench_page.py lists the **no** ones
    return f"{target} {'yes' if ok else '**no**'}"


def row(r: Run) -> tuple[str, list[bool]]:
    """One table row, and whether it met each of `TARGETS`."""
    label, p, o = f"{r.model}, {r.budget.replace('%', ' %')}", r.plan, r.outcome
    if p is None or o is None:
        return f"| {label} | {r.unreachable} |", []
    got = o.activation_bytes.realised
    error, over = got - p.predicted_activation_bytes, got - p.budget_bytes
    predicted_ratio = p.predicted_step_ms / p.step_ms_now
    step_err = 100 * (r.step_ratio - predicted_ratio) / predicted_ratio
    peak_err = o.peak_bytes.error_percent
    met = [
        abs(error) <= p.margin_bytes,
        over <= p.margin_bytes,
        peak_err is not None and abs(peak_err) <= PEAK_TARGET,
        abs(step_err) <= STEP_TARGET,
        got == r.truth_planned and p.activation_bytes_now == r.truth_now,
    ]
    differs = r.truth_now != p.activation_bytes_now
    now = mib(p.activation_bytes_now) + (f" (unwatched {mib(r.truth_now)})" if differs else "")
    share = 100 * error / p.predicted_activation_bytes
    cells = [
        label, mib(p.budget_bytes), now, mib(p.predicted_activation_bytes), mib(got),
        mib(r.truth_planned), f"{p.margin_bytes / 1024:,.0f} KiB",
        "0" if error == 0 else f"{error / 1024:+,.1f} KiB ({share:+.2f} %)",
        judged(met[0], "within margin"), f"{over / 1024:+,.0f} KiB",
        judged(met[1], "<= margin"), mib(o.peak_bytes.predicted), mib(o.peak_bytes.realised),
        "-" if peak_err is None else f"{peak_err:+.1f} %", judged(met[2], "<= 10 %"),
        f"{mib(r.step_peaks[0])} -> {mib(r.step_peaks[1])}", str(len(p.calls)),
        f"{predicted_ratio:.3f}x", f"{r.step_ratio:.3f}x", f"{step_err:+.1f} %",
        judged(met[3], "<= 15 %"), f"{r.aa_ratio:.3f}x",
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |", met


def report_tables(runs: list[Run], cuda: bool) -> str:
    """The table, then each target: met in how many runs, and where not."""
    columns = [c.format("allocator" if cuda else "curve") for c in COLUMNS]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    missed: dict[str, list[str]] = {t: [] for t in TARGETS}
    judged_runs = 0
    for r in runs:
        line, met = row(r)
        lines.append(line)
        judged_runs += bool(met)
        for target, ok in zip(TARGETS, met, strict=False):
            missed[target] += [] if ok else [f"{r.model} {r.budget}"]
    lines += ["", "Targets:", ""]
    for target, where in missed.items():
        shown = f"; **not met**: {', '.join(where)}" if where else ""
        lines.append(f"- {target}: {judged_runs - len(where)} of {judged_runs} runs{shown}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: a tiny GPT-2, 50 %%")
    parser.add_argument("--out", help="also write the report to this file")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--models", default="gpt2,resnet18,moe", help="comma-separated")
    parser.add_argument("--rounds", type=int, help="timed rounds (default 20; quick 3)")
    parser.add_argument("--block", type=int, default=4, help="steps per block, first untimed")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 20)
    if args.rounds < 1 or args.block < 2 or args.threads < 1:
        parser.error("need --rounds >= 1, --block >= 2 and --threads >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("checkpoint.py --device cuda: torch sees no CUDA device here", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    wanted = {m.strip() for m in args.models.split(",") if m.strip()}
    workloads = [w for w in make_workloads(args.quick, device) if w.name in wanted]
    if not workloads:
        raise SystemExit(f"--models: nothing to run in {args.models!r}")
    started = time.perf_counter()
    runs: list[Run] = []
    for w in workloads:
        runs += measure(w, ("50%",) if args.quick else BUDGETS, args)
        print(f"[{w.name} done, {time.perf_counter() - started:.0f} s]", file=sys.stderr)
    given = sys.argv[1:] if argv is None else argv
    command = " ".join([".venv/bin/python benchmarks/checkpoint.py", *given])
    cuda = device.type == "cuda"
    memory = (
        "the peaks are the allocator's (the step peak: one unwatched step)"
        if cuda
        else "memory is the saved-tensor bytes, and the peaks are read from the profile's "
        "saved-tensor curve (not what a recompute saves again)"
    )
    models = "\n".join(f"- {w.name}: {w.description}" for w in workloads)
    report = (
        f"Command: `{command}`\n\n"
        + ("--quick: a tiny model, a smoke test of the script.\n\n" if args.quick else "")
        + f"wandb_modprof {wandb_modprof.__version__} at git {revision()}, "
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {args.threads}, "
        f"device {device}. Step times: {args.rounds} rounds of {args.block} steps per copy "
        f"(first untimed), shuffled. Total {time.perf_counter() - started:.0f} s.\n\n"
        f"{models}\n\n"
        f"MiB = 2^20 bytes. Realised: the planned model's root `act_bytes` (profile) and the "
        f"saved-tensor count of an unwatched step. Error = realised - predicted; above budget "
        f"by = realised - budget. Peak: the larger of the root's forward and backward peaks, "
        f"each above what was live as its phase started (as `applied.outcome`); step peak: the "
        f"whole step's, above its start. On {device.type}, {memory}. Step ratio: planned / "
        f"unplanned step time, predicted by the profile, realised unwatched (medians); A/A: the "
        f"second unplanned copy / the first (the noise floor).\n\n{report_tables(runs, cuda)}\n"
    )
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
