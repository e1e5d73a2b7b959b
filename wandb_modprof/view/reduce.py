"""Fitting the views into the table's row budget. Takes every view's `ViewGraph` (parents
first), the calls and statistics, and the number of rows left for node and edge rows; gives a
`Reduction`: the views to draw (whole, or the top view shrunk), the `reduced` note saying what
was left out ("" when nothing was), and the members of every group node drawn.

First views below some depth are not drawn (their modules' cost stays in the ancestors
shown), but the costliest of them that fit in the rows left are; if the top view alone is too
big, its cheapest modules merge into one `group` node, and if even that is too big, its inputs
and its outputs merge too (see `wandb_modprof.view.table`). How nodes merge into a group node,
and what modules rank by, is `view/group_nodes.py`.

>>> from wandb_modprof.records.graph import GraphNode
>>> top = ViewGraph("m#0", (GraphNode("m#0|self", "self", "self", "own ops"),), ())
>>> reduce_views([top], {}, {}, budget=MIN_VIEW_ROWS, max_rows=100).note
''
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from wandb_modprof.records.calls import CallInfo
from wandb_modprof.records.graph import GraphNode, ViewGraph
from wandb_modprof.records.sample import ModuleStats
from wandb_modprof.view.blocks import drawn_rows
from wandb_modprof.view.group_nodes import group_key, merge_nodes, module_cost, ranked_modules

# The most rows one view takes once its modules, its inputs and its outputs are each merged into
# one group node: its `view` row, those 3 and the `self` node, and at most one edge per ordered
# pair of them.
MIN_VIEW_ROWS = 1 + 4 + 4 * 3


@dataclass(frozen=True)
class Reduction:
    """The views to draw, what was reduced ("" when nothing was), and per group node drawn its
    members (module keys for the modules' group, input or output node keys for the others)."""

    graphs: tuple[ViewGraph, ...]
    note: str
    groups: Mapping[str, list[str]]


def reduce_views(
    graphs: Sequence[ViewGraph],
    calls: Mapping[str, CallInfo],
    stats: Mapping[str, ModuleStats],
    budget: int,
    max_rows: int,
    full_detail: str = "",
) -> Reduction:
    """Fit the views into `budget` rows (of a table of at most `max_rows`, named in the note).
    `full_detail` (where the full profile is) follows the note's first sentence, before the
    list of merged groups, so that the panel's one-line banner shows it."""
    # Each view sized once (a grid's size needs its blocks found): the depth totals and
    # `_fill` read these.
    sizes = [_size(g) for g in graphs]
    if sum(sizes) <= budget:
        return Reduction(tuple(graphs), "", {})
    depth_of = {g.view_key: calls[g.view_key].depth for g in graphs}
    total_by_depth: dict[int, int] = {}
    for g, size in zip(graphs, sizes, strict=True):
        d = depth_of[g.view_key]
        total_by_depth[d] = total_by_depth.get(d, 0) + size
    used, max_depth = 0, -1
    for d in sorted(total_by_depth):
        if used + total_by_depth[d] > budget:
            break
        used += total_by_depth[d]
        max_depth = d
    if max_depth >= 0:
        capped = _cap_next_depth(graphs, stats, depth_of, max_depth + 1, budget - used)
        merged: set[str] = set()
        shown: dict[str, ViewGraph] = {}
        groups: dict[str, list[str]] = {}
        if capped is not None:
            for view_key, (graph, members) in capped.items():
                shown[view_key] = graph
                if members:
                    groups[group_key(view_key)] = members
                    merged.update(members)
                used += _size(graph)
            max_depth += 1
        size_of = {g.view_key: size for g, size in zip(graphs, sizes, strict=True)}
        drawn = _fill(graphs, calls, stats, depth_of, max_depth, budget - used, merged, size_of)
        kept = [shown.get(g.view_key, g) for g in graphs if g.view_key in drawn]
        hidden = len(graphs) - len(kept)
        deeper = len(kept) - sum(1 for d in depth_of.values() if d <= max_depth)
        also = f", and the {deeper} costliest deeper views that fit" if deeper else ""
        merged_views, merged_list = _merged_note(groups, graphs, stats)
        head = (
            f"{hidden} of {len(graphs)} views are not drawn, to stay within {max_rows:,} rows: "
            f"every view down to depth {max_depth} is drawn{also}{merged_views}; the modules "
            "not drawn have their time and memory included in the modules shown"
            if hidden
            else f"Every view is drawn, but to stay within {max_rows:,} rows{merged_views}"
        )
        note = f"{head}; every module's statistics are in the saved profile."
        return Reduction(tuple(kept), _join(note, full_detail, merged_list), groups)
    root = graphs[0]
    shrunk, groups = _shrink_view(root, stats, budget)
    return Reduction((shrunk,), _join(_shrink_note(root, groups, max_rows), full_detail), groups)


def _join(*sentences: str) -> str:
    return " ".join(s for s in sentences if s)


def _fill(
    graphs: Sequence[ViewGraph],
    calls: Mapping[str, CallInfo],
    stats: Mapping[str, ModuleStats],
    depth_of: Mapping[str, int],
    max_depth: int,
    left: int,
    merged: AbstractSet[str] = frozenset(),
    size_of: Mapping[str, int] | None = None,
) -> set[str]:
    """The views drawn: every view down to `max_depth`, then, in the `left` rows the depth cut
    leaves, whole deeper views whose parent view is drawn, the costliest first (a view that
    does not fit is passed over for cheaper ones that do). Without this a model of 50 blocks of
    240 modules drew its top view alone (123 rows of 10,000). `size_of`: each view's
    `_size`, where the caller has them."""
    by_key = {g.view_key: g for g in graphs}
    if size_of is None:
        size_of = {key: _size(g) for key, g in by_key.items()}
    drawn = {k for k, d in depth_of.items() if d <= max_depth and k not in merged}
    order = {g.view_key: i for i, g in enumerate(graphs)}
    children: dict[str, list[str]] = {}
    for key in by_key:
        parent = calls[key].parent_key
        if parent is not None and parent in by_key:
            children.setdefault(parent, []).append(key)
    frontier: list[tuple[float, int, str]] = []

    def offer(parent: str) -> None:
        for kid in children.get(parent, ()):
            if kid not in drawn and kid not in merged:
                heapq.heappush(frontier, (-module_cost(stats.get(kid)), order[kid], kid))

    for key in drawn:
        offer(key)
    while frontier:
        _, _, key = heapq.heappop(frontier)
        size = size_of[key]
        if size <= left:
            left -= size
            drawn.add(key)
            offer(key)
    return drawn


def _cap_next_depth(
    graphs: Sequence[ViewGraph],
    stats: Mapping[str, ModuleStats],
    depth_of: Mapping[str, int],
    depth: int,
    left: int,
) -> dict[str, tuple[ViewGraph, list[str]]] | None:
    """Every view at `depth`, each with its cheapest modules merged into one group node so that
    all of them fit in `left` rows: one cap for all (the most modules any of them keeps as its
    own nodes, found by bisection), so a wide view (a layer's 128 experts) keeps its hottest
    modules and a narrow one stays whole. Gives per view its graph and the modules merged
    (empty: drawn whole); None when even merging every module of every view does not fit.

    This is what keeps each of a mixture-of-experts model's 48 layers reachable with all its
    experts (individually or, the cheapest, in their group), where dropping the whole depth
    would hide them all."""
    views = [g for g in graphs if depth_of[g.view_key] == depth]
    if not views:
        return None
    ranked = {g.view_key: ranked_modules(g, stats) for g in views}
    # (view index, cap) -> the capped view, its members and its size: the bisection and the
    # result below ask for the same caps again
    tried: dict[tuple[int, int], tuple[ViewGraph, list[str], int]] = {}

    def capped(i: int, cap: int) -> tuple[ViewGraph, list[str], int]:
        if (i, cap) in tried:
            return tried[i, cap]
        g = views[i]
        order = ranked[g.view_key]
        if len(order) <= cap:
            tried[i, cap] = (g, [], _size(g))
            return tried[i, cap]
        members = order[cap:]
        label = f"{len(members)} modules" if cap == 0 else f"{len(members)} more modules"
        group = GraphNode(group_key(g.view_key), "group", label, "grouped")
        position = {n.node_key: k for k, n in enumerate(g.nodes)}
        graph = merge_nodes(g, dict.fromkeys(members, group))
        tried[i, cap] = (graph, sorted(members, key=position.__getitem__), _size(graph))
        return tried[i, cap]

    def rows(cap: int) -> int:
        return sum(capped(i, cap)[2] for i in range(len(views)))

    if rows(0) > left:
        return None
    # Keeping more modules never makes a view smaller (see `_shrink_view`): bisect the cap.
    lo, hi = 1, max(len(r) for r in ranked.values())  # a cap of `lo - 1` fits; above `hi` not
    while lo <= hi:
        mid = (lo + hi) // 2
        if rows(mid) <= left:
            lo = mid + 1
        else:
            hi = mid - 1
    return {g.view_key: capped(i, lo - 1)[:2] for i, g in enumerate(views)}


def _merged_note(
    groups: Mapping[str, list[str]], graphs: Sequence[ViewGraph], stats: Mapping[str, ModuleStats]
) -> tuple[str, str]:
    """The clause saying how many views merged their cheapest modules (", in 2 views the
    cheapest modules are merged into one group node each"), and the sentence naming each,
    with how many of how many and their summed forward + backward time ("Merged (view: ...):
    `l.0.experts#0` 96 of 128 (0.412 ms), `l.1.experts#0` ..."); ("", "") when none did."""
    parts = []
    for g in graphs:
        members = groups.get(group_key(g.view_key))
        if members:
            total = sum(1 for n in g.nodes if n.kind == "module")
            cost = sum(module_cost(stats.get(k)) for k in members)
            parts.append(f"`{g.view_key}` {len(members)} of {total} ({cost:.3g} ms)")
    if not parts:
        return "", ""
    views = "1 view" if len(parts) == 1 else f"{len(parts)} views"
    return (
        f", in {views} the cheapest modules are merged into one group node each",
        "Merged (view: merged of modules, their summed forward + backward time): "
        f"{', '.join(parts)}.",
    )


def _size(graph: ViewGraph) -> int:
    """The rows a view takes: its `view` row, a row per node and a row per edge; a view whose
    many siblings are drawn as a grid (a layer's experts) has a frame row per grid and only
    the grid's bundled edges (`view/blocks.py`), so it takes far fewer."""
    return 1 + drawn_rows(graph)


def _shrink_view(
    graph: ViewGraph, stats: Mapping[str, ModuleStats], budget: int
) -> tuple[ViewGraph, dict[str, list[str]]]:
    """Keep the most expensive modules of an oversized view; merge the others into a group.

    When even one group for all modules leaves the view too big, its inputs (if more than one)
    merge into one group and its outputs into another, and as many modules as then fit are
    kept. Returns the view and the members of each group node drawn (module keys for the
    modules' group, input or output node keys for the others)."""
    modules = [n.node_key for n in graph.nodes if n.kind == "module"]
    ranked = ranked_modules(graph, stats)
    modules_group = group_key(graph.view_key)
    ends: dict[str, GraphNode] = {}  # input / output node key -> the group it merges into

    def attempt(kept: int) -> ViewGraph:
        label = f"{len(ranked)} modules" if kept == 0 else f"{len(ranked) - kept} more modules"
        group = GraphNode(modules_group, "group", label, "grouped")
        return merge_nodes(graph, ends | dict.fromkeys(ranked[kept:], group))

    best = attempt(0)
    if _size(best) > budget:
        for kind, noun in (("input", "inputs"), ("output", "outputs")):
            members = [n.node_key for n in graph.nodes if n.kind == kind]
            if len(members) > 1:
                node = GraphNode(
                    f"{graph.view_key}|{noun}", "group", f"{len(members)} {noun}", noun
                )
                ends.update(dict.fromkeys(members, node))
        best = attempt(0)
    # Keeping more modules never makes the view smaller (merging fewer nodes merges fewer
    # edges), so the largest number kept that fits is found by bisection.
    lo, hi = 1, len(ranked)  # `lo - 1` modules kept fit; more than `hi` do not
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = attempt(mid)
        if _size(candidate) <= budget:
            best, lo = candidate, mid + 1
        else:
            hi = mid - 1
    drawn = {n.node_key for n in best.nodes}
    groups: dict[str, list[str]] = {}
    if modules_group in drawn:
        groups[modules_group] = [k for k in modules if k not in drawn]
    for member, node in ends.items():
        groups.setdefault(node.node_key, []).append(member)
    return best, groups


def _shrink_note(view: ViewGraph, groups: dict[str, list[str]], max_rows: int) -> str:
    """What `_shrink_view` merged, e.g. "...; 118 of its cheapest modules are merged into one
    group node and its 120 outputs into another, ..."."""
    parts = []
    modules = groups.get(f"{view.view_key}|group")
    if modules is not None:
        parts.append(f"{len(modules)} of its cheapest modules")
    for noun in ("inputs", "outputs"):
        members = groups.get(f"{view.view_key}|{noun}")
        if members is not None:
            parts.append(f"its {len(members)} {noun}")
    merged = ""
    if parts:
        first, *rest = parts
        merged = f"; {first} are merged into one group node"
        if rest:
            *others, last = [f"{p} into another" for p in rest]
            merged += "".join(f", {p}" for p in others) + f" and {last}"
    return (
        f"The top view has {len(view.nodes)} nodes{merged}, and no other views are drawn, to "
        f"stay within {max_rows:,} rows. Every module's statistics are in the saved profile."
    )
