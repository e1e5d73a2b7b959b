"""Time of the layout stage (`wandb_modprof.view.layout.layout_view`) on large synthetic views.

Run (full run a few seconds; ``--quick`` is the CI smoke run, small graphs, one repeat):

    .venv/bin/python benchmarks/layout.py [--quick] [--repeats N] [--out PATH]

Cases
-----
* ``chain+skips``: one view holding a chain of 2,000 calls (``in -> m0 -> ... -> out``) with
  a residual skip around every pair of calls (``m[i] -> m[i+2]`` for even ``i``) and a longer
  one every 10 calls (``m[i] -> m[i+10]``): 2,000 layers, edges spanning 2 and 10 layers;
* ``model-like``: the views of a transformer-shaped call tree with about 2,000 invocations:
  a root view (embeddings, 24 blocks, final norm, head) and 24 block views of 80 calls each
  (20 sub-layers of norm -> linear -> activation -> linear, the sub-layer's input skipping
  round it as a residual); every view also has its edge-less ``self`` node. Timed is the
  layout of all 25 views, one after the other, as a report would do;
* ``fan``: one input feeding 2,000 calls side by side (labels of varied length) that all
  feed one output: a single 2,000-wide layer (64 module types, so that no 33 siblings share one);
* ``grid``: the same fan with one module type, a mixture-of-experts layer's shape: the 2,000
  siblings are drawn as a grid in one frame with bundled edges (`view/blocks.py`);
* ``residual-stream``: a stress case beyond the issue's three: one view of 80 calls whose own
  code adds every call's output to the stream (``x = x + f(x)``), so the structure pass
  records an edge from every call (and the input) to every later call: 3,321 edges.

Each case is laid out ``--repeats`` times (default 7) after one untimed warm-up run;
``median``/``min``/``max`` are over the repeats, in milliseconds of wall time
(``time.perf_counter``). The issue's target: well under a second for each case.

Timings include Python's cyclic garbage collector, as a real run would: importing
wandb_modprof imports torch, and a full collection, which scans torch's many objects too,
costs about 80 ms here. The allocations of the 2,000-node cases set one off about every
second repeat, so ``max`` (and for ``chain+skips`` even the median) can be 3-4x ``min``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import igraph
from _report import emit, revision

from wandb_modprof.records.graph import GraphEdge, GraphNode, ViewGraph
from wandb_modprof.view.layout import layout_view

TARGET_MS = 1000.0


# ---- synthetic views -----------------------------------------------------------------------
def _view(
    view: str, calls: list[tuple[str, str]], edges: list[tuple[str, str]], inputs: int = 1
) -> ViewGraph:
    """A view with `inputs` inputs, the given (key, type) calls, one output and `self`.

    In `edges`, "in", "in1", ... name the inputs and "out" the output."""
    nodes = [GraphNode(f"{view}|in:{i}", "input", f"x{i}", "input") for i in range(inputs)]
    nodes += [GraphNode(key, "module", key.rsplit(".", 1)[-1], kind) for key, kind in calls]
    nodes += [
        GraphNode(f"{view}|out:0", "output", "out", "output"),
        GraphNode(f"{view}|self", "self", "self", "own code"),
    ]

    def key(name: str) -> str:
        if name == "out":
            return f"{view}|out:0"
        if name.startswith("in"):
            return f"{view}|in:{name[2:] or 0}"
        return name

    graph_edges = tuple(sorted({GraphEdge(key(s), key(d)) for s, d in edges}, key=_edge_key))
    return ViewGraph(view, tuple(nodes), graph_edges)


def _edge_key(edge: GraphEdge) -> tuple[str, str]:
    return edge.src_key, edge.dst_key


def chain_with_skips(n: int) -> list[ViewGraph]:
    calls = [(f"m{i}", "Linear") for i in range(n)]
    edges = [("in", "m0"), (f"m{n - 1}", "out")]
    edges += [(f"m{i}", f"m{i + 1}") for i in range(n - 1)]
    edges += [(f"m{i}", f"m{i + 2}") for i in range(0, n - 2, 2)]
    edges += [(f"m{i}", f"m{i + 10}") for i in range(0, n - 10, 10)]
    return [_view("chain", calls, edges)]


def model_like(blocks: int, sublayers: int) -> list[ViewGraph]:
    """Root view plus one view per block; a block has 4 calls per sub-layer."""
    root_calls = [("wte", "Embedding"), ("wpe", "Embedding"), ("drop", "Dropout")]
    root_calls += [(f"h.{b}", "Block") for b in range(blocks)]
    root_calls += [("ln_f", "LayerNorm"), ("lm_head", "Linear")]
    root_edges = [("in", "wte"), ("wte", "drop"), ("wpe", "drop"), ("drop", "h.0")]
    root_edges += [(f"h.{b}", f"h.{b + 1}") for b in range(blocks - 1)]
    root_edges += [(f"h.{blocks - 1}", "ln_f"), ("ln_f", "lm_head"), ("lm_head", "out")]
    views = [_view("model", root_calls, root_edges)]
    for b in range(blocks):
        p = f"h.{b}"
        calls: list[tuple[str, str]] = []
        edges: list[tuple[str, str]] = []
        stream = "in"  # producer of the residual stream entering the sub-layer
        for s in range(sublayers):
            norm, up, act, down = (f"{p}.{s}.{name}" for name in ("norm", "up", "act", "down"))
            calls += [(norm, "LayerNorm"), (up, "Linear"), (act, "GELU"), (down, "Linear")]
            edges += [(stream, norm), (norm, up), (up, act), (act, down)]
            if s + 1 < sublayers:
                edges.append((stream, f"{p}.{s + 1}.norm"))  # the residual skips the sub-layer
            stream = down
        edges += [(stream, "out")]
        views.append(_view(p, calls, edges))
    return views


def residual_stream(n: int) -> list[ViewGraph]:
    calls = [(f"m{i}", "Block") for i in range(n)]
    names = ["in", *(key for key, _ in calls)]
    edges = [(a, b) for j, b in enumerate(names) for a in names[:j]]
    edges += [(a, "out") for a in names]
    return [_view("stream", calls, edges)]


def fan(n: int, grid: bool = False) -> list[ViewGraph]:
    # 64 module types: at most 32 siblings of one type, so the fan stays one layered row; with
    # `grid`, one type: more than 32 siblings of it are a grid in a frame (`view/blocks.py`)
    types = 1 if grid else 64
    calls = [(f"m{i}{'_wide' * (i % 5)}", f"Linear{i % types}") for i in range(n)]
    edges = [("in", key) for key, _ in calls] + [(key, "out") for key, _ in calls]
    return [_view("grid" if grid else "fan", calls, edges)]


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], list[ViewGraph]]


def cases(quick: bool) -> list[Case]:
    if quick:
        return [
            Case("chain+skips", lambda: chain_with_skips(200)),
            Case("model-like", lambda: model_like(blocks=4, sublayers=5)),
            Case("fan", lambda: fan(200)),
            Case("grid", lambda: fan(200, grid=True)),
            Case("residual-stream", lambda: residual_stream(20)),
        ]
    return [
        Case("chain+skips", lambda: chain_with_skips(2000)),
        Case("model-like", lambda: model_like(blocks=24, sublayers=20)),
        Case("fan", lambda: fan(2000)),
        Case("grid", lambda: fan(2000, grid=True)),
        Case("residual-stream", lambda: residual_stream(80)),
    ]


# ---- measurement ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    case: str
    views: int
    nodes: int
    edges: int
    times_ms: list[float]


def measure(case: Case, repeats: int) -> Row:
    views = case.build()
    for view in views:  # warm-up: imports, igraph's first call
        layout_view(view)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for view in views:
            layout_view(view)
        times.append((time.perf_counter() - started) * 1000)
    return Row(
        case=case.name,
        views=len(views),
        nodes=sum(len(v.nodes) for v in views),
        edges=sum(len(v.edges) for v in views),
        times_ms=times,
    )


def markdown_table(rows: list[Row], judge: bool) -> str:
    columns = ["case", "views", "nodes", "edges", "median ms", "min ms", "max ms"]
    columns += ["target", "met"] if judge else []
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        median = statistics.median(row.times_ms)
        cells = [
            row.case,
            str(row.views),
            str(row.nodes),
            str(row.edges),
            f"{median:.1f}",
            f"{min(row.times_ms):.1f}",
            f"{max(row.times_ms):.1f}",
        ]
        if judge:
            cells += [f"< {TARGET_MS:.0f} ms", "yes" if median < TARGET_MS else "NO"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time the layout stage on large synthetic views (see the module docstring)."
    )
    parser.add_argument("--quick", action="store_true", help="small graphs, 1 repeat (CI smoke)")
    parser.add_argument("--repeats", type=int, help="timed repeats per case (default 7; quick 1)")
    parser.add_argument("--out", metavar="PATH", help="also write the markdown report to PATH")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 7)
    rows = [measure(case, repeats) for case in cases(args.quick)]
    given = sys.argv[1:] if argv is None else argv
    command = " ".join([".venv/bin/python benchmarks/layout.py", *given])
    quick_note = "--quick: small graphs, a smoke test of the script; not judged.\n\n"
    report = (
        f"Command: `{command}`\n\n"
        f"{quick_note if args.quick else ''}"
        f"git {revision()}, igraph {igraph.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}. {repeats} timed repeat(s) per case after one warm-up; "
        f"times are for laying out all views of the case.\n\n"
        f"{markdown_table(rows, judge=not args.quick)}\n"
    )
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
