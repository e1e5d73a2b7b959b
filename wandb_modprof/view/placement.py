"""Steps 2 and 3 of the layout (see `wandb_modprof.view.layout`): where each box and each edge
lane goes across. Takes the node kinds, their layers and box sizes, and the downward edges;
adds one dummy vertex per layer an edge lane crosses, has igraph's `layout_sugiyama` order
every layer and give every vertex a grid x, then maps grid columns to pixels. Gives each box's
centre x and, per edge, the x of its dummy slots (before the margin shift).

>>> centres, lanes = place(["input", "module"], [0, 1], [(47.0, 40.0), (54.0, 40.0)], [(0, 1)])
>>> centres, lanes
([0.0, 0.0], [[]])
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import igraph

from wandb_modprof.view.geometry import EDGE_GAP_PX, NODE_GAP_PX, SUGIYAMA_MAXITER


@dataclass(frozen=True)
class _Vertices:
    """igraph's vertices: first the boxes with edges, then the dummies, with their layers and
    widths (0 for dummies), the chain of edges igraph orders them by, and per edge its dummies
    (consecutive vertex ids, one per layer crossed)."""

    layer: list[int]
    width: list[float]
    boxes: int
    chain: list[tuple[int, int]]
    dummies: list[range]


def place(
    kinds: Sequence[str],
    layer: list[int],
    sizes: list[tuple[float, float]],
    edges: list[tuple[int, int]],
) -> tuple[list[float], list[list[float]]]:
    """Box centres (x, px) and per edge the x of its dummy slots, one per crossed layer."""
    n = len(layer)
    touched = [False] * n
    for u, v in edges:
        touched[u] = touched[v] = True
    # igraph's vertices: the nodes with edges (the others would take grid places among them,
    # holes once moved to the end of their layer), then the dummies. The dummies are ours,
    # not igraph's: igraph 1.0.0 scrambles `Layout.edge_routing` when the graph has several
    # components, and adds no dummies in layers where none of its vertices lie.
    ids = [i for i in range(n) if touched[i]]
    vid = {i: k for k, i in enumerate(ids)}
    verts = _vertices(ids, vid, layer, sizes, edges)
    grid_x: list[float] = [0.0] * len(verts.layer)
    if verts.chain:
        g = igraph.Graph(n=len(verts.layer), edges=verts.chain, directed=True)
        coords = g.layout_sugiyama(layers=verts.layer, hgap=1, vgap=1, maxiter=SUGIYAMA_MAXITER)
        grid_x = [x for x, _ in coords]
    rows: list[list[int]] = [[] for _ in range(max(layer) + 1)]
    for v in sorted(range(len(verts.layer)), key=lambda v: (grid_x[v], v)):
        rows[verts.layer[v]].append(v)

    def sep(a: int, b: int) -> float:  # least distance of neighbouring centres in a layer
        gap = NODE_GAP_PX if a < verts.boxes and b < verts.boxes else EDGE_GAP_PX
        return (verts.width[a] + verts.width[b]) / 2 + gap

    px = _columns(grid_x, rows, sep)
    centres = [0.0] * n
    for i in ids:
        centres[i] = px[vid[i]]
    _place_loose(kinds, layer, sizes, touched, rows, px, verts.width, centres)
    return centres, [[px[d] for d in ds] for ds in verts.dummies]


def _vertices(
    ids: list[int],
    vid: dict[int, int],
    layer: list[int],
    sizes: list[tuple[float, float]],
    edges: list[tuple[int, int]],
) -> _Vertices:
    v_layer = [layer[i] for i in ids]
    v_width = [sizes[i][0] for i in ids]
    # Edges from one node share its dummies (a "lane" down to its deepest target) and leave
    # the lane above their targets: a residual stream is one line with branches, not one line
    # per edge, which would make a view whose own code adds every call's output to the stream
    # O(n) lanes wide and O(n^3) dummies big.
    reach: dict[int, int] = {}
    for u, v in edges:
        reach[u] = max(reach.get(u, 0), layer[v])
    lane: dict[int, int] = {}  # node -> its dummy vertex in the layer below it
    chain: list[tuple[int, int]] = []
    for u, deepest in reach.items():
        lane[u] = len(v_layer)
        for k in range(layer[u] + 1, deepest):
            v_layer.append(k)
            v_width.append(0.0)
            chain.append((vid[u] if k == layer[u] + 1 else len(v_layer) - 2, len(v_layer) - 1))
    dummies: list[range] = []
    for u, v in edges:
        dummies.append(range(lane[u], lane[u] + layer[v] - layer[u] - 1))
        chain.append((dummies[-1][-1] if dummies[-1] else vid[u], vid[v]))
    return _Vertices(v_layer, v_width, len(ids), chain, dummies)


def _place_loose(
    kinds: Sequence[str],
    layer: list[int],
    sizes: list[tuple[float, float]],
    touched: list[bool],
    rows: list[list[int]],
    px: list[float],
    v_width: list[float],
    centres: list[float],
) -> None:
    """Nodes without edges into `centres`: right of everything in their layer, unused inputs
    first (they belong with the inputs), then node order."""
    loose: list[list[int]] = [[] for _ in rows]
    for i in sorted(range(len(layer)), key=lambda i: (kinds[i] != "input", i)):
        if not touched[i]:
            loose[layer[i]].append(i)
    for row, extra in zip(rows, loose, strict=True):
        right = px[row[-1]] + v_width[row[-1]] / 2 + NODE_GAP_PX if row else 0.0
        for i in extra:
            centres[i] = right + sizes[i][0] / 2
            right += sizes[i][0] + NODE_GAP_PX


def _columns(
    grid_x: list[float], rows: list[list[int]], sep: Callable[[int, int], float]
) -> list[float]:
    """Pixel x per vertex: igraph's grid x mapped to pixels by one increasing function.

    Each grid column sits as far right of the previous ones as the layers it shares with them
    demand (`sep` between neighbours in a row, rows sorted by grid x), then moves to the middle
    of its slack. One function for all layers keeps every vertical run igraph lined up
    straight; a column holding only edge lanes is EDGE_GAP_PX wide, not a box wide.
    """
    cols = sorted(set(grid_x))
    col = {x: c for c, x in enumerate(cols)}
    before: list[list[tuple[int, float]]] = [[] for _ in cols]
    after: list[list[tuple[int, float]]] = [[] for _ in cols]
    for row in rows:
        for a, b in itertools.pairwise(row):
            ca, cb = col[grid_x[a]], col[grid_x[b]]
            if ca < cb:
                before[cb].append((ca, sep(a, b)))
                after[ca].append((cb, sep(a, b)))
    lo = [0.0] * len(cols)  # leftmost place of each column
    for c in range(1, len(cols)):
        lo[c] = max([lo[c - 1]] + [lo[a] + s for a, s in before[c]])
    hi = lo[:]  # rightmost place, the total width kept
    for c in range(len(cols) - 2, -1, -1):
        hi[c] = min([hi[c + 1]] + [hi[b] - s for b, s in after[c]])
    px = [(lo[col[x]] + hi[col[x]]) / 2 for x in grid_x]
    # igraph gives the vertices of one layer distinct grid x; should two ever share one (or
    # rounding eat an ulp of a gap), push the right one over rather than overlap.
    for row in rows:
        for a, b in itertools.pairwise(row):
            px[b] = max(px[b], px[a] + sep(a, b))
    return px
