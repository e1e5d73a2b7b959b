"""From captured structures (and the statistics' call tree) to one `ViewGraph` per view.

A view is a module invocation that has child invocations; drilling into a node opens its
view. Several structure passes (dynamic control flow) are merged: a view shows every call and
edge any pass saw, so both branches of an `if` appear. Calls the statistics know but no pass
saw (structure capture off, or a variant beyond the cap) still get a node in their parent's
view, without edges: nothing measured is left out of the graph.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from wandb_modprof.records.calls import (
    CallInfo,
    DataEdge,
    Structure,
    input_key,
    output_key,
    self_key,
)
from wandb_modprof.records.graph import GraphEdge, GraphNode, ViewGraph
from wandb_modprof.records.sample import ModuleStats


@dataclass(frozen=True)
class CallTree:
    """Every known call (forward order) and every dataflow edge, merged over passes. Calls no
    structure pass saw have `flops_known=False` and no slots."""

    calls: tuple[CallInfo, ...]
    edges: tuple[DataEdge, ...]


def merge(structures: Sequence[Structure], stats: Iterable[ModuleStats] = ()) -> CallTree:
    """Union of the passes; the newest pass wins for a call's attributes (its FLOPs, slots)."""
    calls: dict[str, CallInfo] = {}
    edges: set[DataEdge] = set()
    stats = list(stats)
    for structure in structures:
        for call in structure.calls:
            old = calls.get(call.key)
            merged = call
            if old is not None and (old.inputs != call.inputs or old.outputs != call.outputs):
                # A call whose arguments differ between passes keeps every slot seen.
                merged = dataclasses.replace(
                    call,
                    inputs=_union(old.inputs, call.inputs),
                    outputs=_union(old.outputs, call.outputs),
                )
            calls[call.key] = merged
        edges.update(structure.edges)
    for stat in stats:
        if stat.key not in calls:
            calls[stat.key] = CallInfo(
                key=stat.key,
                module_name=stat.module_name,
                module_type=stat.module_type,
                call_index=stat.call_index,
                parent_key=stat.parent_key,
                depth=stat.depth,
                order=len(calls),
                inputs=(),
                outputs=(),
                fwd_flops=0,
                fwd_self_flops=0,
                flops_known=False,
            )
    ordered = tuple(at_mean_rows(calls.values(), stats))
    return CallTree(
        calls=ordered,
        edges=tuple(sorted(edges, key=lambda e: (e.view_key, e.src_key, e.dst_key))),
    )


# The counts that grow with a call's rows: its FLOPs. Bytes hold its weights' reads, which do
# not, and op counts do not change with the rows: those stay as counted.
_ROW_SCALED = ("fwd_flops", "fwd_self_flops", "bwd_flops", "bwd_self_flops")


def at_mean_rows(calls: Iterable[CallInfo], stats: Iterable[ModuleStats]) -> list[CallInfo]:
    """Each call whose counts are linear in its rows (`CallInfo.rows_linear`: an expert of a
    routed MoE, counted once at the rows it got that step) with its FLOPs at its mean rows
    over the samples (the `rows` statistic), where those differ from the counted rows."""
    means: dict[str, float] = {}
    for stat in stats:
        rows = stat.metrics.get("rows")
        if rows is None or not rows.count:
            continue
        try:  # (a profile file's statistics may hold anything: NaN, an int past a float's)
            mean = float(rows.mean)
        except OverflowError:
            continue
        if math.isfinite(mean) and mean >= 0:
            means[stat.key] = mean
    out: list[CallInfo] = []
    for call in calls:
        at = means.get(call.key)
        if not call.rows_linear or not call.rows or at is None or at == call.rows:
            out.append(call)
            continue
        try:  # (a profile file's counts may be any size: one past a float's range stays)
            scale = at / call.rows
            changes = {f: round(getattr(call, f) * scale) for f in _ROW_SCALED}
        except (OverflowError, ValueError):
            out.append(call)
            continue
        out.append(dataclasses.replace(call, rows=round(at), **changes))
    return out


def _union(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    return a + tuple(x for x in b if x not in a)


def short_name(call: CallInfo, parent: CallInfo | None) -> str:
    """The name shown in the parent's view: relative to the parent module when nested in it."""
    if parent is None:
        return call.module_name
    prefix = parent.module_name + "."
    if call.module_name.startswith(prefix):
        return call.module_name[len(prefix) :]
    return call.module_name


def view_graphs(tree: CallTree) -> list[ViewGraph]:
    """One graph per call that has children, parents before children (forward order)."""
    by_key = {c.key: c for c in tree.calls}
    children: dict[str, list[CallInfo]] = {}
    for call in tree.calls:
        if call.parent_key is not None and call.parent_key in by_key:
            children.setdefault(call.parent_key, []).append(call)
    calls_per_name: dict[str, int] = {}
    for call in tree.calls:
        calls_per_name[call.module_name] = calls_per_name.get(call.module_name, 0) + 1
    edges_per_view: dict[str, list[GraphEdge]] = {}
    for e in tree.edges:
        edges_per_view.setdefault(e.view_key, []).append(GraphEdge(e.src_key, e.dst_key))

    graphs: list[ViewGraph] = []
    for view in tree.calls:
        kids = children.get(view.key)
        if not kids:
            continue
        nodes = [GraphNode(input_key(view.key, s), "input", s, "input") for s in view.inputs]
        for kid in kids:
            label = short_name(kid, view)
            if calls_per_name[kid.module_name] > 1:
                label = f"{label} #{kid.call_index}"
            nodes.append(GraphNode(kid.key, "module", label, kid.module_type))
        nodes.append(GraphNode(self_key(view.key), "self", "self", "own ops"))
        nodes.extend(
            GraphNode(output_key(view.key, s), "output", s, "output") for s in view.outputs
        )
        known = {n.node_key for n in nodes}
        edges = [
            e
            for e in edges_per_view.get(view.key, [])
            if e.src_key in known and e.dst_key in known and e.src_key != e.dst_key
        ]
        if len(edges) > DENSE_EDGES_PER_NODE * len(nodes):
            edges = thin(nodes, edges)
        graphs.append(ViewGraph(view.key, tuple(nodes), tuple(edges)))
    return graphs


# A view whose own code keeps a running sum over many children (`x = x + layer(x)` in the
# parent) links every call to every later one: O(n^2) edges that no one can read. Such views
# (more edges per node than this) are drawn with their transitive reduction.
DENSE_EDGES_PER_NODE = 3


def thin(nodes: Sequence[GraphNode], edges: list[GraphEdge]) -> list[GraphEdge]:
    """Drop every edge implied by a longer path (the transitive reduction of a DAG); a
    residual edge next to a chain is kept in sparse views, where it is worth seeing."""
    index = {n.node_key: i for i, n in enumerate(nodes)}
    succ: dict[int, set[int]] = {}
    for e in edges:
        succ.setdefault(index[e.src_key], set()).add(index[e.dst_key])
    order = _topological(len(nodes), succ)
    if order is None:
        return edges  # a cycle: leave the view as captured
    reach: dict[int, int] = {}  # node -> bitset of nodes reachable through one or more edges
    for v in reversed(order):
        bits = 0
        for w in succ.get(v, ()):
            bits |= reach[w] | (1 << w)
        reach[v] = bits
    kept = []
    for e in edges:
        u, v = index[e.src_key], index[e.dst_key]
        if not any(w != v and (reach[w] >> v) & 1 for w in succ[u]):
            kept.append(e)
    return kept


def _topological(n: int, succ: dict[int, set[int]]) -> list[int] | None:
    indegree = [0] * n
    for targets in succ.values():
        for w in targets:
            indegree[w] += 1
    ready = [v for v in range(n) if indegree[v] == 0]
    order: list[int] = []
    while ready:
        v = ready.pop()
        order.append(v)
        for w in succ.get(v, ()):
            indegree[w] -= 1
            if indegree[w] == 0:
                ready.append(w)
    return order if len(order) == n else None


def call_graphs(
    structures: Sequence[Structure], stats: Iterable[ModuleStats] = ()
) -> tuple[CallTree, tuple[ViewGraph, ...]]:
    """`merge` and `view_graphs` of the same inputs, reused while they are unchanged: every
    sample of a watched model has the same structure passes (the same objects) and the same
    calls, and rebuilding the tree and the views of a 10,000-call model took ~0.2 s of each
    table. Reused when the passes are the same objects and the calls they did not see (those
    the statistics add) are the same; the results are frozen records."""
    stats = list(stats)
    ids = tuple(id(s) for s in structures)
    entry = _GRAPHS.get(ids)
    if (
        entry is not None
        and all(a is b for a, b in zip(entry.structures, structures, strict=True))
        and _unseen(stats, entry.seen) == entry.unseen
    ):
        _GRAPHS.move_to_end(ids)
        return entry.tree, entry.graphs
    tree = merge(structures, stats)
    seen = frozenset(c.key for s in structures for c in s.calls)
    _GRAPHS[ids] = _Graphs(
        tuple(structures), seen, _unseen(stats, seen), tree, tuple(view_graphs(tree))
    )
    if len(_GRAPHS) > GRAPH_CACHE_ENTRIES:
        _GRAPHS.popitem(last=False)
    return _GRAPHS[ids].tree, _GRAPHS[ids].graphs


def _unseen(stats: list[ModuleStats], seen: frozenset[str]) -> tuple[tuple[object, ...], ...]:
    """What `merge` reads of the statistics: the calls no pass saw, in order."""
    return tuple(
        (s.key, s.module_name, s.module_type, s.call_index, s.parent_key, s.depth)
        for s in stats
        if s.key not in seen
    )


@dataclass(frozen=True)
class _Graphs:
    structures: tuple[Structure, ...]  # held: their ids are the cache key
    seen: frozenset[str]  # the call keys of the passes
    unseen: tuple[tuple[object, ...], ...]
    tree: CallTree
    graphs: tuple[ViewGraph, ...]


# A few profiles at a time (a run that compares two models, a report beside a live watch).
GRAPH_CACHE_ENTRIES = 8
_GRAPHS: OrderedDict[tuple[int, ...], _Graphs] = OrderedDict()
