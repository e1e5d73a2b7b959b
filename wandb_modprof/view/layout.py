"""Layout stage: place the boxes and route the edges of one view (`ViewGraph`) in pixels,
for the Vega spec to draw (`layout_view`, `box_size`, and the font and spacing constants).
Takes a `ViewGraph`; gives a `ViewLayout`. The steps below live in `layering` (1),
`placement` (2, 3: the igraph call and grid columns to pixels) and `routing` (bands, edge
paths, ports); sizes, constants and result types in `geometry`, re-exported here.

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

Many siblings (`blocks`): more than 32 modules of one type with the same predecessors and
successors (a mixture-of-experts layer's experts) are one vertex of the steps above, as large
as the grid they are then placed in, inside a frame (`BlockFrame`), hottest first by the
view's `heat`; their edges are bundled: one per predecessor into the frame, one per successor
out of it.

Edges drawn against the flow (only in cycles) run from the source's top-centre to the
destination's bottom-centre; edges inside one layer (input to input, output to output) from
top-centre to top-centre, over the layer. Limit: a view whose own code adds every call's
output to a residual stream has an edge from every call to every later one: O(n^2) edges and
lane dummies (80 calls: 0.1 s, 200 calls: 1.3 s).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from wandb_modprof.records.graph import ViewGraph
from wandb_modprof.view.blocks import Block, Grid, find_blocks, grid_boxes, grid_size
from wandb_modprof.view.geometry import (
    BLOCK_GAP_PX,
    BLOCK_HEAD_PX,
    BLOCK_MAX_COLS,
    BLOCK_MIN_COLS,
    BLOCK_MIN_SIBLINGS,
    BLOCK_PAD_PX,
    BLOCK_VIEW_ASPECT,
    CHAR_W_PX,
    EDGE_GAP_PX,
    FONT_FAMILY,
    FONT_PX,
    LAYER_GAP_PX,
    LINE_HEIGHT,
    MARGIN_PX,
    MIN_BOX_W_PX,
    NODE_GAP_PX,
    PAD_X_PX,
    PAD_Y_PX,
    SUBLABEL_CHAR_W_PX,
    SUBLABEL_FONT_PX,
    SUGIYAMA_MAXITER,
    BlockFrame,
    EdgePath,
    NodeBox,
    Point,
    ViewLayout,
    box_size,
)
from wandb_modprof.view.layering import layers, orient
from wandb_modprof.view.placement import place
from wandb_modprof.view.routing import bands, route

# The font and spacing constants are shared with the Vega spec generator, which imports them
# from here; they and the result types are defined in `geometry`.
__all__ = [
    "BLOCK_GAP_PX",
    "BLOCK_HEAD_PX",
    "BLOCK_MAX_COLS",
    "BLOCK_MIN_COLS",
    "BLOCK_MIN_SIBLINGS",
    "BLOCK_PAD_PX",
    "BLOCK_VIEW_ASPECT",
    "CHAR_W_PX",
    "EDGE_GAP_PX",
    "FONT_FAMILY",
    "FONT_PX",
    "LAYER_GAP_PX",
    "LINE_HEIGHT",
    "MARGIN_PX",
    "MIN_BOX_W_PX",
    "NODE_GAP_PX",
    "PAD_X_PX",
    "PAD_Y_PX",
    "SUBLABEL_CHAR_W_PX",
    "SUBLABEL_FONT_PX",
    "SUGIYAMA_MAXITER",
    "BlockFrame",
    "EdgePath",
    "NodeBox",
    "ViewLayout",
    "box_size",
    "layout_view",
]


def layout_view(graph: ViewGraph) -> ViewLayout:
    """Lay out one view; deterministic (same graph, same layout). See the module docstring.

    >>> from wandb_modprof.records.graph import GraphEdge, GraphNode
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
    found = find_blocks(nodes, edges, graph.heat)
    # The layout depends on the nodes, the edges and, through the grids' order, the heat
    # ranking of each grid's members, nothing else: the same view of a later sample (a
    # watched model's next table) reuses it unless a grid was re-ranked.
    key = (graph.view_key, nodes, tuple(edges), tuple(b.members for b in found))
    cached = _LAYOUTS.get(key)
    if cached is not None:
        _LAYOUTS.move_to_end(key)
        return cached
    if found:
        laid = _with_blocks(graph, edges, found)
    else:
        keys = [node.node_key for node in nodes]
        lay = _layered(keys, [node.kind for node in nodes], [box_size(n) for n in nodes], edges)
        paths = tuple(EdgePath(keys[s], keys[d], lay.paths[i]) for i, (s, d) in enumerate(edges))
        laid = ViewLayout(graph.view_key, lay.width_px, lay.height_px, lay.boxes, paths)
    _LAYOUTS[key] = laid
    if len(_LAYOUTS) > LAYOUT_CACHE_VIEWS:
        _LAYOUTS.popitem(last=False)
    return laid


# Layouts of the views laid out last (least recently used dropped first): enough for every view
# of the largest tables (a 10,000-row table draws a few hundred views). A `ViewLayout` is frozen.
LAYOUT_CACHE_VIEWS = 4096
_LAYOUTS: OrderedDict[tuple[object, ...], ViewLayout] = OrderedDict()


@dataclass(frozen=True)
class _Layered:
    """Steps 1 to 3 on vertices given as keys, kinds, sizes and index-pair edges: a box per
    vertex and a path per edge, and the view's size."""

    boxes: tuple[NodeBox, ...]
    paths: list[tuple[Point, ...]]
    width_px: float
    height_px: float


def _layered(
    keys: list[str],
    kinds: list[str],
    sizes: list[tuple[float, float]],
    edges: list[tuple[int, int]],
) -> _Layered:
    down, flipped = orient(kinds, edges)
    layer = layers(kinds, [e for e in down if e is not None])
    # Only the downward edges are placed; same-layer ones are routed over their layer.
    centres, dummy_x = place(kinds, layer, sizes, [e for e in down if e is not None])

    band = bands(layer, sizes)
    dummies = [x for xs in dummy_x for x in xs]
    left = min([c - w / 2 for c, (w, _) in zip(centres, sizes, strict=True)] + dummies)
    right = max([c + w / 2 for c, (w, _) in zip(centres, sizes, strict=True)] + dummies)
    shift = MARGIN_PX - left
    boxes: list[NodeBox] = []
    for i, key in enumerate(keys):
        w, h = sizes[i]
        top = band.top[layer[i]] + (band.height[layer[i]] - h) / 2  # centred in the band
        boxes.append(NodeBox(key, round(centres[i] + shift - w / 2, 2), top, w, h))
    lanes = [[x + shift for x in xs] for xs in dummy_x]
    paths = route(edges, down, flipped, layer, band, boxes, lanes)
    return _Layered(tuple(boxes), paths, round(right - left + 2 * MARGIN_PX, 2), band.view_h_px)


def _with_blocks(graph: ViewGraph, edges: list[tuple[int, int]], found: list[Block]) -> ViewLayout:
    """A view with blocks of siblings (`view/blocks.py`): each block is one vertex, as large as
    its grid's frame, where its first member was in node order; its members' edges become one
    edge per predecessor into it and one per successor out of it (the bundle). Once placed, the
    members fill the frame's grid, row by row in the block's order."""
    nodes = graph.nodes
    block_of = {i: b for b, block in enumerate(found) for i in block.members}
    vertex: dict[int, int] = {}  # node index -> its vertex (a block's members share one)
    frame_vertex: dict[int, int] = {}
    keys: list[str] = []
    kinds: list[str] = []
    sizes: list[tuple[float, float]] = []
    for i, node in enumerate(nodes):
        b = block_of.get(i)
        if b is not None and b in frame_vertex:
            vertex[i] = frame_vertex[b]
            continue
        vertex[i] = len(keys)
        if b is None:
            keys.append(node.node_key)
            kinds.append(node.kind)
            sizes.append(box_size(node))
        else:
            frame_vertex[b] = len(keys)
            keys.append(f"{graph.view_key}|block:{b}")
            kinds.append("module")
            sizes.append((0.0, 0.0))  # the grid's size, below
    bundled: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    for s, d in edges:
        pair = (vertex[s], vertex[d])
        if pair[0] != pair[1] and pair not in seen:  # no edge joins two members of one block
            seen.add(pair)
            bundled.append(pair)
    # The column count needs the height of the other layers; layers do not depend on sizes.
    down, _ = orient(kinds, bundled)
    layer = layers(kinds, [e for e in down if e is not None])
    framed = {layer[v] for v in frame_vertex.values()}
    band_h: dict[int, float] = {}
    for v, (_, h) in enumerate(sizes):
        band_h[layer[v]] = max(band_h.get(layer[v], 0.0), h)
    others_h = 2 * MARGIN_PX + sum(h + LAYER_GAP_PX for k, h in band_h.items() if k not in framed)
    grids: dict[int, Grid] = {}
    for b, v in frame_vertex.items():
        members = [nodes[i] for i in found[b].members]
        grids[b] = grid_size([box_size(n)[0] for n in members], box_size(members[0])[1], others_h)
        sizes[v] = (grids[b].w_px, grids[b].h_px)
    lay = _layered(keys, kinds, sizes, bundled)
    boxes: list[NodeBox | None] = [None] * len(nodes)
    frames: list[BlockFrame] = []
    for b, v in frame_vertex.items():
        block = found[b]
        member_keys = [nodes[i].node_key for i in block.members]
        for i, box in zip(
            block.members, grid_boxes(lay.boxes[v], grids[b], member_keys), strict=True
        ):
            boxes[i] = box
        order = "hottest first (fwd + bwd)" if block.by_heat else "in call order"
        label = f"{block.modules} {block.module_type} modules"
        frames.append(BlockFrame(lay.boxes[v], label, order, tuple(member_keys)))
    for i in range(len(nodes)):
        if boxes[i] is None:
            boxes[i] = lay.boxes[vertex[i]]
    return ViewLayout(
        view_key=graph.view_key,
        width_px=lay.width_px,
        height_px=lay.height_px,
        boxes=tuple(box for box in boxes if box is not None),
        edges=tuple(EdgePath(keys[s], keys[d], lay.paths[j]) for j, (s, d) in enumerate(bundled)),
        frames=tuple(frames),
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
