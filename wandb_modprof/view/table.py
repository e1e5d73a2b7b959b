"""The flat table every sink consumes (W&B Table, HTML report, tests): rows of kind view /
node / edge / meta: one per drawn view, per node and per edge of it, plus meta rows with totals
and notes; and the last sample's timeline (`view/timeline.py`): `span` rows (a node's forward
or backward window, `span_phase`, `t0_ms`, `t1_ms`, `group_count` runs merged; keyed like node
rows) and `mem` rows (the step's memory curve: `t0_ms`, `live_bytes`), with meta rows
`timeline` (the curve's source, the sample's step), `mem_peak` (the call running at the peak,
its bytes) and `mem_peak_ms` ("forward" / "backward", when). The timeline is downsampled to its
own budget (at most 500 spans per view, 1,000 curve points, 3,000 rows and a quarter of the
table) and the `reduced` note says what that left out.

The table is linear in the calls it shows: a `view` row holds its view's key and module name
once, with its number `view_id`, its parent's `view_parent` (-1: the root view) and the last
number of its subtree `view_last` (views are numbered depth first, so the breadcrumbs of a view
are the views whose `[view_id, view_last]` holds its id). Node and edge rows name their view by
`view_id` and hold keys and names relative to it (`node_ref`, `name_ref`, `src_ref`,
`dst_ref`; see `view/refs.py`); `ProfileTable.resolved()` reads them back as `node_key`,
`module_name`, `src_key`, `dst_key` and `view_key`.

Takes a `ProfileData`; gives a `ProfileTable`. `build_table` is the pipeline: merge the
structure passes into one call tree and its views (`graphs`), fit them into the row budget
(`reduce`), lay out each view drawn (`layout`), write the rows (`meta`, `rows`, with the cell
values from `values` and `ranks`). The column names live in `columns`, re-exported here.

A view whose many siblings are drawn as a grid (`view/blocks.py`: a mixture-of-experts layer's
experts) has one more node row per grid, its frame: `node_kind` "block", the frame's box, its
title in `label` / `sublabel`, the nodes inside in `group_members` (grid order) and
`group_count`, no metric; the edges of the framed nodes are bundled at the frame.

Cells are always a string, a finite number or a bool: a metric that was not measured for a
node is written as 0 and its column name is listed in that row's `missing` cell (`"*"`: none
of the metrics apply, e.g. input nodes). No `null` (W&B rewrites nulls in specs; browsers
reject bare NaN), no NaN/inf, and no column named `id`, `name` or `color` (W&B adds those).

Distributed runs (rank 0 of a `watch` under `torch.distributed`, see `api.distributed`): module,
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

import dataclasses
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from wandb_modprof.capture.step.random_state import keeping
from wandb_modprof.view.checkpoint_cells import DEFAULT_BUDGET, checkpoint_cells
from wandb_modprof.view.columns import (
    BOOL_COLUMNS,
    CHECKPOINT_COLUMNS,
    COLUMNS,
    FLOP_COLUMNS,
    INT_COLUMNS,
    LAYOUT_COLUMNS,
    METRIC_COLUMNS,
    MISSABLE_COLUMNS,
    NUMBER_COLUMNS,
    RANK_COLUMNS,
    RANK_INT_COLUMNS,
    RANK_NUMBER_COLUMNS,
    RESOLVED_COLUMNS,
    SPREAD_METRICS,
    TABLE_FORMAT,
    TABLE_VERSION,
    TEXT_COLUMNS,
    Cell,
)
from wandb_modprof.view.graphs import call_graphs
from wandb_modprof.view.layout import layout_view
from wandb_modprof.view.load import load_cells
from wandb_modprof.view.meta import REDUCTION_META_ROWS, profile_meta, reduction_meta
from wandb_modprof.view.reduce import MIN_VIEW_ROWS, reduce_views
from wandb_modprof.view.refs import from_ref, number_views
from wandb_modprof.view.rows import RowSource, meta_rows, timeline_rows, view_rows
from wandb_modprof.view.spans import ViewSpans
from wandb_modprof.view.timeline import build_timeline, timeline_budget
from wandb_modprof.view.values import finite, profile_roofline

if TYPE_CHECKING:
    from wandb_modprof.records.graph import ViewGraph
    from wandb_modprof.records.sample import ModuleStats
    from wandb_modprof.records.snapshot import ProfileData

# The schema lives in `columns` (the row writer needs it too); it is re-exported here, where the
# sinks and tests look for it.
__all__ = [
    "BOOL_COLUMNS",
    "CHECKPOINT_COLUMNS",
    "COLUMNS",
    "FLOP_COLUMNS",
    "INT_COLUMNS",
    "LAYOUT_COLUMNS",
    "MAX_ROWS",
    "METRIC_COLUMNS",
    "MISSABLE_COLUMNS",
    "NUMBER_COLUMNS",
    "RANK_COLUMNS",
    "RANK_INT_COLUMNS",
    "RANK_NUMBER_COLUMNS",
    "RESOLVED_COLUMNS",
    "SPREAD_METRICS",
    "TABLE_FORMAT",
    "TABLE_VERSION",
    "TEXT_COLUMNS",
    "Cell",
    "ProfileTable",
    "build_table",
]

MAX_ROWS = 10_000


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

    def records(self, kinds: Collection[str] | None = None) -> list[dict[str, Cell]]:
        """The rows as dicts, as stored: node and edge rows name their view by `view_id` and
        hold keys and names as refs relative to it (`node_ref`, `name_ref`, ...). `kinds`:
        only the rows of those `row_kind`s (the few meta rows of a 10,000-row table without
        building a dict per row)."""
        if kinds is None:
            return [dict(zip(self.columns, row, strict=True)) for row in self.rows]
        at = self.columns.index("row_kind")
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows if row[at] in kinds]

    def resolved(self) -> list[dict[str, Cell]]:
        """`records()` with the refs read back: every node and edge row also gets its view's
        `view_key` and its full `node_key`, `module_name`, `src_key`, `dst_key` and, for a
        group node, `group_keys` (its members' keys, one per line) (view rows: `module_name`;
        "" where a row has none). Built in memory for readers in Python; the
        panel does the same in Vega.

        >>> [r["node_key"] for r in prof.table().resolved() if r["row_kind"] == "node"][:2]
        ['<root>#0|in:x', 'fc1#0']                                 # doctest: +SKIP
        """
        views: dict[int, tuple[str, str]] = {}
        out = []
        for record in self.records():
            kind = record["row_kind"]
            full: dict[str, Cell] = dict.fromkeys(RESOLVED_COLUMNS, "")
            if kind == "view":
                views[int(record["view_id"])] = (str(record["view_key"]), str(record["name_ref"]))
                full["module_name"] = record["name_ref"]
            elif kind in ("node", "edge", "span"):
                vk, vn = views.get(int(record["view_id"]), ("", ""))
                record["view_key"] = vk
                for column, ref in zip(RESOLVED_COLUMNS[:4], _REF_COLUMNS, strict=True):
                    full[column] = from_ref(str(record[ref]), vk, vn)  # "" stays ""
                members = str(record["group_members"])
                full["group_keys"] = "\n".join(
                    from_ref(m, vk, vn) for m in members.split("\n") if members
                )
            record.update(full)
            out.append(record)
        return out


def _heat(graph: ViewGraph, stats: Mapping[str, ModuleStats]) -> tuple[float, ...]:
    """Per node of `graph` its forward + backward time (the medians the panel colours by; the
    forward alone where no backward ran), NaN where neither was measured: the layout ranks a
    grid of many siblings by it, hottest first (`view/blocks.py`)."""
    out = []
    for node in graph.nodes:
        node_stats = stats.get(node.node_key)
        parts = [] if node_stats is None else [node_stats.typical(m) for m in ("fwd_ms", "bwd_ms")]
        known = [v for v in (finite(p) for p in parts) if v is not None]
        out.append(sum(known) if known else math.nan)
    return tuple(out)


# the stored column each of the first four `RESOLVED_COLUMNS` is read from (`group_keys`: one
# ref per line of `group_members`)
_REF_COLUMNS = ("node_ref", "name_ref", "src_ref", "dst_ref")


@keeping("a table build")
def build_table(
    prof: ProfileData,
    max_rows: int = MAX_ROWS,
    full_detail: str = "",
    checkpoint_budget: int | float | str | None = DEFAULT_BUDGET,
    checkpoint_call_ms: float | None = None,
) -> ProfileTable:
    """The profile as one flat table of at most `max_rows` rows (see the module docstring):
    merge the structure passes into one call tree, reduce its views to the row budget, lay
    out each view drawn, then write the rows. `full_detail` (where the full profile is, e.g.
    the W&B artifact `sinks.wandb.wandb_log` logs) ends a reduced table's note.
    `checkpoint_budget`: the checkpoint plan the table carries (`view.checkpoint_cells`;
    None: none), `checkpoint_call_ms` what it prices each checkpointed call at beyond the
    recompute (None: this process's measurement where it has one)."""
    tree, graphs = call_graphs(prof.structures, prof.stats.values())
    roofline = profile_roofline(prof.structures, tree.calls, prof.stats)
    plan = checkpoint_cells(prof, tree.calls, prof.stats, checkpoint_budget, checkpoint_call_ms)
    meta = profile_meta(prof, tree, has_views=bool(graphs), roofline=roofline)
    meta += plan.meta
    load = load_cells(tree.calls, prof.stats, prof.num_samples - prof.cold_left_out)
    meta += load.meta
    # The timeline's rows come out of the budget first, as many as it needs with every view
    # drawn, within its own budget (`view/timeline.py`) and never below one view's room.
    # (one `ViewSpans` for both timelines: the second reuses the views the reduction kept)
    spans = ViewSpans(prof.last) if prof.last is not None else None
    wanted = build_timeline(prof.last, graphs, {}, timeline_budget(max_rows), source=spans)
    meta += wanted.meta
    budget = max_rows - len(meta) - REDUCTION_META_ROWS
    if budget < MIN_VIEW_ROWS:
        raise ValueError(f"max_rows must leave room for a view; got {max_rows}")
    reserve = min(len(wanted.spans) + len(wanted.curve), budget - MIN_VIEW_ROWS)
    calls = {c.key: c for c in tree.calls}
    reduction = reduce_views(graphs, calls, prof.stats, budget - reserve, max_rows, full_detail)
    # the curve keeps the points it had with every view drawn, the spans share the rest
    points = min(len(wanted.curve), reserve)
    timeline = build_timeline(
        prof.last, reduction.graphs, reduction.groups, reserve, points, source=spans
    )
    if timeline.note:
        note = "; ".join(n for n in (reduction.note, "timeline: " + timeline.note) if n)
        reduction = dataclasses.replace(reduction, note=note)
    meta += reduction_meta(reduction, tree, prof.stats)

    src = RowSource(
        calls=calls,
        stats=prof.stats,
        ranks=prof.ranks,
        groups=reduction.groups,
        views=frozenset(g.view_key for g in reduction.graphs),
        roofline=roofline,
        checkpoint=plan.values,
        load=load.values,
    )
    rows = meta_rows(meta)
    refs = number_views([g.view_key for g in reduction.graphs], calls)
    for drawn in sorted(reduction.graphs, key=lambda g: refs[g.view_key].view_id):
        graph = dataclasses.replace(drawn, heat=_heat(drawn, prof.stats))
        # `layout_view` looked up here, at call time: benchmarks/scale.py times the layout by
        # replacing it in this module.
        rows += view_rows(graph, layout_view(graph), refs[graph.view_key], src)
    rows += timeline_rows(timeline.spans, timeline.curve, refs, calls)
    # Unreachable: any view reduces to MIN_VIEW_ROWS rows, and the budget holds at least that.
    assert len(rows) <= max_rows, (len(rows), max_rows)
    return ProfileTable(COLUMNS, tuple(rows), reduction.note)
