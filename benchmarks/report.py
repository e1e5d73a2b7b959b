"""Time to the first view of the HTML report (`wandb_modprof.sinks.report.html`) at the
table's row limit.

Run (full run about a minute; ``--quick`` is the CI smoke run: small models, one repeat):

    .venv/bin/python benchmarks/report.py [--quick] [--repeats N] [--out PATH]

Cases (synthetic models, the largest that still fit the table's 10,000 rows unreduced; the
`reduced` column says if one did not):

* ``nested``: `Sequential` of stages, each a `Sequential` of 25 blocks of
  `Linear -> ReLU -> Linear`: the first view holds the stages;
* ``flat``: one `Sequential` of N such blocks: the first view holds all N blocks (the worst
  case for drawing: every one of them is a box on the first screen).

Each model is profiled (`wandb_modprof.profile`, 3 steps), its report written, and then opened
``--repeats`` times (default 5) from file:// in headless Chromium (Debian's, as the browser
tests; every network request aborted), a fresh browser each time so nothing is cached. Timed:
from navigation start to `window.__modprof_ready`, which the report sets after the first
`runAsync()` of its view, i.e. when the first view's nodes are drawn (checked: the
scenegraph then holds them); in milliseconds of the page's own clock (`performance.now()`).
Target (the issue): first view < 2 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from _report import emit, revision
from torch import nn

import wandb_modprof

TARGET_MS = 2000.0
MAX_ROWS = 10_000
CHROMIUM = os.environ.get("MODPROF_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
COUNT_NODES_JS = """() => {
  let n = 0;
  const walk = (m) => {
    if (m.name === 'node_rect') n += m.items.length;
    for (const i of m.items || []) for (const c of i.items || []) walk(c);
  };
  walk(window.__modprof_view.scenegraph().root);
  return n;
}"""


def block(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))


def flat(blocks: int, width: int = 8) -> nn.Module:
    return nn.Sequential(*(block(width) for _ in range(blocks)))


def profile_of(model: nn.Module, width: int = 8) -> wandb_modprof.Profile:
    x = torch.randn(2, width)
    with wandb_modprof.profile(model) as prof:
        for _ in range(3):  # the structure pass, then two timed samples
            model(x).sum().backward()
    return prof


@dataclass
class Case:
    name: str
    shape: str
    prof: wandb_modprof.Profile


def fitted(name: str, quick: bool) -> Case:
    """The largest model of the family whose table fits MAX_ROWS unreduced (or a small one)."""
    if quick:
        size = 6
    else:
        # rows grow linearly in the block count: fit from two small models, then step down
        r1 = len(profile_of(_family(name, 8)).table().rows)
        r2 = len(profile_of(_family(name, 16)).table().rows)
        per = (r2 - r1) / 8
        size = int(8 + (MAX_ROWS - r1) / per)
    while True:
        prof = profile_of(_family(name, size))
        table = prof.table(MAX_ROWS)
        if quick or not table.reduced:
            break
        size -= 1
    shape = f"{size} blocks in stages of 25" if name == "nested" else f"{size} blocks"
    return Case(name, shape, prof)


def _family(name: str, size: int) -> nn.Module:
    # nested: `size` is the number of blocks, in stages of 25 (the last one may be shorter)
    if name == "nested":
        stages = [min(25, size - i) for i in range(0, size, 25)]
        return nn.Sequential(*(nn.Sequential(*(block(8) for _ in range(b))) for b in stages))
    return flat(size)


def opened_reports(path: Path, repeats: int, timeout_ms: int = 60_000) -> Iterator[Any]:
    """The report at `path` loaded `repeats` times, each in a fresh headless Chromium with
    every request but the file itself aborted: yields each page once its first view is drawn
    (`window.__modprof_ready`); a page error, a report error or any blocked request raises."""
    from playwright.sync_api import sync_playwright

    url = path.resolve().as_uri()
    with sync_playwright() as pw:
        for _ in range(repeats):
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                blocked: list[str] = []

                def route(r: Any, blocked: list[str] = blocked) -> None:
                    if r.request.url == url:
                        r.continue_()
                    else:
                        blocked.append(r.request.url)
                        r.abort()

                context.route("**/*", route)
                page = context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                page.goto(url)
                page.wait_for_function(
                    "() => window.__modprof_ready || window.__modprof_error", timeout=timeout_ms
                )
                failed = page.evaluate("() => window.__modprof_error || ''")
                if failed or errors or blocked:
                    raise RuntimeError(f"{path.name}: report failed: {failed} {errors} {blocked}")
                yield page
            finally:
                browser.close()


def open_times(path: Path, repeats: int) -> tuple[list[float], int]:
    times: list[float] = []
    nodes = 0
    for page in opened_reports(path, repeats):
        times.append(float(page.evaluate("() => window.__modprof_ready")))
        nodes = int(page.evaluate(COUNT_NODES_JS))
    return times, nodes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke run: small, 1 repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="also write the markdown report to this file")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    torch.manual_seed(0)
    torch.set_num_threads(1)

    from wandb_modprof.sinks.report.html import vega_bundle

    started = time.perf_counter()
    vega_bundle()
    bundle_s = time.perf_counter() - started

    lines = [
        "| case | model | rows | reduced | views | nodes in first view | HTML MB | write s "
        "| first view ms (min) | median | max | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    all_met = True
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("nested", "flat"):
            case = fitted(name, args.quick)
            table = case.prof.table(MAX_ROWS)
            views = len({r["view_key"] for r in table.resolved() if r["row_kind"] == "node"})
            path = Path(tmp) / f"{name}.html"
            started = time.perf_counter()
            case.prof.to_html(path)
            write_s = time.perf_counter() - started
            times, nodes = open_times(path, repeats)
            median = statistics.median(times)
            met = median < TARGET_MS
            all_met &= met
            lines.append(
                f"| {name} | {case.shape} | {len(table.rows)} | {table.reduced or 'no'} | "
                f"{views} | {nodes} | {path.stat().st_size / 1e6:.2f} | {write_s:.2f} | "
                f"{min(times):.0f} | {median:.0f} | {max(times):.0f} | < {TARGET_MS:.0f} | "
                f"{'yes' if met else 'NO'} |"
            )
    command = ".venv/bin/python benchmarks/report.py" + (
        " --quick" if args.quick else f" --repeats {repeats}"
    )
    report = "\n".join(
        [
            "## HTML report: time to the first view",
            "",
            f"`{command}` ({revision()}; {platform.machine()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}, torch {torch.__version__}; Chromium headless, "
            f"{repeats} fresh browser(s) per case; Vega bundle built in {bundle_s:.2f} s, once "
            "per process)",
            "",
            *lines,
            "",
        ]
    )
    emit(report, args.out)
    return 0 if all_met or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
