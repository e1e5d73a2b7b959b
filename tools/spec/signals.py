"""The spec's signals: the controls (mode, scale, runs, compare, drill-down, hover), the current
mode's label / unit / total (so expressions dispatch on the unit, not on every mode), the graph
area's size and the pan / zoom state, and the extents read back from the data."""

from __future__ import annotations

from typing import Any

from tools.spec.expressions import CKPT_ON, legend_rows
from tools.spec.theme import (
    GX0,
    GY0,
    MAX_RATIO_SPAN,
    MAX_RUNS,
    MIN_RATIO_SPAN,
    MIN_READABLE_PX,
    MIN_TOP_ROWS,
    NODE_FONT_PX,
    ROW,
)
from wandb_modprof.records.modes import DEFAULT_MODE, DEFAULT_SCALE, MODES, Group

Signal = dict[str, Any]
COMPUTE_KEYS = [m.key for m in MODES if m.group is Group.COMPUTE]


def signals() -> list[Signal]:
    return [*_controls(), *_modes(), *_runs(), *_views(), *_meta(), *_zoom()]


def _first(dataset: str, field: str = "", empty: str = "{}") -> str:
    """The first tuple of `dataset` (or its `field`), `empty` while it has none."""
    row = f"data('{dataset}')[0]" + (f".{field}" if field else "")
    return f"length(data('{dataset}')) ? {row} : {empty}"


def _controls() -> list[Signal]:
    return [
        {
            "name": "mode",
            "value": f"${{string:mode:{DEFAULT_MODE}}}",
            "on": [{"events": "@mode_entry:click", "update": "datum.avail ? datum.key : mode"}],
        },
        {
            "name": "scale_type",
            "value": f"${{string:scale:{DEFAULT_SCALE}}}",
            "on": [{"events": "@scale_entry:click", "update": "datum.key"}],
        },
    ]


def _modes() -> list[Signal]:
    """The modes as parallel lists, and the current mode's entries (all '' for a mode the
    table does not know, e.g. a mistyped `${string:mode}`)."""
    tables: list[Signal] = [
        {"name": "mode_keys", "value": [m.key for m in MODES]},
        {"name": "mode_labels", "value": [m.label for m in MODES]},
        {"name": "mode_units", "value": [m.unit.value for m in MODES]},
        {"name": "mode_totals", "value": [m.total for m in MODES]},
        # the ranked list's order where it is not the value (`Mode.rank_by`): its label, unit
        {"name": "mode_rank_labels", "value": [m.rank_label for m in MODES]},
        {"name": "mode_rank_units", "value": [m.rank_unit.value for m in MODES]},
        {"name": "mode_i", "update": "indexof(mode_keys, mode)"},
    ]
    return tables + [
        {"name": f"mode_{field}", "update": f"mode_i >= 0 ? mode_{field}s[mode_i] : ''"}
        for field in ("label", "unit", "total", "rank_label", "rank_unit")
    ]


def _runs() -> list[Signal]:
    runs = "pluck(data('runs'), 'run')"
    return [
        {
            "name": "run_pick",
            "value": "",
            "on": [{"events": "@run_entry:click", "update": "datum.run"}],
        },
        {"name": "n_runs", "update": "length(data('runs'))"},
        {
            "name": "run_now",
            "update": f"indexof({runs}, run_pick) >= 0 ? run_pick : "
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
            "update": f"indexof({runs}, baseline_pick) >= 0 ? baseline_pick : "
            "(n_runs > 1 ? (data('runs')[0].run === run_now ? data('runs')[1].run : "
            "data('runs')[0].run) : '')",
        },
        {"name": "cmp", "update": "compare && n_runs >= 2 && baseline !== run_now"},
    ]


def _views() -> list[Signal]:
    return [
        {"name": "root_view", "update": _first("m_root", "meta_value", "''")},
        # where one module holds >= 90 % of the root's time: the view to open on (the user's
        # click, `view_pick`, wins; the breadcrumb leads back to the root)
        {"name": "open_view", "update": _first("m_open", "meta_value", "''")},
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
            "(indexof(pluck(data('views'), 'view_key'), open_view) >= 0 ? open_view : root_view)",
        },
        {"name": "view_now_id", "update": _first("view_at", "view_id", "-1")},
        {
            "name": "focus_key",
            "value": "",
            "on": [
                {"events": "@top_entry:click, @span_rect:click", "update": "datum.node_key"},
                {"events": "@node_rect:click, @crumb:click", "update": "''"},
            ],
        },
        {
            "name": "hover_key",
            "value": "",
            "on": [
                {
                    "events": "@node_rect:mouseover, @span_rect:mouseover",
                    "update": "datum.node_key",
                },
                {"events": "@node_rect:mouseout, @span_rect:mouseout", "update": "''"},
            ],
        },
        {"name": "card_key", "update": "hover_key || focus_key"},
    ]


def _meta() -> list[Signal]:
    return [
        {"name": "tot", "update": _first("meta_n")},
        {"name": "avail", "update": _first("avail")},
        {"name": "model_name", "update": _first("m_model", "meta_value", "''")},
        {"name": "reduced_text", "update": _first("m_reduced", "meta_value", "''")},
        {"name": "format_version", "update": _first("m_format", "meta_number", "0")},
        # what the metric columns hold: "median", or "mean" (a version-1 profile file, or a
        # table written before the row existed, whose columns were means)
        {"name": "statistic", "update": _first("m_statistic", "meta_value", "'mean'")},
        # calls no captured graph holds (`view.meta.unseen_meta`): drawn without edges
        {"name": "unseen_text", "update": _first("m_unseen", "meta_value", "''")},
        # calls without FLOP counts (meta `flops_unknown`), said in the Compute modes only
        {"name": "flops_text", "update": _first("m_flops_unknown", "meta_value", "''")},
        {"name": "flops_note", "update": f"indexof({COMPUTE_KEYS}, mode) >= 0 ? flops_text : ''"},
        # module-list members no sample called (meta `never_called`, `view.load`): said in the
        # "Load" mode's banner
        {"name": "never_text", "update": _first("m_never_called", "meta_value", "''")},
        {"name": "load_note", "update": "mode === 'load' ? never_text : ''"},
        # the checkpoint plan at the table's budget (meta `ckpt_plan`, `view.checkpoint_cells`):
        # its lines, shown in place of the totals in the "Checkpoint value" mode
        {"name": "ckpt_text", "update": _first("m_ckpt_plan", "meta_value", "''")},
        # ... and in the banner, on one line, where those have no room (`totals_on`)
        {
            "name": "ckpt_note",
            "update": f"{CKPT_ON} && !totals_on ? "
            "replace(ckpt_text, regexp('\\n', 'g'), ' · ') : ''",
        },
        # the model's first step in its process (`view.meta.cold_meta`): what became of it
        {"name": "cold_text", "update": _first("m_cold", "meta_value", "''")},
        # the compiled region (`view.meta.region_meta`) the current view lies in: its root
        # call's key and name ('' outside compiled code)
        {"name": "region_key", "update": _first("region_at", "meta_value", "''")},
        {"name": "region_label", "update": _first("region_at", "rlabel", "''")},
        # how many regions, and the calls fused inside them all (the totals' last line)
        {"name": "regions_tot", "update": _first("regions_sum", "", "{'n': 0, 'fused': 0}")},
        {
            "name": "banner_h",
            "update": "reduced_text || unseen_text || flops_note || ckpt_note || load_note "
            "? 22 : 0",
        },
        {"name": "gw", "update": f"max(60, width - {GX0})"},
        # the phase bar (`phases.py`) and the detail strip (`strip.py`) take their height and a
        # gap each below the graph
        {
            "name": "gh",
            "update": f"max(60, height - {GY0} - banner_h - (phase_h ? phase_h + 6 : 0) - "
            "(strip_h ? strip_h + 6 : 0))",
        },
        {
            "name": "vdim",
            "update": "length(data('vnodes')) ? [max(1, data('vnodes')[0].view_w_px), "
            "max(1, data('vnodes')[0].view_h_px)] : [1, 1]",
        },
        # The whole view fits the graph area at first, however small that makes it: node labels
        # too small to read are left out (`show_text`) and the ranked list names the modules.
        {
            "name": "fit",
            "update": "clamp(min((gw - 24) / vdim[0], (gh - 24) / vdim[1]), 0.02, 1.6)",
        },
    ]


def _zoom() -> list[Signal]:
    reset = "{uz: 1, px: 0, py: 0, auto: true}"
    nz = "clamp(zs.uz * pow(1.0018, -event.deltaY), 0.1, 30)"
    mx, my = f"(x() - {GX0} - ox)", f"(y() - {GY0} - oy)"
    wheel = (
        f"{{uz: {nz}, px: {mx} - ({mx} - px_eff) * {nz} / zs.uz, "
        f"py: {my} - ({my} - py_eff) * {nz} / zs.uz, auto: false}}"
    )
    return [
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
        *_pan(),
    ]


def _pan() -> list[Signal]:
    return [
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
        {"name": "show_text", "update": f"k * {NODE_FONT_PX} >= {MIN_READABLE_PX}"},
    ]


def extra_signals() -> list[Signal]:
    """Signals that read the extents computed in the data (colour normalisation, list sizes)."""
    runs_h = (
        f"n_runs >= 2 ? 16 + min(n_runs, {MAX_RUNS}) * {ROW} + {ROW} + "
        f"(compare ? min(n_runs, {MAX_RUNS}) * {ROW} : 0) + 8 : 0"
    )
    bar_y = 40 + legend_rows() * ROW + 8 + ROW + 16
    return [
        {"name": "vs", "update": _first("vstat")},
        {"name": "ps", "update": _first("positive")},
        {"name": "rs", "update": _first("ratios")},
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
        # texts computed once in the data (`bar_ticks`, `totals_items`), read by index
        {"name": "bar_text", "update": "pluck(data('bar_ticks'), 'text')"},
        {"name": "total_parts", "update": "pluck(data('totals_items'), 'text')"},
        {"name": "totals_y", "update": f"{bar_y} + 38 + ({runs_h})"},
        {"name": "totals_h", "update": f"18 + length(data('totals')) * {ROW - 1} + 10"},
        # In a low panel (W&B's default 640 x 400) the ranked list comes first: the totals are
        # shown only where the list still gets `MIN_TOP_ROWS` entries below them.
        {
            "name": "totals_on",
            "update": f"floor((height - totals_y - totals_h - 16) / {ROW}) >= {MIN_TOP_ROWS}",
        },
        {"name": "top_y", "update": "totals_y + (totals_on ? totals_h : 0)"},
        {"name": "top_n", "update": f"clamp(floor((height - top_y - 16) / {ROW}), 0, 15)"},
    ]
