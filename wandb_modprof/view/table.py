"""The flat table every sink consumes (W&B Table, HTML report, tests): rows of kind node / edge
/ meta, one per node and edge of every drawn view, plus meta rows with totals and notes.

Cells are always a string, a finite number or a bool: a metric that was not measured for a
node is written as 0 and its column name is listed in that row's `missing` cell (`"*"`: none
of the metrics apply, e.g. input nodes). No `null` (W&B rewrites nulls in specs; browsers
reject bare NaN), no NaN/inf, and no column named `id`, `name` or `color` (W&B adds those).

Distributed runs (rank 0 of a `watch` under `torch.distributed`, see `_distributed`): module,
`self` and group nodes carry `rank_count` (ranks with data for the call), `rank_fwd_bwd_mean_ms`
and `rank_fwd_bwd_max_ms` (mean and max over ranks of each rank's mean fwd_ms + bwd_ms; self
nodes: self times; group nodes: each rank's sum over the merged calls), `rank_slowest` (the
rank with that max, the lowest on a tie) and `rank_imbalance` (max / mean; 1.0: balanced; the
panel's imbalance mode); meta rows `ranks` (world size), `ranks_reported` (how many ranks'
statistics are in the table; text: `rank@step` of each one's newest sample folded in) and
`ranks_missing` (how many sent none; text: which). Without per-rank data these are 0 and
listed in `missing`.

Values that do not convert to a finite float (a loaded file may hold `"nan"`, `"inf"` or an
integer beyond a float's range) are treated as not measured: written as 0 and named in
`missing` (`meta_number` for meta rows).

At most `max_rows` rows, `MAX_ROWS` by default (W&B cuts tables at 10,000 rows without a
word). A larger profile is reduced on purpose, and the `reduced` meta row says how: first views
below some depth are not drawn (their modules' cost stays in the ancestors shown), then, if one
view alone is too big, its cheapest modules merge into one `group` node that carries their sums
and count; if even that is too big (a view with hundreds of inputs or outputs), its inputs merge
into one `group` node ("N inputs") and its outputs into another ("N outputs"). A view reduced
that far has at most 4 nodes and 12 edges, so every profile fits every limit `Profile.table`
accepts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wandb_modprof.records.calls import CallInfo
from wandb_modprof.records.graph import GraphEdge, GraphNode, ViewGraph
from wandb_modprof.records.sample import (
    MEMORY_METRICS,
    METRICS,
    TIME_METRICS,
    ModuleStats,
    RunningStat,
)
from wandb_modprof.view.graphs import merge, short_name, view_graphs
from wandb_modprof.view.layout import ViewLayout, layout_view

if TYPE_CHECKING:
    from wandb_modprof.records.ranks import RankData
    from wandb_modprof.records.snapshot import ProfileData

MAX_ROWS = 10_000
TABLE_FORMAT = "wandb_modprof.table"
TABLE_VERSION = 1
SPREAD_METRICS = ("fwd_ms", "fwd_self_ms", "bwd_ms", "bwd_self_ms")  # with std/min/max/last
FLOP_COLUMNS = ("fwd_flops", "fwd_self_flops", "fwd_flop_per_s")
# Summed when cheap modules merge into a group node; spans, peaks and norms are not additive.
ADDITIVE = (
    frozenset(TIME_METRICS) - {"bwd_span_ms"} | frozenset(MEMORY_METRICS) | frozenset(FLOP_COLUMNS)
) - {"fwd_flop_per_s"}
# A `self` node shows the view's own work: these metrics of the view, under these columns.
_SELF_FROM = {
    "fwd_ms": "fwd_self_ms",
    "fwd_self_ms": "fwd_self_ms",
    "bwd_ms": "bwd_self_ms",
    "bwd_self_ms": "bwd_self_ms",
    "act_bytes": "act_self_bytes",
    "act_self_bytes": "act_self_bytes",
}
_OWN_STATIC = ("param_bytes", "param_count", "buffer_bytes", "grad_bytes", "optim_bytes")

TEXT_COLUMNS = (
    "row_kind",
    "view_key",
    "view_path",
    "view_labels",
    "node_key",
    "node_kind",
    "label",
    "sublabel",
    "module_name",
    "module_type",
    "src_key",
    "dst_key",
    "edge_path",
    "meta_key",
    "meta_value",
    "missing",
)
# Distributed runs (`_distributed`): across ranks, the mean and max of each rank's mean
# fwd_ms + bwd_ms, the rank with that max, and max / mean (1.0: balanced); 0 and `missing`
# without per-rank data.
RANK_INT_COLUMNS = ("rank_count", "rank_slowest")
RANK_NUMBER_COLUMNS = ("rank_fwd_bwd_mean_ms", "rank_fwd_bwd_max_ms", "rank_imbalance")
RANK_COLUMNS = (
    "rank_count",
    "rank_fwd_bwd_mean_ms",
    "rank_fwd_bwd_max_ms",
    "rank_slowest",
    "rank_imbalance",
)
INT_COLUMNS = ("view_depth", "call_index", "group_count", "samples", *RANK_INT_COLUMNS)
BOOL_COLUMNS = ("has_view",)
LAYOUT_COLUMNS = ("x_px", "y_px", "w_px", "h_px", "view_w_px", "view_h_px")
METRIC_COLUMNS = (
    METRICS
    + tuple(f"{m}_{s}" for m in SPREAD_METRICS for s in ("std", "min", "max", "last"))
    + FLOP_COLUMNS
)
NUMBER_COLUMNS = LAYOUT_COLUMNS + METRIC_COLUMNS + RANK_NUMBER_COLUMNS + ("meta_number",)
# Columns named in `missing` when not measured for a row.
MISSABLE_COLUMNS = METRIC_COLUMNS + RANK_COLUMNS
COLUMNS = TEXT_COLUMNS + INT_COLUMNS + BOOL_COLUMNS + NUMBER_COLUMNS
Cell = str | int | float | bool


@dataclass(frozen=True)
class ProfileTable:
    """`columns` and `rows` as W&B's table JSON has them; `reduced` is "" or what was reduced.

    >>> table = prof.table()                                   # doctest: +SKIP
    >>> rows = [list(r) for r in table.rows]                    # doctest: +SKIP
    >>> wandb.Table(columns=list(table.columns), data=rows)    # doctest: +SKIP
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    reduced: str

    def records(self) -> list[dict[str, Cell]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


# ---- values per node -------------------------------------------------------------------------
def _as_float(value: float) -> float:
    """`value` as a float; an int beyond a float's range becomes +-inf instead of raising.

    Every number taken from the profile goes through here, so the arithmetic below sees only
    floats: NaN and inf propagate through sums and differences and are dropped (as missing)
    when the row is written, never an `OverflowError` in the middle of `table()`."""
    try:
        return float(value)
    except OverflowError:  # only ints overflow: a loaded file or `_restore` can hold 10**400
        return math.inf if value > 0 else -math.inf


def _finite(value: float | None) -> float | None:
    """`value` as a finite float, or None where it is missing, NaN, infinite or too large."""
    if value is None:
        return None
    number = _as_float(value)
    return number if math.isfinite(number) else None


def _metric_values(stats: ModuleStats | None) -> dict[str, float]:
    if stats is None:
        return {}
    out: dict[str, float] = {}
    for metric, stat in stats.metrics.items():
        out[metric] = _as_float(stat.mean)
        if metric in SPREAD_METRICS:
            _spread(out, metric, stat)
    return out


def _spread(out: dict[str, float], column: str, stat: RunningStat) -> None:
    out[f"{column}_std"] = _as_float(stat.std)
    out[f"{column}_min"] = _as_float(stat.min)
    out[f"{column}_max"] = _as_float(stat.max)
    out[f"{column}_last"] = _as_float(stat.last)


def _self_values(
    view: ModuleStats | None, kids: Sequence[ModuleStats], call: CallInfo | None
) -> dict[str, float]:
    """The view's own work: its self time and self activations, the parameters it holds
    itself (not through a child), and the FLOPs of its own ops."""
    out: dict[str, float] = {}
    if view is not None:
        for column, metric in _SELF_FROM.items():
            stat = view.metrics.get(metric)
            if stat is not None:
                out[column] = _as_float(stat.mean)
                if column in SPREAD_METRICS:
                    _spread(out, column, stat)
        # Once per child module: a module called three times holds its parameters once.
        distinct = {k.module_name: k for k in kids}.values()
        for metric in _OWN_STATIC:
            total = view.metrics.get(metric)
            if total is not None:
                inner = sum(
                    _as_float(k.metrics[metric].mean) for k in distinct if metric in k.metrics
                )
                own = _as_float(total.mean) - inner
                # tied weights can overcount; max() would also turn a NaN into 0, so not then
                out[metric] = max(0.0, own) if math.isfinite(own) else own
    if call is not None:
        out["fwd_flops"] = _as_float(call.fwd_self_flops)
        out["fwd_self_flops"] = _as_float(call.fwd_self_flops)
        _flop_rate(out)
    return out


def _flop_rate(out: dict[str, float]) -> None:
    fwd_ms = out.get("fwd_ms")
    if fwd_ms is not None and math.isfinite(fwd_ms) and fwd_ms > 0 and "fwd_flops" in out:
        out["fwd_flop_per_s"] = out["fwd_flops"] / (fwd_ms / 1000.0)


def _module_values(stats: ModuleStats | None, call: CallInfo | None) -> dict[str, float]:
    out = _metric_values(stats)
    if call is not None:
        out["fwd_flops"] = _as_float(call.fwd_flops)
        out["fwd_self_flops"] = _as_float(call.fwd_self_flops)
        _flop_rate(out)
    return out


# ---- reduction -------------------------------------------------------------------------------
# The most rows one view takes once its modules, its inputs and its outputs are each merged into
# one group node: those 3 and the `self` node, and at most one edge per ordered pair of them.
MIN_VIEW_ROWS = 4 + 4 * 3


def _size(graph: ViewGraph) -> int:
    return len(graph.nodes) + len(graph.edges)


def _merge_nodes(graph: ViewGraph, into: dict[str, GraphNode]) -> ViewGraph:
    """Replace every node named in `into` by the group node it maps to, placed where its first
    member was (so merged inputs stay first and merged outputs last); edges follow,
    deduplicated, and edges inside one group disappear."""
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


def _cost(stats: ModuleStats | None) -> float:
    if stats is None:
        return 0.0
    cost = sum(_as_float(stats.metrics[m].mean) for m in ("fwd_ms", "bwd_ms") if m in stats.metrics)
    return cost if not math.isnan(cost) else 0.0  # NaN would make the ranking arbitrary


def _shrink_view(
    graph: ViewGraph, stats: Mapping[str, ModuleStats], budget: int
) -> tuple[ViewGraph, dict[str, list[str]]]:
    """Keep the most expensive modules of an oversized view; merge the others into a group.

    When even one group for all modules leaves the view too big, its inputs (if more than one)
    merge into one group and its outputs into another, and as many modules as then fit are
    kept. Returns the view and the members of each group node drawn (module keys for the
    modules' group, input or output node keys for the others)."""
    position = {n.node_key: i for i, n in enumerate(graph.nodes)}
    modules = [n.node_key for n in graph.nodes if n.kind == "module"]
    ranked = sorted(modules, key=lambda k: (-_cost(stats.get(k)), position[k]))
    group_key = f"{graph.view_key}|group"
    ends: dict[str, GraphNode] = {}  # input / output node key -> the group it merges into

    def attempt(kept: int) -> ViewGraph:
        label = f"{len(ranked)} modules" if kept == 0 else f"{len(ranked) - kept} more modules"
        group = GraphNode(group_key, "group", label, "grouped")
        return _merge_nodes(graph, ends | dict.fromkeys(ranked[kept:], group))

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
    if group_key in drawn:
        groups[group_key] = [k for k in modules if k not in drawn]
    for member, node in ends.items():
        groups.setdefault(node.node_key, []).append(member)
    return best, groups


def reduce_graphs(
    graphs: list[ViewGraph],
    depth_of: dict[str, int],
    stats: Mapping[str, ModuleStats],
    budget: int,
    max_rows: int = MAX_ROWS,
) -> tuple[list[ViewGraph], str, dict[str, list[str]]]:
    """Fit the views into `budget` rows (of a table of at most `max_rows`, named in the note);
    returns the views kept, what was done (or ""), and the members of every group node."""
    if sum(_size(g) for g in graphs) <= budget:
        return graphs, "", {}
    total_by_depth: dict[int, int] = {}
    for g in graphs:
        d = depth_of[g.view_key]
        total_by_depth[d] = total_by_depth.get(d, 0) + _size(g)
    used, max_depth = 0, -1
    for d in sorted(total_by_depth):
        if used + total_by_depth[d] > budget:
            break
        used += total_by_depth[d]
        max_depth = d
    if max_depth >= 0:
        kept = [g for g in graphs if depth_of[g.view_key] <= max_depth]
        hidden = len(graphs) - len(kept)
        note = (
            f"{hidden} views below depth {max_depth} are not drawn, to stay within "
            f"{max_rows:,} rows; their modules' time and memory are included in the modules "
            "shown, and every module's statistics are in the saved profile."
        )
        return kept, note, {}
    root = graphs[0]
    shrunk, groups = _shrink_view(root, stats, budget)
    note = _shrink_note(root, groups, max_rows)
    return [shrunk], note, groups


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


# ---- rows ------------------------------------------------------------------------------------
def _ancestors(key: str, calls: dict[str, CallInfo]) -> list[CallInfo]:
    """The call of `key` and its ancestors, outermost first. A parent cycle (only a hand-made
    profile has one: `load` rejects such files) ends the chain where it repeats."""
    chain: list[CallInfo] = []
    seen: set[str] = set()
    call: CallInfo | None = calls.get(key)
    while call is not None and call.key not in seen:
        seen.add(call.key)
        chain.append(call)
        call = calls.get(call.parent_key) if call.parent_key is not None else None
    return chain[::-1]


def _view_labels(chain: list[CallInfo]) -> str:
    labels = [chain[0].module_type] + [short_name(c, p) for p, c in itertools.pairwise(chain)]
    return " / ".join(labels)


def _edge_path(points: Sequence[tuple[float, float]]) -> str:
    head, *rest = points
    return f"M{head[0]:.1f},{head[1]:.1f}" + "".join(f"L{x:.1f},{y:.1f}" for x, y in rest)


class _RowWriter:
    def __init__(self) -> None:
        self.rows: list[tuple[Cell, ...]] = []
        self._defaults: dict[str, Cell] = {c: "" for c in TEXT_COLUMNS}
        self._defaults.update({c: 0 for c in INT_COLUMNS})
        self._defaults.update({c: False for c in BOOL_COLUMNS})
        self._defaults.update({c: 0.0 for c in NUMBER_COLUMNS})

    def add(self, cells: dict[str, Cell], values: dict[str, float] | None = None) -> None:
        """One row; `values` are the metric columns measured for it, the others are missing.
        A value that is not a finite float counts as missing too (see the module docstring)."""
        row = dict(self._defaults)
        row.update(cells)
        if values is not None:
            measured: set[str] = set()
            for column, value in values.items():
                number = _finite(value)
                if number is not None:
                    row[column] = number
                    measured.add(column)
            for column in RANK_INT_COLUMNS:
                if column in measured:
                    row[column] = int(row[column])
            missing = [c for c in MISSABLE_COLUMNS if c not in measured]
            row["missing"] = "*" if len(missing) == len(MISSABLE_COLUMNS) else ",".join(missing)
        self.rows.append(tuple(row[c] for c in COLUMNS))


def _rank_values(per_rank: Mapping[int, float] | None) -> dict[str, float]:
    """The rank columns of one node from each rank's mean fwd + bwd time (ms)."""
    finite = {r: v for r, v in (per_rank or {}).items() if math.isfinite(_as_float(v))}
    if not finite:
        return {}
    mean = sum(finite.values()) / len(finite)
    slowest = max(sorted(finite), key=lambda r: finite[r])  # the lowest rank on a tie
    out = {
        "rank_count": float(len(finite)),
        "rank_fwd_bwd_mean_ms": mean,
        "rank_fwd_bwd_max_ms": finite[slowest],
        "rank_slowest": float(slowest),
    }
    if mean > 0:
        out["rank_imbalance"] = finite[slowest] / mean
    return out


def _group_rank_values(members: list[str], ranks: RankData | None) -> dict[str, float]:
    """A group node's rank columns: each rank's sum over the merged modules it measured."""
    if ranks is None:
        return {}
    sums: dict[int, float] = {}
    for key in members:
        for rank, value in ranks.fwd_bwd.get(key, {}).items():
            sums[rank] = sums.get(rank, 0.0) + value
    return _rank_values(sums)


def _rank_meta(ranks: RankData | None) -> list[tuple[str, str, float | None]]:
    """`ranks` (world size), `ranks_reported` (how many; text `rank@step` of each rank's newest
    sample folded in) and `ranks_missing` (how many; text: which ranks sent nothing)."""
    if ranks is None:
        return [("ranks", "", None), ("ranks_reported", "", None), ("ranks_missing", "", None)]
    reported = ",".join(f"{r}@{ranks.steps[r]}" for r in ranks.reported)
    missing = ",".join(str(r) for r in ranks.missing)
    return [
        ("ranks", "", float(ranks.world_size)),
        ("ranks_reported", reported, float(len(ranks.reported))),
        ("ranks_missing", missing, float(len(ranks.missing))),
    ]


def _group_values(
    members: list[str], stats: Mapping[str, ModuleStats], calls: dict[str, CallInfo]
) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in members:
        call = calls[key]
        values = _module_values(stats.get(key), call if call.flops_known else None)
        for column, value in values.items():
            if column in ADDITIVE:
                out[column] = out.get(column, 0.0) + value
    _flop_rate(out)
    return out


def build_table(prof: ProfileData, max_rows: int = MAX_ROWS) -> ProfileTable:
    """The profile as one flat table of at most `max_rows` rows (see the module docstring)."""
    stats = prof.stats
    structures = list(prof.structures)
    tree = merge(structures, stats.values())
    calls = {c.key: c for c in tree.calls}
    graphs = view_graphs(tree)
    # (key, text, number); a number that is None or not a finite float is missing
    meta: list[tuple[str, str, float | None]] = []
    root = tree.calls[0] if tree.calls else None
    root_stats = stats.get(root.key) if root is not None else None

    def total(metric: str) -> float | None:
        stat = root_stats.metrics.get(metric) if root_stats is not None else None
        return None if stat is None else stat.mean

    meta = [
        ("table_format", TABLE_FORMAT, float(TABLE_VERSION)),
        ("model_name", prof.model_name, 0.0),
        ("root_view", root.key if root is not None and graphs else "", 0.0),
        ("num_samples", "", prof.num_samples),
        ("invocations", "", float(len(tree.calls))),
        ("structure_passes", "", float(len(structures))),
    ]
    for metric in ("fwd_ms", "bwd_ms", "act_bytes", "param_bytes", "grad_bytes", "optim_bytes"):
        meta.append((f"total_{metric}", "", total(metric)))
    fwd, bwd = total("fwd_ms"), total("bwd_ms")
    meta.append(("total_fwd_bwd_ms", "", None if fwd is None or bwd is None else fwd + bwd))
    flops = None
    if root is not None and root.flops_known:
        flops = root.fwd_flops
    meta.append(("total_fwd_flops", "", flops))
    ranks = prof.ranks
    meta.extend(_rank_meta(ranks))
    budget = max_rows - len(meta) - 2  # the `reduced` and `views` rows
    if budget < MIN_VIEW_ROWS:
        raise ValueError(f"max_rows must leave room for a view; got {max_rows}")
    depth_of = {g.view_key: calls[g.view_key].depth for g in graphs}
    graphs, reduced, groups = reduce_graphs(graphs, depth_of, stats, budget, max_rows)
    drawn = {n.node_key for g in graphs for n in g.nodes}
    not_drawn = sum(1 for k in calls if k not in drawn and (root is None or k != root.key))
    meta.append(("reduced", reduced, float(not_drawn if reduced else 0)))
    meta.append(("views", "", float(len(graphs))))

    out = _RowWriter()
    for key, text, number in meta:
        cells: dict[str, Cell] = {"row_kind": "meta", "meta_key": key, "meta_value": text}
        finite = _finite(number)
        cells["meta_number"] = 0.0 if finite is None else finite
        cells["missing"] = "meta_number" if finite is None else ""
        out.add(cells)
    views = {g.view_key for g in graphs}
    for graph in graphs:
        layout: ViewLayout = layout_view(graph)
        chain = _ancestors(graph.view_key, calls)
        view_cells: dict[str, Cell] = {
            "view_key": graph.view_key,
            "view_path": " / ".join(c.key for c in chain),
            "view_labels": _view_labels(chain),
            "view_depth": len(chain) - 1,
            "view_w_px": layout.width_px,
            "view_h_px": layout.height_px,
        }
        kids = [
            stats[n.node_key] for n in graph.nodes if n.kind == "module" and n.node_key in stats
        ]
        for node, box in zip(graph.nodes, layout.boxes, strict=True):
            cells = dict(view_cells)
            cells.update(
                row_kind="node",
                node_key=node.node_key,
                node_kind=node.kind,
                label=node.label,
                sublabel=node.sublabel,
                x_px=box.x_px,
                y_px=box.y_px,
                w_px=box.w_px,
                h_px=box.h_px,
            )
            values: dict[str, float]
            count_from: ModuleStats | None = None
            if node.kind == "module":
                call = calls[node.node_key]
                count_from = stats.get(call.key)
                cells.update(
                    module_name=call.module_name,
                    module_type=call.module_type,
                    call_index=call.call_index,
                    has_view=call.key in views,
                    group_count=1,
                )
                values = _module_values(count_from, call if call.flops_known else None)
                if ranks is not None:
                    values.update(_rank_values(ranks.fwd_bwd.get(call.key)))
            elif node.kind == "self":
                view_call = calls[graph.view_key]
                count_from = stats.get(graph.view_key)
                cells.update(module_name=view_call.module_name, module_type=view_call.module_type)
                values = _self_values(
                    count_from, kids, view_call if view_call.flops_known else None
                )
                if ranks is not None:
                    values.update(_rank_values(ranks.self_ms.get(graph.view_key)))
            elif node.kind == "group":
                # merged modules carry their sums; merged inputs or outputs only their count
                members = groups.get(node.node_key, [])
                cells["group_count"] = len(members)
                values = _group_values([k for k in members if k in calls], stats, calls)
                values.update(_group_rank_values(members, ranks))
            else:
                values = {}
            if count_from is not None and "fwd_ms" in count_from.metrics:
                cells["samples"] = count_from.metrics["fwd_ms"].count
            out.add(cells, values)
        for edge in layout.edges:
            cells = dict(view_cells)
            cells.update(
                row_kind="edge",
                src_key=edge.src_key,
                dst_key=edge.dst_key,
                edge_path=_edge_path(edge.points),
                missing="*",
            )
            out.add(cells)
    # Unreachable: any view reduces to MIN_VIEW_ROWS rows, and the budget holds at least that.
    assert len(out.rows) <= max_rows, (len(out.rows), max_rows)
    return ProfileTable(COLUMNS, tuple(out.rows), reduced)
