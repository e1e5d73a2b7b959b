"""The flat table every sink consumes (W&B Table, HTML report, tests): rows of kind node / edge
/ meta, one per node and edge of every drawn view, plus meta rows with totals and notes.

Cells are always a string, a finite number or a bool: a metric that was not measured for a
node is written as 0 and its column name is listed in that row's `missing` cell (`"*"`: none
of the metrics apply, e.g. input nodes). No `null` (W&B rewrites nulls in specs; browsers
reject bare NaN), no NaN/inf, and no column named `id`, `name` or `color` (W&B adds those).

At most `MAX_ROWS` rows (W&B cuts tables at 10,000 rows without a word). A larger profile is
reduced on purpose, and the `reduced` meta row says how: first views below some depth are not
drawn (their modules' cost stays in the ancestors shown), then, if one view alone is too big,
its cheapest modules merge into one `group` node that carries their sums and count.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._graph import GraphEdge, GraphNode, LevelGraph
from ._layout import LevelLayout, layout_level
from ._levels import CallTree, level_graphs, merge, short_name
from ._records import MEMORY_METRICS, METRICS, TIME_METRICS, ModuleStats, RunningStat
from ._structure import CallInfo

if TYPE_CHECKING:
    from ._profile import Profile

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
INT_COLUMNS = ("view_depth", "call_index", "group_count", "samples")
BOOL_COLUMNS = ("has_view",)
LAYOUT_COLUMNS = ("x_px", "y_px", "w_px", "h_px", "view_w_px", "view_h_px")
METRIC_COLUMNS = (
    METRICS
    + tuple(f"{m}_{s}" for m in SPREAD_METRICS for s in ("std", "min", "max", "last"))
    + FLOP_COLUMNS
)
NUMBER_COLUMNS = LAYOUT_COLUMNS + METRIC_COLUMNS + ("meta_number",)
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
def _metric_values(stats: ModuleStats | None) -> dict[str, float]:
    if stats is None:
        return {}
    out: dict[str, float] = {}
    for metric, stat in stats.metrics.items():
        out[metric] = stat.mean
        if metric in SPREAD_METRICS:
            _spread(out, metric, stat)
    return out


def _spread(out: dict[str, float], column: str, stat: RunningStat) -> None:
    out[f"{column}_std"] = stat.std
    out[f"{column}_min"] = stat.min
    out[f"{column}_max"] = stat.max
    out[f"{column}_last"] = stat.last


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
                out[column] = stat.mean
                if column in SPREAD_METRICS:
                    _spread(out, column, stat)
        # Once per child module: a module called three times holds its parameters once.
        distinct = {k.module_name: k for k in kids}.values()
        for metric in _OWN_STATIC:
            total = view.metrics.get(metric)
            if total is not None:
                inner = sum(k.metrics[metric].mean for k in distinct if metric in k.metrics)
                out[metric] = max(0.0, total.mean - inner)  # tied weights can overcount
    if call is not None:
        out["fwd_flops"] = float(call.fwd_self_flops)
        out["fwd_self_flops"] = float(call.fwd_self_flops)
        _flop_rate(out)
    return out


def _flop_rate(out: dict[str, float]) -> None:
    fwd_ms = out.get("fwd_ms")
    if fwd_ms is not None and fwd_ms > 0 and "fwd_flops" in out:
        out["fwd_flop_per_s"] = out["fwd_flops"] / (fwd_ms / 1000.0)


def _module_values(stats: ModuleStats | None, call: CallInfo | None) -> dict[str, float]:
    out = _metric_values(stats)
    if call is not None:
        out["fwd_flops"] = float(call.fwd_flops)
        out["fwd_self_flops"] = float(call.fwd_self_flops)
        _flop_rate(out)
    return out


# ---- reduction -------------------------------------------------------------------------------
def _size(graph: LevelGraph) -> int:
    return len(graph.nodes) + len(graph.edges)


def _group(graph: LevelGraph, keep: set[str], group_key: str, label: str) -> LevelGraph:
    """Merge the module nodes not in `keep` into one node; edges follow, deduplicated."""
    merged = {n.node_key for n in graph.nodes if n.kind == "module" and n.node_key not in keep}
    nodes: list[GraphNode] = []
    for n in graph.nodes:
        if n.node_key not in merged:
            nodes.append(n)
        elif not any(x.node_key == group_key for x in nodes):
            nodes.append(GraphNode(group_key, "group", label, "grouped"))
    seen: set[tuple[str, str]] = set()
    edges: list[GraphEdge] = []
    for e in graph.edges:
        src = group_key if e.src_key in merged else e.src_key
        dst = group_key if e.dst_key in merged else e.dst_key
        if src != dst and (src, dst) not in seen:
            seen.add((src, dst))
            edges.append(GraphEdge(src, dst))
    return LevelGraph(graph.view_key, tuple(nodes), tuple(edges))


def _cost(stats: ModuleStats | None) -> float:
    if stats is None:
        return 0.0
    return sum(stats.metrics[m].mean for m in ("fwd_ms", "bwd_ms") if m in stats.metrics)


def _shrink_view(
    graph: LevelGraph, stats: dict[str, ModuleStats], budget: int
) -> tuple[LevelGraph, dict[str, list[str]]]:
    """Keep the most expensive modules of an oversized view; merge the others into a group."""
    modules = [n.node_key for n in graph.nodes if n.kind == "module"]
    ranked = sorted(modules, key=lambda k: (-_cost(stats.get(k)), modules.index(k)))
    group_key = f"{graph.view_key}|group"
    lo, hi = 0, len(ranked) - 1  # keep `lo` modules at least; `hi` is too many
    best = _group(graph, set(), group_key, f"{len(ranked)} modules")
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = _group(graph, set(ranked[:mid]), group_key, f"{len(ranked) - mid} more modules")
        if _size(candidate) <= budget:
            best, lo = candidate, mid + 1
        else:
            hi = mid - 1
    members = [k for k in modules if k not in {n.node_key for n in best.nodes}]
    return best, {group_key: members}


def reduce_graphs(
    graphs: list[LevelGraph],
    depth_of: dict[str, int],
    stats: dict[str, ModuleStats],
    budget: int,
) -> tuple[list[LevelGraph], str, dict[str, list[str]]]:
    """Fit the views into `budget` rows; returns the views kept, what was done (or ""), and
    the members of every group node."""
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
            f"{MAX_ROWS:,} rows; their modules' time and memory are included in the modules "
            "shown, and every module's statistics are in the saved profile."
        )
        return kept, note, {}
    root = graphs[0]
    shrunk, groups = _shrink_view(root, stats, budget)
    count = len(next(iter(groups.values())))
    note = (
        f"The top view has {len(root.nodes)} nodes; {count} of its cheapest modules are "
        f"merged into one group node, and no deeper views are drawn, to stay within "
        f"{MAX_ROWS:,} rows. Every module's statistics are in the saved profile."
    )
    return [shrunk], note, groups


# ---- rows ------------------------------------------------------------------------------------
def _ancestors(key: str, calls: dict[str, CallInfo]) -> list[CallInfo]:
    chain: list[CallInfo] = []
    call: CallInfo | None = calls.get(key)
    while call is not None:
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
        row = dict(self._defaults)
        row.update(cells)
        if values is not None:
            row.update(values)
            missing = [c for c in METRIC_COLUMNS if c not in values]
            row["missing"] = "*" if len(missing) == len(METRIC_COLUMNS) else ",".join(missing)
        self.rows.append(tuple(row[c] for c in COLUMNS))


def _group_values(
    members: list[str], stats: dict[str, ModuleStats], calls: dict[str, CallInfo], tree: CallTree
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


def build_table(prof: Profile, max_rows: int = MAX_ROWS) -> ProfileTable:
    """The profile as one flat table of at most `max_rows` rows (see the module docstring)."""
    stats = prof.stats()
    structures = prof.structures()
    tree = merge(structures, stats.values())
    calls = {c.key: c for c in tree.calls}
    graphs = level_graphs(tree)
    meta: list[tuple[str, str, float | None]] = []  # (key, text, number or None = missing)
    root = tree.calls[0] if tree.calls else None
    root_stats = stats.get(root.key) if root is not None else None

    def total(metric: str) -> float | None:
        stat = root_stats.metrics.get(metric) if root_stats is not None else None
        return None if stat is None else stat.mean

    meta = [
        ("table_format", TABLE_FORMAT, float(TABLE_VERSION)),
        ("model_name", prof.model_name, 0.0),
        ("root_view", root.key if root is not None and graphs else "", 0.0),
        ("num_samples", "", float(prof.num_samples)),
        ("invocations", "", float(len(tree.calls))),
        ("structure_passes", "", float(len(structures))),
    ]
    for metric in ("fwd_ms", "bwd_ms", "act_bytes", "param_bytes", "grad_bytes", "optim_bytes"):
        meta.append((f"total_{metric}", "", total(metric)))
    flops = None
    if root is not None and root.flops_known:
        flops = float(root.fwd_flops)
    meta.append(("total_fwd_flops", "", flops))
    budget = max_rows - len(meta) - 2  # the `reduced` and `views` rows
    if budget < 8:
        raise ValueError(f"max_rows must leave room for a view; got {max_rows}")
    depth_of = {g.view_key: calls[g.view_key].depth for g in graphs}
    graphs, reduced, groups = reduce_graphs(graphs, depth_of, stats, budget)
    drawn = {n.node_key for g in graphs for n in g.nodes}
    not_drawn = sum(1 for k in calls if k not in drawn and (root is None or k != root.key))
    meta.append(("reduced", reduced, float(not_drawn if reduced else 0)))
    meta.append(("views", "", float(len(graphs))))

    out = _RowWriter()
    for key, text, number in meta:
        cells: dict[str, Cell] = {"row_kind": "meta", "meta_key": key, "meta_value": text}
        cells["meta_number"] = 0.0 if number is None else number
        cells["missing"] = "meta_number" if number is None else ""
        out.add(cells)
    views = {g.view_key for g in graphs}
    for graph in graphs:
        layout: LevelLayout = layout_level(graph)
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
            elif node.kind == "self":
                view_call = calls[graph.view_key]
                count_from = stats.get(graph.view_key)
                cells.update(module_name=view_call.module_name, module_type=view_call.module_type)
                values = _self_values(
                    count_from, kids, view_call if view_call.flops_known else None
                )
            elif node.kind == "group":
                members = groups.get(node.node_key, [])
                cells["group_count"] = len(members)
                values = _group_values(members, stats, calls, tree)
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
    assert len(out.rows) <= max_rows, (len(out.rows), max_rows)
    return ProfileTable(COLUMNS, tuple(out.rows), reduced)
