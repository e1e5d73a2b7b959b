"""Layout stage: place the boxes and route the edges of one view (`LevelGraph`) in pixels.

    >>> from wandb_modprof._graph import GraphEdge, GraphNode, LevelGraph
    >>> a = GraphNode("v|in:x", "input", "x", "input")
    >>> b = GraphNode("fc#0", "module", "fc", "Linear")
    >>> lay = layout_level(LevelGraph("v", (a, b), (GraphEdge("v|in:x", "fc#0"),)))
    >>> [box.node_key for box in lay.boxes], len(lay.edges[0].points) >= 2
    (['v|in:x', 'fc#0'], True)

A layered (Sugiyama) layout, top to bottom:

1. Layers are ours: edges are oriented so inputs are sources and outputs sinks, remaining
   cycles are broken by reversing the back edges of a depth-first search in node order, then
   longest-path layering; sources that are not inputs move down to just above their first
   consumer (a positional embedding sits beside its use, not beside the inputs). Inputs get
   the first layer, outputs the last. Nodes without edges (usually the `self` node) go to the
   first layer, right of everything else there, so they never lengthen an edge.
2. igraph's `layout_sugiyama` orders each layer (barycenter crossing reduction) and gives grid
   positions to the nodes and to the dummy vertices of edges spanning several layers.
3. Pixels are ours: igraph's grid assumes equal-width vertices, our boxes fit their labels.
   Each layer keeps igraph's order; centres are the least-squares fit to igraph's positions
   (scaled by a typical box width) that keeps neighbours apart, so one wide label moves its
   neighbours, not the whole level. Dummies are narrow slots: an edge crosses a layer band
   vertically through its slot, and only runs diagonally in the box-free gaps between bands,
   so no edge crosses a box.

Limits: an input used by every one of n layered calls makes O(n^2) dummies (igraph and this
module both pay for them); edges drawn against the flow (only in cycles) run from the source's
top-centre to the destination's bottom-centre, and edges inside one layer (input to input,
output to output) from top-centre to top-centre over the layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

import igraph

from wandb_modprof._graph import GraphNode, LevelGraph

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
class LevelLayout:
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
    (56, 40)
    """
    text_w = max(len(node.label) * CHAR_W_PX, len(node.sublabel) * SUBLABEL_CHAR_W_PX)
    # Whole pixels: crisp box edges, and sizes that read well in a spec.
    w = max(MIN_BOX_W_PX, math.ceil(text_w + 2 * PAD_X_PX))
    h = math.ceil((FONT_PX + SUBLABEL_FONT_PX) * LINE_HEIGHT + 2 * PAD_Y_PX)
    return w, h


def layout_level(graph: LevelGraph) -> LevelLayout:
    """Lay out one view; deterministic (same graph, same layout). See the module docstring.

    Raises ValueError when node keys repeat or an edge names a node not in the graph.
    """
    nodes = graph.nodes
    index = {node.node_key: i for i, node in enumerate(nodes)}
    if len(index) != len(nodes):
        raise ValueError(f"view {graph.view_key!r}: node keys are not unique")
    edges = _unique_edges(graph, index)
    kinds = [node.kind for node in nodes]
    down, flipped = _orient(kinds, edges)
    layer = _layers(kinds, [down[i] for i in range(len(edges)) if down[i] is not None])
    sizes = [box_size(node) for node in nodes]

    # igraph gets only the downward edges (same-layer ones are routed by hand); its routing is
    # per igraph edge, so remember which of our edges each one is.
    ig_edges = [(i, e) for i, e in enumerate(down) if e is not None]
    centres, dummy_x = _place(layer, sizes, [e for _, e in ig_edges])

    n_layers = max(layer, default=-1) + 1
    band_h = [0.0] * n_layers
    for i, (_, h) in enumerate(sizes):
        band_h[layer[i]] = max(band_h[layer[i]], h)
    band_top = [0.0] * n_layers
    y = float(MARGIN_PX)
    for k in range(n_layers):
        band_top[k] = y
        y += band_h[k] + LAYER_GAP_PX
    height = y - LAYER_GAP_PX + MARGIN_PX if n_layers else 2.0 * MARGIN_PX
    left = min([c - w / 2 for c, (w, _) in zip(centres, sizes)] + [x for xs in dummy_x for x in xs])
    shift = MARGIN_PX - left if nodes else 0.0
    rights = [c + w / 2 for c, (w, _) in zip(centres, sizes)]
    width = max(rights, default=MARGIN_PX - shift) + shift + MARGIN_PX

    boxes: list[NodeBox] = []
    for i, node in enumerate(nodes):
        w, h = sizes[i]
        top = band_top[layer[i]] + (band_h[layer[i]] - h) / 2  # centred in the band
        boxes.append(NodeBox(node.node_key, round(centres[i] + shift - w / 2, 2), top, w, h))

    def centre_top(i: int) -> tuple[float, float]:
        return boxes[i].x_px + boxes[i].w_px / 2, boxes[i].y_px

    def centre_bottom(i: int) -> tuple[float, float]:
        return boxes[i].x_px + boxes[i].w_px / 2, boxes[i].y_px + boxes[i].h_px

    paths: list[tuple[tuple[float, float], ...]] = [()] * len(edges)
    for j, (i, (u, v)) in enumerate(ig_edges):
        (ux, uy), (vx, vy) = centre_bottom(u), centre_top(v)
        a, b = layer[u], layer[v]
        pts = [(ux, uy), (ux, band_top[a] + band_h[a])]
        for k, x in zip(range(a + 1, b), dummy_x[j]):
            x = round(x + shift, 2)
            pts += [(x, band_top[k]), (x, band_top[k] + band_h[k])]
        pts += [(vx, band_top[b]), (vx, vy)]
        paths[i] = _simplify(pts[::-1] if flipped[i] else pts)
    for i, (s, d) in enumerate(edges):
        if down[i] is None:  # same layer: over the band, through the gap (or margin) above it
            k = layer[s]
            lane = band_top[k] - (LAYER_GAP_PX if k else MARGIN_PX) / 2
            (sx, sy), (dx, dy) = centre_top(s), centre_top(d)
            paths[i] = _simplify([(sx, sy), (sx, lane), (dx, lane), (dx, dy)])
    return LevelLayout(
        view_key=graph.view_key,
        width_px=round(width, 2),
        height_px=height,
        boxes=tuple(boxes),
        edges=tuple(
            EdgePath(nodes[s].node_key, nodes[d].node_key, paths[i])
            for i, (s, d) in enumerate(edges)
        ),
    )


def _unique_edges(graph: LevelGraph, index: dict[str, int]) -> list[tuple[int, int]]:
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
    kinds: list[str], edges: list[tuple[int, int]]
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
    adj: list[list[int]] = [[] for _ in kinds]
    for i, e in enumerate(down):
        if e is not None:
            adj[e[0]].append(i)
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
            i = adj[u][pos]
            v = down[i][1]  # type: ignore[index]  # adj only holds edges that are not None
            if state[v] == 1:
                down[i] = (v, u)
                flipped[i] = not flipped[i]
            elif state[v] == 0:
                state[v] = 1
                stack.append((v, 0))
    return down, flipped


def _layers(kinds: list[str], edges: list[tuple[int, int]]) -> list[int]:
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
    layer = [0] * n
    for u in order:
        for v in succ[u]:
            layer[v] = max(layer[v], layer[u] + 1)
    has_pred = [False] * n
    for _, v in edges:
        has_pred[v] = True
    for u in reversed(order):  # successors are final when a source is reached
        if not has_pred[u] and succ[u] and kinds[u] != "input":
            layer[u] = min(layer[v] for v in succ[u]) - 1
    others = [layer[i] for i in range(n) if kinds[i] != "output"]
    bottom = max(others) + 1 if others else 0
    for i in range(n):
        if kinds[i] == "output":
            layer[i] = bottom
    # Compact: igraph adds no dummy vertices in empty layers (seen with igraph 1.0.0).
    rank = {v: r for r, v in enumerate(sorted(set(layer)))}
    return [rank[v] for v in layer]


def _place(
    layer: list[int], sizes: list[tuple[float, float]], edges: list[tuple[int, int]]
) -> tuple[list[float], list[list[float]]]:
    """Box centres (x, px) and per edge the x of its dummy slots, one per crossed layer."""
    n = len(layer)
    if n == 0:
        return [], []
    touched = [False] * n
    for u, v in edges:
        touched[u] = touched[v] = True
    g = igraph.Graph(n=n, edges=edges, directed=True)
    result = g.layout_sugiyama(layers=layer, hgap=1, vgap=1, maxiter=SUGIYAMA_MAXITER)
    coords: list[list[float]] = result.coords
    routing: list[list[list[float]]] = result.edge_routing
    # One grid unit of igraph is one typical box plus a gap: wide boxes push neighbours aside.
    unit = median(w for w, _ in sizes) + NODE_GAP_PX
    # Per layer: (grid x, tie-break, width, node index or -1 - slot id of a dummy).
    slots: list[list[tuple[float, int, float, int]]] = [[] for _ in range(max(layer) + 1)]
    for i in range(n):
        if touched[i]:
            slots[layer[i]].append((coords[i][0], i, sizes[i][0], i))
    dummy_ref: list[tuple[int, int]] = []
    for j, (u, v) in enumerate(edges):
        points = routing[j]
        assert len(points) == layer[v] - layer[u] - 1, "igraph: one dummy per crossed layer"
        for k, (x, _) in enumerate(points):
            slots[layer[u] + 1 + k].append((x, n + len(dummy_ref), 0.0, -1 - len(dummy_ref)))
            dummy_ref.append((j, k))
    centres = [0.0] * n
    dummy_x: list[list[float]] = [[0.0] * len(routing[j]) for j in range(len(edges))]
    for k, row in enumerate(slots):
        row.sort()
        seps = [
            (a[2] + b[2]) / 2 + (NODE_GAP_PX if a[3] >= 0 and b[3] >= 0 else EDGE_GAP_PX)
            for a, b in zip(row, row[1:])
        ]
        xs = _fit_ordered([s[0] * unit for s in row], seps)
        for (_, _, _, ref), x in zip(row, xs):
            if ref >= 0:
                centres[ref] = x
            else:
                j, d = dummy_ref[-1 - ref]
                dummy_x[j][d] = x
        # Nodes without edges: right of everything in their layer, in node order.
        right = xs[-1] + row[-1][2] / 2 + NODE_GAP_PX if row else 0.0
        for i in range(n):
            if layer[i] == k and not touched[i]:
                centres[i] = right + sizes[i][0] / 2
                right += sizes[i][0] + NODE_GAP_PX
    return centres, dummy_x


def _fit_ordered(desired: list[float], seps: list[float]) -> list[float]:
    """Positions closest to `desired` (least squares) with `x[i+1] - x[i] >= seps[i]`.

    With offsets o[i] = sum(seps[:i]) the constraint is that x[i] - o[i] never decreases:
    an isotonic regression of desired[i] - o[i], solved by pool-adjacent-violators in O(n).
    """
    offsets = [0.0]
    for s in seps:
        offsets.append(offsets[-1] + s)
    sums: list[float] = []
    counts: list[int] = []
    for d, o in zip(desired, offsets):
        s, c = d - o, 1
        while sums and sums[-1] / counts[-1] > s / c:
            s += sums.pop()
            c += counts.pop()
        sums.append(s)
        counts.append(c)
    fit: list[float] = []
    for s, c in zip(sums, counts):
        fit += [s / c] * c
    # Float rounding may eat a few ulps of a separation; never let it eat into a gap.
    out = [f + o for f, o in zip(fit, offsets)]
    for i in range(1, len(out)):
        out[i] = max(out[i], out[i - 1] + seps[i - 1])
    return out


def _simplify(points: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Drop repeated points and the middle of three points on one vertical/horizontal line."""
    out: list[tuple[float, float]] = []
    for p in points:
        if out and out[-1] == p:
            continue
        if len(out) >= 2 and (
            out[-2][0] == out[-1][0] == p[0] or out[-2][1] == out[-1][1] == p[1]
        ):
            out[-1] = p
        else:
            out.append(p)
    if len(out) == 1:  # src and dst touch (cannot happen with gaps > 0); keep two points
        out.append(out[0])
    return tuple(out)
