"""Sizes and shapes of a laid-out view: the font and spacing constants (shared with the Vega
spec, which draws the text), the size of a node's box, and the layout's result types
(`NodeBox`, `EdgePath`, `ViewLayout`). Takes a `GraphNode`; gives its box size in pixels.
`wandb_modprof.view.layout` re-exports all of it.

>>> box_size(GraphNode("fc#0", "module", "fc", "Linear"))
(54.0, 40.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wandb_modprof.records.graph import GraphNode

# Shared with the Vega spec, which draws the text: box sizes assume these fonts.
FONT_FAMILY = "Helvetica Neue, Helvetica, Arial, sans-serif"
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
# Many siblings (a mixture-of-experts layer's experts, `view/blocks.py`): more than
# BLOCK_MIN_SIBLINGS - 1 modules of one type with the same predecessors and successors are
# drawn as a grid inside one frame, BLOCK_MIN_COLS to BLOCK_MAX_COLS boxes a row, rather than
# one layer row thousands of pixels wide. The head holds the frame's title line.
BLOCK_MIN_SIBLINGS = 33
BLOCK_MIN_COLS = 8
BLOCK_MAX_COLS = 16
BLOCK_GAP_PX = 8  # between the grid's boxes: no edge runs inside the frame
BLOCK_PAD_PX = 8
BLOCK_HEAD_PX = 24
# The view's width / height the grid's column count aims at: about the panel's graph area,
# which is 1.5 (1,200 x 700 px panel) to 2.2 (the same with the timeline strip below it) wide.
BLOCK_VIEW_ASPECT = 2.0

Point = tuple[float, float]


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
    top-centre of the destination box (see `wandb_modprof.view.layout` for cycles)."""

    src_key: str
    dst_key: str
    points: tuple[Point, ...]


@dataclass(frozen=True)
class BlockFrame:
    """The frame around a grid of siblings (`view/blocks.py`): its box (`node_key` is
    `"<view>|block:<n>"`), its title line (`label`: "128 MLP modules", `sublabel`: the
    order) and the keys of the nodes inside, in grid order (row by row, hottest first)."""

    box: NodeBox
    label: str
    sublabel: str
    members: tuple[str, ...]


@dataclass(frozen=True)
class ViewLayout:
    """Boxes in the graph's node order, edges in its edge order (self loops dropped, duplicate
    edges once, at their first position), except that the edges into and out of a grid of
    siblings are bundled: one from each predecessor to its frame, one from the frame to each
    successor, in the position of the first edge they stand for. `frames`: the grids' frames
    (none in most views)."""

    view_key: str
    width_px: float
    height_px: float
    boxes: tuple[NodeBox, ...]
    edges: tuple[EdgePath, ...]
    frames: tuple[BlockFrame, ...] = ()


def box_size(node: GraphNode) -> tuple[float, float]:
    """Width and height in pixels of a box holding the label line over the sublabel line.

    >>> box_size(GraphNode("a#0", "module", "a", "B"))[0] == MIN_BOX_W_PX
    True
    """
    text_w = max(len(node.label) * CHAR_W_PX, len(node.sublabel) * SUBLABEL_CHAR_W_PX)
    # Whole pixels: crisp box edges, and sizes that read well in a spec.
    w = max(MIN_BOX_W_PX, math.ceil(text_w + 2 * PAD_X_PX))
    h = math.ceil((FONT_PX + SUBLABEL_FONT_PX) * LINE_HEIGHT + 2 * PAD_Y_PX)
    return float(w), float(h)
