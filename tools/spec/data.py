"""The spec's data, first half: the rows W&B hands over (dataset `wandb`), runs, meta rows, the
nodes of the current view with their value in the current mode, the extents that normalise
the colours, and what is drawn. The lists shown around the graph are in `lists`."""

from __future__ import annotations

from typing import Any

from tools.spec.expressions import colour_field, missing, rank_expr, resolve_ref, value_expr
from tools.spec.theme import NO_VALUE_FILL, PORT_FILL
from wandb_modprof.records.modes import MODES
from wandb_modprof.sinks.spec import DATASET, SPEC_VERSION, read_columns
from wandb_modprof.sinks.wandb.packed import ESC, PACKED, SEP, UNPACKED
from wandb_modprof.view.columns import (
    BOOL_COLUMNS,
    COLUMNS,
    INT_COLUMNS,
    NUMBER_COLUMNS,
    TEXT_COLUMNS,
)

Data = dict[str, Any]
PORT = "datum.node_kind === 'input' || datum.node_kind === 'output'"


def _filter(expr: str) -> dict[str, str]:
    return {"type": "filter", "expr": expr}


def _formula(as_: str, expr: str) -> dict[str, str]:
    return {"type": "formula", "as": as_, "expr": expr}


def _min_max(field: str, lo: str, hi: str) -> dict[str, Any]:
    # min / max by aggregate, not `extent`: extent warns on every empty view
    return {"type": "aggregate", "fields": [field, field], "ops": ["min", "max"], "as": [lo, hi]}


def data() -> list[Data]:
    return [*_runs(), *_meta(), *_nodes(), *_extents(), *_drawn()]


def packed_columns(spec_text: str) -> tuple[list[str], list[str]]:
    """The numeric and the text columns the W&B copy of a table packs (`sinks/wandb/packed.py`):
    those the rest of the spec names, in the table's column order, but `UNPACKED`."""
    read = [c for c in read_columns(COLUMNS, spec_text) if c not in UNPACKED]
    numbers = set(INT_COLUMNS) | set(NUMBER_COLUMNS) | set(BOOL_COLUMNS)
    return [c for c in read if c in numbers], [c for c in read if c in TEXT_COLUMNS]


def _literal(char: str) -> str:
    return f"'\\u{ord(char):04x}'"


def unpack(numbers: list[str], texts: list[str]) -> list[dict[str, str]]:
    """The `rows` dataset's first transforms: split a W&B row's `PACKED` cell and give each
    packed column its value back (an empty number: null, so `missing` holds; a text's escapes
    undone). A row without the cell (the HTML report's full rows, a run's fields-only row)
    keeps its own fields. Running them twice (W&B inserts rows twice on mount) gives the same
    fields: they read only `PACKED`."""
    has = f"isString(datum.{PACKED})"
    sep, esc = _literal(SEP), _literal(ESC)
    out = [
        _formula("_packed", f"{has} ? split(datum.{PACKED}, {sep}) : []"),
        _formula("_numbers", f"{has} ? split(datum._packed[0], ',') : []"),
    ]
    for i, name in enumerate(numbers):
        conv = "toBoolean" if name in BOOL_COLUMNS else "toNumber"
        out.append(_formula(name, f"{has} ? {conv}(datum._numbers[{i}]) : datum.{name}"))
    for i, name in enumerate(texts, start=1):
        field = f"datum._packed[{i}]"
        unescaped = (
            f"replace(replace({field}, regexp({_literal(ESC)} + '1', 'g'), {sep}), "
            f"regexp({esc} + '0', 'g'), {esc})"
        )
        text = f"(indexof({field}, {esc}) < 0 ? {field} : {unescaped})"
        out.append(_formula(name, f"{has} ? {text} : datum.{name}"))
    return out


def _runs() -> list[Data]:
    run_label = (
        "isValid(datum.name) ? datum.name + '' : (isValid(datum.id) ? datum.id + '' : 'this run')"
    )
    return [
        {"name": DATASET},
        {
            "name": "rows",
            "source": DATASET,
            "transform": [
                _formula("run", "isValid(datum.id) ? datum.id + '' : ''"),
                _formula("run_label", run_label),
                _formula("run_color", "isValid(datum.color) ? datum.color + '' : '#888'"),
            ],
        },
        {
            # Only runs that logged this table: W&B hands the spec one row holding only the run's
            # fields for every visible run, including runs that never logged it.
            "name": "runs",
            "source": "rows",
            "transform": [
                _filter("datum.row_kind === 'meta' && datum.meta_key === 'table_format'"),
                {"type": "aggregate", "groupby": ["run", "run_label", "run_color"]},
                {"type": "window", "sort": {"field": "run"}, "ops": ["row_number"], "as": ["i"]},
            ],
        },
        {"name": "cur", "source": "rows", "transform": [_filter("datum.run === run_now")]},
        {
            # one row per drawn view (table format 2): its key and module name, written once,
            # which node and edge rows refer to by `view_id` (see `_in_view`)
            "name": "view_rows",
            "source": "rows",
            "transform": [
                _filter("datum.row_kind === 'view'"),
                _formula("vref", "datum.run + '/' + datum.view_id"),
            ],
        },
        {
            "name": "cur_views",
            "source": "view_rows",
            "transform": [_filter("datum.run === run_now")],
        },
        {
            "name": "view_at",
            "source": "cur_views",
            "transform": [_filter("datum.view_key === view_now")],
        },
    ]


def _in_view(*refs: tuple[str, str]) -> list[dict[str, Any]]:
    """Transforms giving a node or edge row its view's `view_key` and each `(field, ref
    column)` the full string: the table stores them relative to the view. Every field written
    is new or derived from other fields only, so re-running a transform never resolves twice."""
    lookup = {
        "type": "lookup",
        "from": "view_rows",
        "key": "vref",
        "fields": ["vref"],
        "values": ["view_key", "name_ref"],
        "as": ["vk", "vn"],
        "default": "",
    }
    return [
        _formula("vref", "datum.run + '/' + datum.view_id"),
        lookup,
        _formula("view_key", "datum.vk"),
        *(_formula(field, resolve_ref(f"datum.{ref}")) for field, ref in refs),
    ]


def _meta() -> list[Data]:
    number = _formula("n", f"{missing('meta_number')} ? NaN : datum.meta_number")
    return [
        {"name": "meta", "source": "cur", "transform": [_filter("datum.row_kind === 'meta'")]},
        {
            "name": "meta_n",
            "source": "meta",
            "transform": [
                number,
                {"type": "pivot", "field": "meta_key", "value": "n", "op": "max"},
            ],
        },
        *[
            {
                "name": f"m_{key}",
                "source": "meta",
                "transform": [_filter(f"datum.meta_key === '{meta_key}'")],
            }
            for key, meta_key in (
                ("root", "root_view"),
                ("open", "open_view"),  # the view to open on (`view.meta.open_view`)
                ("model", "model_name"),
                ("reduced", "reduced"),
                ("format", "table_format"),
                ("statistic", "statistic"),
                ("unseen", "unseen_calls"),
                ("flops_unknown", "flops_unknown"),
                ("ckpt_plan", "ckpt_plan"),  # the checkpoint plan's totals (`checkpoint_cells`)
                ("never_called", "never_called"),  # list members no sample called (`view.load`)
                ("cold", "cold_start"),  # the model's first step: left out, or the only one
                # the timeline (`strip.py`): the curve's source and step, its peak
                ("timeline", "timeline"),
                ("mem_peak", "mem_peak"),
                ("mem_peak_ms", "mem_peak_ms"),
            )
        ],
        *_regions(),
    ]


def _regions() -> list[Data]:
    """The compiled regions (meta `compiled_region`: text the root call's key, number the
    calls fused inside it) with their root's view interval (`rv0`..`rv1`, -1: not drawn) and
    the name the card says; `region_at`: the regions holding the current view, outermost
    first (views are numbered depth first: inside a region, a view's id lies in its root's
    view's interval). Only the outermost region is recorded, so there is one at most."""
    lookup = {
        "type": "lookup",
        "from": "cur_views",
        "key": "view_key",
        "fields": ["meta_value"],
        "values": ["view_id", "view_last", "view_parent", "name_ref", "module_type"],
        "as": ["rv0", "rv1", "rparent", "rname", "rtype"],
        "default": -1,
    }
    return [
        {
            "name": "m_regions",
            "source": "meta",
            "transform": [
                _filter("datum.meta_key === 'compiled_region'"),
                lookup,
                # the whole model: named by its class, as the breadcrumbs do
                _formula("rlabel", "datum.rparent === -1 ? datum.rtype + '' : datum.rname + ''"),
            ],
        },
        {
            "name": "regions_sum",
            "source": "m_regions",
            "transform": [
                {
                    "type": "aggregate",
                    "fields": ["meta_number", "meta_number"],
                    "ops": ["sum", "count"],
                    "as": ["fused", "n"],
                }
            ],
        },
        {
            "name": "region_at",
            "source": "m_regions",
            "transform": [
                _filter("datum.rv0 >= 0 && datum.rv0 <= view_now_id && view_now_id <= datum.rv1"),
                {"type": "collect", "sort": {"field": "rv0"}},
            ],
        },
    ]


def _nodes() -> list[Data]:
    values = [f"v_{m.key}" for m in MODES]
    ratio = (
        "isValid(datum.bv) && datum.bv > 0 && datum.v > 0 ? log(datum.v / datum.bv) / log(2) : NaN"
    )
    lookup = {
        "type": "lookup",
        "from": "base_nodes",
        "key": "node_key",
        "fields": ["node_key"],
        "values": ["bv"],
        "as": ["bv"],
        "default": 0,
    }
    return [
        {
            "name": "nodes_every",
            "source": "rows",
            "transform": [
                # a table of another format is not drawn (a message says why, `lists._message`):
                # read with this version's columns its nodes would all land in one view
                _filter(f"datum.row_kind === 'node' && format_version === {SPEC_VERSION}"),
                *_in_view(("node_key", "node_ref"), ("module_name", "name_ref")),
                *(_formula(f"v_{m.key}", value_expr(m)) for m in MODES),
                *(_formula(f"r_{m.key}", rank_expr(m)) for m in MODES if m.rank_by),
            ],
        },
        {
            "name": "nodes_all",
            "source": "nodes_every",
            "transform": [_filter("datum.run === run_now")],
        },
        {
            "name": "avail",
            "source": "nodes_all",
            "transform": [
                {"type": "aggregate", "fields": values, "ops": ["valid"] * len(MODES), "as": values}
            ],
        },
        {
            "name": "views",
            "source": "nodes_all",
            "transform": [{"type": "aggregate", "groupby": ["view_key"]}],
        },
        {
            "name": "base_nodes",
            "source": "nodes_every",
            "transform": [
                _filter("cmp && datum.run === baseline && datum.view_key === view_now"),
                _formula("bv", colour_field()),
            ],
        },
        {
            "name": "vnodes",
            "source": "nodes_all",
            "transform": [
                _filter("datum.view_key === view_now"),
                # what the node is coloured by (`Mode.colour_value`): its value, or what the
                # mode ranks by (the efficiency modes: the time lost, so the hottest node is
                # the one with the most time to win; compare mode: the ratio of that); a call
                # without work has none, so it is grey and outside the extents
                _formula("v", colour_field()),
                lookup,
                _formula("lr", ratio),
            ],
        },
    ]


def _extents() -> list[Data]:
    return [
        {
            "name": "valued",
            "source": "vnodes",
            "transform": [_filter(f"isValid(datum.v) && !({PORT})")],
        },
        {"name": "vstat", "source": "valued", "transform": [_min_max("v", "lo", "hi")]},
        {
            "name": "positive",
            "source": "valued",
            "transform": [_filter("datum.v > 0"), _min_max("v", "plo", "phi")],
        },
        {
            "name": "ratios",
            "source": "vnodes",
            "transform": [
                _filter("isValid(datum.lr)"),
                _formula("alr", "abs(datum.lr)"),
                _min_max("alr", "rlo", "rhi"),
            ],
        },
    ]


def _drawn() -> list[Data]:
    lin_t = "hi > lo ? (datum.v - lo) / (hi - lo) : 1"
    log_t = (
        "datum.v <= 0 ? 0 : (lhi > llo ? "
        "(log(max(datum.v, plo)) - log(plo)) / (log(phi) - log(plo)) "
        ": 1)"
    )
    fill = (
        f"{PORT} ? '{PORT_FILL}' : "
        f"cmp ? (isValid(datum.lr) ? scale('diverge', clamp(datum.lr / rspan, -1, 1)) : "
        f"'{NO_VALUE_FILL}') : (isValid(datum.v) ? scale('turbo', clamp(datum.t, 0, 1)) : "
        f"'{NO_VALUE_FILL}')"
    )
    ink = (
        "contrast(datum.fill, '#111111') >= contrast(datum.fill, '#ffffff') ? '#111111' : '#ffffff'"
    )
    return [
        {
            # Colours need the extents of `valued` / `ratios`, which read `vnodes`: computing them
            # in `vnodes` itself would be a cycle in the dataflow.
            "name": "vdraw",
            "source": "vnodes",
            "transform": [
                _formula("t", f"scale_type === 'log' ? ({log_t}) : ({lin_t})"),
                _formula("fill", fill),
                _formula("ink", ink),
                _formula("sx", "ox + px_eff + k * datum.x_px"),
                _formula("sy", "oy + py_eff + k * datum.y_px"),
            ],
        },
        {
            "name": "vedges",
            "source": "cur",
            "transform": [
                _filter("datum.row_kind === 'edge'"),
                *_in_view(("src_key", "src_ref"), ("dst_key", "dst_ref")),
                _filter("datum.view_key === view_now"),
            ],
        },
        {
            # the nodes inside a grid's frame (`view/blocks.py`, the frame's `group_members`):
            # drawn without edges of their own, since the frame's edges stand for theirs
            "name": "vframed",
            "source": "vnodes",
            "transform": [
                _filter("datum.node_kind === 'block'"),
                _formula("member_ref", "split(datum.group_members, '\\n')"),
                {"type": "flatten", "fields": ["member_ref"]},
                _formula("member", resolve_ref("datum.member_ref")),
            ],
        },
        {
            "name": "focus",
            "source": "vnodes",
            "transform": [_filter("focus_key !== '' && datum.node_key === focus_key")],
        },
    ]
