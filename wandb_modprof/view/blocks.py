"""Many siblings as one grid (see `wandb_modprof.view.layout`): a mixture-of-experts layer's
128 experts sit between the router and the combine, all with the same predecessors and
successors; laid out as one layer row they made the view thousands of pixels wide. Takes a
view's nodes, its edges as node-index pairs and its `heat`; finds each block of siblings
(`find_blocks`), sizes its grid (`grid_size`, the column count chosen for the view's aspect)
and places its members in the frame once the frame is placed (`grid_boxes`).

A block is more than 32 (`BLOCK_MIN_SIBLINGS - 1`) module nodes of one module type with the
same, non-empty, set of predecessors and successors; the view's group node of merged cheapest
modules (`view/reduce.py`) joins it, last, when its edges are the same too. Members are ranked
by the view's `heat` (forward + backward time, the median the panel colours by), hottest
first, unmeasured ones after them; without heat, in call order (node order). The order is the
grid's, row by row, so the hottest experts are the first row.

>>> from wandb_modprof.records.graph import GraphNode
>>> nodes = [GraphNode("v|in:x", "input", "x", "input")]
>>> nodes += [GraphNode(f"e.{i}#0", "module", f"e.{i}", "MLP") for i in range(40)]
>>> (block,) = find_blocks(nodes, [(0, i) for i in range(1, 41)], ())
>>> len(block.members), block.members[:3], block.preds, block.succs
(40, (1, 2, 3), (0,), ())
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from wandb_modprof.records.graph import GraphNode, ViewGraph
from wandb_modprof.view.geometry import (
    BLOCK_GAP_PX,
    BLOCK_HEAD_PX,
    BLOCK_MAX_COLS,
    BLOCK_MIN_COLS,
    BLOCK_MIN_SIBLINGS,
    BLOCK_PAD_PX,
    BLOCK_VIEW_ASPECT,
    MARGIN_PX,
    NodeBox,
)


@dataclass(frozen=True)
class Block:
    """Node indices of one block's members in grid order, its shared predecessors and
    successors (node indices, ascending), its module type, how many members are modules (the
    rest is the group node) and whether the order is by heat (else call order)."""

    members: tuple[int, ...]
    preds: tuple[int, ...]
    succs: tuple[int, ...]
    module_type: str
    modules: int
    by_heat: bool


@dataclass(frozen=True)
class Grid:
    """A block's grid: columns, rows, the cell every member's box takes, the frame's size."""

    cols: int
    rows: int
    cell_w: float
    cell_h: float
    w_px: float
    h_px: float


def find_blocks(
    nodes: Sequence[GraphNode], edges: Sequence[tuple[int, int]], heat: Sequence[float]
) -> list[Block]:
    """Every block of the view (see the module docstring), in the order of its first member."""
    preds: list[set[int]] = [set() for _ in nodes]
    succs: list[set[int]] = [set() for _ in nodes]
    for s, d in edges:
        succs[s].add(d)
        preds[d].add(s)
    siblings: dict[tuple[str, frozenset[int], frozenset[int]], list[int]] = {}
    for i, node in enumerate(nodes):
        if node.kind == "module" and (preds[i] or succs[i]):
            key = (node.sublabel, frozenset(preds[i]), frozenset(succs[i]))
            siblings.setdefault(key, []).append(i)
    by_heat = len(heat) == len(nodes)
    blocks = []
    for (module_type, before, after), members in siblings.items():
        if len(members) < BLOCK_MIN_SIBLINGS:
            continue
        group = [
            i
            for i, node in enumerate(nodes)
            if node.kind == "group" and preds[i] == before and succs[i] == after
        ]
        ranked = sorted(members, key=lambda i: _rank(heat[i]) if by_heat else (0, 0.0))
        blocks.append(
            Block(
                tuple(ranked + group[:1]),
                tuple(sorted(before)),
                tuple(sorted(after)),
                module_type,
                len(members),
                by_heat,
            )
        )
    return sorted(blocks, key=lambda b: min(b.members))


def drawn_rows(graph: ViewGraph) -> int:
    """The node and edge rows the table writes for `graph`: a row per node, per edge (each
    pair once, no self loops) and, where siblings form grids, a frame row per grid, with the
    grid's edges bundled as the layout draws them. `view/reduce.py` sizes views by it."""
    counts = Counter(n.sublabel for n in graph.nodes if n.kind == "module")
    if not counts or max(counts.values()) < BLOCK_MIN_SIBLINGS:  # the usual view: no grid
        return len(graph.nodes) + len(graph.edges)
    index = {n.node_key: i for i, n in enumerate(graph.nodes)}
    pairs = list(dict.fromkeys((index[e.src_key], index[e.dst_key]) for e in graph.edges))
    pairs = [(s, d) for s, d in pairs if s != d]
    found = find_blocks(graph.nodes, pairs, ())
    frame = {i: -1 - b for b, block in enumerate(found) for i in block.members}
    bundled = {(frame.get(s, s), frame.get(d, d)) for s, d in pairs}
    return len(graph.nodes) + len(found) + len(bundled)


def _rank(heat: float) -> tuple[int, float]:
    """Hottest first, unmeasured (NaN) last; `sorted` is stable, so ties keep call order."""
    return (1, 0.0) if math.isnan(heat) else (0, -heat)


def grid_size(widths: Sequence[float], height: float, others_h: float) -> Grid:
    """The grid for members of these box widths and this height: every cell as wide as the
    widest box (a grid, not a ragged row), and the column count (BLOCK_MIN_COLS to
    BLOCK_MAX_COLS, never more than the members) whose view, `others_h` px of other layers
    plus this frame, comes closest to BLOCK_VIEW_ASPECT; on a tie the fewer columns."""
    n = len(widths)
    cell_w = max(widths)
    best: Grid | None = None
    best_score = math.inf
    for cols in range(min(BLOCK_MIN_COLS, n), min(BLOCK_MAX_COLS, n) + 1):
        rows = -(-n // cols)
        w = 2 * BLOCK_PAD_PX + cols * cell_w + (cols - 1) * BLOCK_GAP_PX
        h = BLOCK_HEAD_PX + rows * height + (rows - 1) * BLOCK_GAP_PX + BLOCK_PAD_PX
        score = abs(math.log((w + 2 * MARGIN_PX) / (others_h + h)) - math.log(BLOCK_VIEW_ASPECT))
        if score < best_score - 1e-9:
            best, best_score = Grid(cols, rows, cell_w, height, float(w), float(h)), score
    assert best is not None  # n >= BLOCK_MIN_SIBLINGS > 0
    return best


def grid_boxes(frame: NodeBox, grid: Grid, keys: Sequence[str]) -> list[NodeBox]:
    """The members' boxes (`keys` in grid order) inside the placed `frame`, row by row."""
    boxes = []
    for k, key in enumerate(keys):
        row, col = divmod(k, grid.cols)
        x = frame.x_px + BLOCK_PAD_PX + col * (grid.cell_w + BLOCK_GAP_PX)
        y = frame.y_px + BLOCK_HEAD_PX + row * (grid.cell_h + BLOCK_GAP_PX)
        boxes.append(NodeBox(key, round(x, 2), round(y, 2), grid.cell_w, grid.cell_h))
    return boxes
