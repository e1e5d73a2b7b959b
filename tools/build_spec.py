"""Writes `vega_specs/modprof.vg.json`, the panel's Vega v5 spec.

The spec is plain JSON (what W&B stores and what the HTML report embeds); it is generated here
because every analysis mode needs the same handful of expressions (value, missing, format),
which are written once below from `wandb_modprof.records.modes.MODES`. `make spec` runs this;
`tests/test_panel_render.py` checks the committed file equals this script's output.

W&B's rules the spec obeys (see shared/design/WANDB.md): rows arrive as the dataset `wandb`
(no inline data: the spec object is frozen), no `null` anywhere (W&B turns it into `{}`), the
size comes from the `width`/`height` signals (W&B forces `autosize: fit`), and the controls are
clickable marks (bound HTML inputs hide behind a gear icon in W&B).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wandb_modprof.records.modes import DEFAULT_MODE, DEFAULT_SCALE, MODES, Mode  # noqa: E402
from wandb_modprof.sinks.spec import DATASET, SPEC_FILE, SPEC_VERSION  # noqa: E402

OUT = ROOT / "vega_specs" / SPEC_FILE

SIDE_W = 224  # sidebar width; the graph area starts at GX0
GX0 = 236
GY0 = 30  # breadcrumbs above the graph area
ROW = 15  # sidebar line height
FONT = "Helvetica Neue, Helvetica, Arial, sans-serif"
INK = "#222222"
MUTED = "#777777"
NO_VALUE_FILL = "#e3e3e3"  # a module whose value in this mode was not measured
PORT_FILL = "#ffffff"  # input / output nodes carry no measurements
MAX_RUNS = 10  # run entries listed; more are counted, not drawn
# Compare mode: log2(ratio) is normalised by max(|log2 ratio|) over the view, but never by less
# than log2(1.25), so run-to-run noise of a few percent stays pale instead of saturating, and
# never by more than log2(8), so one outlier does not wash out every other node.
MIN_RATIO_SPAN = 0.32192809488736235  # log2(1.25)
MAX_RATIO_SPAN = 3.0  # log2(8): a ratio beyond 8x (e.g. a cold first step) saturates
DIVERGE = ["#3b4cc0", "#f2f2f2", "#b40426"]  # faster than baseline / same / slower


# ---- expressions -----------------------------------------------------------------------------
def missing(column: str, d: str = "datum") -> str:
    # a table from before a column existed has no such cell: missing too
    return (
        f"({d}.missing === '*' || indexof(',' + {d}.missing + ',', ',{column},') >= 0 "
        f"|| !isValid({d}.{column}))"
    )


def value_expr(m: Mode, d: str = "datum") -> str:
    """The node's value in mode `m`, NaN where the table says a column was not measured."""
    gone = " || ".join(missing(c, d) for c in m.columns)
    cols = [f"{d}.{c}" for c in m.columns]
    value = " + ".join(cols) if m.combine == "sum" else f"max({', '.join(cols)})"
    return f"({gone}) ? NaN : ({value})"


def _decimal(v: str, unit: str) -> str:
    steps = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
    out = f"format({v}, '.3~r') + ' {unit}'"
    for size, prefix in reversed(steps):
        out = f"abs({v}) >= {size:g} ? format({v} / {size:g}, '.3~r') + ' {prefix}{unit}' : ({out})"
    return out


def fmt(unit: str, v: str) -> str:
    """A Vega expression writing the number `v` with its unit (binary prefixes for bytes)."""
    if unit == "ms":
        return (
            f"abs({v}) >= 1000 ? format({v} / 1000, '.3~r') + ' s' : "
            f"abs({v}) >= 1 ? format({v}, '.3~r') + ' ms' : format({v} * 1000, '.3~r') + ' µs'"
        )
    if unit == "bytes":
        out = f"format({v}, ',d') + ' B'"
        for power, prefix in ((1, "KiB"), (2, "MiB"), (3, "GiB"), (4, "TiB")):
            size = 1024**power
            out = f"abs({v}) >= {size} ? format({v} / {size}, '.3~r') + ' {prefix}' : ({out})"
        return out
    if unit == "flops":
        return _decimal(v, "FLOP")
    if unit == "flop_s":
        return _decimal(v, "FLOP/s")
    if unit == "ratio":
        return f"format({v}, '.3~r') + '×'"
    return f"format({v}, '.4~g')"


def by_mode(pick: dict[str, str], default: str = "''") -> str:
    """`mode === 'a' ? pick[a] : mode === 'b' ? ... : default` over every mode."""
    out = default
    for m in reversed(MODES):
        out = f"mode === '{m.key}' ? ({pick[m.key]}) : ({out})"
    return out


def js_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i).replace('"', "'") for i in items) + "]"


def share(m: Mode, v: str) -> str:
    if not m.total:
        return "''"
    total = f"tot.{m.total}"
    return f"isValid({total}) && {total} > 0 ? ' (' + format({v} / {total}, '.1%') + ')' : ''"


# ---- signals ---------------------------------------------------------------------------------
def signals() -> list[dict[str, Any]]:
    reset = "{uz: 1, px: 0, py: 0, auto: true}"
    nz = "clamp(zs.uz * pow(1.0018, -event.deltaY), 0.1, 30)"
    mx, my = f"(x() - {GX0} - ox)", f"(y() - {GY0} - oy)"
    wheel = (
        f"{{uz: {nz}, px: {mx} - ({mx} - px_eff) * {nz} / zs.uz, "
        f"py: {my} - ({my} - py_eff) * {nz} / zs.uz, auto: false}}"
    )
    mode_pick = "datum.avail ? datum.key : mode"
    return [
        {
            "name": "mode",
            "value": f"${{string:mode:{DEFAULT_MODE}}}",
            "on": [{"events": "@mode_entry:click", "update": mode_pick}],
        },
        {
            "name": "scale_type",
            "value": f"${{string:scale:{DEFAULT_SCALE}}}",
            "on": [{"events": "@scale_entry:click", "update": "datum.key"}],
        },
        {
            "name": "run_pick",
            "value": "",
            "on": [{"events": "@run_entry:click", "update": "datum.run"}],
        },
        {"name": "n_runs", "update": "length(data('runs'))"},
        {
            "name": "run_now",
            "update": "indexof(pluck(data('runs'), 'run'), run_pick) >= 0 ? run_pick : "
            "(n_runs > 0 ? data('runs')[0].run : '')",
        },
        {
            "name": "compare",
            "value": False,
            "on": [{"events": "@compare_entry:click", "update": "!compare"}],
        },
        {
            "name": "baseline_pick",
            "value": "",
            "on": [{"events": "@baseline_entry:click", "update": "datum.run"}],
        },
        {
            "name": "baseline",
            "update": "indexof(pluck(data('runs'), 'run'), baseline_pick) >= 0 ? baseline_pick : "
            "(n_runs > 1 ? (data('runs')[0].run === run_now ? data('runs')[1].run : "
            "data('runs')[0].run) : '')",
        },
        {"name": "cmp", "update": "compare && n_runs >= 2 && baseline !== run_now"},
        {
            "name": "root_view",
            "update": "length(data('m_root')) ? data('m_root')[0].meta_value : ''",
        },
        {
            "name": "view_pick",
            "value": "",
            "on": [
                {
                    "events": "@node_rect:click",
                    "update": "datum.has_view ? datum.node_key : view_pick",
                },
                {"events": "@crumb:click", "update": "datum.key"},
                {"events": "@top_entry:click", "update": "datum.view_key"},
            ],
        },
        {
            "name": "view_now",
            "update": "indexof(pluck(data('views'), 'view_key'), view_pick) >= 0 ? view_pick : "
            "root_view",
        },
        {
            "name": "focus_key",
            "value": "",
            "on": [
                {"events": "@top_entry:click", "update": "datum.node_key"},
                {"events": "@node_rect:click, @crumb:click", "update": "''"},
            ],
        },
        {
            "name": "hover_key",
            "value": "",
            "on": [
                {"events": "@node_rect:mouseover", "update": "datum.node_key"},
                {"events": "@node_rect:mouseout", "update": "''"},
            ],
        },
        {"name": "card_key", "update": "hover_key || focus_key"},
        {"name": "tot", "update": "length(data('meta_n')) ? data('meta_n')[0] : {}"},
        {"name": "avail", "update": "length(data('avail')) ? data('avail')[0] : {}"},
        {
            "name": "model_name",
            "update": "length(data('m_model')) ? data('m_model')[0].meta_value : ''",
        },
        {
            "name": "reduced_text",
            "update": "length(data('m_reduced')) ? data('m_reduced')[0].meta_value : ''",
        },
        {
            "name": "format_version",
            "update": "length(data('m_format')) ? data('m_format')[0].meta_number : 0",
        },
        {"name": "banner_h", "update": "reduced_text ? 22 : 0"},
        {"name": "gw", "update": f"max(60, width - {GX0})"},
        {"name": "gh", "update": f"max(60, height - {GY0} - banner_h)"},
        {
            "name": "vdim",
            "update": "length(data('vnodes')) ? [max(1, data('vnodes')[0].view_w_px), "
            "max(1, data('vnodes')[0].view_h_px)] : [1, 1]",
        },
        {
            "name": "fit",
            "update": "clamp(min((gw - 24) / vdim[0], (gh - 24) / vdim[1]), 0.45, 1.6)",
        },
        {
            "name": "zs",
            "init": reset,
            "on": [
                {"events": {"signal": "view_now"}, "update": reset},
                {"events": {"signal": "run_now"}, "update": reset},
                {"events": "@fit_button:click", "update": reset},
                {
                    "events": "[@graph_bg:mousedown, window:mouseup] > window:mousemove",
                    "update": "{uz: zs.uz, px: drag0.px + x() - drag0.x, "
                    "py: drag0.py + y() - drag0.y, auto: false}",
                },
                {"events": "@graph_bg:wheel!, @node_rect:wheel!", "update": wheel},
            ],
        },
        {
            "name": "drag0",
            "init": "{x: 0, y: 0, px: 0, py: 0}",
            "on": [
                {
                    "events": "@graph_bg:mousedown",
                    "update": "{x: x(), y: y(), px: px_eff, py: py_eff}",
                }
            ],
        },
        {"name": "k", "update": "fit * zs.uz"},
        {"name": "ox", "update": "max(12, (gw - vdim[0] * fit) / 2)"},
        {"name": "oy", "update": "12"},
        # A module picked in the ranked list may sit below the fold of a tall view: centre it.
        {
            "name": "focus_y",
            "update": "length(data('focus')) ? data('focus')[0].y_px + data('focus')[0].h_px / 2 "
            ": -1",
        },
        {"name": "px_eff", "update": "zs.px"},
        {
            "name": "py_eff",
            "update": "zs.py + (zs.auto && focus_y >= 0 && oy + k * focus_y > gh - 30 ? "
            "gh / 2 - oy - k * focus_y : 0)",
        },
        {"name": "show_text", "update": "k * 12 >= 6"},
    ]


# ---- data ------------------------------------------------------------------------------------
def data() -> list[dict[str, Any]]:
    mode_formulas = [{"type": "formula", "as": f"v_{m.key}", "expr": value_expr(m)} for m in MODES]
    valid_ops = {
        "type": "aggregate",
        "fields": [f"v_{m.key}" for m in MODES],
        "ops": ["valid"] * len(MODES),
        "as": [f"v_{m.key}" for m in MODES],
    }
    lin_t = "hi > lo ? (datum.v - lo) / (hi - lo) : 1"
    log_t = (
        "datum.v <= 0 ? 0 : (lhi > llo ? "
        "(log(max(datum.v, plo)) - log(plo)) / (log(phi) - log(plo)) "
        ": 1)"
    )
    t_expr = f"scale_type === 'log' ? ({log_t}) : ({lin_t})"
    ratio = (
        "isValid(datum.bv) && datum.bv > 0 && datum.v > 0 ? log(datum.v / datum.bv) / log(2) : NaN"
    )
    fill = (
        f"datum.node_kind === 'input' || datum.node_kind === 'output' ? '{PORT_FILL}' : "
        f"cmp ? (isValid(datum.lr) ? scale('diverge', clamp(datum.lr / rspan, -1, 1)) : "
        f"'{NO_VALUE_FILL}') : (isValid(datum.v) ? scale('turbo', clamp(datum.t, 0, 1)) : "
        f"'{NO_VALUE_FILL}')"
    )
    run_key = "isValid(datum.id) ? datum.id + '' : ''"
    run_label = (
        "isValid(datum.name) ? datum.name + '' : (isValid(datum.id) ? datum.id + '' : 'this run')"
    )
    card_lines = [
        "datum.module_name ? datum.module_name + ' (' + datum.module_type + ')' : datum.label"
    ]
    for m in MODES:
        v = f"datum.v_{m.key}"
        card_lines.append(
            f"isValid({v}) ? '{m.label}: ' + ({fmt(m.unit, v)}) + ({share(m, v)}) : ''"
        )
    card_lines.append(
        "cmp ? (isValid(datum.bv) && datum.bv > 0 && isValid(datum.v) ? 'vs baseline: ' + "
        "format(datum.v / datum.bv, '.3~r') + '×' : 'not in the baseline run') : ''"
    )
    card_lines.append(
        "datum.samples > 0 && isValid(datum.fwd_ms_std) && datum.node_kind === 'module' ? "
        f"'Forward spread: ' + ({fmt('ms', 'datum.fwd_ms_min')}) + ' – ' + "
        f"({fmt('ms', 'datum.fwd_ms_max')}) + ' over ' + datum.samples + ' samples' : ''"
    )
    card_lines.append(
        f"!{missing('rank_slowest')} && datum.rank_count > 1 ? 'Slowest rank: ' + "
        "datum.rank_slowest + ' of ' + datum.rank_count : ''"
    )
    card_lines.append("datum.has_view ? 'Click to open' : ''")
    card_lines.append(
        "datum.node_kind === 'group' ? datum.group_count + ' modules merged to fit the table' : ''"
    )
    card_array = "[" + ", ".join(f"({line})" for line in card_lines) + "]"
    return [
        {"name": DATASET},
        {
            "name": "rows",
            "source": DATASET,
            "transform": [
                {"type": "formula", "as": "run", "expr": run_key},
                {"type": "formula", "as": "run_label", "expr": run_label},
                {
                    "type": "formula",
                    "as": "run_color",
                    "expr": "isValid(datum.color) ? datum.color + '' : '#888'",
                },
            ],
        },
        {
            "name": "runs",
            "source": "rows",
            "transform": [
                {"type": "aggregate", "groupby": ["run", "run_label", "run_color"]},
                {"type": "window", "sort": {"field": "run"}, "ops": ["row_number"], "as": ["i"]},
            ],
        },
        {
            "name": "cur",
            "source": "rows",
            "transform": [{"type": "filter", "expr": "datum.run === run_now"}],
        },
        {
            "name": "meta",
            "source": "cur",
            "transform": [{"type": "filter", "expr": "datum.row_kind === 'meta'"}],
        },
        {
            "name": "meta_n",
            "source": "meta",
            "transform": [
                {
                    "type": "formula",
                    "as": "n",
                    "expr": f"{missing('meta_number')} ? NaN : datum.meta_number",
                },
                {"type": "pivot", "field": "meta_key", "value": "n", "op": "max"},
            ],
        },
        *[
            {
                "name": f"m_{key}",
                "source": "meta",
                "transform": [{"type": "filter", "expr": f"datum.meta_key === '{meta_key}'"}],
            }
            for key, meta_key in (
                ("root", "root_view"),
                ("model", "model_name"),
                ("reduced", "reduced"),
                ("format", "table_format"),
            )
        ],
        {
            "name": "nodes_every",
            "source": "rows",
            "transform": [{"type": "filter", "expr": "datum.row_kind === 'node'"}, *mode_formulas],
        },
        {
            "name": "nodes_all",
            "source": "nodes_every",
            "transform": [{"type": "filter", "expr": "datum.run === run_now"}],
        },
        {"name": "avail", "source": "nodes_all", "transform": [valid_ops]},
        {
            "name": "views",
            "source": "nodes_all",
            "transform": [{"type": "aggregate", "groupby": ["view_key"]}],
        },
        {
            "name": "base_nodes",
            "source": "nodes_every",
            "transform": [
                {
                    "type": "filter",
                    "expr": "cmp && datum.run === baseline && datum.view_key === view_now",
                },
                {"type": "formula", "as": "bv", "expr": "datum['v_' + mode]"},
            ],
        },
        {
            "name": "vnodes",
            "source": "nodes_all",
            "transform": [
                {"type": "filter", "expr": "datum.view_key === view_now"},
                {"type": "formula", "as": "v", "expr": "datum['v_' + mode]"},
                {
                    "type": "lookup",
                    "from": "base_nodes",
                    "key": "node_key",
                    "fields": ["node_key"],
                    "values": ["bv"],
                    "as": ["bv"],
                    "default": 0,
                },
                {"type": "formula", "as": "lr", "expr": ratio},
            ],
        },
        {
            "name": "valued",
            "source": "vnodes",
            "transform": [
                {
                    "type": "filter",
                    "expr": "isValid(datum.v) && datum.node_kind !== 'input' "
                    "&& datum.node_kind !== 'output'",
                },
            ],
        },
        {
            # min / max by aggregate, not `extent`: extent warns on every empty view
            "name": "vstat",
            "source": "valued",
            "transform": [
                {
                    "type": "aggregate",
                    "fields": ["v", "v"],
                    "ops": ["min", "max"],
                    "as": ["lo", "hi"],
                }
            ],
        },
        {
            "name": "positive",
            "source": "valued",
            "transform": [
                {"type": "filter", "expr": "datum.v > 0"},
                {
                    "type": "aggregate",
                    "fields": ["v", "v"],
                    "ops": ["min", "max"],
                    "as": ["plo", "phi"],
                },
            ],
        },
        {
            "name": "ratios",
            "source": "vnodes",
            "transform": [
                {"type": "filter", "expr": "isValid(datum.lr)"},
                {"type": "formula", "as": "alr", "expr": "abs(datum.lr)"},
                {
                    "type": "aggregate",
                    "fields": ["alr", "alr"],
                    "ops": ["min", "max"],
                    "as": ["rlo", "rhi"],
                },
            ],
        },
        {
            # Colours need the extents of `valued` / `ratios`, which read `vnodes`: computing them
            # in `vnodes` itself would be a cycle in the dataflow.
            "name": "vdraw",
            "source": "vnodes",
            "transform": [
                {"type": "formula", "as": "t", "expr": t_expr},
                {"type": "formula", "as": "fill", "expr": fill},
                {
                    "type": "formula",
                    "as": "ink",
                    "expr": "contrast(datum.fill, '#111111') >= contrast(datum.fill, '#ffffff') "
                    "? '#111111' : '#ffffff'",
                },
                {"type": "formula", "as": "sx", "expr": "ox + px_eff + k * datum.x_px"},
                {"type": "formula", "as": "sy", "expr": "oy + py_eff + k * datum.y_px"},
            ],
        },
        {
            "name": "vedges",
            "source": "cur",
            "transform": [
                {
                    "type": "filter",
                    "expr": "datum.row_kind === 'edge' && datum.view_key === view_now",
                }
            ],
        },
        {
            "name": "focus",
            "source": "vnodes",
            "transform": [
                {"type": "filter", "expr": "focus_key !== '' && datum.node_key === focus_key"}
            ],
        },
        {
            "name": "card",
            "source": "vnodes",
            "transform": [
                {"type": "filter", "expr": "card_key !== '' && datum.node_key === card_key"},
                {"type": "formula", "as": "lines", "expr": card_array},
                {"type": "flatten", "fields": ["lines"], "as": ["line"], "index": "i"},
                {"type": "filter", "expr": "datum.line !== ''"},
                {"type": "window", "ops": ["row_number"], "as": ["n"]},
            ],
        },
        {
            "name": "crumbs",
            "source": "vnodes",
            "transform": [
                {"type": "window", "ops": ["row_number"], "as": ["first"]},
                {"type": "filter", "expr": "datum.first === 1"},
                {"type": "formula", "as": "keys", "expr": "split(datum.view_path, ' / ')"},
                {"type": "formula", "as": "labels", "expr": "split(datum.view_labels, ' / ')"},
                {
                    "type": "flatten",
                    "fields": ["keys", "labels"],
                    "as": ["key", "text"],
                    "index": "i",
                },
                {"type": "formula", "as": "w", "expr": "length(datum.text) * 7.2 + 22"},
                {
                    "type": "window",
                    "sort": {"field": "i"},
                    "ops": ["sum"],
                    "fields": ["w"],
                    "as": ["x_end"],
                },
                {"type": "formula", "as": "last", "expr": "datum.key === view_now"},
            ],
        },
        {
            "name": "top",
            "source": "nodes_all",
            "transform": [
                {
                    "type": "filter",
                    "expr": "datum.node_kind === 'module' || datum.node_kind === 'group'",
                },
                {"type": "formula", "as": "v", "expr": "datum['v_' + mode]"},
                {"type": "filter", "expr": "isValid(datum.v)"},
                {
                    "type": "window",
                    "sort": {"field": ["v", "node_key"], "order": ["descending", "ascending"]},
                    "ops": ["row_number"],
                    "as": ["rank"],
                },
                {"type": "filter", "expr": "datum.rank <= top_n"},
                {
                    "type": "formula",
                    "as": "value_text",
                    "expr": by_mode({m.key: fmt(m.unit, "datum.v") for m in MODES}),
                },
                {
                    "type": "formula",
                    "as": "share_text",
                    "expr": by_mode({m.key: share(m, "datum.v") for m in MODES}),
                },
                {"type": "formula", "as": "who", "expr": "datum.module_name || datum.label"},
            ],
        },
        {
            "name": "modes",
            "transform": [
                {"type": "sequence", "start": 0, "stop": len(MODES), "as": "i"},
                {
                    "type": "formula",
                    "as": "key",
                    "expr": f"{js_list([m.key for m in MODES])}[datum.i]",
                },
                {
                    "type": "formula",
                    "as": "label",
                    "expr": f"{js_list([m.label for m in MODES])}[datum.i]",
                },
                {
                    "type": "formula",
                    "as": "col",
                    "expr": f"{[_mode_cell(m)[0] for m in MODES]}[datum.i]",
                },
                {
                    "type": "formula",
                    "as": "row",
                    "expr": f"{[_mode_cell(m)[1] for m in MODES]}[datum.i]",
                },
                {"type": "formula", "as": "avail", "expr": "avail['v_' + datum.key] > 0"},
            ],
        },
        {
            "name": "scales_list",
            "transform": [
                {"type": "sequence", "start": 0, "stop": 2, "as": "i"},
                {"type": "formula", "as": "key", "expr": "['linear', 'log'][datum.i]"},
                {"type": "formula", "as": "label", "expr": "['Linear', 'Log'][datum.i]"},
            ],
        },
        {
            "name": "totals",
            "transform": [
                {"type": "sequence", "start": 0, "stop": 5, "as": "i"},
                {"type": "formula", "as": "line", "expr": _totals_lines() + "[datum.i]"},
                {"type": "filter", "expr": "datum.line !== ''"},
                {"type": "window", "ops": ["row_number"], "as": ["n"]},
            ],
        },
        {
            "name": "messages",
            "transform": [
                {"type": "sequence", "start": 0, "stop": 1, "as": "i"},
                {"type": "formula", "as": "text", "expr": _message_expr()},
                {"type": "filter", "expr": "datum.text !== ''"},
            ],
        },
        {
            "name": "banner",
            "transform": [
                {"type": "sequence", "start": 0, "stop": 1, "as": "i"},
                {"type": "filter", "expr": "reduced_text !== ''"},
                {
                    "type": "formula",
                    "as": "text",
                    "expr": "'Reduced to fit the table: ' + reduced_text",
                },
            ],
        },
    ]


def _mode_cell(m: Mode) -> tuple[int, int]:
    """(column, row) of a mode's legend entry: Time + Compute left, Memory + Health right."""
    layout = {0: ["Time", "Compute", "Ranks"], 1: ["Memory", "Health"]}
    for col, groups in layout.items():
        row = 0
        for group in groups:
            row += 1  # the heading
            for other in MODES:
                if other.group == group:
                    if other is m:
                        return col, row
                    row += 1
    raise ValueError(m.key)


def _heading_rows() -> list[tuple[str, int, int]]:
    layout = {0: ["Time", "Compute", "Ranks"], 1: ["Memory", "Health"]}
    out = []
    for col, groups in layout.items():
        row = 0
        for group in groups:
            out.append((group, col, row))
            row += 1 + sum(1 for m in MODES if m.group == group)
    return out


def _totals_lines() -> str:
    def item(label: str, key: str, unit: str) -> str:
        v = f"tot.{key}"
        return f"(isValid({v}) ? '{label} ' + ({fmt(unit, v)}) : '')"

    def join(*parts: str) -> str:
        if len(parts) == 1:
            return parts[0]
        a, b = parts
        return f"({a}) + (({a}) !== '' && ({b}) !== '' ? '  ·  ' : '') + ({b})"

    lines = [
        join(item("Forward", "total_fwd_ms", "ms"), item("Backward", "total_bwd_ms", "ms")),
        join(item("Activations", "total_act_bytes", "bytes")),
        join(
            item("Params", "total_param_bytes", "bytes"), item("Grads", "total_grad_bytes", "bytes")
        ),
        join(
            item("Optimizer", "total_optim_bytes", "bytes"),
            item("FLOPs", "total_fwd_flops", "flops"),
        ),
        "isValid(tot.num_samples) ? format(tot.num_samples, 'd') + ' samples  ·  ' + "
        "format(tot.invocations, 'd') + ' calls' : ''",
    ]
    return "[" + ", ".join(lines) + "]"


def _message_expr() -> str:
    modes = by_mode({m.key: f"'{m.label}'" for m in MODES})
    return (
        "length(data('wandb')) === 0 ? 'Loading the profile… (if this stays, the table of this "
        "chart holds no rows)' : "
        "format_version === 0 ? 'These rows are not a wandb_modprof table (no table_format row)' : "
        f"format_version > {SPEC_VERSION} ? 'This table was written by a newer wandb_modprof "
        f"(table format v' + format_version + '); this panel reads v{SPEC_VERSION}' : "
        "length(data('vnodes')) === 0 ? "
        "'No module graph in this profile (no structure pass ran)' : "
        f"!(avail['v_' + mode] > 0) ? ({modes}) + ' was not measured in this run' : ''"
    )


# ---- scales ----------------------------------------------------------------------------------
def scales() -> list[dict[str, Any]]:
    return [
        {"name": "turbo", "type": "linear", "domain": [0, 1], "range": {"scheme": "turbo"}},
        {"name": "diverge", "type": "linear", "domain": [-1, 0, 1], "range": DIVERGE},
    ]


# ---- marks -----------------------------------------------------------------------------------
def text(name: str, **enc: Any) -> dict[str, Any]:
    base = {"font": {"value": FONT}, "fontSize": {"value": 11}, "fill": {"value": INK}}
    base.update(enc)
    return base


def sidebar() -> dict[str, Any]:
    heading = {"fontWeight": {"value": "bold"}, "fill": {"value": MUTED}, "fontSize": {"value": 10}}
    modes_y = 40
    mode_rows = 1 + max(_mode_cell(m)[1] for m in MODES)
    scale_y = modes_y + mode_rows * ROW + 8
    bar_y = scale_y + ROW + 16
    runs_y = bar_y + 38
    marks: list[dict[str, Any]] = [
        {
            "type": "text",
            "name": "title",
            "interactive": False,
            "encode": {
                "update": text(
                    "title",
                    x={"value": 0},
                    y={"value": 12},
                    text={"signal": "model_name ? model_name : 'wandb_modprof'"},
                    fontSize={"value": 13},
                    fontWeight={"value": "bold"},
                    limit={"value": SIDE_W - 4},
                )
            },
        },
        _heading("ANALYSIS MODE (click)", 0, modes_y - 14, heading),
    ]
    for group, col, row in _heading_rows():
        marks.append(
            _heading(
                group, col * 112, modes_y + row * ROW, heading | {"fontWeight": {"value": "normal"}}
            )
        )
    marks += _radio(
        "mode",
        "modes",
        x="datum.col * 112",
        y=f"{modes_y} + datum.row * {ROW}",
        active="datum.key === mode",
        label="datum.label",
        enabled="datum.avail",
        width=110,
    )
    marks.append(_heading("COLOUR SCALE", 0, scale_y, heading))
    marks += _radio(
        "scale",
        "scales_list",
        x="90 + datum.i * 60",
        y=f"{scale_y}",
        active="datum.key === scale_type",
        label="datum.label",
        enabled="!cmp",
        width=58,
    )
    marks += _colorbar(bar_y)
    marks += _runs(runs_y, heading)
    marks += _totals_and_top(heading)
    return {
        "type": "group",
        "name": "sidebar",
        "encode": {
            "update": {
                "x": {"value": 0},
                "y": {"value": 0},
                "width": {"value": SIDE_W},
                "height": {"signal": "height"},
                "clip": {"value": True},
            }
        },
        "marks": marks,
    }


def _heading(label: str, x: float, y: float, style: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "text",
        "interactive": False,
        "encode": {
            "update": text("h", x={"value": x}, y={"value": y + 10}, text={"value": label}, **style)
        },
    }


def _radio(
    stem: str, source: str, *, x: str, y: str, active: str, label: str, enabled: str, width: int
) -> list[dict[str, Any]]:
    """A legend entry that acts as a radio button: a click target, a dot and a label."""
    return [
        {
            "type": "rect",
            "name": f"{stem}_entry",
            "from": {"data": source},
            "encode": {
                "update": {
                    "x": {"signal": x},
                    "y": {"signal": y},
                    "width": {"value": width},
                    "height": {"value": ROW - 1},
                    "cornerRadius": {"value": 3},
                    "fill": {"signal": f"{active} ? '#e8eefc' : '#ffffff'"},
                    "fillOpacity": {"value": 1},
                    "cursor": {"signal": f"{enabled} ? 'pointer' : 'default'"},
                }
            },
        },
        {
            "type": "symbol",
            "name": f"{stem}_dot",
            "from": {"data": source},
            "interactive": False,
            "encode": {
                "update": {
                    "x": {"signal": f"{x} + 7"},
                    "y": {"signal": f"{y} + 7"},
                    "size": {"value": 50},
                    "shape": {"value": "circle"},
                    "stroke": {"signal": f"{enabled} ? '#3b5bdb' : '#bbbbbb'"},
                    "strokeWidth": {"value": 1.2},
                    "fill": {"signal": f"{active} ? '#3b5bdb' : '#ffffff'"},
                }
            },
        },
        {
            "type": "text",
            "name": f"{stem}_label",
            "from": {"data": source},
            "interactive": False,
            "encode": {
                "update": text(
                    stem,
                    x={"signal": f"{x} + 16"},
                    y={"signal": f"{y} + 11"},
                    text={"signal": label},
                    fontWeight={"signal": f"{active} ? 'bold' : 'normal'"},
                    fill={"signal": f"{enabled} ? '{INK}' : '#aaaaaa'"},
                    limit={"value": width - 17},
                )
            },
        },
    ]


def _colorbar(y: int) -> list[dict[str, Any]]:
    unit = by_mode({m.key: f"'{m.label}'" for m in MODES})
    lo = by_mode({m.key: fmt(m.unit, "bar_lo") for m in MODES})
    mid = by_mode({m.key: fmt(m.unit, "bar_mid") for m in MODES})
    hi = by_mode({m.key: fmt(m.unit, "bar_hi") for m in MODES})
    ratio = "format(pow(2, {s} * rspan), '.3~r') + '×'"
    label = {
        "lo": f"cmp ? {ratio.format(s='-1')} : ({lo})",
        "mid": f"cmp ? '1×' : ({mid})",
        "hi": f"cmp ? {ratio.format(s='1')} : ({hi})",
    }
    anchors = {"lo": (0, "left"), "mid": (SIDE_W / 2 - 4, "center"), "hi": (SIDE_W - 8, "right")}
    marks: list[dict[str, Any]] = [
        {
            "type": "text",
            "name": "colorbar_title",
            "interactive": False,
            "encode": {
                "update": text(
                    "cb",
                    x={"value": 0},
                    y={"value": y - 4},
                    text={
                        "signal": f"cmp ? 'Ratio to baseline, ' + ({unit}) : "
                        f"({unit}) + (scale_type === 'log' ? ' (log)' : '')"
                    },
                    fontSize={"value": 10},
                    fill={"value": MUTED},
                    limit={"value": SIDE_W - 4},
                )
            },
        },
        {
            "type": "rect",
            "name": "colorbar",
            "interactive": False,
            "encode": {
                "update": {
                    "x": {"value": 0},
                    "y": {"value": y},
                    "width": {"value": SIDE_W - 8},
                    "height": {"value": 10},
                    "fill": {
                        "signal": "cmp ? gradient('diverge', [0, 0], [1, 0]) : "
                        "gradient('turbo', [0, 0], [1, 0])"
                    },
                    "stroke": {"value": "#cccccc"},
                }
            },
        },
    ]
    for key, (x, align) in anchors.items():
        marks.append(
            {
                "type": "text",
                "name": f"colorbar_{key}",
                "interactive": False,
                "encode": {
                    "update": text(
                        "cb",
                        x={"value": x},
                        y={"value": y + 22},
                        align={"value": align},
                        text={"signal": f"has_range || cmp ? ({label[key]}) : ''"},
                        fontSize={"value": 10},
                    )
                },
            }
        )
    return marks


def _runs(y: int, heading: dict[str, Any]) -> list[dict[str, Any]]:
    entries_y = f"{y} + 14 + (datum.i - 1) * {ROW}"
    compare_y = f"{y} + 16 + min(n_runs, {MAX_RUNS}) * {ROW}"
    marks: list[dict[str, Any]] = [
        {
            "type": "text",
            "name": "runs_heading",
            "interactive": False,
            "encode": {
                "update": text(
                    "rh",
                    x={"value": 0},
                    y={"value": y + 10},
                    text={
                        "signal": f"n_runs >= 2 ? 'RUNS (' + n_runs + '): click to show one' + "
                        f"(n_runs > {MAX_RUNS} ? ', first {MAX_RUNS} listed' : '') : ''"
                    },
                    **heading,
                )
            },
        },
        *_radio(
            "run",
            "runs_shown",
            x="0",
            y=entries_y,
            active="datum.run === run_now",
            label="datum.run_label",
            enabled="true",
            width=SIDE_W - 8,
        ),
        {
            "type": "rect",
            "name": "run_swatch",
            "from": {"data": "runs_shown"},
            "interactive": False,
            "encode": {
                "update": {
                    "x": {"value": SIDE_W - 20},
                    "y": {"signal": f"{entries_y} + 3"},
                    "width": {"value": 9},
                    "height": {"value": 9},
                    "fill": {"field": "run_color"},
                }
            },
        },
        *_radio(
            "compare",
            "compare_toggle",
            x="0",
            y=compare_y,
            active="compare",
            label="'Colour by ratio to a baseline run'",
            enabled="true",
            width=SIDE_W - 8,
        ),
        *_radio(
            "baseline",
            "baselines_shown",
            x="12",
            y=f"{compare_y} + {ROW} + (datum.i - 1) * {ROW}",
            active="datum.run === baseline",
            label="'baseline: ' + datum.run_label",
            enabled="datum.run !== run_now",
            width=SIDE_W - 20,
        ),
    ]
    return marks


def _totals_and_top(heading: dict[str, Any]) -> list[dict[str, Any]]:
    mode_label = by_mode({m.key: f"'{m.label}'" for m in MODES})
    return [
        {
            "type": "text",
            "name": "totals_heading",
            "interactive": False,
            "encode": {
                "update": text(
                    "th",
                    x={"value": 0},
                    y={"signal": "totals_y + 10"},
                    text={"value": "PER STEP (mean over samples)"},
                    **heading,
                )
            },
        },
        {
            "type": "text",
            "name": "total_text",
            "from": {"data": "totals"},
            "interactive": False,
            "encode": {
                "update": text(
                    "tt",
                    x={"value": 0},
                    y={"signal": f"totals_y + 12 + datum.n * {ROW - 1}"},
                    text={"field": "line"},
                    limit={"value": SIDE_W - 4},
                )
            },
        },
        {
            "type": "text",
            "name": "top_heading",
            "interactive": False,
            "encode": {
                "update": text(
                    "toph",
                    x={"value": 0},
                    y={"signal": "top_y + 10"},
                    text={"signal": f"top_n > 0 ? 'TOP MODULES: ' + upper({mode_label}) : ''"},
                    limit={"value": SIDE_W - 4},
                    **heading,
                )
            },
        },
        {
            "type": "rect",
            "name": "top_entry",
            "from": {"data": "top"},
            "encode": {
                "update": {
                    "x": {"value": 0},
                    "y": {"signal": f"top_y + 14 + (datum.rank - 1) * {ROW}"},
                    "width": {"value": SIDE_W - 8},
                    "height": {"value": ROW - 1},
                    "fill": {"signal": "datum.node_key === focus_key ? '#e8eefc' : '#ffffff'"},
                    "cursor": {"value": "pointer"},
                }
            },
        },
        {
            "type": "text",
            "name": "top_label",
            "from": {"data": "top"},
            "interactive": False,
            "encode": {
                "update": text(
                    "tl",
                    x={"value": 2},
                    y={"signal": f"top_y + 25 + (datum.rank - 1) * {ROW}"},
                    text={"signal": "datum.rank + '. ' + datum.who"},
                    limit={"value": 118},
                )
            },
        },
        {
            "type": "text",
            "name": "top_value",
            "from": {"data": "top"},
            "interactive": False,
            "encode": {
                "update": text(
                    "tv",
                    x={"value": SIDE_W - 10},
                    y={"signal": f"top_y + 25 + (datum.rank - 1) * {ROW}"},
                    align={"value": "right"},
                    text={"signal": "datum.value_text + datum.share_text"},
                    limit={"value": 100},
                )
            },
        },
    ]


def graph() -> dict[str, Any]:
    node_enc = {
        "x": {"field": "sx"},
        "y": {"field": "sy"},
        "width": {"signal": "k * datum.w_px"},
        "height": {"signal": "k * datum.h_px"},
        "cornerRadius": {
            "signal": "datum.node_kind === 'input' || datum.node_kind === 'output' ? k * 18 : k * 4"
        },
        "fill": {"field": "fill"},
        "stroke": {
            "signal": "datum.node_key === card_key ? '#000000' : "
            "(datum.has_view ? '#333333' : '#999999')"
        },
        "strokeWidth": {"signal": "datum.node_key === card_key ? 2.5 : (datum.has_view ? 1.6 : 1)"},
        "strokeDash": {
            "signal": "datum.node_kind === 'self' || datum.node_kind === 'group' ? [4, 3] : [1, 0]"
        },
        "cursor": {"signal": "datum.has_view ? 'pointer' : 'default'"},
    }
    label_enc = text(
        "nl",
        x={"signal": "datum.sx + k * datum.w_px / 2"},
        y={"signal": "datum.sy + k * datum.h_px * 0.42"},
        align={"value": "center"},
        baseline={"value": "middle"},
        text={"signal": "show_text ? datum.label : ''"},
        fontSize={"signal": "12 * k"},
        fill={"field": "ink"},
        limit={"signal": "k * datum.w_px - 4"},
    )
    sub_enc = text(
        "ns",
        x={"signal": "datum.sx + k * datum.w_px / 2"},
        y={"signal": "datum.sy + k * datum.h_px * 0.76"},
        align={"value": "center"},
        baseline={"value": "middle"},
        text={"signal": "show_text && k * 10 >= 6 ? datum.sublabel : ''"},
        fontSize={"signal": "10 * k"},
        fill={"field": "ink"},
        fillOpacity={"value": 0.85},
        limit={"signal": "k * datum.w_px - 4"},
    )
    plus_enc = text(
        "np",
        x={"signal": "datum.sx + k * datum.w_px - 3 * k"},
        y={"signal": "datum.sy + 9 * k"},
        align={"value": "right"},
        baseline={"value": "middle"},
        text={"signal": "datum.has_view && show_text ? '+' : ''"},
        fontSize={"signal": "11 * k"},
        fill={"field": "ink"},
    )
    card_w = 250
    return {
        "type": "group",
        "name": "graph",
        "encode": {
            "update": {
                "x": {"value": GX0},
                "y": {"value": GY0},
                "width": {"signal": "gw"},
                "height": {"signal": "gh"},
                "clip": {"value": True},
                "stroke": {"value": "#e6e6e6"},
            }
        },
        "marks": [
            {
                "type": "rect",
                "name": "graph_bg",
                "encode": {
                    "update": {
                        "x": {"value": 0},
                        "y": {"value": 0},
                        "width": {"signal": "gw"},
                        "height": {"signal": "gh"},
                        "fill": {"value": "#fbfbfb"},
                        "cursor": {"value": "move"},
                    }
                },
            },
            {
                "type": "path",
                "name": "edge_path",
                "from": {"data": "vedges"},
                "interactive": False,
                "encode": {
                    "update": {
                        "x": {"signal": "ox + px_eff"},
                        "y": {"signal": "oy + py_eff"},
                        "scaleX": {"signal": "k"},
                        "scaleY": {"signal": "k"},
                        "path": {"field": "edge_path"},
                        "stroke": {"value": "#8c8c8c"},
                        "strokeWidth": {"value": 1.3},
                    }
                },
            },
            *(
                {
                    "type": kind,
                    "name": name,
                    "from": {"data": "vdraw"},
                    "interactive": name == "node_rect",  # labels let events reach the box
                    "encode": {"update": enc},
                }
                for kind, name, enc in (
                    ("rect", "node_rect", node_enc),
                    ("text", "node_label", label_enc),
                    ("text", "node_sublabel", sub_enc),
                    ("text", "node_open", plus_enc),
                )
            ),
            {
                "type": "rect",
                "name": "card_bg",
                "from": {"data": "card_box"},
                "interactive": False,
                "encode": {
                    "update": {
                        "x": {"signal": f"gw - {card_w + 8}"},
                        "y": {"value": 8},
                        "width": {"value": card_w},
                        "height": {"signal": "datum.lines * 14 + 10"},
                        "fill": {"value": "#ffffff"},
                        "fillOpacity": {"value": 0.95},
                        "stroke": {"value": "#999999"},
                        "cornerRadius": {"value": 4},
                    }
                },
            },
            {
                "type": "text",
                "name": "card_text",
                "from": {"data": "card"},
                "interactive": False,
                "encode": {
                    "update": text(
                        "ct",
                        x={"signal": f"gw - {card_w}"},
                        y={"signal": "8 + datum.n * 14"},
                        text={"field": "line"},
                        fontWeight={"signal": "datum.n === 1 ? 'bold' : 'normal'"},
                        limit={"value": card_w - 12},
                    )
                },
            },
            {
                "type": "text",
                "name": "message",
                "from": {"data": "messages"},
                "interactive": False,
                "encode": {
                    "update": text(
                        "msg",
                        x={"signal": "gw / 2"},
                        y={"signal": "gh / 2"},
                        align={"value": "center"},
                        text={"field": "text"},
                        fontSize={"value": 13},
                        fill={"value": "#555555"},
                        limit={"signal": "gw - 20"},
                    )
                },
            },
        ],
    }


def top_bar() -> list[dict[str, Any]]:
    return [
        {
            "type": "rect",
            "name": "crumb",
            "from": {"data": "crumbs"},
            "encode": {
                "update": {
                    "x": {"signal": f"{GX0} + datum.x_end - datum.w"},
                    "y": {"value": 4},
                    "width": {"signal": "datum.w - 4"},
                    "height": {"value": 20},
                    "cornerRadius": {"value": 3},
                    "fill": {"signal": "datum.last ? '#e8eefc' : '#f1f3f5'"},
                    "cursor": {"signal": "datum.last ? 'default' : 'pointer'"},
                }
            },
        },
        {
            "type": "text",
            "name": "crumb_label",
            "from": {"data": "crumbs"},
            "interactive": False,
            "encode": {
                "update": text(
                    "cl",
                    x={"signal": f"{GX0} + datum.x_end - datum.w + 8"},
                    y={"value": 18},
                    text={"signal": "(datum.i > 0 ? '› ' : '') + datum.text"},
                    fontWeight={"signal": "datum.last ? 'bold' : 'normal'"},
                    fontSize={"value": 12},
                )
            },
        },
        {
            "type": "rect",
            "name": "fit_button",
            "encode": {
                "update": {
                    "x": {"signal": "width - 46"},
                    "y": {"value": 4},
                    "width": {"value": 44},
                    "height": {"value": 20},
                    "cornerRadius": {"value": 3},
                    "fill": {"value": "#f1f3f5"},
                    "cursor": {"value": "pointer"},
                }
            },
        },
        {
            "type": "text",
            "interactive": False,
            "encode": {
                "update": text(
                    "fb",
                    x={"signal": "width - 24"},
                    y={"value": 18},
                    align={"value": "center"},
                    text={"value": "Fit"},
                )
            },
        },
        {
            "type": "text",
            "name": "hint",
            "interactive": False,
            "encode": {
                "update": text(
                    "hint",
                    x={"signal": "width - 54"},
                    y={"value": 18},
                    align={"value": "right"},
                    text={
                        "signal": "width > 760 ? 'drag to pan · wheel to zoom · click + to open' "
                        ": ''"
                    },
                    fontSize={"value": 10},
                    fill={"value": "#999999"},
                )
            },
        },
        {
            "type": "rect",
            "name": "banner_bg",
            "from": {"data": "banner"},
            "interactive": False,
            "encode": {
                "update": {
                    "x": {"value": GX0},
                    "y": {"signal": "height - 20"},
                    "width": {"signal": "gw"},
                    "height": {"value": 20},
                    "fill": {"value": "#fff4cc"},
                }
            },
        },
        {
            "type": "text",
            "name": "message",
            "from": {"data": "banner"},
            "interactive": False,
            "encode": {
                "update": text(
                    "ban",
                    x={"value": GX0 + 6},
                    y={"signal": "height - 6"},
                    text={"field": "text"},
                    limit={"signal": "gw - 12"},
                )
            },
        },
    ]


def extra_signals() -> list[dict[str, Any]]:
    """Signals that read the extents computed in the data (colour normalisation, list sizes)."""
    runs_h = (
        f"n_runs >= 2 ? 16 + min(n_runs, {MAX_RUNS}) * {ROW} + {ROW} + "
        f"(compare ? min(n_runs, {MAX_RUNS}) * {ROW} : 0) + 8 : 0"
    )
    bar_y = 40 + (1 + max(_mode_cell(m)[1] for m in MODES)) * ROW + 8 + ROW + 16
    return [
        {"name": "vs", "update": "length(data('vstat')) ? data('vstat')[0] : {}"},
        {"name": "ps", "update": "length(data('positive')) ? data('positive')[0] : {}"},
        {"name": "rs", "update": "length(data('ratios')) ? data('ratios')[0] : {}"},
        {"name": "lo", "update": "isValid(vs.lo) ? vs.lo : 0"},
        {"name": "hi", "update": "isValid(vs.hi) ? vs.hi : 0"},
        {"name": "plo", "update": "isValid(ps.plo) ? ps.plo : 1"},
        {"name": "phi", "update": "isValid(ps.phi) ? ps.phi : 1"},
        {"name": "llo", "update": "log(plo)"},
        {"name": "lhi", "update": "log(phi)"},
        {"name": "has_range", "update": "isValid(vs.hi)"},
        {
            "name": "rspan",
            "update": f"clamp(isValid(rs.rhi) ? rs.rhi : 0, {MIN_RATIO_SPAN}, {MAX_RATIO_SPAN})",
        },
        {"name": "bar_lo", "update": "scale_type === 'log' ? plo : lo"},
        {"name": "bar_hi", "update": "scale_type === 'log' ? phi : hi"},
        {"name": "bar_mid", "update": "scale_type === 'log' ? sqrt(plo * phi) : (lo + hi) / 2"},
        {"name": "totals_y", "update": f"{bar_y} + 38 + ({runs_h})"},
        {"name": "top_y", "update": f"totals_y + 18 + length(data('totals')) * {ROW - 1} + 10"},
        {"name": "top_n", "update": f"clamp(floor((height - top_y - 20) / {ROW}), 0, 15)"},
    ]


def extra_data() -> list[dict[str, Any]]:
    return [
        {
            "name": "runs_shown",
            "source": "runs",
            "transform": [{"type": "filter", "expr": f"n_runs >= 2 && datum.i <= {MAX_RUNS}"}],
        },
        {
            "name": "baselines_shown",
            "source": "runs_shown",
            "transform": [{"type": "filter", "expr": "compare"}],
        },
        {
            "name": "compare_toggle",
            "transform": [
                {"type": "sequence", "start": 0, "stop": 1, "as": "i"},
                {"type": "filter", "expr": "n_runs >= 2"},
            ],
        },
        {
            "name": "card_box",
            "source": "card",
            "transform": [
                {"type": "aggregate", "ops": ["count"], "as": ["lines"]},
                {"type": "filter", "expr": "datum.lines > 0"},
            ],
        },
    ]


def build() -> dict[str, Any]:
    return {
        "$schema": "https://vega.github.io/schema/vega/v5.json",
        "description": (
            f"wandb_modprof module graph, spec v{SPEC_VERSION}: nodes coloured (Turbo) by the "
            "analysis mode picked in the legend; generated by tools/build_spec.py"
        ),
        "autosize": {"type": "fit", "contains": "padding"},
        # W&B (react-vega) sets the top-level width / height from the panel; a `width` signal
        # declared here would override them and pin the size.
        "width": 960,
        "height": 600,
        "padding": 4,
        "background": "#ffffff",
        "signals": signals() + extra_signals(),
        "data": data() + extra_data(),
        "scales": scales(),
        "marks": [sidebar(), graph(), *top_bar()],
    }


def _has_null(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return any(_has_null(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_null(v) for v in value)
    return False


def render() -> str:
    return json.dumps(build(), indent=1, ensure_ascii=False) + "\n"


def main() -> None:
    text_out = render()
    if _has_null(build()):
        raise SystemExit("the spec must not contain null (W&B rewrites it to {})")
    OUT.write_text(text_out, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)} ({len(text_out):,} bytes)")


if __name__ == "__main__":
    main()
