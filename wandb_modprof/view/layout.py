"""Layout stage: place the boxes and route the edges of one view (`ViewGraph`) in pixels,
for the Vega spec to draw (`layout_view`, `box_size`, and the font and spacing constants).

A layered (Sugiyama) layout, top to bottom:

1. Layers are ours: edges are oriented so inputs are sources and outputs sinks, remaining
   cycles are broken by reversing the back edges of a depth-first search in node order, then
   longest-path layering; sources that are not inputs move down to just above their first
   consumer (a positional embedding sits beside its use, not beside the inputs). Inputs get
   the first layer to themselves, outputs the last. Nodes without edges (usually the `self`
   node) go to the first layer, right of everything else there (unused inputs first), so
   they never lengthen an edge.
2. Edges spanning several layers get dummy vertices, one per crossed layer; the edges of one
   source share them (a lane that branches off above each target). igraph's
   `layout_sugiyama` orders each layer (barycenter crossing reduction) and gives every
   vertex, box or dummy, a grid x.
3. Pixels are ours: igraph's grid assumes equal-width vertices, our boxes fit their labels.
   Grid columns map to pixels by one increasing function, each column as narrow as the
   widest thing in it allows, so one wide label widens one column, not the whole view, and
   what igraph lined up stays lined up. Dummies are narrow slots: an edge crosses a layer
   band vertically through its slot, and runs diagonally only in the box-free gaps between
   bands, so no edge crosses a box.

Edges drawn against the flow (only in cycles) run from the source's top-centre to the
destination's bottom-centre; edges inside one layer (input to input, output to output) from
top-centre to top-centre, over the layer. Limit: a view whose own code adds every call's
output to a residual stream has an edge from every call to every later one: O(n^2) edges and
lane dummies (80 calls: 0.1 s, 200 calls: 1.3 s).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import igraph

from wandb_modprof.records.graph import GraphNode, ViewGraph

# Shared with the Vega spec, which draws the text: box sizes assume these fonts.
FONT_PX = 12
SUBLABEL_FONT_PX = 10
# Average glyph advance of a sans font is about 0.5-0.55 em for mixed-case identifiers;
# 0.62 em leaves room for capitals ("MultiheadAttention") and for font substitution.
CHAR_W_PX = 0.62 * FONT_PX
SUBLABEL_CHAR_W_PX = 0.62 * SUBLABEL_FONT_PX
LINE_HEIGHT = 1.25  # line box / font size
PAD_X_PX = 8
PAD_Y_PX = 6
MIN_BOX_W_PX = 40
LAYER_GAP_PX = 40  # vertical gap between layer bands, where edges bend
NODE_GAP_PX = 16  # horizontal gap between neighbouring boxes
EDGE_GAP_PX = 8  # horizontal clearance of an edge crossing a layer band, to boxes and edges
MARGIN_PX = 16
# igraph's crossing-reduction sweeps; more barely changes model graphs and costs time.
SUGIYAMA_MAXITER = 100


@dataclass(frozen=True)
class NodeBox:
    """A node's box; `x_px`, `y_px` is the top-left corner."""

    node_key: str
    x_px: float
    y_px: float
    w_px: float
    h_px: float


@dataclass(frozen=True)
class EdgePath:
    """A polyline (at least two points) from the bottom-centre of the source box to the
    top-centre of the destination box (see the module docstring for cycles)."""

    src_key: str
    dst_key: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class ViewLayout:
    """Boxes in the graph's node order, edges in its edge order (self loops dropped, duplicate
    edges once, at their first position)."""

    view_key: str
    width_px: float
    height_px: float
    boxes: tuple[NodeBox, ...]
    edges: tuple[EdgePath, ...]


def box_size(node: GraphNode) -> tuple[float, float]:
    """Width and height in pixels of a box holding the label line over the sublabel line.

    >>> box_size(GraphNode("fc#0", "module", "fc", "Linear"))
    (54.0, 40.0)
    """
    text_w = max(len(node.label) * CHAR_W_PX, len(node.sublabel) * SUBLABEL_CHAR_W_PX)
    # Whole pixels: crisp box edges, and sizes that read well in a spec.
    w = max(MIN_BOX_W_PX, math.ceil(text_w + 2 * PAD_X_PX))
    h = math.ceil((FONT_PX + SUBLABEL_FONT_PX) * LINE_HEIGHT + 2 * PAD_Y_PX)
    return float(w), float(h)


def layout_view(graph: ViewGraph) -> ViewLayout:
    """Lay out one view; deterministic (same graph, same layout). See the module docstring.

    >>> from wandb_modprof.records.graph import GraphEdge
    >>> x = GraphNode("v|in:x", "input", "x", "input")
    >>> fc = GraphNode("fc#0", "module", "fc", "Linear")
    >>> lay = layout_view(ViewGraph("v", (x, fc), (GraphEdge("v|in:x", "fc#0"),)))
    >>> [(b.node_key, b.x_px, b.y_px, b.w_px, b.h_px) for b in lay.boxes]
    [('v|in:x', 19.5, 16.0, 47.0, 40.0), ('fc#0', 16.0, 96.0, 54.0, 40.0)]
    >>> lay.edges[0].points  # bottom-centre of x to top-centre of fc
    ((43.0, 56.0), (43.0, 96.0))

    Raises ValueError when node keys repeat or an edge names a node not in the graph.
    """
    nodes = graph.nodes
    index = {node.node_key: i for i, node in enumerate(nodes)}
    if len(index) != len(nodes):
        raise ValueError(f"view {graph.view_key!r}: node keys are not unique")
    edges = _unique_edges(graph, index)
    if not nodes:
        return ViewLayout(graph.view_key, 2.0 * MARGIN_PX, 2.0 * MARGIN_PX, (), ())
    kinds = [node.kind for node in nodes]
    down, flipped = _orient(kinds, edges)
    layer = _layers(kinds, [e for e in down if e is not None])
    sizes = [box_size(node) for node in nodes]

    # Only the downward edges are placed; same-layer ones are routed by hand below.
    ig_edges = [(i, e) for i, e in enumerate(down) if e is not None]
    centres, dummy_x = _place(kinds, layer, sizes, [e for _, e in ig_edges])

    n_layers = max(layer) + 1
    band_h = [0.0] * n_layers
    for i, (_, h) in enumerate(sizes):
        band_h[layer[i]] = max(band_h[layer[i]], h)
    band_top = [0.0] * n_layers
    y = float(MARGIN_PX)
    for k in range(n_layers):
        band_top[k] = y
        y += band_h[k] + LAYER_GAP_PX
    height = y - LAYER_GAP_PX + MARGIN_PX
    dummies = [x for xs in dummy_x for x in xs]
    left = min([c - w / 2 for c, (w, _) in zip(centres, sizes, strict=True)] + dummies)
    right = max([c + w / 2 for c, (w, _) in zip(centres, sizes, strict=True)] + dummies)
    shift = MARGIN_PX - left
    width = right - left + 2 * MARGIN_PX

    boxes: list[NodeBox] = []
    for i, node in enumerate(nodes):
        w, h = sizes[i]
        top = band_top[layer[i]] + (band_h[layer[i]] - h) / 2  # centred in the band
        boxes.append(NodeBox(node.node_key, round(centres[i] + shift - w / 2, 2), top, w, h))

    def centre_top(i: int) -> tuple[float, float]:
        return boxes[i].x_px + boxes[i].w_px / 2, boxes[i].y_px

    def centre_bottom(i: int) -> tuple[float, float]:
        return boxes[i].x_px + boxes[i].w_px / 2, boxes[i].y_px + boxes[i].h_px

    # Edges into one box end at ports spread over its top, in the order they arrive from
    # (left to right), so arrowheads do not pile up on one point and no two edges cross there.
    arrivals: dict[int, list[tuple[float, int]]] = {}
    for j, (i, (u, v)) in enumerate(ig_edges):
        if not flipped[i]:
            before = dummy_x[j][-1] + shift if dummy_x[j] else centre_bottom(u)[0]
            arrivals.setdefault(v, []).append((before, j))
    port_x: dict[int, float] = {}
    for v, incoming in arrivals.items():
        incoming.sort()
        box = boxes[v]
        for k, (_, j) in enumerate(incoming):
            port_x[j] = round(box.x_px + box.w_px * (0.15 + 0.7 * (k + 0.5) / len(incoming)), 2)

    paths: list[tuple[tuple[float, float], ...]] = [()] * len(edges)
    for j, (i, (u, v)) in enumerate(ig_edges):
        (ux, uy), (vx, vy) = centre_bottom(u), centre_top(v)
        vx = port_x.get(j, vx)
        a, b = layer[u], layer[v]
        pts = [(ux, uy), (ux, band_top[a] + band_h[a])]
        for k, dx in zip(range(a + 1, b), dummy_x[j], strict=True):
            x = round(dx + shift, 2)
            pts += [(x, band_top[k]), (x, band_top[k] + band_h[k])]
        pts += [(vx, band_top[b]), (vx, vy)]
        paths[i] = _simplify(pts[::-1] if flipped[i] else pts)
    for i, (s, d) in enumerate(edges):
        if down[i] is None:  # same layer: over the band, through the gap (or margin) above it
            k = layer[s]
            lane = band_top[k] - (LAYER_GAP_PX if k else MARGIN_PX) / 2
            (sx, sy), (dx, dy) = centre_top(s), centre_top(d)
            paths[i] = _simplify([(sx, sy), (sx, lane), (dx, lane), (dx, dy)])
    return ViewLayout(
        view_key=graph.view_key,
        width_px=round(width, 2),
        height_px=height,
        boxes=tuple(boxes),
        edges=tuple(
            EdgePath(nodes[s].node_key, nodes[d].node_key, paths[i])
            for i, (s, d) in enumerate(edges)
        ),
    )


def _unique_edges(graph: ViewGraph, index: dict[str, int]) -> list[tuple[int, int]]:
    """Edges as index pairs in first-occurrence order, without self loops and duplicates."""
    seen: set[tuple[int, int]] = set()
    out: list[tuple[int, int]] = []
    for edge in graph.edges:
        for key in (edge.src_key, edge.dst_key):
            if key not in index:
                raise ValueError(
                    f"view {graph.view_key!r}: edge {edge.src_key!r} -> {edge.dst_key!r} "
                    f"names {key!r}, which is not a node of the view"
                )
        pair = (index[edge.src_key], index[edge.dst_key])
        if pair[0] != pair[1] and pair not in seen:
            seen.add(pair)
            out.append(pair)
    return out


def _orient(
    kinds: Sequence[str], edges: list[tuple[int, int]]
) -> tuple[list[tuple[int, int] | None], list[bool]]:
    """Each edge as (upper, lower) for the layering, or None if it stays inside one layer
    (input to input, output to output), plus whether it was turned against its direction."""
    down: list[tuple[int, int] | None] = []
    flipped: list[bool] = []
    for s, d in edges:
        if kinds[s] == kinds[d] and kinds[s] in ("input", "output"):
            down.append(None)
            flipped.append(False)
        else:
            turn = kinds[d] == "input" or kinds[s] == "output"
            down.append((d, s) if turn else (s, d))
            flipped.append(turn)
    # Break the remaining cycles: reverse the back edges of an iterative DFS in node order.
    # Inputs are sources and outputs sinks by now, so they are never on a cycle.
    adj: list[list[tuple[int, int]]] = [[] for _ in kinds]  # (head, edge index) per tail
    for i, e in enumerate(down):
        if e is not None:
            adj[e[0]].append((e[1], i))
    state = [0] * len(kinds)  # 0 new, 1 on the stack, 2 done
    for root in range(len(kinds)):
        if state[root]:
            continue
        state[root] = 1
        stack = [(root, 0)]
        while stack:
            u, pos = stack[-1]
            if pos == len(adj[u]):
                state[u] = 2
                stack.pop()
                continue
            stack[-1] = (u, pos + 1)
            v, i = adj[u][pos]
            if state[v] == 1:
                down[i] = (v, u)
                flipped[i] = not flipped[i]
            elif state[v] == 0:
                state[v] = 1
                stack.append((v, 0))
    return down, flipped


def _layers(kinds: Sequence[str], edges: list[tuple[int, int]]) -> list[int]:
    """Layer index per node for a DAG given as (upper, lower) pairs; compact, 0 at the top."""
    n = len(kinds)
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for u, v in edges:
        succ[u].append(v)
        indeg[v] += 1
    order = [i for i in range(n) if indeg[i] == 0]  # Kahn's algorithm, FIFO: deterministic
    for u in order:
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                order.append(v)
    assert len(order) == n, "cycle left after orientation"
    has_pred = [False] * n
    for _, v in edges:
        has_pred[v] = True
    # The first layer belongs to the inputs (and nodes without edges): the rest start below.
    below = 1 if "input" in kinds else 0
    layer = [
        0 if kind == "input" or not (out or into) else below
        for kind, out, into in zip(kinds, succ, has_pred, strict=True)
    ]
    for u in order:
        for v in succ[u]:
            layer[v] = max(layer[v], layer[u] + 1)
    for u in reversed(order):  # successors are final when a source is reached
        if not has_pred[u] and succ[u] and kinds[u] != "input":
            layer[u] = min(layer[v] for v in succ[u]) - 1
    others = [layer[i] for i in range(n) if kinds[i] != "output"]
    bottom = max(others) + 1 if others else 0
    for i in range(n):
        if kinds[i] == "output":
            layer[i] = bottom
    # Compact: no empty bands.
    rank = {v: r for r, v in enumerate(sorted(set(layer)))}
    return [rank[v] for v in layer]


def _place(
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
    grid_x: list[float] = [0.0] * len(v_layer)
    if chain:
        g = igraph.Graph(n=len(v_layer), edges=chain, directed=True)
        coords = g.layout_sugiyama(layers=v_layer, hgap=1, vgap=1, maxiter=SUGIYAMA_MAXITER)
        grid_x = [x for x, _ in coords]
    rows: list[list[int]] = [[] for _ in range(max(layer) + 1)]
    for v in sorted(range(len(v_layer)), key=lambda v: (grid_x[v], v)):
        rows[v_layer[v]].append(v)

    def sep(a: int, b: int) -> float:  # least distance of neighbouring centres in a layer
        gap = NODE_GAP_PX if a < len(ids) and b < len(ids) else EDGE_GAP_PX
        return (v_width[a] + v_width[b]) / 2 + gap

    px = _columns(grid_x, rows, sep)
    loose: list[list[int]] = [[] for _ in rows]
    # Unused inputs first: they belong with the inputs; then node order.
    for i in sorted(range(n), key=lambda i: (kinds[i] != "input", i)):
        if not touched[i]:
            loose[layer[i]].append(i)
    centres = [0.0] * n
    for row, extra in zip(rows, loose, strict=True):
        # Nodes without edges: right of everything in their layer.
        right = px[row[-1]] + v_width[row[-1]] / 2 + NODE_GAP_PX if row else 0.0
        for i in extra:
            centres[i] = right + sizes[i][0] / 2
            right += sizes[i][0] + NODE_GAP_PX
    for i in ids:
        centres[i] = px[vid[i]]
    return centres, [[px[d] for d in ds] for ds in dummies]


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


def _simplify(points: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Drop repeated points and the middle of three points on one vertical/horizontal line."""
    out: list[tuple[float, float]] = []
    for p in points:
        if out and out[-1] == p:
            continue
        if len(out) >= 2 and (out[-2][0] == out[-1][0] == p[0] or out[-2][1] == out[-1][1] == p[1]):
            out[-1] = p
        else:
            out.append(p)
    if len(out) == 1:  # src and dst touch (cannot happen with gaps > 0); keep two points
        out.append(out[0])
    return tuple(out)
