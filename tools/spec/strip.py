"""The detail strip under the graph: the last sample's timeline (`view/timeline.py` rows),
following the analysis mode.

* Time (and every other group but Memory): the current view's calls on the step's time axis, one
  lane per node, forward spans solid and backward spans paler; hovering a span shows the
  node's card and highlights the node in the graph (the spans of the hovered or clicked node
  are outlined, here and in the graph, via `card_key`); clicking one focuses the node.
* Memory: the step's memory curve (`mem` rows, a step function), the hovered or clicked node's
  forward and backward spans shaded, the peak marked and the call running at it named.

W&B's rules hold: data comes from `wandb` only, no null, and the only interactive mark is
`span_rect` (clickable marks are how a panel is driven). The strip takes no room in a table
without timeline rows (one from before issue 18).
"""

from __future__ import annotations

from typing import Any

from tools.spec.expressions import fmt_bytes, fmt_ms, resolve_ref
from tools.spec.lanes import lanes_data, span_lane  # noqa: F401 (lanes_data: build_spec)
from tools.spec.marks import encode, text, text_mark
from tools.spec.theme import (
    GX0,
    GY0,
    INK,
    MIN_READABLE_PX,
    MIN_TEXT_PX,
    MUTED,
    NODE_FONT_PX,
    SMALL_FONT_PX,
    TEXT_FONT_PX,
)
from wandb_modprof.records.modes import MODES, Group

Mark = dict[str, Any]
STRIP_GAP = 6
STRIP_MIN_H = 64
LANE_LABEL_W = 110  # lane names at the strip's left
HEAD_H = 16  # the strip's heading line
AXIS_H = 22  # the time axis under the lanes (ticks, labels: inside the strip)
MEMORY = "mode_group === 'Memory'"


def strip_signals() -> list[dict[str, Any]]:
    first = "length(data('{0}')) ? data('{0}')[0].{1} : {2}"
    return [
        {"name": "mode_groups", "value": [m.group.value for m in MODES]},
        {"name": "mode_group", "update": "mode_i >= 0 ? mode_groups[mode_i] : ''"},
        {"name": "has_tl", "update": "length(data('tl_rows')) > 0"},
        # The graph keeps the room that its text needs at the fitted zoom (`show_text`), the
        # strip takes up to 30 % of the panel from what is left, never less than STRIP_MIN_H;
        # the phase bar (`phases.py`) takes its room from the strip's, down to STRIP_MIN_H.
        {
            "name": "strip_h",
            "update": f"has_tl ? max({STRIP_MIN_H}, clamp(min(round(height * 0.3), height - "
            f"{GY0} - banner_h - {STRIP_GAP} - (vdim[1] * {MIN_READABLE_PX / NODE_FONT_PX} + 24)"
            f"), {STRIP_MIN_H}, 200) - (phase_h ? phase_h + {STRIP_GAP} : 0)) : 0",
        },
        # Without a timeline the (empty, clipped) strip sits at the graph's top: its axis still
        # has bounds, and below the panel they would make autosize "fit" shrink the panel on
        # the first render (before the rows arrive), for good.
        {
            "name": "strip_y",
            "update": f"has_tl ? {GY0} + gh + {STRIP_GAP} + "
            f"(phase_h ? phase_h + {STRIP_GAP} : 0) : {GY0}",
        },
        {"name": "lane_h", "update": f"max(1, strip_h - {HEAD_H + AXIS_H})"},
        {"name": "t_hi", "update": first.format("tl_ext", "t_hi", "1")},
        {"name": "mem_hi", "update": first.format("mem_ext", "mem_hi", "1")},
        # time modes zoom to the current view's calls; memory modes show the whole step
        {"name": "v_lo", "update": first.format("vspan_ext", "v_lo", "0")},
        {"name": "v_hi", "update": first.format("vspan_ext", "v_hi", "1")},
        {"name": "tl_step", "update": first.format("m_timeline", "meta_number", "0")},
        {"name": "tl_source", "update": first.format("m_timeline", "meta_value", "''")},
        {"name": "peak_bytes", "update": first.format("m_mem_peak", "meta_number", "0")},
        {"name": "peak_key", "update": first.format("m_mem_peak", "meta_value", "''")},
        {"name": "peak_ms", "update": first.format("m_mem_peak_ms", "meta_number", "0")},
        {"name": "peak_phase", "update": first.format("m_mem_peak_ms", "meta_value", "''")},
    ]


def strip_data() -> list[dict[str, Any]]:
    def filt(expr: str) -> dict[str, str]:
        return {"type": "filter", "expr": expr}

    def formula(as_: str, expr: str) -> dict[str, str]:
        return {"type": "formula", "as": as_, "expr": expr}

    view_lookup = {
        "type": "lookup",
        "from": "view_rows",
        "key": "vref",
        "fields": ["vref"],
        "values": ["view_key", "name_ref"],
        "as": ["vk", "vn"],
        "default": "",
    }
    node_lookup = {
        "type": "lookup",
        "from": "vdraw",
        "key": "node_key",
        "fields": ["node_key"],
        "values": ["fill", "label"],
        "as": ["fill", "lane"],
        "default": "#cccccc",
    }
    return [
        {
            "name": "tl_rows",
            "source": "cur",
            "transform": [filt("datum.row_kind === 'span' || datum.row_kind === 'mem'")],
        },
        {
            "name": "vspans",
            "source": "cur",
            "transform": [
                filt("datum.row_kind === 'span'"),
                formula("vref", "datum.run + '/' + datum.view_id"),
                view_lookup,
                formula("view_key", "datum.vk"),
                formula("node_key", resolve_ref("datum.node_ref")),
                filt("datum.view_key === view_now"),
                node_lookup,
            ],
        },
        # what the time mode draws (an interactive mark must have no items when hidden)
        {"name": "time_spans", "source": "vspans", "transform": [filt(f"!({MEMORY})")]},
        {
            "name": "sel_spans",
            "source": "vspans",
            "transform": [filt(f"{MEMORY} && card_key !== '' && datum.node_key === card_key")],
        },
        {"name": "mem_pts", "source": "cur", "transform": [filt("datum.row_kind === 'mem'")]},
        {"name": "mem_drawn", "source": "mem_pts", "transform": [filt(MEMORY)]},
        {
            "name": "tl_ext",
            "source": "tl_rows",
            "transform": [
                formula("t_end", "datum.row_kind === 'span' ? datum.t1_ms : datum.t0_ms"),
                {"type": "aggregate", "fields": ["t_end"], "ops": ["max"], "as": ["t_hi"]},
            ],
        },
        {
            "name": "vspan_ext",
            "source": "vspans",
            "transform": [
                {
                    "type": "aggregate",
                    "fields": ["t0_ms", "t1_ms"],
                    "ops": ["min", "max"],
                    "as": ["v_lo", "v_hi"],
                }
            ],
        },
        {
            "name": "mem_ext",
            "source": "mem_pts",
            "transform": [
                {"type": "aggregate", "fields": ["live_bytes"], "ops": ["max"], "as": ["mem_hi"]}
            ],
        },
        {
            "name": "peak_mark",
            "source": "m_mem_peak",
            "transform": [filt(f"{MEMORY} && datum.meta_number > 0")],
        },
        {
            "name": "strip_head",
            "source": "m_format",
            "transform": [filt("has_tl"), formula("text", _heading())],
        },
    ]


def _heading() -> str:
    peak_name = "peak_key === root_view ? model_name : replace(peak_key, regexp('#0$'), '')"
    memory = (
        f"'Memory over step ' + tl_step + (tl_source === 'saved' ? "
        f"' (CPU: parameters, gradients, tensors saved for backward)' : ' (allocator)') + "
        f"(peak_bytes > 0 ? ' · peak ' + ({fmt_bytes('peak_bytes')}) + "
        f"(peak_key ? ' during ' + ({peak_name}) + ' ' + peak_phase : '') : '')"
    )
    # Inside a compiled region (`region_key`) the calls of this view ran fused: no span.
    time = (
        "'Timeline of step ' + tl_step + ': ' + (region_key ? 'inside compiled region ' + "
        "region_label + ', no call of this view ran on its own' : "
        "'the calls of this view, forward then backward (paler)')"
    )
    return f"{MEMORY} ? ({memory}) : ({time})"


def strip() -> Mark:
    area = {
        "x": {"value": GX0},
        "y": {"signal": "strip_y"},
        "width": {"signal": "gw"},
        # 1 px less: the stroke's outer half would stick out, and autosize "fit" would then
        # shrink the whole panel to contain it, which moves the strip down again
        "height": {"signal": "max(0, strip_h - 1)"},
        "clip": {"value": True},
        "fill": {"value": "#ffffff"},
        "stroke": {"signal": "has_tl ? '#e6e6e6' : 'transparent'"},
    }
    x_range = {"signal": f"[{LANE_LABEL_W}, max({LANE_LABEL_W + 10}, gw - 10)]"}
    scales = [
        {
            "name": "tl_x",
            "type": "linear",
            "domain": {
                "signal": f"{MEMORY} ? [0, max(t_hi, 1e-6)] : [v_lo, max(v_hi, v_lo + 1e-6)]"
            },
            "range": x_range,
            "zero": False,
        },
        {
            "name": "lane",
            "type": "band",
            # one band per lane (`lanes_data`: a node, or its folded siblings), by first start
            "domain": {"data": "lanes", "field": "lane_key", "sort": {"op": "min", "field": "t0"}},
            "range": {"signal": f"[{HEAD_H}, {HEAD_H} + lane_h]"},
            "paddingInner": 0.15,
        },
        {
            "name": "mem_y",
            "type": "linear",
            "domain": {"signal": "[0, max(mem_hi, 1)]"},
            "range": {"signal": f"[{HEAD_H} + lane_h, {HEAD_H + 4}]"},
            "zero": True,
        },
    ]
    axis = {
        "orient": "bottom",
        "scale": "tl_x",
        "offset": -AXIS_H,  # at the lanes' foot: a bottom axis sits at the group's height
        "labelFontSize": SMALL_FONT_PX,
        "tickCount": {"signal": "max(2, floor(gw / 110))"},
        "labelOverlap": True,
        "tickSize": 3,
        "labelPadding": 1,
        "labelColor": MUTED,
        "domainColor": "#cccccc",
        "tickColor": "#cccccc",
        "encode": {"labels": {"update": {"text": {"signal": fmt_ms("datum.value")}}}},
    }
    span = {
        "x": {"scale": "tl_x", "field": "t0_ms"},
        "x2": {"signal": "max(scale('tl_x', datum.t1_ms), scale('tl_x', datum.t0_ms) + 1)"},
        "y": {"signal": f"scale('lane', {span_lane('datum')})"},
        "height": {"signal": "max(1, bandwidth('lane'))"},
        "fill": {"field": "fill"},
        "fillOpacity": {"signal": "datum.span_phase === 'fwd' ? 1 : 0.55"},
        "stroke": {"signal": "datum.node_key === card_key ? '#000000' : 'transparent'"},
        "strokeWidth": {"signal": "datum.node_key === card_key ? 1.5 : 0"},
        "cursor": {"value": "pointer"},
    }
    lane_label = {
        "x": {"value": 4},
        "y": {"signal": "scale('lane', datum.lane_key) + bandwidth('lane') / 2"},
        "baseline": {"value": "middle"},
        # one name per lane (a folded lane's: "experts", times 128); lanes too thin for readable
        # text: only the hovered node's lane is named
        "text": {
            "signal": f"datum.lane_i === 1 && (bandwidth('lane') >= {MIN_TEXT_PX} || "
            "datum.node_key === card_key) ? datum.lane_text : ''"
        },
        "fontSize": {"signal": f"min({SMALL_FONT_PX}, max({MIN_TEXT_PX}, bandwidth('lane')))"},
        "fontWeight": {"signal": "datum.node_key === card_key ? 'bold' : 'normal'"},
        "limit": {"value": LANE_LABEL_W - 8},
    }
    shade = {
        "x": {"scale": "tl_x", "field": "t0_ms"},
        "x2": {"signal": "max(scale('tl_x', datum.t1_ms), scale('tl_x', datum.t0_ms) + 1)"},
        "y": {"value": HEAD_H},
        "height": {"signal": "lane_h"},
        "fill": {"signal": "datum.span_phase === 'fwd' ? '#4477aa' : '#cc6677'"},
        "fillOpacity": {"value": 0.22},
    }
    curve = {
        "x": {"scale": "tl_x", "field": "t0_ms"},
        "y": {"scale": "mem_y", "field": "live_bytes"},
        "y2": {"scale": "mem_y", "value": 0},
        "interpolate": {"value": "step-after"},
        "fill": {"value": "#88aadd"},
        "fillOpacity": {"value": 0.45},
        "stroke": {"value": "#335588"},
        "strokeWidth": {"value": 1.2},
    }
    peak = {
        "x": {"signal": "scale('tl_x', peak_ms)"},
        "y": {"signal": "scale('mem_y', peak_bytes)"},
        "shape": {"value": "triangle-down"},
        "size": {"value": 70},
        "fill": {"value": "#b40426"},
    }
    mem_label = {
        "x": {"value": 4},
        "y": {"signal": f"{HEAD_H + 8}"},
        "text": {"signal": fmt_bytes("mem_hi")},
        "fontSize": {"value": SMALL_FONT_PX},
        "fill": {"value": MUTED},
    }
    head = {
        "x": {"value": 4},
        "y": {"value": 11},
        "text": {"field": "text"},
        "fontSize": {"value": TEXT_FONT_PX},
        "fill": {"value": INK},
        "limit": {"signal": "gw - 8"},
    }

    def mark(
        kind: str, name: str, source: str, props: dict[str, Any], interactive: bool = False
    ) -> Mark:
        return {
            "type": kind,
            "name": name,
            "from": {"data": source},
            "interactive": interactive,
            "encode": encode(props),
        }

    return {
        "type": "group",
        "name": "strip",
        "encode": encode(area),
        "scales": scales,
        "axes": [axis],
        "marks": [
            mark("rect", "strip_shade", "sel_spans", shade),
            mark("area", "mem_curve", "mem_drawn", curve),
            mark("symbol", "mem_peak", "peak_mark", peak),
            text_mark("mem_scale", mem_label, "peak_mark"),
            mark("rect", "span_rect", "time_spans", span, interactive=True),
            {
                "type": "text",
                "name": "lane_label",
                "from": {"data": "lanes"},
                "interactive": False,
                "encode": encode(text(**lane_label)),
            },
            text_mark("strip_head", head, "strip_head"),
        ],
    }


assert Group.MEMORY.value == "Memory"  # the group name `MEMORY` tests
