"""Table rows from laid-out views: meta rows from `(key, text, number)` triples, and per view
one node row per box and one edge row per path. Takes each drawn `ViewGraph` with its
`ViewLayout`, and the calls, statistics, rank data and group members they are read from (a
`RowSource`); gives rows as tuples of cells in `COLUMNS` order, every cell a string, a finite
number or a bool (a value that is not finite is written as 0 and named in `missing`).

>>> meta_rows([("views", "", 2.0)])[0][COLUMNS.index("meta_number")]
2.0
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from math import isfinite
from operator import itemgetter
from typing import TYPE_CHECKING

from wandb_modprof.records.calls import CallInfo
from wandb_modprof.records.graph import GraphNode, ViewGraph
from wandb_modprof.records.sample import ModuleStats
from wandb_modprof.view.columns import (
    BOOL_COLUMNS,
    COLUMNS,
    INT_COLUMNS,
    MISSABLE_COLUMNS,
    NUMBER_COLUMNS,
    RANK_INT_COLUMNS,
    TEXT_COLUMNS,
    Cell,
)
from wandb_modprof.view.graphs import short_name
from wandb_modprof.view.ranks import group_rank_values, rank_values
from wandb_modprof.view.refs import ViewRef, to_ref
from wandb_modprof.view.values import finite, group_values, module_values, self_values

if TYPE_CHECKING:
    from wandb_modprof.records.ranks import RankData
    from wandb_modprof.records.roofline import Roofline
    from wandb_modprof.view.layout import BlockFrame, ViewLayout

Row = tuple[Cell, ...]
# (key, text, number); a number that is None or not a finite float is missing
MetaRow = tuple[str, str, float | None]

_DEFAULTS: dict[str, Cell] = {
    **{c: "" for c in TEXT_COLUMNS},
    **{c: 0 for c in INT_COLUMNS},
    **{c: False for c in BOOL_COLUMNS},
    **{c: 0.0 for c in NUMBER_COLUMNS},
}


@dataclass(frozen=True)
class RowSource:
    """What the node rows of the drawn views are read from: every call by key, the statistics,
    the rank data (None outside distributed runs), the members of each group node, and the keys
    of the views drawn (a module node whose view is drawn has `has_view`)."""

    calls: Mapping[str, CallInfo]
    stats: Mapping[str, ModuleStats]
    ranks: RankData | None
    groups: Mapping[str, list[str]]
    views: frozenset[str]
    roofline: Roofline | None = None  # the machine's peaks (`records.roofline`); None: unknown
    # call key -> its checkpoint-plan cells (`view.checkpoint_cells`); empty: no plan
    checkpoint: Mapping[str, dict[str, float]] = field(default_factory=dict)
    # call key -> its load cells (`view.load`: members of a module list); empty: none
    load: Mapping[str, dict[str, float]] = field(default_factory=dict)


def meta_rows(meta: Sequence[MetaRow]) -> list[Row]:
    """One `meta` row per triple; a number that is not finite is written as 0, `missing`."""
    rows = []
    for key, text, number in meta:
        cells: dict[str, Cell] = {"row_kind": "meta", "meta_key": key, "meta_value": text}
        value = finite(number)
        cells["meta_number"] = 0.0 if value is None else value
        cells["missing"] = "meta_number" if value is None else ""
        rows.append(_row(cells))
    return rows


def view_rows(graph: ViewGraph, layout: ViewLayout, ref: ViewRef, src: RowSource) -> list[Row]:
    """The `view` row of `graph` (numbered `ref`), its node rows (boxes from `layout`, in node
    order), then its edge rows. Keys and names in node and edge rows are refs relative to the
    view (`view/refs.py`), so no row repeats a string that grows with depth."""
    fixed = _fixed_rows(graph, layout, src.calls)
    call = src.calls.get(graph.view_key)
    parent = src.calls.get(call.parent_key) if call and call.parent_key is not None else None
    crumb = "" if call is None else call.module_type if parent is None else short_name(call, parent)
    rows = [
        _row(
            {
                "view_id": ref.view_id,
                "view_depth": call.depth if call is not None else 0,
                "view_w_px": layout.width_px,
                "view_h_px": layout.height_px,
                "row_kind": "view",
                "view_key": graph.view_key,
                "view_parent": ref.parent_id,
                "view_last": ref.last_id,
                "label": crumb,
                "name_ref": fixed.view_name,
                "module_type": call.module_type if call is not None else "",
                "missing": "*",
            }
        )
    ]
    # the cached rows are numbered 0: this view's number goes in (a later table may number
    # the same view differently when other views are drawn)
    vid = ref.view_id
    rows += (_numbered(r, vid) for r in fixed.frames)
    kids = [
        src.stats[n.node_key] for n in graph.nodes if n.kind == "module" and n.node_key in src.stats
    ]
    for node, base in zip(graph.nodes, fixed.node_bases, strict=True):
        node_cells, values, count_from = _node_values(node, graph.view_key, kids, src)
        node_cells["view_id"] = vid
        if "name_ref" in node_cells:
            node_cells["name_ref"] = fixed.rel(str(node_cells["name_ref"]))
        if count_from is not None:
            samples = count_from.count("fwd_ms")
            if samples:
                node_cells["samples"] = samples
        rows.append(_row(node_cells, values, base))
    rows += (_numbered(r, vid) for r in fixed.edges)
    return rows


@dataclass(frozen=True)
class _FixedRows:
    """What a view's rows hold whatever the statistics and the view's number: its grid frames'
    rows, each node row's cells before its values, its edge rows (all numbered 0). The same
    for a later sample's table while the view's layout and nodes are: kept for those
    (`_FIXED`)."""

    layout: ViewLayout  # (held: the cache key uses the identity of these two)
    nodes: tuple[GraphNode, ...]
    view_name: str
    frames: tuple[Row, ...]
    node_bases: tuple[dict[str, Cell], ...]
    edges: tuple[Row, ...]
    rel: Callable[[str], str]


def _fixed_rows(graph: ViewGraph, layout: ViewLayout, calls: Mapping[str, CallInfo]) -> _FixedRows:
    key = (id(layout), id(graph.nodes))
    cached = _FIXED.get(key)
    if cached is not None and cached.layout is layout and cached.nodes is graph.nodes:
        _FIXED.move_to_end(key)
        return cached
    call = calls.get(graph.view_key)
    view_name = call.module_name if call is not None else ""
    depth = call.depth if call is not None else 0
    ids: dict[str, Cell] = {"view_id": 0, "view_depth": depth}
    size: dict[str, Cell] = {"view_w_px": layout.width_px, "view_h_px": layout.height_px}

    def rel(full: str) -> str:
        return to_ref(full, graph.view_key, view_name)

    # A grid's frame (`view/blocks.py`) comes before the nodes it holds, so it is drawn
    # behind them; it names them in `group_members`, as a group node names what it merged.
    frames = tuple(_row(_frame_cells(frame, rel) | ids | size) for frame in layout.frames)
    bases = []
    for node, box in zip(graph.nodes, layout.boxes, strict=True):
        base = dict(_DEFAULTS)
        base.update(ids)
        base.update(size)
        base.update(
            row_kind="node", node_ref=rel(node.node_key), node_kind=node.kind, label=node.label,
            sublabel=node.sublabel, x_px=box.x_px, y_px=box.y_px, w_px=box.w_px, h_px=box.h_px,
        )  # fmt: skip
        bases.append(base)
    edges = tuple(
        _row(
            {
                **ids,
                "row_kind": "edge",
                "src_ref": rel(edge.src_key),
                "dst_ref": rel(edge.dst_key),
                "edge_path": _edge_path(edge.points),
                "missing": "*",
            }
        )
        for edge in layout.edges
    )
    fixed = _FixedRows(layout, graph.nodes, view_name, frames, tuple(bases), edges, rel)
    _FIXED[key] = fixed
    if len(_FIXED) > FIXED_CACHE_VIEWS:
        _FIXED.popitem(last=False)
    return fixed


# The fixed rows of the views drawn last (least recently used dropped first): as many as the
# layouts kept (`view.layout.LAYOUT_CACHE_VIEWS`).
FIXED_CACHE_VIEWS = 4096
_FIXED: OrderedDict[tuple[int, int], _FixedRows] = OrderedDict()
_VIEW_ID = COLUMNS.index("view_id")


def _numbered(row: Row, view_id: int) -> Row:
    """`row` with `view_id` in its view number's cell."""
    return (*row[:_VIEW_ID], view_id, *row[_VIEW_ID + 1 :])


def _frame_cells(frame: BlockFrame, rel: Callable[[str], str]) -> dict[str, Cell]:
    """A frame's node row (`node_kind` "block"): its box and title, no metric (`missing` "*")."""
    box = frame.box
    return {
        "row_kind": "node",
        "node_ref": rel(box.node_key),
        "node_kind": "block",
        "label": frame.label,
        "sublabel": frame.sublabel,
        "x_px": box.x_px,
        "y_px": box.y_px,
        "w_px": box.w_px,
        "h_px": box.h_px,
        "group_count": len(frame.members),
        "group_members": "\n".join(rel(k) for k in frame.members),
        "missing": "*",
    }


def _node_values(
    node: GraphNode, view_key: str, kids: Sequence[ModuleStats], src: RowSource
) -> tuple[dict[str, Cell], dict[str, float], ModuleStats | None]:
    """A node's cells beyond its box, its metric values, and the statistics its `samples`
    count comes from (None: no count)."""
    if node.kind == "module":
        call = src.calls[node.node_key]
        stats = src.stats.get(call.key)
        cells: dict[str, Cell] = {
            "name_ref": call.module_name,
            "module_type": call.module_type,
            "call_index": call.call_index,
            "has_view": call.key in src.views,
            "group_count": 1,
        }
        values = module_values(stats, call if call.flops_known else None, src.roofline)
        values.update(src.checkpoint.get(call.key, {}))
        values.update(src.load.get(call.key, {}))
        if src.ranks is not None:
            values.update(rank_values(src.ranks.fwd_bwd.get(call.key)))
        return cells, values, stats
    if node.kind == "self":
        view_call = src.calls[view_key]
        stats = src.stats.get(view_key)
        cells = {"name_ref": view_call.module_name, "module_type": view_call.module_type}
        known = view_call if view_call.flops_known else None
        values = self_values(stats, kids, known, src.roofline)
        if src.ranks is not None:
            values.update(rank_values(src.ranks.self_ms.get(view_key)))
        return cells, values, stats
    if node.kind == "group":
        # merged modules carry their sums; merged inputs or outputs only their count
        members = src.groups.get(node.node_key, [])
        merged = [k for k in members if k in src.calls]
        values = group_values(merged, src.stats, src.calls, src.roofline)
        values.update(group_rank_values(members, src.ranks))
        owner = src.calls.get(view_key)
        view_name = owner.module_name if owner is not None else ""
        refs = "\n".join(to_ref(k, view_key, view_name) for k in members)
        return {"group_count": len(members), "group_members": refs}, values, None
    return {}, {}, None


def timeline_rows(
    spans: Sequence[tuple[str, str, str, float, float, int]],
    curve: Sequence[tuple[float, int]],
    refs: Mapping[str, ViewRef],
    calls: Mapping[str, CallInfo],
) -> list[Row]:
    """`span` rows (`view/timeline.py`: per drawn view, a node's forward or backward window,
    its key relative to the view) then `mem` rows (the curve's points, `view_id` -1: every
    view shares it). No metric applies to them (`missing` "*"). A span or point whose time is
    not finite (a loaded file may hold a run ending at "nan") has nothing to draw: no row."""
    rows = []
    for view_key, node_key, phase, t0, t1, runs in spans:
        if not (isfinite(t0) and isfinite(t1)):
            continue
        call = calls.get(view_key)
        cells: dict[str, Cell] = {
            "row_kind": "span",
            "view_id": refs[view_key].view_id,
            "node_ref": to_ref(node_key, view_key, call.module_name if call else ""),
            "span_phase": phase,
            "t0_ms": t0,
            "t1_ms": t1,
            "group_count": runs,
            "missing": "*",
        }
        rows.append(_row(cells))
    for t, live in curve:
        if not isfinite(t):
            continue
        cells = {"row_kind": "mem", "view_id": -1, "t0_ms": t, "live_bytes": float(live)}
        cells["missing"] = "*"
        rows.append(_row(cells))
    return rows


_in_column_order = itemgetter(*COLUMNS)  # a row dict's cells as the table's tuple, in one call


def _row(
    cells: dict[str, Cell],
    values: dict[str, float] | None = None,
    base: dict[str, Cell] = _DEFAULTS,
) -> Row:
    """One row; `values` are the metric columns measured for it, the others are missing.
    A value that is not a finite float counts as missing too (see the module docstring).
    `base`: the cells before `cells` (every column's default, or a node's fixed cells)."""
    row = dict(base)
    row.update(cells)
    if values is not None:
        # (the values are floats but for a few: `finite`'s conversion only for those;
        # ~100,000 values in a 10,000-row table)
        measured = {
            column: value
            for column, value in values.items()
            if (isfinite(value) if type(value) is float else finite(value) is not None)
        }
        for column, value in measured.items():
            if type(value) is not float:
                measured[column] = finite(value)  # type: ignore[assignment]
        row.update(measured)
        for column in RANK_INT_COLUMNS:
            if column in measured:
                row[column] = int(row[column])
        row["missing"] = _missing(tuple(measured))
    cells_in_order: Row = _in_column_order(row)
    return cells_in_order


@lru_cache(maxsize=4096)
def _missing(measured: tuple[str, ...]) -> str:
    """The `missing` cell of a row whose measured columns are `measured` ("*": none measured).
    Rows of one kind measure the same columns: a handful of distinct answers per table."""
    have = set(measured)
    missing = [c for c in MISSABLE_COLUMNS if c not in have]
    return "*" if len(missing) == len(MISSABLE_COLUMNS) else ",".join(missing)


def _edge_path(points: Sequence[tuple[float, float]]) -> str:
    head, *rest = points
    return f"M{head[0]:.1f},{head[1]:.1f}" + "".join(f"L{x:.1f},{y:.1f}" for x, y in rest)
