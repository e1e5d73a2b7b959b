"""What `watch` leaves in an offline W&B run over a long run: tables, bytes, and their time.

Run (about 11 minutes on 2 shared CPU cores under a load of 7-9, 5 minutes of CPU;
``--quick`` is the smoke run, about 35 s):

    .venv/bin/python benchmarks/wandb_log.py [--quick] [--steps 200] [--large-steps 100]

Every sample logs its scalars (``modprof/<Class>/fwd_ms``, ``bwd_ms``, ``act_bytes``,
``overhead_pct``, ``samples``); the profile table, a full file in the run, is logged on a
schedule (``sinks/wandb/table_schedule.py``): the 1st, 2nd, 4th, 8th, ... sample's, whenever
``table_interval`` seconds (default 3600) passed since the last one, and the last at
``unwatch()``. ``table_interval=1e-9`` makes every sample's log carry the table (a table per
sample), so both schedules run side by side in one process.

Models (``scale.py``'s GPT-2 from a config: dim 32, 2 heads, seq 16, batch 1, vocab 256):
``gpt2-24`` (~300 module calls a step) and, unless ``--quick``, ``gpt2-96`` (~1,200 calls).

Per model, identical deep copies, each with its own offline W&B run (``wandb.init(mode=
"offline", entity="me", ...)``, its own folder) and its own W&B data folder (where W&B stages
the artifact copies of each logged table until ``wandb sync``): a plain copy (not watched), and
copies watched with ``log_freq=1``, ``offload=False``, under a table at every sample
(``table_interval=1e-9``), the default schedule, and the default again (the A/A control: what
two identical configurations differ by here); for the larger model also ``offload="auto"`` (the
worker process, from 1,000 calls) under both schedules. Each copy takes its warm-up steps alone
(the first, sampled, step and the structure pass), then ``--steps`` rounds: in each, every copy
takes one step in an order shuffled afresh (forward, backward, ``zero_grad``, then
``run.log({"loss": ...})``), so bursts of a shared machine hit all copies alike. Timed per step
(every one a sample): wall time (``time.perf_counter``) and the training thread's CPU time
(``time.thread_time``; W&B's service process and the worker are other processes). Then each
copy's ``run.log`` calls of ours that carry scalars alone (a sample between tables) are timed
in the training thread's CPU (target: <= 1 ms on average). Then each
copy's ``unwatch()`` is timed (wall, and the thread's CPU), its run finished, and its folders
are read: the table files (``files/media/table/``), the bytes of every file in the run folder,
the bytes W&B staged outside it (``<data dir>/artifacts/staging``). ``bound``: the most tables
the docs state for the run (``TableSchedule.bound(samples, seconds, 3600)``, the seconds from
``watch`` to ``unwatch``). ``tables' worth``: the run folder's bytes over the bytes of one
table (the same model's table-every-sample run); target for a run of a few hundred samples
under the default schedule: <= 20.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import wandb
from _peers import _run_env
from _report import emit, revision
from scale import Case, gpt2
from torch import nn

import wandb_modprof
from wandb_modprof.sinks.wandb.table_schedule import DEFAULT_INTERVAL_S, TableSchedule

EVERY_SAMPLE = 1e-9  # table_interval: every sample's log carries the table
WORTH_TARGET = 20.0  # tables' worth of bytes in a run of a few hundred samples (default)
SCALARS_MS = 1.0  # the training thread's CPU per scalars-only log, mean
WEEK_SAMPLES, WEEK_DAYS = 10_000, 7
MIB = 2**20
# the copies' schedules (the report's `table_interval` column)
PLAIN, EVERY = "plain (not watched)", f"{EVERY_SAMPLE:g} s: a table every log"
DEFAULT, CONTROL = f"{DEFAULT_INTERVAL_S:g} s (default)", f"{DEFAULT_INTERVAL_S:g} s: A/A copy"


@dataclass
class Copy:
    """One copy of the model: its configuration, run, folders and measurements."""

    index: int  # the order of the report's rows
    schedule: str  # PLAIN, EVERY, DEFAULT or CONTROL
    offload: bool | str | None  # None: not watched
    interval: float | None
    model: nn.Module
    data_dir: str  # WANDB_DATA_DIR while this copy runs: W&B's staging folder is under it
    run: Any = None
    handle: Any = None
    run_dir: Path | None = None
    wall_ms: list[float] = field(default_factory=list)  # per measured step
    thread_ms: list[float] = field(default_factory=list)
    scalars_ms: list[float] = field(default_factory=list)  # thread CPU of each scalars-only log
    watched_at: float = 0.0
    watched_s: float = 0.0  # watch() to the end of unwatch(): the schedule's clock
    unwatch_s: float = 0.0
    unwatch_thread_s: float = 0.0
    samples: int = 0
    tables: int = 0
    table_bytes: int = 0
    run_bytes: int = 0
    staged_bytes: int = 0

    @property
    def watched(self) -> bool:
        return self.offload is not None

    @property
    def bound(self) -> int:
        return TableSchedule.bound(self.samples, self.watched_s, self.interval)


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _make_copies(case: Case, large: bool, root: Path) -> list[Copy]:
    torch.manual_seed(0)
    base = case.build().train()
    configs: list[tuple[str, bool | str | None, float | None]] = [
        (PLAIN, None, None),
        (EVERY, False, EVERY_SAMPLE),
        (DEFAULT, False, DEFAULT_INTERVAL_S),
        (CONTROL, False, DEFAULT_INTERVAL_S),
    ]
    if large:
        configs += [(EVERY, "auto", EVERY_SAMPLE), (DEFAULT, "auto", DEFAULT_INTERVAL_S)]
    copies = []
    for i, (schedule, offload, interval) in enumerate(configs):
        folder = root / f"{case.name}-{i}"
        (folder / "data").mkdir(parents=True)
        model = copy.deepcopy(base)
        copies.append(Copy(i, schedule, offload, interval, model, str(folder / "data")))
    return copies


def _start(c: Copy, case: Case, folder: Path) -> None:
    os.environ["WANDB_DATA_DIR"] = c.data_dir
    c.run = wandb.init(
        mode="offline",
        dir=str(folder),
        entity="me",
        project="modprof-bench-wandb-log",
        name=f"{case.name} {c.schedule} offload={c.offload}",
        reinit="create_new",
    )
    c.run_dir = Path(c.run.dir).parent  # .../wandb/offline-run-<time>-<id>
    if c.offload is not None:  # watched
        _time_scalar_logs(c)
        c.watched_at = time.perf_counter()
        c.handle = wandb_modprof.watch(
            c.model,
            log_freq=1,
            run=c.run,
            settings=wandb_modprof.Settings(offload=c.offload),
            table_interval=c.interval,
        )


def _time_scalar_logs(c: Copy) -> None:
    """Time, in the training thread's CPU, each `run.log` of ours that carries scalars alone
    (a sample between scheduled tables): its cost, W&B's included. The user's own `run.log`
    (committed) and the logs with a table or a page are not counted."""
    log = c.run.log

    def timed_log(data: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        ours = kwargs.get("commit") is False
        scalars = ours and all(isinstance(v, (int, float)) for v in data.values())
        start = time.thread_time()
        try:
            return log(data, *args, **kwargs)
        finally:
            if scalars:
                c.scalars_ms.append((time.thread_time() - start) * 1e3)

    c.run.log = timed_log


def _step(c: Copy, case: Case, timed: bool) -> None:
    os.environ["WANDB_DATA_DIR"] = c.data_dir  # W&B reads it when it stages a table
    wall, thread = time.perf_counter(), time.thread_time()
    loss = case.forward(c.model)
    loss.backward()
    c.model.zero_grad(set_to_none=True)
    c.run.log({"loss": loss.item()})
    if timed:
        c.wall_ms.append((time.perf_counter() - wall) * 1e3)
        c.thread_ms.append((time.thread_time() - thread) * 1e3)


def _warm_up(c: Copy, case: Case) -> None:
    """The first (sampled) step, then the structure pass(es): one-off, not timed."""
    _step(c, case, timed=False)
    for _ in range(20):
        if c.handle is None or not c.handle._capture.structures.due:
            break
        _step(c, case, timed=False)


def _finish(c: Copy) -> None:
    os.environ["WANDB_DATA_DIR"] = c.data_dir
    if c.handle is not None:
        wall, thread = time.perf_counter(), time.thread_time()
        prof = c.handle.unwatch()
        c.unwatch_s = time.perf_counter() - wall
        c.unwatch_thread_s = time.thread_time() - thread
        c.watched_s = time.perf_counter() - c.watched_at
        c.samples = prof.num_samples
        c.handle = None
    c.run.finish()
    assert c.run_dir is not None
    tables = [p for p in (c.run_dir / "files" / "media" / "table").rglob("*.table.json")]
    c.tables = len(tables)
    c.table_bytes = sum(p.stat().st_size for p in tables)
    c.run_bytes = _bytes(c.run_dir)
    c.staged_bytes = _bytes(Path(c.data_dir))


def measure(case: Case, steps: int, large: bool, root: Path, seed: int) -> list[Copy]:
    copies = _make_copies(case, large, root)
    order = random.Random(seed)
    try:
        for c in copies:
            _start(c, case, root / case.name)
            _warm_up(c, case)
        for _ in range(steps):
            order.shuffle(copies)
            for c in copies:
                _step(c, case, timed=True)
    finally:
        copies.sort(key=lambda c: c.index)
        for c in copies:
            if c.run is not None:
                _finish(c)
    return copies


# ---- report ----------------------------------------------------------------------------------
def _mmm(values: list[float]) -> str:
    """mean (median / max)."""
    return f"{statistics.fmean(values):.0f} ({statistics.median(values):.0f} / {max(values):.0f})"


def _per_table(copies: list[Copy], offload: bool | str | None) -> float:
    """Bytes per table file, from the same model's table-every-sample run."""
    every = [c for c in copies if c.schedule == EVERY and c.offload == offload]
    every = every or [c for c in copies if c.schedule == EVERY]
    return every[0].table_bytes / max(1, every[0].tables)


def _met(value: float, target: float, judged: bool, unit: str = "") -> str:
    """`<= target yes` (or `**no**`) where judged; the bare target otherwise."""
    if not judged:
        return f"<= {target:g}{unit}"
    return f"<= {target:g}{unit} {'yes' if value <= target else '**no**'}"


def run_table(results: list[tuple[Case, int, list[Copy]]], judged: bool) -> str:
    lines = [
        "| model | calls | offload | table_interval | samples | tables logged | bound | table MiB "
        "(per table) | run folder MiB | tables' worth | target | W&B staging MiB "
        "| wall ms / sample: mean (median / max) | thread ms / sample: mean (median / max) "
        "| scalars-only logs: n, thread ms mean (max) | target | unwatch s (thread s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, calls, copies in results:
        for c in copies:
            per = _per_table(copies, c.offload if c.watched else False)
            worth = c.run_bytes / per
            default = c.schedule in (DEFAULT, CONTROL)
            scalars = scalars_target = ""
            if c.scalars_ms:
                mean = statistics.fmean(c.scalars_ms)
                scalars = f"{len(c.scalars_ms)}, {mean:.2f} ({max(c.scalars_ms):.2f})"
                scalars_target = _met(mean, SCALARS_MS, judged, " ms")
            if not c.watched:
                offload, bound, tables_mib, unwatch = "not watched", "", "", ""
            else:
                offload = "auto (worker)" if c.offload == "auto" else str(c.offload)
                bound = _met(c.tables, c.bound, judged) if default else "(one per log)"
                per_table = c.table_bytes / max(1, c.tables) / MIB
                tables_mib = f"{c.table_bytes / MIB:.1f} ({per_table:.2f})"
                unwatch = f"{c.unwatch_s:.2f} ({c.unwatch_thread_s:.2f})"
            target = _met(worth, WORTH_TARGET, judged) if default else ""
            lines.append(
                f"| {case.name} | {calls} | {offload} | {c.schedule} | {c.samples} "
                f"| {c.tables} | {bound} | {tables_mib} | {c.run_bytes / MIB:.1f} "
                f"| {worth:.1f} | {target} | {c.staged_bytes / MIB:.1f} | {_mmm(c.wall_ms)} "
                f"| {_mmm(c.thread_ms)} | {scalars} | {scalars_target} | {unwatch} |"
            )
    return "\n".join(lines)


def week_table(results: list[tuple[Case, int, list[Copy]]]) -> str:
    seconds = WEEK_DAYS * 86400.0
    default = TableSchedule.bound(WEEK_SAMPLES, seconds, DEFAULT_INTERVAL_S)
    untimed = TableSchedule.bound(WEEK_SAMPLES, seconds, None)
    lines = [
        f"| model | calls | MiB / table | staged MiB / table | default ({DEFAULT_INTERVAL_S:g} s): "
        "at most tables | GiB (with staging) | `table_interval=None`: at most tables "
        "| GiB (with staging) | a table every sample: tables | GiB (with staging) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, calls, copies in results:
        every = next(c for c in copies if c.schedule == EVERY and c.offload is False)
        per = every.table_bytes / max(1, every.tables)
        staged = every.staged_bytes / max(1, every.tables)

        def gib(tables: int, per: float = per, staged: float = staged) -> str:
            return f"{tables * per / 2**30:.2f} ({tables * (per + staged) / 2**30:.2f})"

        lines.append(
            f"| {case.name} | {calls} | {per / MIB:.2f} | {staged / MIB:.2f} | {default} "
            f"| {gib(default)} | {untimed} | {gib(untimed)} | {WEEK_SAMPLES} "
            f"| {gib(WEEK_SAMPLES)} |"
        )
    return "\n".join(lines)


def _calls(case: Case) -> int:
    model, count = case.build(), [0]

    def pre(*_: Any) -> None:
        count[0] += 1

    hooks = [m.register_forward_pre_hook(pre) for m in model.modules()]
    with torch.no_grad():
        case.forward(model)
    for hook in hooks:
        hook.remove()
    return count[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: the small model only")
    parser.add_argument("--steps", type=int, help="measured steps, small model (default 200)")
    parser.add_argument("--large-steps", type=int, default=100, help="for the larger model")
    parser.add_argument("--seed", type=int, default=0, help="the shuffled order of the copies")
    parser.add_argument("--out", metavar="PATH", help="also write the markdown report to PATH")
    args = parser.parse_args(argv)
    steps = args.steps or (30 if args.quick else 200)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # GPT-2 from a config: nothing to download
    torch.set_num_threads(1)
    started = time.perf_counter()
    plan = [(gpt2(24), steps, False)]
    if not args.quick:
        plan.append((gpt2(96), args.large_steps, True))
    results: list[tuple[Case, int, list[Copy]]] = []
    with tempfile.TemporaryDirectory(prefix="modprof-bench-") as tmp:
        _run_env(tmp)  # offline, silent, W&B's folders in tmp (never the network)
        for case, n, large in plan:
            copies = measure(case, n, large, Path(tmp), args.seed)
            results.append((case, _calls(case), copies))
            elapsed = time.perf_counter() - started
            print(f"[{case.name} done, {elapsed:.0f} s]", file=sys.stderr, flush=True)
    given = sys.argv[1:] if argv is None else argv
    command = " ".join([".venv/bin/python benchmarks/wandb_log.py", *given])
    judged = not args.quick
    steps_text = ", ".join(f"{case.name} {n}" for case, n, _ in plan)
    report = "\n".join(
        [
            f"Command: `{command}`\n",
            (
                "--quick: the small model, few samples, a smoke test of the script; targets "
                "not judged.\n"
                if args.quick
                else ""
            ),
            f"wandb_modprof {wandb_modprof.__version__} at git {revision()}, torch "
            f"{torch.__version__}, wandb {wandb.__version__}, Python "
            f"{platform.python_version()}, {os.cpu_count()} CPUs, 1 torch thread. Measured "
            f"steps (each one a sample, after the warm-up): {steps_text}; copies in shuffled "
            f"order every round. Total {time.perf_counter() - started:.0f} s.\n",
            "Each run, after `unwatch()` and `run.finish()`:\n",
            run_table(results, judged),
            "",
            "`tables logged`: table files in the run folder (`files/media/table/`); `bound`: "
            "`TableSchedule.bound(samples, seconds, 3600)`; `run folder MiB`: every file of the "
            "offline run (tables, the HTML report, the `.wandb` log); `W&B staging MiB`: what "
            "W&B staged for the run's artifacts outside the run folder, kept until `wandb "
            "sync` (the `run_table` artifact's copies of each table, the profile file); "
            "`thread`: the training thread's CPU time.\n",
            f"A week-long run ({WEEK_SAMPLES} samples over {WEEK_DAYS} days), from the docs' "
            "bound and each model's measured bytes per table (its `offload=False` "
            "table-every-sample run; `with staging`: plus W&B's staged copies per table):\n",
            week_table(results),
            "",
        ]
    )
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
