"""The module graph of one view: what structure capture produces and layout consumes. Plain
frozen dataclasses; no torch, no layout, no measurements.

A view is one module invocation seen from inside: its child invocations (one node per call,
so a module called three times is three nodes), one node per input argument and per output
field, and a `self` node for the work the invocation does in its own code (its self time),
so the colours of a view account for all of its time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

NodeKind = Literal["module", "input", "output", "self", "group"]


@dataclass(frozen=True)
class GraphNode:
    """One box in a view.

    `node_key` is the call key (`"layer1.0#0"`) for modules, and `"<view>|in:<arg>"`,
    `"<view>|out:<field>"`, `"<view>|self"` for the others; unique across all views.
    `label` is the first text line (short name), `sublabel` the second (module type, "input").
    """

    node_key: str
    kind: NodeKind
    label: str
    sublabel: str


@dataclass(frozen=True)
class GraphEdge:
    """A tensor produced by `src_key` reaches `dst_key` (directly or through tensor ops in the
    view's own code)."""

    src_key: str
    dst_key: str


@dataclass(frozen=True)
class ViewGraph:
    """Nodes in forward order (inputs first, outputs last) and edges sorted by (src, dst).

    `heat`: per node, in node order, its forward + backward time in ms (NaN: not measured), or
    empty when not known; the layout ranks a grid of many siblings by it, hottest first (call
    order without it). The view stage adds it just before the layout (`view/table.py`)."""

    view_key: str
    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]
    heat: tuple[float, ...] = ()
