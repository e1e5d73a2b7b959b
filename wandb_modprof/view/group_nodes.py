"""Group nodes: a view with some of its nodes merged into one node each. Takes a `ViewGraph`
and which node goes into which group node; gives the merged `ViewGraph` (edges follow,
deduplicated; edges inside one group disappear). `view/reduce.py` decides what merges (a
view's cheapest modules, ranked by `module_cost`, and where even that is too big its many
inputs or outputs) to fit the table's row budget.

>>> from wandb_modprof.records.graph import GraphEdge, GraphNode, ViewGraph
>>> a, b = GraphNode("v#0|a", "module", "a", "A"), GraphNode("v#0|b", "module", "b", "B")
>>> view = ViewGraph("v#0", (a, b), (GraphEdge("v#0|a", "v#0|b"),))
>>> group = GraphNode(group_key("v#0"), "group", "2 modules", "grouped")
>>> merge_nodes(view, {"v#0|a": group, "v#0|b": group}).edges
()
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping

from wandb_modprof.records.graph import GraphEdge, GraphNode, ViewGraph
from wandb_modprof.records.sample import ModuleStats
from wandb_modprof.view.values import as_float


def module_cost(stats: ModuleStats | None) -> float:
    """What views rank a module call by: its fwd + bwd medians (0 where not measured)."""
    if stats is None:
        return 0.0
    fwd, bwd = stats.typical("fwd_ms"), stats.typical("bwd_ms")
    cost = (0.0 if fwd is None else as_float(fwd)) + (0.0 if bwd is None else as_float(bwd))
    return cost if not math.isnan(cost) else 0.0  # NaN would make the ranking arbitrary


def ranked_modules(graph: ViewGraph, stats: Mapping[str, ModuleStats]) -> list[str]:
    """A view's module nodes, costliest (forward + backward median) first, then in order."""
    position = {n.node_key: i for i, n in enumerate(graph.nodes)}
    modules = [n.node_key for n in graph.nodes if n.kind == "module"]
    return sorted(modules, key=lambda k: (-module_cost(stats.get(k)), position[k]))


def group_key(view_key: str) -> str:
    """The key of the group node a view's merged modules are drawn as."""
    return f"{view_key}|group"


def merge_nodes(graph: ViewGraph, into: dict[str, GraphNode]) -> ViewGraph:
    """Replace every node named in `into` by the group node it maps to, placed where its first
    member was (so merged inputs stay first and merged outputs last); edges follow,
    deduplicated, and edges inside one group disappear.

    The same view merged the same way again (a later sample's table, its ranking unchanged)
    gives the same object: its layout and fixed rows are then reused (`view/rows.py`)."""
    key = (id(graph), tuple((k, g.node_key, g.label) for k, g in into.items()))
    cached = _MERGED.get(key)
    if cached is not None and cached[0] is graph:
        _MERGED.move_to_end(key)
        return cached[1]
    merged = _merged(graph, into)
    _MERGED[key] = (graph, merged)
    if len(_MERGED) > MERGED_CACHE_VIEWS:
        _MERGED.popitem(last=False)
    return merged


# The merged views made last (least recently used dropped first), each with the view it was
# made from (held: the key uses its identity). A MoE table caps ~3,000 views.
MERGED_CACHE_VIEWS = 8192
_MERGED: OrderedDict[tuple[object, ...], tuple[ViewGraph, ViewGraph]] = OrderedDict()


def _merged(graph: ViewGraph, into: dict[str, GraphNode]) -> ViewGraph:
    nodes: list[GraphNode] = []
    placed: set[str] = set()
    for n in graph.nodes:
        group = into.get(n.node_key)
        if group is None:
            nodes.append(n)
        elif group.node_key not in placed:
            placed.add(group.node_key)
            nodes.append(group)
    seen: set[tuple[str, str]] = set()
    edges: list[GraphEdge] = []
    for e in graph.edges:
        src = into[e.src_key].node_key if e.src_key in into else e.src_key
        dst = into[e.dst_key].node_key if e.dst_key in into else e.dst_key
        if src != dst and (src, dst) not in seen:
            seen.add((src, dst))
            edges.append(GraphEdge(src, dst))
    return ViewGraph(graph.view_key, tuple(nodes), tuple(edges))
