"""Run the benchmarks and write the documentation's performance page from their own output.

    .venv/bin/python tools/bench_page.py                  # every benchmark, then the page
    .venv/bin/python tools/bench_page.py --only overhead  # one section; the others keep theirs
    .venv/bin/python tools/bench_page.py --assemble       # the page from the stored results only

(`make bench` and `make bench BENCH=overhead` run the first two.) Run from the repository root.

Each benchmark in `benchmarks/` prints a markdown report. This script runs one with the command
listed in `BENCHMARKS`, keeps its printed report verbatim with the run's metadata (date,
machine, load average, torch / Python versions, git commit, command, wall time) in
`docs/bench/<name>.json`, and assembles `docs/performance.md` from those files: one section per
benchmark, its method (the stable text below), its tables, and a metadata line. A benchmark
with no stored result shows the command that would measure it, never a figure. The results
are JSON, not markdown, so MkDocs does not take them for pages.

A benchmark that fails keeps its previous result (and the script exits 1 once the others have
run); `gpu.py` is skipped, not failed, where torch sees no CUDA device.

The page states one commit for all its figures: running refuses a tree with uncommitted changes
(`--allow-dirty` runs anyway and the page names the changed files), and the page refuses results
measured at different commits (`--only` after a new commit: rerun everything, or pass
`--allow-mixed`, and the page lists each section's commit at its top). Every section has an
anchor named after its benchmark (`performance.md#scale`), and the page opens with the list of
targets its figures do not meet, each linked to its section.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ".venv/bin/python"  # how commands are shown: relative to the repository root


@dataclass(frozen=True)
class Benchmark:
    """One section of the page: a script in benchmarks/, how `make bench` runs it, its method."""

    name: str
    title: str
    args: tuple[str, ...]
    method: str
    preformatted: bool = False  # the script prints plain lines, not markdown
    needs_cuda: bool = False

    @property
    def anchor(self) -> str:
        """The section's id on the page: `performance.md#<anchor>`."""
        return self.name.replace("_", "-")

    @property
    def command(self) -> str:
        return " ".join([PYTHON, f"benchmarks/{self.name}.py", *self.args])


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "overhead",
        "Step-time overhead of `watch`",
        (),
        """\
What a training step costs with `watch` attached, on CPU, for a small GPT-style transformer
and a small ResNet (`tests/models.py`). One model is deep-copied into identical configurations:
plain, a second plain copy (the A/A control), watched with every step unsampled
(`log_freq=10**9`), watched with every step sampled (`log_freq=1`, W&B logging off; also with
the memory curve off), and sampled with each sample logged to a disabled W&B run. A step is
`zero_grad`, forward, cross-entropy, backward and an SGD step, one torch thread; the copies run
side by side in rounds of short blocks of steps in a shuffled order, the first step of each
block untimed: 80 rounds per model.
""",
    ),
    Benchmark(
        "peers",
        "Against the tools you would use instead",
        (),
        """\
The step-time cost of wandb_modprof beside torch.profiler (defaults, and with
`profile_memory=True`), PyTorch's MemTracker and FlopCounterMode, a DeepSpeed-style per-module
timer and `wandb.watch(log="all", log_freq=1)`, each used the way one would to get per-step
data (`benchmarks/_peers.py` says exactly how), on a ResNet-style net, GPT-2 and a BERT encoder
(from transformers configs). The method is the overhead benchmark's: identical deep copies side
by side in shuffled blocks, an A/A control, a bootstrap interval. `bwd/mem` says whether a tool
measures per-module backward time or memory, the data a sampled step of wandb_modprof collects.
""",
    ),
    Benchmark(
        "accuracy",
        "Accuracy of the per-module figures",
        (),
        """\
Per module call, our forward and backward times against `torch.profiler` on the same step, and
our activation bytes against PyTorch's MemTracker. A second table compares our times with each
module timed with nothing of ours attached (the unobserved model: one plain hook pair per module
on plain steps interleaved with our sampled steps), and beside it the ground truth against
itself (its even repeats against its odd ones: an A/A). Judged are the calls taking at least
1 % of the step; where the A/A's error is as large as ours, the comparison cannot tell our
error from the machine's noise. A third table sets the sampled root forward beside the model's
forward with nothing of ours attached: the observer effect on the whole forward. Five repeats
per model, one torch thread. Last, a truth known by
construction (`tests/phantom.py`): modules whose forward and backward busy-wait a set time, with
containers, a reused module and a checkpointed block. Each spin logs its real length, so each
sample is compared with its own step's truth; judged is each metric's smallest error over 25
samples (preemption between spins only adds time, so the smallest error is what the capture
adds), for true times of at least 1 ms; target: median error <= 5 %, worst <= 15 %.
""",
    ),
    Benchmark(
        "scale",
        "Scale: from 100 to 28,000 module calls",
        ("--steps", "2", "--repeats", "1", "--browser-repeats", "1"),
        """\
How the cost of one logged sample grows with the number of module calls per step, stage by
stage: the capture (sampled step minus plain step), resolving and freezing the sample,
`prof.table()` (the model's first table and a later sample's, which reuses the call tree, the
views, and the layouts and fixed rows of unchanged views; and the layout's part of each), the
W&B table entry and an offline `run.log`, per call and in total; the profiler's Python heap
(`tracemalloc`); and the HTML report opened in headless Chromium.
Then what one logged sample costs the **training thread**, all in, measured against an
unwatched twin stepped alongside (a model logging to an offline run every 4th step): with
everything on the training thread (`offload=False`) and with the worker process that resolves,
tables and packs off the thread (`offload=True`, the default from 1,000 calls), and how long
`unwatch()` waited for the worker's final table, report and profile file. Beside each model,
torch's own hook machinery with no-op hooks on a copy of the same model in the same process
(the floor: what any per-module capture pays before doing anything), our cost per module call
as a multiple of it (targets: the training thread <= 2.5x, the whole sample <= 5x), and the
garbage collections that ran inside the sampled and the plain steps.
Models: synthetic nested `Linear -> ReLU -> Linear` blocks (100 to 20,000 calls), GPT-2 with 96
and 768 layers, and a 48-layer mixture of experts with 128 experts and top-8 routing (~28,000
calls; `benchmarks/_moe.py`). `make bench` takes 2 plain and 2 sampled steps, one table repeat
and one browser per model instead of the script's 5, 3 and 3, to fit the page's time budget:
single figures, so expect 10-20 % run-to-run movement on a shared machine.
""",
    ),
    Benchmark(
        "thread_cpu",
        "The training thread's CPU per logged sample",
        (),
        """\
What one logged sample costs the training thread in CPU time (`time.thread_time`), against
torch's no-op hook floor measured on a copy of the same model in the same process: a model
watched with `log_freq=4` and the worker process on, logging to an offline run, stepped
alternately with an unwatched twin; per cycle of 4 steps, the watched steps' thread CPU minus
the twin's (median and range over 16 logged samples after a warm-up), beside an A/A control
(two unwatched twins). `all-in`: the same for the whole process (its other threads) plus the
worker process, as the mean over those samples: the tables the schedule logs among them (the
2nd, 4th, 8th and 16th sample's) count at their share of a run that short, more than in a
longer run. Also the first watched step (the structure pass and the worker's start) in
plain steps, and what `unwatch()` and `run.finish()` take. Models: the nested tree of about
10,000 calls; a mixture of experts of 8 layers x 64 tiny experts, top-2 routing (each expert
sees about 2 tokens: fixed costs dominate); one of 18 layers x 128 experts, top-8 of 64
tokens (nearly every expert called); the tiny one fed 16 new tokens every step (`-r16`: the
experts called, and their tokens, change from step to step, so each sample shows a new call
sequence; the experts a pass has not met take an identical expert's counts, so no further
pass runs, and the sampled steps derive their graph while it still grows); GPT-2 with 12
layers. Targets: thread <= 1.5x the floor, all-in <= 3x,
`unwatch()` <= 2 s.
""",
    ),
    Benchmark(
        "wandb_log",
        "What a long run writes to W&B",
        (),
        """\
What `watch` leaves in an offline W&B run over a run of a few hundred samples (`log_freq=1`, a
fast loop): every sample logs its scalars, the profile table (a full file in the run) goes on a
schedule: the 1st, 2nd, 4th, 8th, ... sample's, whenever `table_interval` seconds (default 3600)
passed since the last one, and the last at `unwatch()`. Against it, `table_interval=1e-9`: a
table with every log. Models: GPT-2 from a config with 24 layers (~300 module calls a step, 200
samples) and 96 layers (~1,200 calls, 100 samples). Per model, identical deep copies, each with
its own offline run and W&B data folder, step in a shuffled order every round: a plain copy
(not watched); watched in-process (`offload=False`) under both schedules, and a second copy
under the default (the A/A control); for the larger model also `offload="auto"` (the worker
process) under both. After `unwatch()` (timed) and `run.finish()`, per run: the table files,
the bytes of every file in the run folder, and what W&B staged outside it for the run's
artifacts (kept until `wandb sync`); the most tables the docs state for the run
(`TableSchedule.bound`); per step (each one a sample), wall time and the training thread's CPU
time, mean, median and worst; and the training thread's CPU in each of our `run.log` calls that
carries the sample's scalars alone (a sample between tables), mean and worst. Targets: the run
folder holds at most 20 tables' worth of bytes (a table's bytes from the same model's
table-every-log run); a scalars-only log costs the training thread at most 1 ms. Last, from
the bound and the measured bytes per table, what a week-long run of 10,000 samples would write.
""",
    ),
    Benchmark(
        "meter",
        "The overhead a run reports, against an unwatched twin",
        (),
        """\
Whether the overhead `watch` reports (`handle.overhead`, the summary, the panel) is what the
run costs. Per model, a watched copy and an unwatched twin (same weights, optimizer, seed and
batch) train side by side, one step each in turn, one torch thread, a disabled W&B run.
Realised: the watched steps' total time less the twin's; reported: `handle.overhead.cost_s`.
Target: within 1.25x, or 1 percentage point of the twin's training time, whichever is larger.
Each model runs with a fixed `log_freq` (the floor on every step, the samples, the one-time
structure pass) and with `log_freq="auto", overhead=0.01` (the budget: the realised share
beside the 1 %; the structure pass on step 1 runs whatever the budget and is shown as `once`),
beside an A/A control (two unwatched copies). Models: a 1-layer and a 3-layer MLP, the test
zoo's small transformer and ResNet, GPT-2 with 12 layers from a config, the nested tree of
about 10,000 calls (its samples go to the worker process).
""",
    ),
    Benchmark(
        "hook_floor",
        "The floor: torch's own hooks",
        (),
        """\
What torch's hook machinery costs with hooks that do nothing, without wandb_modprof, on the
scale benchmark's nested tree of about 10,000 modules: forward pre-hooks and hooks on every
module, a pre-hook and a hook on every autograd node (and registering them alone), identity
saved-tensor hooks. Reported per module call, one torch thread: each variant's step runs once
per round, 9 rounds interleaved, and each figure is the median over rounds of the training
thread's CPU time of the hooked step less the plain step's in the same round (the collector
off inside the steps): the cost of capturing with the hooks the product needs before any of
its own work. `thread_cpu` and `scale` measure the same floor beside each of their models.
""",
        preformatted=True,
    ),
    Benchmark(
        "structure",
        "Structure pass and table",
        (),
        """\
The one-off structure pass (the first watched step follows every tensor op to find the
module graph, and counts each call's FLOPs, backward FLOPs, bytes moved and ops for the
efficiency modes, its backward's bytes and ops on the step's own backward; the machine's
roofline is calibrated once per process, in the first of the repeats) against a plain step;
a one-step `profile` block with and without deriving the graph from that step (`sampled` /
`derived`, and how much lands in the root's reported forward); and `prof.table()` (merge,
view graphs, layout, rows), also for a
2,000-call transformer. Steps alternate plain / measured, one torch thread, medians.
""",
    ),
    Benchmark(
        "profile_file",
        "The profile file: version 8 against version 7",
        (),
        """The profile file of the nested tree of about 10,000 calls (its structure passes, then 5
samples in the statistics, so the times' statistics vary), saved as version 8 (records as
columns) and as version 7 (an object per record, the writer kept for this), then each file
loaded: bytes, and seconds to save (encode, JSON text, the atomic write: what `prof.save` and
`unwatch()` pay) and to load (parse, check, build: `wandb_modprof.load`), wall-clock and CPU,
medians of 5, the two versions interleaved after one untimed save and load of each. Targets:
version 8 at least 4x smaller than version 7 and at least 5x faster to save and to load.
""",
    ),
    Benchmark(
        "checkpoint",
        "What to checkpoint: predicted against realised",
        (),
        """\
What a checkpoint plan (`prof.checkpoint_plan`) predicts against what the planned model
realises, on CPU, for GPT-2 (transformers, from a config), a torchvision-shaped ResNet-18 with
BatchNorm in training, and a Qwen2 mixture of experts with one module per expert, at 75, 50 and
25 % of today's activation memory. Each model is profiled, planned, the plan applied
(`apply_checkpoint_plan`) and the planned model profiled again: its root call's activation
bytes, memory peak and step time beside the prediction (`applied.outcome`). The truth has
nothing of ours attached: the bytes saved for backward counted with plain saved-tensor hooks
on an unwatched step (unplanned and planned), and the step time of unwatched copies (unplanned,
an A/A control, one per plan) run side by side in shuffled blocks, 20 rounds, one torch thread:
the realised step-time ratio planned / unplanned against the predicted one. On CPU the memory
is the saved-tensor bytes and the peaks are read from the profile's saved-tensor curve; on CUDA
(`--device cuda`) they are the allocator's. Targets: the realised peak within 10 % of the
prediction, the activation memory never above the budget by more than the plan's stated
margin, the step-time ratio within 15 %.
""",
    ),
    Benchmark(
        "layout",
        "Layout of large views",
        (),
        """\
The layout stage alone on synthetic views of about 2,000 calls: a chain with residual skips,
a transformer-shaped call tree (25 views), a 2,000-wide fan with varied module types, the same
fan with one type (drawn as a grid) and a residual stream with an edge from every call to every
later one. Each case is laid out 7 times after a warm-up; times include Python's garbage
collector, as a real run would, so `max` can be several times `min`.
""",
    ),
    Benchmark(
        "report",
        "HTML report: time to the first view",
        (),
        """\
The largest synthetic models (nested stages of blocks, and one flat row of blocks) whose table
is still drawn unreduced within the 10,000-row limit are profiled for 3 steps; each report is
written and opened from `file://` in a fresh headless Chromium 5 times (network blocked,
nothing cached), timed from navigation start until the first view's nodes are drawn, by the
page's own clock.
""",
    ),
    Benchmark(
        "phases",
        "The step's phases against planted truth",
        (),
        """\
A small MLP trained inside `profile(..., optimizer=opt)` (every step sampled), one torch
thread; each scenario plants a known cost in one phase, outside the modules, with `time.sleep`:
a `Dataset` whose `__getitem__` sleeps 30 ms (`between`), the same with two data-loader
workers prefetching while the step itself takes 30 ms (the overlap: `between` must fall below
half the load), an optimizer `step` slowed by 25 ms, a loss followed by 15 ms before the
backward. Per scenario, `prof.step_phases()` (medians over 24 samples) against the sleeps as
they really slept, over 5 repeats. Below, what the phases cost an unsampled step.
""",
    ),
    Benchmark(
        "distributed",
        "Gathering per-rank statistics",
        (),
        """\
The cost of gathering every rank's statistics to rank 0 under `DistributedDataParallel`
(gloo, CPU processes, one thread each, 2 and 4 ranks): every step sampled and logged by rank 0,
with the gathering on (`gathered`) and off (`sampled`) in alternating blocks, and the time of
publishing (ranks > 0) and collecting (rank 0) themselves. Four processes share the two cores,
so those figures include contention.
""",
    ),
    Benchmark(
        "gpu",
        "GPU",
        (),
        """\
The overhead against the peer tools (with the device synchronised around every timed step) and
the accuracy against kernel-level ground truth (each call's kernel span from torch.profiler's
CUDA activity), at GPU sizes: GPT-2 small's shape, BERT-base's, a wider ResNet. It needs a
CUDA build of torch and a GPU; `make bench` skips it on a machine without one.
""",
        needs_cuda=True,
    ),
)
BY_NAME = {b.name: b for b in BENCHMARKS}

# Wide tables: the page uses the whole width (no navigation or contents sidebars) and the
# smaller type of docs/stylesheets/tables.css (`wide-tables` on the page's tables).
FRONT_MATTER = """\
---
hide:
  - navigation
  - toc
---
"""

INTRO = """\
# Performance {{ .wide-tables }}

<!-- Generated by tools/bench_page.py from docs/bench/*.json: edit those (run `make bench`) or
the generator, not this file. -->

What wandb_modprof costs and how close its figures are to the truth, measured by the scripts in
`benchmarks/`. Each section below says what its benchmark measures and how, shows the tables the
script printed on its last run, and ends with when, where and how that run was made.

**Reading the figures.** Absolute milliseconds depend on the machine and on what else ran on
it, so the overhead benchmarks report a *ratio*: the median step time of a configuration over
the median of the plain model's, measured side by side in one process on identical copies.
The *A/A control* is a second plain copy measured the same way: its distance from 1.000x is the
noise floor of that run, and a ratio closer to 1 than the control's cannot be told from no cost
at all. The *95 % CI* is a bootstrap interval over rounds. The machines are shared: the load
average at the start of each run is in its metadata line; a load near or above the number of
cores means other work competed for them, and figures from such a run are noisier.

**Regenerating.** From the repository root, `make bench` runs every benchmark and rewrites this
page; `make bench BENCH=overhead` (or `BENCH=overhead,peers`) reruns only those sections and
keeps the others' last results, which are stored in `docs/bench/<name>.json`.
`.venv/bin/python tools/bench_page.py --assemble` rebuilds the page from the stored results
without running anything.{took}
"""

# what a benchmark prints that the metadata line says again
_COMMAND_LINE = re.compile(r"^Command: `[^`]*`\s*$")


# Files the generator writes: they may differ from the commit being measured.
_OUTPUTS = (":!docs/bench", ":!docs/performance.md")


def uncommitted() -> list[str]:
    """Files of the tree (tracked, or untracked and not ignored) that differ from HEAD."""
    changed = _git("status", "--porcelain", "--", ".", *_OUTPUTS)
    return sorted(line[3:] for line in changed.splitlines())


def _commit_of(result: dict[str, object]) -> str:
    changed = result.get("local_changes") or []
    return str(result["commit"]) + ("-dirty" if changed else "")


def commits(results: list[dict[str, object] | None]) -> list[str]:
    """The distinct commits (`-dirty`: with local changes) of the stored results, in order."""
    return list(dict.fromkeys(_commit_of(r) for r in results if r is not None))


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def unmet_targets(bench: Benchmark, result: dict[str, object] | None) -> list[str]:
    """One line per table row of the section whose target is marked not met (`**no**`)."""
    if result is None or bench.preformatted:
        return []
    found, header = [], None
    for line in [str(x) for x in result["output"]]:  # type: ignore[attr-defined]
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = cells
            continue
        if set("".join(cells)) <= set("-: "):
            continue  # the separator row
        for i, cell in enumerate(cells):
            if "**no**" not in cell:
                continue
            target, value = cell.replace("**no**", "").strip(), ""
            if target and i > 0:  # "<= 2.5x **no**": the figure is the column before
                value = f"{header[i - 1]} {cells[i - 1]}, "
            elif i > 0 and header[i - 1].lower() == "target":
                target = cells[i - 1]
                if "ratio" in header:
                    value = f"ratio {cells[header.index('ratio')]}, "
            what = " / ".join(c for c in cells[:2] if c and not c[0].isdigit())
            found.append(
                f"- [{bench.title}](#{bench.anchor}): {what or cells[0]}: {value}target "
                f"{target or header[i]}"
            )
    return found


def unmet_section(results: list[dict[str, object] | None]) -> str:
    lines = [u for b, r in zip(BENCHMARKS, results, strict=True) for u in unmet_targets(b, r)]
    if not lines:
        return "**Unmet targets.** None: every figure with a target meets it.\n"
    return (
        f"**Unmet targets** ({len(lines)}; the rows marked **no** in the tables below):\n\n"
        + "\n".join(lines)
        + "\n"
    )


def measured_at(results: list[dict[str, object] | None]) -> str:
    shown = [(b, r) for b, r in zip(BENCHMARKS, results, strict=True) if r is not None]
    if not shown:
        return ""
    found = commits(results)
    if len(found) == 1:
        dates = sorted(str(r["date"]) for _, r in shown)
        return f"**Measured at** git {found[0]}, every section, from {dates[0]} to {dates[-1]}.\n"
    per = ", ".join(f"[{b.title}](#{b.anchor}) {_commit_of(r)}" for b, r in shown)
    return (
        f"**Measured at {len(found)} different commits** (assembled with `--allow-mixed`: "
        f"compare sections with care): {per}.\n"
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
    )
    return done.stdout.rstrip()


def _has_cuda() -> bool:
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"
    return subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=False).returncode == 0


def run_one(bench: Benchmark) -> dict[str, object] | None:
    """Run one benchmark from the repository root; its result, or None if it failed."""
    print(f"== {bench.name}: {bench.command}", file=sys.stderr, flush=True)
    load_start = [round(x, 2) for x in os.getloadavg()]
    date = dt.datetime.now(dt.timezone.utc)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, f"benchmarks/{bench.name}.py", *bench.args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    wall_s = time.perf_counter() - started
    print(done.stdout, flush=True)
    if done.returncode != 0:
        print(f"== {bench.name} failed (exit {done.returncode})", file=sys.stderr, flush=True)
        return None
    print(f"== {bench.name} done in {wall_s:.0f} s", file=sys.stderr, flush=True)
    return {
        "name": bench.name,
        "command": bench.command,
        "date": date.strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "load_start": load_start,
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "torch": importlib.metadata.version("torch"),
        "python": platform.python_version(),
        "commit": _git("rev-parse", "--short", "HEAD") or "unknown",
        "local_changes": uncommitted(),
        "wall_s": round(wall_s),
        "output": done.stdout.rstrip("\n").splitlines(),
    }


def _body(lines: list[str], bench: Benchmark) -> list[str]:
    """The benchmark's printed report as page markdown: headings under the section's level."""
    if bench.preformatted:
        return ["```text", *lines, "```"]
    body: list[str] = []
    for raw in lines:
        said = raw.startswith("#") and raw.lstrip("# ").lower() == bench.title.lower()
        if said or _COMMAND_LINE.match(raw):  # the section's title and metadata line say it
            continue
        line = "#### " + raw.lstrip("#").strip() if raw.startswith("#") else raw
        # a table needs a blank line above it to be read as one
        if line.startswith("|") and body and body[-1].strip() and not body[-1].startswith("|"):
            body.append("")
        body.append(line)
    while body and not body[0].strip():
        body.pop(0)
    return body


def metadata_line(result: dict[str, object]) -> str:
    load = result["load_start"]
    assert isinstance(load, list)
    changed = result.get("local_changes") or []
    assert isinstance(changed, list)
    commit = str(result["commit"]) + (f" (uncommitted: {', '.join(changed)})" if changed else "")
    return (
        f"*Run {result['date']} on {result['cpu']}, {result['cores']} cores, load average "
        f"{load[0]} at start (1 / 5 / 15 min: {', '.join(str(x) for x in load)}); "
        f"torch {result['torch']}, Python {result['python']}, git {commit}; "
        f"{result['wall_s']} s; command: `{result['command']}`.*"
    )


def section(bench: Benchmark, result: dict[str, object] | None) -> str:
    parts = [f"## {bench.title} {{#{bench.anchor}}}", "", bench.method.rstrip("\n"), ""]
    if result is None:
        if bench.needs_cuda:
            parts.append(
                "Not run on a GPU yet: the machines these figures come from have no CUDA "
                f"device. On one that has: `{bench.command}` (or `make bench BENCH={bench.name}`)."
            )
        else:
            parts.append(
                f"Not measured yet: run `{bench.command}` (or `make bench BENCH={bench.name}`)."
            )
        return "\n".join(parts) + "\n"
    output = result["output"]
    assert isinstance(output, list)
    parts += _body([str(x) for x in output], bench)
    parts += ["", metadata_line(result), ""]
    parts.append(f"Rerun this section alone: `make bench BENCH={bench.name}`.")
    return "\n".join(parts) + "\n"


def load(bench_dir: Path, name: str) -> dict[str, object] | None:
    path = bench_dir / f"{name}.json"
    if not path.exists():
        return None
    result = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(result, dict)
    return result


class MixedCommitsError(Exception):
    """Stored results measured at more than one commit, or with local changes."""


def assemble(bench_dir: Path, allow_mixed: bool = False) -> str:
    results = [load(bench_dir, b.name) for b in BENCHMARKS]
    found = commits(results)
    if not allow_mixed and (len(found) > 1 or any(c.endswith("-dirty") for c in found)):
        per = ", ".join(
            f"{b.name} {_commit_of(r)}" for b, r in zip(BENCHMARKS, results, strict=True) if r
        )
        raise MixedCommitsError(
            f"the stored results were not all measured at one clean commit ({per}): rerun "
            "every benchmark (`make bench`) on a clean tree, or pass --allow-mixed"
        )
    wall_s = [r["wall_s"] for r in results if r is not None]
    took = ""
    if wall_s:
        minutes = sum(float(str(s)) for s in wall_s) / 60
        took = f"\nThe runs shown took {minutes:.0f} minutes together."
    sections = [section(b, r) for b, r in zip(BENCHMARKS, results, strict=True)]
    head = [FRONT_MATTER + INTRO.format(took=took), measured_at(results), unmet_section(results)]
    return "\n".join([*head, *sections]).rstrip("\n") + "\n"


def write_page(page: Path, bench_dir: Path, allow_mixed: bool = False) -> None:
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(assemble(bench_dir, allow_mixed), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--only", metavar="NAMES", help="comma-separated: " + ",".join(BY_NAME))
    how.add_argument("--assemble", action="store_true", help="run nothing, only write the page")
    parser.add_argument("--bench-dir", type=Path, default=ROOT / "docs" / "bench")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "performance.md")
    parser.add_argument(
        "--allow-dirty", action="store_true", help="run with uncommitted changes in the tree"
    )
    parser.add_argument(
        "--allow-mixed", action="store_true", help="assemble results from different commits"
    )
    args = parser.parse_args(argv)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in BY_NAME]
        if unknown or not names:
            parser.error(f"--only: expected some of {', '.join(BY_NAME)}; got {args.only!r}")
        chosen = [BY_NAME[n] for n in names]
    else:
        chosen = [] if args.assemble else list(BENCHMARKS)
    dirty = uncommitted() if chosen else []
    if dirty and not args.allow_dirty:
        print(
            f"refused: uncommitted changes ({', '.join(dirty[:8])}"
            f"{' ...' if len(dirty) > 8 else ''}): the page states the commit its figures were "
            "measured at. Commit first, or pass --allow-dirty (the page names the changed files).",
            file=sys.stderr,
        )
        return 2
    if chosen and len(chosen) < len(BENCHMARKS) and not args.allow_mixed:
        head = _git("rev-parse", "--short", "HEAD")
        others = [load(args.bench_dir, b.name) for b in BENCHMARKS if b not in chosen]
        stale = sorted({_commit_of(r) for r in others if r is not None} - {head})
        if stale:
            print(
                f"refused: the other sections were measured at {', '.join(stale)}, not at "
                f"HEAD {head}: rerun every benchmark (`make bench`), or pass --allow-mixed",
                file=sys.stderr,
            )
            return 2
    failed: list[str] = []
    for bench in chosen:
        if bench.needs_cuda and not _has_cuda():
            print(f"== {bench.name}: skipped, torch sees no CUDA device", file=sys.stderr)
            continue
        result = run_one(bench)
        if result is None:
            failed.append(bench.name)
            continue
        args.bench_dir.mkdir(parents=True, exist_ok=True)
        path = args.bench_dir / f"{bench.name}.json"
        path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        # after each: an interrupted run leaves it whole (the sections it did not reach yet
        # are from another commit)
        write_page(args.page, args.bench_dir, allow_mixed=True)
    try:
        write_page(args.page, args.bench_dir, args.allow_mixed or args.allow_dirty)
    except MixedCommitsError as error:
        print(f"refused: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.page}", file=sys.stderr)
    if failed:
        print(f"failed (previous results kept): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
