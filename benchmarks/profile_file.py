"""The profile file: version 8 (records as columns) against version 7 (an object per record).

Run (about a minute on 2 CPU cores; ``--quick`` is the CI smoke run, a few seconds):

    .venv/bin/python benchmarks/profile_file.py [--quick] [--calls 10000] [--out PATH]

One profile of ``scale.py``'s ``nested-N`` model (N = 10,000 module calls: a root
``Sequential`` of stages of 25 blocks of ``Linear -> ReLU -> Linear``), built by
``wandb_modprof.profile`` over its structure passes and sampled steps until ``--samples``
(default 5) are in the statistics (one more, the cold first one, is left out), so the times'
statistics vary from sample to sample as in a real run (``--quick``: nested-300, 2 samples).
Its snapshot is saved as version 7 (the writer kept for this, through
``save_profile(..., version=7)``) and as version 8, then each file is loaded, ``--repeats``
times (default 5) with the two versions interleaved (the order alternating round by round),
after one untimed save and load of each. Reported per version: the file's bytes, the median
(and min-max) seconds of ``save_profile`` (encoding, JSON text, the atomic write: what
``prof.save`` and ``unwatch()`` pay) and of ``read_profile`` (read, parse, check, build: what
``wandb_modprof.load`` pays), wall-clock and the process's CPU (which other load on a shared
machine does not inflate); then version 7 over version 8 for each, against the targets: at
least 4x smaller and 5x faster to write and to load (judged on wall-clock seconds). Version
8's bytes are also split by part of the file. The run checks that version 8 round-trips: the
loaded profile saved again gives the same bytes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _report import emit, revision
from scale import nested

import wandb_modprof
from wandb_modprof.records.snapshot import ProfileData
from wandb_modprof.sinks.file.profile_file import VERSION, read_profile, save_profile

SMALLER, FASTER = 4.0, 5.0  # the targets: version 8 against version 7 on nested-10000
VERSIONS = (7, VERSION)


def build(calls: int, samples: int) -> ProfileData:
    """A profile of `nested(calls)`: its structure passes, then `samples` sampled steps."""
    case = nested(calls)
    model = case.build()
    with wandb_modprof.profile(model) as prof:
        for _ in range(100):  # (a cap: the passes take ceil(calls / 2,500) steps)
            case.forward(model).backward()
            model.zero_grad(set_to_none=True)
            if prof.num_samples > samples:
                break
    return prof.snapshot()


Seconds = dict[int, dict[str, list[float]]]  # version -> "write" / "load" (+ " cpu") -> runs


def timed(work: Callable[[], object]) -> tuple[float, float]:
    """Wall-clock and CPU seconds of `work` (the CPU's: what a shared machine's other load
    does not add)."""
    gc.collect()  # each measurement starts with the same heap
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(data: ProfileData, folder: Path, repeats: int) -> Seconds:
    """Seconds of each save and load, per version, the versions interleaved."""
    paths = {v: folder / f"v{v}.modprof.json" for v in VERSIONS}
    for v in VERSIONS:  # untimed: the encoders are generated and the caches filled once
        read_profile(save_profile(data, paths[v], version=v))
    seconds: Seconds = {v: {} for v in VERSIONS}
    for r in range(repeats):
        for v in VERSIONS if r % 2 == 0 else VERSIONS[::-1]:
            runs = {
                "write": lambda v=v: save_profile(data, paths[v], version=v),
                "load": lambda v=v: read_profile(paths[v]),
            }
            for what, work in runs.items():
                wall, cpu = timed(work)
                seconds[v].setdefault(what, []).append(wall)
                seconds[v].setdefault(f"{what} cpu", []).append(cpu)
    return seconds


def parts(path: Path) -> str:
    """Version 8's bytes per part of the file."""
    doc = json.loads(path.read_bytes())
    sizes = {
        name: len(json.dumps(doc[name], separators=(",", ":")))
        for name in ("stats", "last_sample", "structures")
    }
    total = path.stat().st_size
    return ", ".join(f"{name} {size / 1e6:.2f} MB ({100 * size / total:.0f} %)"
                     for name, size in sizes.items())  # fmt: skip


def _s(values: list[float]) -> str:
    """The median of `values`, and their range."""
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def report(sizes: dict[int, int], seconds: Seconds, judged: bool) -> str:
    old, new = VERSIONS
    lines = [
        "| version | bytes | write s | write CPU s | load s | load CPU s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for v in VERSIONS:
        times = " | ".join(
            _s(seconds[v][what]) for what in ("write", "write cpu", "load", "load cpu")
        )
        lines.append(f"| {v} | {sizes[v]:,} | {times} |")

    def ratio(what: str) -> float:
        return statistics.median(seconds[old][what]) / statistics.median(seconds[new][what])

    lines += [
        "",
        f"| version {old} / version {new} | ratio | CPU ratio | target | met |",
        "|---|---:|---:|---:|---|",
        f"| smaller | {sizes[old] / sizes[new]:.1f}x |  | >= {SMALLER:.0f}x | "
        f"{_met(sizes[old] / sizes[new], SMALLER, judged)} |",
    ]
    for what in ("write", "load"):
        met = _met(ratio(what), FASTER, judged)
        lines.append(
            f"| faster to {what} | {ratio(what):.1f}x | {ratio(what + ' cpu'):.1f}x | "
            f">= {FASTER:.0f}x | {met} |"
        )
    return "\n".join(lines)


def _met(ratio: float, target: float, judged: bool) -> str:
    return ("yes" if ratio >= target else "**no**") if judged else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run: nested-300")
    parser.add_argument("--calls", type=int, help="module calls of nested-N (default 10000)")
    parser.add_argument(
        "--samples", type=int, help="samples in the statistics (default 5; quick 2)"
    )
    parser.add_argument("--repeats", type=int, help="timed saves and loads (default 5; quick 2)")
    parser.add_argument("--out", metavar="PATH", help="also write the markdown report to PATH")
    args = parser.parse_args(argv)
    calls = args.calls or (300 if args.quick else 10_000)
    samples = args.samples or (2 if args.quick else 5)
    repeats = args.repeats or (2 if args.quick else 5)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    started = time.perf_counter()
    data = build(calls, samples)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        seconds = measure(data, folder, repeats)
        paths = {v: folder / f"v{v}.modprof.json" for v in VERSIONS}
        sizes = {v: paths[v].stat().st_size for v in VERSIONS}
        again = save_profile(read_profile(paths[VERSION]), folder / "again.modprof.json")
        assert again.read_bytes() == paths[VERSION].read_bytes(), "version 8 round trip"
        split = parts(paths[VERSION])
    in_stats = max((s.count("fwd_ms") for s in data.stats.values()), default=0)
    given = sys.argv[1:] if argv is None else argv
    command = " ".join([".venv/bin/python benchmarks/profile_file.py", *given])
    judged = not args.quick and calls == 10_000
    text = "\n".join(
        [
            f"Command: `{command}`\n",
            "--quick: a small model, a smoke test of the script; targets not judged.\n"
            if args.quick
            else "",
            f"wandb_modprof {wandb_modprof.__version__} at git {revision()}, "
            f"torch {torch.__version__}, Python {platform.python_version()}, "
            f"{platform.machine()}, {os.cpu_count()} CPUs. nested-{calls}: {len(data.stats):,} "
            f"call keys, {data.num_samples} samples ({in_stats} in the statistics), "
            f"{len(data.last.runs) if data.last else 0:,} backward runs in the last; "
            f"{repeats} timed saves and loads per version, interleaved. "
            f"Total {time.perf_counter() - started:.0f} s.\n",
            report(sizes, seconds, judged),
            "",
            f"Version {VERSION}'s bytes: {split}.",
        ]
    )
    emit(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
